"""Eager host path of the decoder MSDA call through autograd, several source trees side by side
on one CUDA device, with Deformable-DETR's CUDA op and the autograd floor in the same processes.

    python benchmarks/host_path_ab.py --trees before=DIR,after=DIR [--cuda-op-dir OPS]
        [--rounds 4] [--inner 3] [--steps 20]

Each tree runs in its own child process (two trees cannot register the same torch operators in
one process); the parent alternates the trees for ``--rounds`` rounds (before, after, before,
...), so a slow stretch of the host hits both. Inside a child, every row runs once per inner
round, in table order, ``--inner`` rounds; a sample is the wall time per call of ``--steps``
back-to-back calls and one synchronisation (max(host, GPU) time of one call). The table gives
each row's median over all samples of a tree and the median of the per-process ratios ours /
CUDA op (each ratio from one process, so from the same stretch of host time).

Rows (ddetr-decoder workload, fp32, forward + ``torch.autograd.grad`` of the three inputs):
ours with shapes as Python ints, ours with shapes as CUDA tensors, the CUDA op through its own
``MSDeformAttnFunction`` (when ``--cuda-op-dir`` is given and built), and a trivial
``autograd.Function`` saving three tensors (the autograd engine's floor). The child uses only
the public function and ``nkilib_msda.workloads``, so it runs on older trees too.

Children write to files (no pipes: a grandchild that outlives its parent cannot hold the
parent's read end open) and run under a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

ROW_INT, ROW_TENSOR = "ours, shapes as Python ints", "ours, shapes as CUDA tensors"
ROW_CUDA, ROW_FLOOR = "CUDA op, its MSDeformAttnFunction", "trivial autograd.Function (floor)"


def _child(args) -> int:
    """Time the rows in this process (the tree on PYTHONPATH) and print one JSON line."""
    import torch

    import nkilib_msda
    from nkilib_msda.workloads import PRESETS, make_torch_inputs

    case = replace(PRESETS["ddetr-decoder"], value_dtype="float32", param_dtype="float32")
    made = make_torch_inputs(case, 0, args.device)
    levels = tuple(tuple(s) for s in case.spatial_shapes)
    grad = made["grad_output"]
    leaves = [made[k].detach().clone().requires_grad_(True)
              for k in ("value", "sampling_locations", "attention_weights")]
    shapes_t = torch.tensor(levels, dtype=torch.long, device=args.device)
    areas = [h * w for h, w in levels]
    starts_t = torch.tensor([sum(areas[:i]) for i in range(len(areas))], dtype=torch.long,
                            device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    api = nkilib_msda.multi_scale_deformable_attention

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v, loc, a):
            ctx.save_for_backward(v, loc, a)
            return v.new_empty(grad.shape)

        @staticmethod
        def backward(ctx, g):
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

    rows = {
        ROW_INT: lambda: torch.autograd.grad(api(leaves[0], levels, None, leaves[1], leaves[2]),
                                             leaves, grad),
        ROW_TENSOR: lambda: torch.autograd.grad(
            api(leaves[0], shapes_t, starts_t, leaves[1], leaves[2]), leaves, grad),
        ROW_FLOOR: lambda: torch.autograd.grad(Trivial.apply(*leaves), leaves, grad),
    }
    if args.cuda_op_dir:
        sys.path.insert(0, os.path.abspath(args.cuda_op_dir))
        try:
            from functions.ms_deform_attn_func import MSDeformAttnFunction

            rows[ROW_CUDA] = lambda: torch.autograd.grad(
                MSDeformAttnFunction.apply(leaves[0], shapes_t, starts_t, leaves[1], leaves[2],
                                           64), leaves, grad)
        except ImportError as exc:
            print(f"CUDA op not importable ({exc}): row skipped", file=sys.stderr)

    def per_call_us(fn) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            fn()
        sync()
        return (time.perf_counter() - start) / args.steps * 1e6

    for fn in rows.values():  # warm-up: compile, caches
        per_call_us(fn)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.inner):
        for name, fn in rows.items():
            samples[name].append(per_call_us(fn))
    print(json.dumps(samples))
    return 0


def _run_child(tree: str, args, log_dir: str, label: str) -> dict[str, list[float]]:
    out_path = os.path.join(log_dir, f"{label}.out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--steps", str(args.steps),
           "--inner", str(args.inner), "--cuda-op-dir", args.cuda_op_dir, "--device", args.device]
    with open(out_path, "w") as out:
        proc = subprocess.run(cmd, env=env, cwd=os.path.abspath(tree), stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=args.timeout_s)
    with open(out_path) as f:
        lines = f.read().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child for tree {tree} exited {proc.returncode}: "
                           + " | ".join(lines[-5:]))
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="", help="LABEL=DIR,LABEL=DIR (source trees)")
    parser.add_argument("--cuda-op-dir", default="", metavar="OPS")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the trees")
    parser.add_argument("--inner", type=int, default=3, help="rounds inside one child")
    parser.add_argument("--steps", type=int, default=20, help="back-to-back calls per sample")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per child process")
    parser.add_argument("--device", default="cuda", help="cuda (cpu: a dry run of the script)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    trees = dict(item.split("=", 1) for item in args.trees.split(",") if item)
    if not trees:
        parser.error(f"--trees: expected LABEL=DIR[,LABEL=DIR...], got {args.trees!r}")
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in trees}
    ratios: dict[str, list[float]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as log_dir:
        for r in range(args.rounds):
            for label, tree in trees.items():
                got = _run_child(tree, args, log_dir, f"{label}_{r}")
                for row, values in got.items():
                    samples[label].setdefault(row, []).extend(values)
                if ROW_CUDA in got:
                    ratios[label].append(statistics.median(got[ROW_INT])
                                         / statistics.median(got[ROW_CUDA]))
                print(f"round {r} {label}: " + ", ".join(
                    f"{row} {statistics.median(v):.1f}" for row, v in got.items()), flush=True)
    n = args.rounds * args.inner
    print(f"\nµs per forward+backward call (ddetr-decoder, fp32); median of {n} samples of "
          f"{args.steps} back-to-back calls per tree, {args.rounds} alternating child processes "
          f"per tree; [min-max]")
    rows = list(dict.fromkeys(row for per in samples.values() for row in per))
    print("| row | " + " | ".join(trees) + " |\n|---|" + "---:|" * len(trees))
    for row in rows:
        cells = [f"{statistics.median(v):.1f} [{min(v):.0f}-{max(v):.0f}]"
                 if (v := samples[label].get(row)) else "—" for label in trees]
        print(f"| {row} | " + " | ".join(cells) + " |")
    if any(ratios.values()):
        cells = [f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" if (v := ratios[label])
                 else "—" for label in trees]
        print("| ours (int shapes) / CUDA op, per process | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
