"""Host (Python + dispatcher) overhead per call of the public torch path, on CPU.

The compute backend is replaced by a stub that only allocates its outputs (``--backend stub``,
the default), so what is left is argument validation, backend selection, operator dispatch and
autograd bookkeeping: the per-call cost that dominates decoder-sized GPU calls. Tensors are
tiny by default (``--shape tiny``: B=1, N_q=8, N_h=2, C_h=4, levels (4, 4) and (2, 2), N_p=2);
``--shape ddetr_dec`` is the Deformable-DETR decoder (B=2, N_q=300, N_h=8, C_h=32, its four
levels, N_p=4). ``--dtype`` picks the tensors' dtype (float32 or bfloat16).

    python benchmarks/host_overhead.py                      # this working tree
    python benchmarks/host_overhead.py --before d38c30d     # also a git revision, side by side
    python benchmarks/host_overhead.py --shape ddetr_dec --dtype bfloat16 --before HEAD~3

``--before REF`` extracts ``nkilib_msda`` at REF with ``git archive`` (read-only) into a
temporary folder and times both trees in alternating subprocesses, keeping each case's best.
Prints a markdown table of microseconds per call (best of ``--repeats`` loops of ``--calls``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name -> (levels, B, N_q, N_h, C_h, N_p); the named shapes come from nkilib_msda.workloads of
# this checkout (resolved in the parent process and handed to the timed trees as JSON, so an
# old tree timed with --before needs no workloads module).
TINY = (((4, 4), (2, 2)), 1, 8, 2, 4, 2)
WORKLOADS = ("tiny", "ddetr_dec")
SHAPES = TINY[0]
BATCH, QUERIES, HEADS, CHANNELS, POINTS = TINY[1:]


def _workload(name: str) -> list:
    if name == "tiny":
        return json.loads(json.dumps(TINY))
    from nkilib_msda.workloads import PRESETS, resolve_preset

    case = PRESETS[resolve_preset(name)]
    return [case.spatial_shapes, case.batch, case.num_queries, case.num_heads, case.head_dim,
            case.num_points]


def _use_workload(workload: list) -> None:
    global SHAPES, BATCH, QUERIES, HEADS, CHANNELS, POINTS
    SHAPES = tuple(tuple(level) for level in workload[0])
    BATCH, QUERIES, HEADS, CHANNELS, POINTS = workload[1:]


def _install_stub_backend() -> None:
    """Make the 'reference' backend a stub that allocates outputs and computes nothing."""
    import torch

    from nkilib_msda.backends.reference import backend as reference_torch

    def stub_forward(value, problem, sampling_locations, attention_weights):
        return value.new_empty(problem.output_shape)

    def stub_backward(grad_output, value, problem, sampling_locations, attention_weights,
                      compute=(True, True, True), deterministic=None):
        return (torch.empty_like(value), torch.empty_like(sampling_locations),
                torch.empty_like(attention_weights))

    reference_torch.msda_forward = stub_forward
    reference_torch.msda_backward = stub_backward


CLOCKS = {"wall": time.perf_counter_ns,
          # CPU time of the calling thread: what the call costs the host, far less disturbed
          # by other processes on a shared machine (the autograd engine runs CPU backward
          # passes on the calling thread; torch runs single-threaded here).
          "cpu": time.thread_time_ns}


def _time_us(fn, calls: int, repeats: int, clock: str = "wall") -> float:
    """Best mean time per call (µs) over ``repeats`` loops of ``calls`` calls."""
    now = CLOCKS[clock]
    for _ in range(min(200, calls)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = now()
        for _ in range(calls):
            fn()
        best = min(best, (now() - start) / calls / 1e3)
    return best


def _cases(dtype_name: str = "float32"):
    """(label, callable, calls multiplier) for every measured path."""
    import torch

    import nkilib_msda
    from nkilib_msda.backends.reference import backend as reference_torch
    from nkilib_msda.pytorch import ops  # noqa: F401 - registers torch.ops.nkilib_msda
    from nkilib_msda.validation.layouts import level_starts
    from nkilib_msda.validation.msda import validate_msda_args

    torch.manual_seed(0)
    length = sum(h * w for h, w in SHAPES)
    levels = len(SHAPES)
    dtype = getattr(torch, dtype_name)
    value = torch.randn(BATCH, length, HEADS, CHANNELS).to(dtype)
    loc = torch.rand(BATCH, QUERIES, HEADS, levels, POINTS, 2).to(dtype)
    attn = torch.rand(BATCH, QUERIES, HEADS, levels, POINTS).to(dtype)
    grad = torch.randn(BATCH, QUERIES, HEADS * CHANNELS).to(dtype)
    shapes_tensor = torch.tensor(SHAPES, dtype=torch.int64)
    starts = list(level_starts(SHAPES))
    starts_tensor = torch.tensor(starts, dtype=torch.int64)
    flat_shapes = [d for pair in SHAPES for d in pair]
    flat_starts = starts_tensor.tolist()
    problem = validate_msda_args(value, SHAPES, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    msda = nkilib_msda.multi_scale_deformable_attention
    op = torch.ops.nkilib_msda.ms_deformable_attention
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]

    def forward_backward():
        out = msda(leaves[0], SHAPES, None, leaves[1], leaves[2], backend="reference")
        return torch.autograd.grad(out, leaves, grad)

    def op_forward_backward():
        out = op(leaves[0], flat_shapes, flat_starts, leaves[1], leaves[2], "BLNC", "BQHLP2",
                 False, "zeros", "reference")
        return torch.autograd.grad(out, leaves, grad)

    d_model = HEADS * CHANNELS
    module = nkilib_msda.MSDeformAttn(d_model, levels, HEADS, POINTS, backend="reference")
    module.to(dtype)
    query = torch.randn(BATCH, QUERIES, d_model).to(dtype)
    reference_points = torch.rand(BATCH, QUERIES, levels, 2).to(dtype)
    flat_input = torch.randn(BATCH, length, d_model).to(dtype)
    hf_layer = nkilib_msda.MultiScaleDeformableAttention()
    hf_layer.nkilib_msda_backend = "reference"

    class TrivialFunction(torch.autograd.Function):
        """Saves the three inputs, allocates outputs: the autograd engine's own cost."""

        @staticmethod
        def forward(ctx, v, l, a):
            ctx.save_for_backward(v, l, a)
            return v.new_empty(BATCH, QUERIES, HEADS * CHANNELS)

        @staticmethod
        def backward(ctx, g):
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

    def autograd_floor():
        return torch.autograd.grad(TrivialFunction.apply(*leaves), leaves, grad)

    def module_forward():
        with torch.no_grad():
            return module(query, reference_points, flat_input, shapes_tensor, starts_tensor)

    # The module's own Linear layers dominate at decoder size: measured on the tiny shape only.
    module_rows = [("MSDeformAttn forward (no_grad, tensor shapes)", module_forward, 1)
                   ] if QUERIES * length <= 4096 else []
    return [
        ("backend call alone (floor)",
         lambda: reference_torch.msda_forward(value, problem, loc, attn), 1),
        ("functional forward, shapes as tuples",
         lambda: msda(value, SHAPES, None, loc, attn, backend="reference"), 1),
        ("functional forward, shapes/starts as tensors",
         lambda: msda(value, shapes_tensor, starts_tensor, loc, attn, backend="reference"), 1),
        ("functional forward, backend=None (auto)",
         lambda: msda(value, SHAPES, None, loc, attn), 1),
        ("autograd floor: trivial Function forward + backward", autograd_floor, 2),
        ("functional forward + backward (3 grads)", forward_backward, 2),
        ("operator forward + backward (3 grads)", op_forward_backward, 2),
        ("torch.ops.nkilib_msda.ms_deformable_attention",
         lambda: op(value, flat_shapes, flat_starts, loc, attn, "BLNC", "BQHLP2", False, "zeros",
                    "reference"), 1),
        *module_rows,
        ("HF MultiScaleDeformableAttention forward",
         lambda: hf_layer(value, shapes_tensor, list(SHAPES), starts_tensor, loc, attn, 64), 1),
    ]


def measure(backend: str, calls: int, repeats: int, workload: list,
            dtype: str = "float32", clock: str = "wall", cases: str = "") -> dict:
    """{label: µs per call} for this interpreter's nkilib_msda."""
    import nkilib_msda

    import torch

    os.environ.pop("NKILIB_MSDA_BACKEND", None)
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add wake-up noise
    if backend == "stub":
        _install_stub_backend()
    _use_workload(workload)
    results = {}
    for label, fn, divisor in _cases(dtype):
        if cases and not any(part in label for part in cases.split(",")):
            continue
        results[label] = _time_us(fn, max(1, calls // divisor), repeats, clock)
    return {"package": str(Path(nkilib_msda.__file__).parent), "results": results}


def _run_tree(path: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--backend", args.backend,
           "--calls", str(args.calls), "--repeats", str(args.repeats), "--shape", args.shape,
           "--workload-json", json.dumps(_workload(args.shape)),
           "--dtype", args.dtype, "--clock", args.clock, "--cases", args.cases]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=path)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not report["package"].startswith(str(path)):
        raise RuntimeError(f"expected nkilib_msda from {path}, imported {report['package']}")
    return report["results"]


def _best(runs: list[dict]) -> dict:
    return {label: min(run[label] for run in runs) for label in runs[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REF", help="git revision to compare against")
    parser.add_argument("--backend", choices=("stub", "reference"), default="stub")
    parser.add_argument("--shape", choices=tuple(WORKLOADS), default="tiny")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall time, or the calling thread's CPU time (shared machines)")
    parser.add_argument("--cases", default="", help="comma-separated label parts to keep")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="alternating subprocess rounds")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.json:
        workload = json.loads(args.workload_json) if args.workload_json else _workload(args.shape)
        print(json.dumps(measure(args.backend, args.calls, args.repeats, workload, args.dtype,
                                 args.clock, args.cases)))
        return

    command = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    if args.before is None:
        after = _best([_run_tree(REPO, args) for _ in range(args.rounds)])
        print(f"`{command}` (backend: {args.backend}, shape: {args.shape}, {args.dtype}, "
              f"{args.clock} clock, µs per call, best of {args.repeats}x{args.calls} calls)\n")
        print("| case | µs per call |\n|---|---:|")
        for label, us in after.items():
            print(f"| {label} | {us:.1f} |")
        return

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "nkilib_msda"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        before_runs, after_runs = [], []
        for _ in range(args.rounds):
            before_runs.append(_run_tree(Path(tmp), args))
            after_runs.append(_run_tree(REPO, args))
    before, after = _best(before_runs), _best(after_runs)
    after = {label: us for label, us in after.items() if label in before}
    print(f"`{command}` (backend: {args.backend}, shape: {args.shape}, {args.dtype}, "
          f"{args.clock} clock, µs per call, best of {args.rounds} rounds x "
          f"{args.repeats} loops x {args.calls} calls; before = {args.before})\n")
    print("| case | before (µs) | after (µs) | speed-up |\n|---|---:|---:|---:|")
    for label in after:
        ratio = before[label] / after[label]
        print(f"| {label} | {before[label]:.1f} | {after[label]:.1f} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
