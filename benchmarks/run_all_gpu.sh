#!/usr/bin/env bash
# Correctness check and benchmark of the Triton backend in one go, on a CUDA machine, from the
# repository root:   [CUDA_OP_DIR=path/to/Deformable-DETR/models/ops] [PEER_DIR=folder holding
#   roulbac/msda-triton's msda_triton package] bash benchmarks/run_all_gpu.sh [OUT_DIR]
# (CUDA_OP_DIR: that folder with its extension built in place, `python setup.py build_ext --inplace`)
# 1. benchmarks/check_gpu.py in 12 processes (shards) while 12 more compile every kernel the
#    benchmark uses (Triton's on-disk cache is shared; compiling dominates otherwise), then
# 2. the timed benchmark, alone on the GPU: this package's public function and kernels, and the
#    peers PyTorch grid_sample ("ref") and Deformable-DETR's CUDA op ("cuda", when it builds), so
#    that the tables, results.json and bench_gpu.png under $OUT/bench all come from this one run.
set -u
out=${1:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
shapes=ddetr-encoder,ddetr-decoder,bevformer-sca,bevformer-decoder,bevformer-tsa,mask2former-encoder
start=$(date +%s)
for i in $(seq 0 11); do
  python benchmarks/check_gpu.py --shard "$i/12" > "$out/check_$i.log" 2>&1 &
done
for s in ${shapes//,/ }; do
  for d in float32 bfloat16; do
    python benchmarks/bench_gpu.py --shapes "$s" --dtypes "$d" --impls triton,api,msda-triton --peer-dir "${PEER_DIR:-}" --warmup 1 \
      --rep 1 --no-errors --out "$out/warm" > "$out/warm_${s}_$d.log" 2>&1 &
  done
done
wait
echo "check + compile: $(( $(date +%s) - start )) s"
cat "$out"/check_*.log | grep -E "^(PASS|FAIL|INFO)" | sort -k1,1 > "$out/check.txt"
echo "check: $(grep -c '^PASS' "$out/check.txt") PASS, $(grep -c '^FAIL' "$out/check.txt") FAIL"
grep '^FAIL' "$out/check.txt"
grep -l -E "Traceback|Error" "$out"/check_*.log "$out"/warm_*.log
python benchmarks/bench_gpu.py --shapes "$shapes" --impls triton,api,ref,cuda,msda-triton --warmup 10 \
  --rep 40 --cuda-op-dir "${CUDA_OP_DIR:-}" --peer-dir "${PEER_DIR:-}" --out "$out/bench" 2>&1 | tee "$out/bench.log"
echo "total: $(( $(date +%s) - start )) s"
