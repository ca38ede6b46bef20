"""CPU speed: our default backend vs the grid_sample formulation on the Deformable-DETR shapes.

    python benchmarks/cpu_speed.py                      # ddetr_dec and ddetr_enc, fp32 + fp64, 1 and all threads
    python benchmarks/cpu_speed.py --shapes ddetr_dec --repeat 7 --threads 1
    python benchmarks/cpu_speed.py --repeat 0 --check-queries 100   # the error table only

"ours" is ``nkilib_msda.multi_scale_deformable_attention`` with the automatic backend choice
(the reference backend on CPU); "grid_sample" is the formulation Deformable-DETR's PyTorch path
and transformers use (``nkilib_msda.reference.grid_sample``: one ``F.grid_sample`` per level,
then the attention-weighted sum), differentiated by autograd. "fwd" runs under ``no_grad``;
"fwd+bwd" is forward plus ``backward`` of all three inputs. Both run on the same inputs (value
~ N(0, 1), locations ~ U[0, 1), weights normalized over (N_l, N_p), rounded to the run dtype),
interleaved call by call so that the load of a shared machine hits both alike; the table gives
the median wall time of ``--repeat`` calls after one warm-up, and the process CPU time (all
threads) of the same calls.

Accuracy: the output and the three gradients of both, on the first ``--check-queries`` queries
of each shape (the value map is the full one), against the float64 NumPy reference on the same
rounded inputs: max |x - ref| / max |ref|, the worst of the three gradients for "grad".
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Callable, Hashable

import numpy as np
import torch

import nkilib_msda
from bench_gpu import SHAPES, BenchShape, shape_name as canonical_shape
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.reference.grid_sample import msda_grid_sample
from nkilib_msda.validation.arrays import as_float64

DTYPES = {"float32": torch.float32, "float64": torch.float64}
Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_inputs(shape: BenchShape, dtype: torch.dtype, seed: int = 0) -> Inputs:
    """(value BLNC, locations BQHLP2, attention weights, grad_output) on CPU in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    b, q, h, c = shape.batch, shape.num_queries, shape.heads, shape.channels
    nl, npnt = len(shape.levels), shape.points
    value = torch.randn(b, shape.pixels, h, c, generator=gen, dtype=torch.float64)
    loc = torch.rand(b, q, h, nl, npnt, 2, generator=gen, dtype=torch.float64)
    attn = torch.rand(b, q, h, nl, npnt, generator=gen, dtype=torch.float64)
    attn = attn / attn.sum((-1, -2), keepdim=True)
    grad = torch.randn(b, q, h * c, generator=gen, dtype=torch.float64)
    return value.to(dtype), loc.to(dtype), attn.to(dtype), grad.to(dtype)


def ours(levels: tuple) -> Callable[..., torch.Tensor]:
    return lambda v, loc, a: nkilib_msda.multi_scale_deformable_attention(v, levels, None, loc, a)


def grid_sample(levels: tuple) -> Callable[..., torch.Tensor]:
    return lambda v, loc, a: msda_grid_sample(v, levels, loc, a)


def forward_call(fn: Callable[..., torch.Tensor], inputs: Inputs) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            fn(*inputs[:3])
    return run


def forward_backward_call(fn: Callable[..., torch.Tensor], inputs: Inputs) -> Callable[[], None]:
    def run() -> None:
        leaves = [t.detach().requires_grad_() for t in inputs[:3]]
        fn(*leaves).backward(inputs[3])
    return run


def time_interleaved(calls: dict[Hashable, Callable[[], None]], repeat: int
                     ) -> dict[Hashable, tuple[float, float]]:
    """name -> (median wall s, median process CPU s); one warm-up each, then ``repeat`` rounds
    calling every entry once per round, in an order rotated each round."""
    for call in calls.values():
        call()
    names = list(calls)
    samples: dict[Hashable, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - wall0, time.process_time() - cpu0))
    return {n: (statistics.median(s[0] for s in samples[n]), statistics.median(s[1] for s in samples[n]))
            for n in names}


def relative_max_error(got: torch.Tensor, ref: np.ndarray) -> float:
    ref64 = torch.from_numpy(np.asarray(ref, dtype=np.float64))
    return float((got.double() - ref64).abs().max() / ref64.abs().max())


def errors(shape: BenchShape, dtype: torch.dtype, queries: int) -> dict[str, tuple[float, float]]:
    """impl -> (output error, worst gradient error) on the first ``queries`` queries."""
    value, loc, attn, grad = make_inputs(shape, dtype)
    loc, attn, grad = loc[:, :queries], attn[:, :queries], grad[:, :queries]
    args = (as_float64(value), shape.levels, None, as_float64(loc), as_float64(attn))
    ref_out = ms_deformable_attention_ref(*args)
    ref_grads = ms_deformable_attention_bwd_ref(as_float64(grad), *args)
    result = {}
    for name, fn in (("ours", ours(shape.levels)), ("grid_sample", grid_sample(shape.levels))):
        leaves = [t.detach().requires_grad_() for t in (value, loc, attn)]
        out = fn(*leaves)
        grads = torch.autograd.grad(out, leaves, grad)
        result[name] = (relative_max_error(out.detach(), ref_out),
                        max(relative_max_error(g, r) for g, r in zip(grads, ref_grads)))
    return result


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} logical CPUs, load average {load:.1f} at start; "
            f"torch {torch.__version__}, {platform.python_implementation()} {platform.python_version()}")


def print_timings(shapes: list[str], dtypes: list[str], threads: list[int], repeat: int) -> None:
    print("| shape | dtype | threads | pass | ours (ms) | grid_sample (ms) | grid_sample / ours "
          "| ours CPU (ms) | grid_sample CPU (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape_name in shapes:
        shape = SHAPES[canonical_shape(shape_name)]
        for dtype_name in dtypes:
            inputs = make_inputs(shape, DTYPES[dtype_name])
            for n in threads:
                torch.set_num_threads(n)
                calls: dict[Hashable, Callable[[], None]] = {}
                for impl, fn in (("ours", ours(shape.levels)), ("grid_sample", grid_sample(shape.levels))):
                    calls[(impl, "fwd")] = forward_call(fn, inputs)
                    calls[(impl, "fwd+bwd")] = forward_backward_call(fn, inputs)
                times = time_interleaved(calls, repeat)
                for mode in ("fwd", "fwd+bwd"):
                    (w_ours, c_ours), (w_gs, c_gs) = times[("ours", mode)], times[("grid_sample", mode)]
                    print(f"| {shape_name} | {dtype_name} | {n} | {mode} | {w_ours * 1e3:.0f} "
                          f"| {w_gs * 1e3:.0f} | {w_gs / w_ours:.2f} | {c_ours * 1e3:.0f} "
                          f"| {c_gs * 1e3:.0f} |", flush=True)


def print_errors(shapes: list[str], dtypes: list[str], queries: int) -> None:
    print(f"\nError vs the float64 NumPy reference (first {queries} queries; "
          "max |x - ref| / max |ref|):\n")
    print("| shape | dtype | ours output | grid_sample output | ours grad | grid_sample grad |")
    print("|---|---|---|---|---|---|")
    for shape_name in shapes:
        for dtype_name in dtypes:
            err = errors(SHAPES[canonical_shape(shape_name)], DTYPES[dtype_name], queries)
            print(f"| {shape_name} | {dtype_name} | {err['ours'][0]:.1e} | "
                  f"{err['grid_sample'][0]:.1e} | {err['ours'][1]:.1e} | "
                  f"{err['grid_sample'][1]:.1e} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="ddetr_dec,ddetr_enc",
                        help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--threads", default="1,all",
                        help="comma-separated thread counts; 'all' = torch's default here")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed rounds per row (median); 0: no timing, the error table only")
    parser.add_argument("--check-queries", type=int, default=300,
                        help="queries compared with the NumPy reference (0: skip)")
    args = parser.parse_args(argv)
    all_threads = torch.get_num_threads()
    threads = [all_threads if t == "all" else int(t) for t in args.threads.split(",")]
    command = "python benchmarks/cpu_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}`  ")
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}\n")
    if args.repeat > 0:
        print_timings(args.shapes.split(","), args.dtypes.split(","), threads, args.repeat)
    torch.set_num_threads(all_threads)
    if args.check_queries > 0:
        print_errors(args.shapes.split(","), args.dtypes.split(","), args.check_queries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
