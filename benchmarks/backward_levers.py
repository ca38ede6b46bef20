"""Time the Triton backward/forward levers on one GPU and print one table per shape.

    python benchmarks/backward_levers.py [--shapes ddetr-encoder,bevformer-sca] [--dtypes float32,bfloat16]

Backend functions are called directly (no autograd), timed with ``triton.testing.do_bench``
medians (L2 flushed before each call). Backward rows:
- ``default``: the launch plan of ``plan_launch``;
- ``only level k``: the same kernel with every sample outside level k moved to NaN (masked: no
  loads, no atomics), i.e. level k's share of the time;
- ``samples kernel (q, warps)``: the all-samples backward (coalesced parameter tiles).
Each variant's grad_value is compared with the default's (relative L2; summation order differs).
Forward rows: the default, the all-samples kernel, and a head-major (BNLC) copy of value (the
head-major lever: x-adjacent corners contiguous), with the cost of making that copy.

``--smoke`` runs everything on a tiny shape under TRITON_INTERPRET=1 on CPU (no timing value).
"""

from __future__ import annotations

import argparse
import os
import sys
import time



def _timer(smoke: bool):
    if smoke:
        def bench(fn):
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return bench
    import triton.testing

    return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def _rel(a, b) -> float:
    from nkilib_msda.workloads import relative_l2

    return relative_l2(a, b)


SAMPLES_BACKWARD_CONFIGS = ((1, 2), (2, 4), (4, 4), (4, 8))
SAMPLES_FORWARD_CONFIGS = ((2, 2), (4, 4))


def _only_level(loc, problem, level):
    """Locations with every sample outside ``level`` set to NaN (BQHLP2 layout)."""
    out = loc.clone()
    keep = [lv for lv in range(problem.num_levels) if lv != level]
    out[:, :, :, keep] = float("nan")
    return out


def run(name: str, dtype_name: str, smoke: bool, bench) -> None:
    import torch

    from nkilib_msda.backends.triton import backend as tb
    from bench_gpu import SHAPES, BenchShape, make_inputs, shape_name
    from nkilib_msda.validation.msda import validate_msda_args

    if smoke:
        shape = BenchShape("smoke", 1, 40, ((9, 11), (5, 6), (3, 3)), 2, heads=2, channels=8)
        device = "cpu"
    else:
        shape = SHAPES[shape_name(name)]
        device = "cuda"
    dtype = getattr(torch, dtype_name)
    value, loc, attn, grad = make_inputs(shape, dtype, 0, device)
    problem = validate_msda_args(value, shape.levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    base = tb.plan_launch(problem, dtype_name)
    print(f"\n## {shape.name} {dtype_name}\n\ndefault plan: {base}\n", flush=True)
    print("| kernel | variant | µs | grad_value vs default |\n|---|---|---|---|", flush=True)

    def bwd(plan, locations=loc):
        return lambda: tb.msda_backward(grad, value, problem, locations, attn, plan=plan,
                                        deterministic=False)

    reference = bwd(base)()[0]
    variants = [("default", base, loc)]
    for level in range(len(shape.levels)):
        variants.append((f"only level {level} ({shape.levels[level][0]}x{shape.levels[level][1]})",
                         base, _only_level(loc, problem, level)))
    for bq, warps in SAMPLES_BACKWARD_CONFIGS:
        plan = tb.with_configs(base, backward_kernel="samples",
                               backward=tb.KernelConfig(bq, warps))
        variants.append((f"samples kernel ({bq} q, {warps} warps)", plan, loc))
    if smoke:
        variants = variants[:2] + variants[-1:]
    for label, plan, locations in variants:
        fn = bwd(plan, locations)
        agreement = "-" if locations is not loc else f"{_rel(fn()[0], reference):.1e}"
        print(f"| backward | {label} | {bench(fn) * 1e3:.1f} | {agreement} |", flush=True)

    fwd_variants = [("default", base)] + [
        (f"samples kernel ({bq} q, {warps} warps)",
         tb.with_configs(base, forward_kernel="samples", forward=tb.KernelConfig(bq, warps)))
        for bq, warps in SAMPLES_FORWARD_CONFIGS]
    for label, plan in fwd_variants:
        fn = (lambda p: lambda: tb.msda_forward(value, problem, loc, attn, plan=p))(plan)
        print(f"| forward | {label} | {bench(fn) * 1e3:.1f} | |", flush=True)
    head_major = value.transpose(1, 2).contiguous()
    hm_problem = validate_msda_args(head_major, shape.levels, None, loc, attn, value_layout="BNLC", sampling_locations_layout="BQHLP2", align_corners=False, padding_mode="zeros")
    fn = lambda: tb.msda_forward(head_major, hm_problem, loc, attn)  # noqa: E731
    print(f"| forward | value head-major (BNLC), default plan | {bench(fn) * 1e3:.1f} | |", flush=True)
    fn = lambda: value.transpose(1, 2).contiguous()  # noqa: E731
    print(f"| (cost) | BLNC -> BNLC copy of value | {bench(fn) * 1e3:.1f} | |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="ddetr-encoder,bevformer-sca")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        assert os.environ.get("TRITON_INTERPRET") == "1", "--smoke needs TRITON_INTERPRET=1"
    else:
        import torch
        import triton

        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}")
    bench = _timer(args.smoke)
    for shape_name in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            run(shape_name, dtype_name, args.smoke, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
