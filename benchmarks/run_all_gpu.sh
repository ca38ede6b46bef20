#!/usr/bin/env bash
# Every GPU table of docs/performance.md and benchmarks/RESULTS.md from one run, on a CUDA
# machine, from the repository root:
#   [CUDA_OP_DIR=path/to/Deformable-DETR/models/ops] [PEER_DIR=folder holding roulbac/msda-triton's
#    msda_triton package] [HOST_TREES=LABEL=DIR,...] [VERSIONS=LABEL=DIR,...]
#    [SWITCHES=LABEL=DIR@NAME=VALUE,...] [BENCH_SHAPES=shape,...]
#    [PARTS="check levers switches bench decoder host profile versions"] [COMPILE_LIMIT=400]
#    bash benchmarks/run_all_gpu.sh [OUT_DIR]
# CUDA_OP_DIR: built in place first when no built extension is there (`setup.py build_ext
# --inplace`). HOST_TREES: source trees for the host-path table (default: this tree alone).
# VERSIONS: source trees (DIR/nkilib_msda) whose GPU time benchmarks/version_ab.py compares;
# VERSIONS_ENV="NAME=VALUE ...": environment of that comparison alone (a variant's switches).
# SWITCHES: versions of this tree with switches set (version_ab.py's LABEL=DIR@NAME=VALUE, the
# first one the default; a second one without switches measures the noise): part "switches"
# times them and writes the environment of the one that beats the default on every shape beyond
# the noise to OUT_DIR/switch.env (empty when none does; source it before later parts).
# BENCH_SHAPES: the benchmark's shapes (default all six), to split it over several calls.
# PARTS="warm" alone runs only the benchmark's kernel compiles of step 1 (e.g. after sourcing
# switch.env, whose switches compile other kernels). COMPILE_LIMIT: seconds per process of step 1.
# 1. benchmarks/check_gpu.py in 12 processes (shards), the GPU tests, and 12 processes that
#    compile every kernel of ours the benchmark uses (Triton's on-disk cache is shared), in
#    parallel. msda-triton autotunes its forward when first called, so it compiles in the timed
#    step, alone on the GPU (its bevformer-sca warm-ups in this phase did not end within 400 s in
#    a run of 2026-12-03, and an autotune beside 30 busy processes picks on noise);
# 2. alone on the GPU, one after the other: the atomics floor beside ours' and the peers' backward
#    (benchmarks/backward_levers.py --floor, encoder, SCA and TSA; msda-triton compiles here),
#    the switches (SWITCHES), the benchmark (this package's public function and
#    kernels, grid_sample "ref", Deformable-DETR's CUDA op "cuda", msda-triton), the Deformable-DETR
#    decoder step (benchmarks/decoder_step_gpu.py), the eager host path
#    (benchmarks/host_path_ab.py), its profile (benchmarks/host_overhead_gpu.py --profile) and, with
#    VERSIONS, benchmarks/version_ab.py.
# PARTS names the steps to run (default all; e.g. PARTS="decoder host" in a second call on the
# same machine, whose Triton cache the first call filled). Every step runs under `timeout` (a
# stuck step is killed and reported, the run goes on) and writes its log to a file under OUT_DIR,
# never to this script's stdout: a process a step leaves behind (torch.compile's compile-worker
# sidecar inherits its parent's stdout) cannot hold a pipe that reads this script's output open.
# The script ends by listing any process a step left behind.
set -u
mkdir -p "${1:-gpu_out}"
out=$(cd "${1:-gpu_out}" && pwd)
py=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ops=${CUDA_OP_DIR:-}
parts=" ${PARTS:-check levers switches bench decoder host profile versions} "
want() { [[ "$parts" == *" $1 "* ]]; }
shapes=${BENCH_SHAPES:-ddetr-encoder,ddetr-decoder,bevformer-sca,bevformer-decoder,bevformer-tsa,mask2former-encoder}
large=ddetr-encoder,bevformer-sca,bevformer-tsa
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start )) s] $*"; }
# step SECONDS LOG COMMAND...: run under timeout, output to LOG, report the exit status.
step() {
  local limit=$1 log=$2; shift 2
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && say "TIMEOUT after ${limit} s: $*"
  return $rc
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
$py -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
[ -f COMMIT ] && echo "tree: $(cat COMMIT)"
if [ -n "$ops" ] && [ -f "$ops/setup.py" ] && ! ls "$ops"/MultiScaleDeformableAttention*.so > /dev/null 2>&1; then
  (cd "$ops" && TORCH_CUDA_ARCH_LIST=9.0 step 300 "$out/cuda_op_build.log" $py setup.py build_ext --inplace) &
fi
limit=${COMPILE_LIMIT:-400}  # each process of the check + tests + compile phase
warm() {  # compile every kernel of ours the benchmark uses, one process per shape and dtype
  for s in ${shapes//,/ }; do
    for d in float32 bfloat16; do
      step $limit "$out/warm_${s}_$d.log" $py benchmarks/bench_gpu.py --shapes "$s" --dtypes "$d" \
        --impls triton,api --warmup 1 --rep 1 --no-errors --out "$out/warm" &
    done
  done
}
if want check; then
for i in $(seq 0 11); do
  step $limit "$out/check_$i.log" $py benchmarks/check_gpu.py --shard "$i/12" &
done
warm
if [ -n "${VERSIONS:-}" ]; then
  step $limit "$out/version_ab_compile.log" env ${VERSIONS_ENV:-} $py benchmarks/version_ab.py --versions "$VERSIONS" \
    --shapes $large --compile-only &
fi
if [ -n "${SWITCHES:-}" ]; then
  for s in ${large//,/ }; do
    step $limit "$out/switches_compile_$s.log" $py benchmarks/version_ab.py --versions "$SWITCHES" \
      --shapes "$s" --compile-only &
  done
fi
step $limit "$out/tests.log" $py -m pytest tests/backends/triton tests/pytorch/test_tensor_shapes_ops.py \
  tests/pytorch/test_point_counts.py -q -p no:cacheprovider -n 4 -rfs
say "GPU tests: $(tail -1 "$out/tests.log")"
wait
say "check + tests + compile done"
cat "$out"/check_*.log | grep -E "^(PASS|FAIL|INFO)" | sort -k1,1 > "$out/check.txt"
echo "check: $(grep -c '^PASS' "$out/check.txt") PASS, $(grep -c '^FAIL' "$out/check.txt") FAIL"
grep '^FAIL' "$out/check.txt"
grep -l -E "Traceback|Error" "$out"/check_*.log "$out"/warm_*.log
elif want warm; then  # alone: e.g. again after sourcing switch.env (other kernels)
  warm
  wait
  say "warm done"
fi
wait  # the CUDA op's build
if want levers; then  # msda-triton autotunes (and compiles) its forward here, alone on the GPU
  step ${LEVERS_LIMIT:-240} "$out/levers.log" $py benchmarks/backward_levers.py --floor --shapes $large \
    --cuda-op-dir "$ops" --peer-dir "${PEER_DIR:-}"
  say "levers rc=$?"
fi
if want switches && [ -n "${SWITCHES:-}" ]; then
  step 150 "$out/switches.log" $py benchmarks/version_ab.py --versions "$SWITCHES" --shapes $large \
    --rounds 7 --decide "$out/switch.env"
  say "switches rc=$?: $(grep '^decision' "$out/switches.log")"
fi
if want bench; then
  step ${BENCH_LIMIT:-420} "$out/bench.log" $py benchmarks/bench_gpu.py --shapes "$shapes" --impls triton,api,ref,cuda,msda-triton \
    --warmup 10 --rep 40 --cuda-op-dir "$ops" --peer-dir "${PEER_DIR:-}" --out "$out/bench"
  say "bench rc=$?"
fi
if want decoder; then
  step 240 "$out/decoder_step.log" $py benchmarks/decoder_step_gpu.py --cuda-op-dir "$ops" --rounds 7 --steps 20
  say "decoder step rc=$?"
fi
if want host; then
  step 300 "$out/host_path.log" $py benchmarks/host_path_ab.py --trees "${HOST_TREES:-this=$PWD}" \
    --cuda-op-dir "$ops" --rounds 3 --inner 3 --steps 20
  say "host path rc=$?"
fi
if want profile; then  # where the eager decoder call's host time goes (cProfile, fp32)
  (cd benchmarks && step 180 "$out/host_profile.log" $py host_overhead_gpu.py --shape ddetr-decoder --calls 200 \
    --profile 300 --dtypes float32 --cuda-op-dir "$ops")
  say "host profile rc=$?"
fi
if want versions && [ -n "${VERSIONS:-}" ]; then
  step 300 "$out/version_ab.log" env ${VERSIONS_ENV:-} $py benchmarks/version_ab.py --versions "$VERSIONS" \
    --shapes ddetr-encoder,bevformer-sca,bevformer-tsa --rounds 5
  say "version_ab rc=$?"
fi
left=$(ps -eo pid,ppid,etime,args | grep -E "python|pytest" | grep -v -E "grep|run_all_gpu" || true)
[ -n "$left" ] && echo "processes left running:" && echo "$left"
say "total"
