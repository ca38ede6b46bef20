"""Time the Triton backward/forward levers on one GPU and print one table per shape.

    python benchmarks/backward_levers.py [--shapes ddetr-encoder,bevformer-sca] [--dtypes float32,bfloat16]
    python benchmarks/backward_levers.py --floor [--peer-dir P] [--cuda-op-dir OPS] [--shapes ...]

Backend functions are called directly (no autograd), timed with ``triton.testing.do_bench``
medians (L2 flushed before each call). Backward rows:
- ``default``: the launch plan of ``plan_launch``;
- ``only level k``: the same kernel with every sample outside level k moved to NaN (masked: no
  loads, no atomics), i.e. level k's share of the time;
- ``samples kernel (q, warps)``: the all-samples backward (coalesced parameter tiles).
Each variant's grad_value is compared with the default's (relative L2; summation order differs).
Forward rows: the default, the all-samples kernel, and a head-major (BNLC) copy of value (the
head-major lever: x-adjacent corners contiguous), with the cost of making that copy.

``--floor`` times instead the atomics floor (benchmarks/atomics_floor.py: only the grad_value
reductions of our fast backward, same rows, channel vectors and fp32 accumulator) beside ours'
forward and backward and the peers' backward and forward+backward (msda-triton with fp32
grad_value accumulation, ``--peer-dir``; Deformable-DETR's CUDA op, fp32, ``--cuda-op-dir``;
a peer's backward alone is ``torch.autograd.grad`` of a kept graph), checks the floor's
accumulator against ours' grad_value, prints how often reductions of one program (or of 8 / 64
consecutive programs) hit the same value row, and ends with the implied best ratio
(ours' forward + the floor) ÷ the best accurate peer's fwd+bwd per shape.

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


def _peer_backward(fn, leaves, grad):
    """A peer's backward alone: its autograd graph kept from one forward, differentiated again
    on every call (``fn`` takes the three leaves and returns the output)."""
    import torch

    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True)


def _peers(shape, dtype_name: str, inputs) -> dict:
    """peer -> (fwd+bwd callable, backward-only callable) of the accurate peers available."""
    import torch

    from bench_gpu import _load_cuda_op

    value, loc, attn, grad = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (value, loc, attn)]
    found = {}
    try:
        from msda_triton import multi_scale_deformable_attention as peer
    except ImportError as exc:
        print(f"msda-triton not importable ({exc}): no rows", flush=True)
    else:
        shapes = torch.tensor(shape.levels, dtype=torch.long, device="cuda")

        def mt(v, lo, at):
            return peer(v, shapes, None, lo, at, fp32_grad_accum=True)

        found["msda-triton"] = (lambda: torch.autograd.grad(mt(*leaves), leaves, grad),
                                _peer_backward(mt, leaves, grad))
    ext, function, note = _load_cuda_op()
    if note:
        print(note, flush=True)
    elif dtype_name == "float32" and function is not None:
        shapes_t = torch.tensor(shape.levels, dtype=torch.long, device="cuda")
        sizes = shapes_t.prod(1)
        starts_t = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])

        def op(v, lo, at):
            return function.apply(v, shapes_t, starts_t, lo, at, 64)

        found["cuda"] = (lambda: torch.autograd.grad(op(*leaves), leaves, grad),
                         _peer_backward(op, leaves, grad))
    return found


def run_floor(name: str, dtype_name: str, smoke: bool, bench, summary: list) -> None:
    """The atomics-floor rows of one shape and dtype (see the module docstring); ``smoke``: a
    tiny shape on CPU under the interpreter, no peers."""
    import torch

    from atomics_floor import corner_entries, floor_launch, repeat_fractions
    from bench_gpu import SHAPES, BenchShape, make_inputs, shape_name
    from nkilib_msda.backends.triton import backend as tb
    from nkilib_msda.validation.msda import validate_msda_args

    device = "cpu" if smoke else "cuda"
    shape = (BenchShape("smoke", 1, 40, ((9, 11), (5, 6), (3, 3)), 2, heads=2, channels=8)
             if smoke else SHAPES[shape_name(name)])
    inputs = make_inputs(shape, getattr(torch, dtype_name), 0, device)
    value, loc, attn, grad = inputs
    problem = validate_msda_args(value, shape.levels, None, loc, attn, "BLNC", "BQHLP2", False,
                                 "zeros")
    plan = tb.plan_launch(problem, dtype_name)
    cfg = plan.samples_backward
    rows, coef = corner_entries(value, shape.levels, loc, attn)
    acc = torch.zeros(value.shape, dtype=torch.float32, device=device)
    floor_launch(grad, rows, coef, acc, cfg.block_q, cfg.num_warps)
    ours_gv = tb.msda_backward(grad, value, problem, loc, attn, deterministic=False)[0]
    agree = _rel(acc.to(ours_gv.dtype), ours_gv)
    repeats = repeat_fractions(rows, cfg.block_q)
    valid = float((rows >= 0).float().mean())
    print(f"\n## {shape.name} {dtype_name}: atomics floor\n\nplan: samples backward {cfg}; "
          f"{int((rows >= 0).sum())} in-map corner reductions ({valid:.1%} of all corners); "
          f"floor accumulator vs ours' grad_value: relative L2 {agree:.1e}; reductions hitting "
          f"a row already reduced into by the same window: "
          + ", ".join(f"{w} program{'s' if w > 1 else ''} {f:.2%}" for w, f in repeats.items())
          + "\n", flush=True)
    print("| row | µs |\n|---|---|", flush=True)
    times = {}

    def row(label, fn):
        times[label] = bench(fn) * 1e3
        print(f"| {label} | {times[label]:.1f} |", flush=True)

    row("ours forward", lambda: tb.msda_forward(value, problem, loc, attn))
    row("ours backward", lambda: tb.msda_backward(grad, value, problem, loc, attn,
                                                  deterministic=False))
    row("ours backward, grad_value only", lambda: tb.msda_backward(
        grad, value, problem, loc, attn, compute=(True, False, False), deterministic=False))
    row("atomics floor (grad_value reductions only)",
        lambda: floor_launch(grad, rows, coef, acc, cfg.block_q, cfg.num_warps))
    peer_fb = {}
    for peer, (fwd_bwd, bwd) in ({} if smoke else _peers(shape, dtype_name, inputs)).items():
        row(f"{peer} backward", bwd)
        row(f"{peer} fwd+bwd", fwd_bwd)
        peer_fb[peer] = times[f"{peer} fwd+bwd"]
    best = min(peer_fb.values()) if peer_fb else float("nan")
    floor = times["atomics floor (grad_value reductions only)"]
    summary.append((shape.name, dtype_name, times["ours forward"], times["ours backward"], floor,
                    best, min(peer_fb, key=peer_fb.get) if peer_fb else "—"))


def print_floor_summary(summary: list) -> None:
    print("\n## Implied best ratio\n\n| shape | dtype | ours fwd µs | ours bwd µs | atomics floor "
          "µs | floor ÷ ours bwd | best peer fwd+bwd µs | ours now ÷ peer | (ours fwd + floor) "
          "÷ peer |\n|---|---|---|---|---|---|---|---|---|")
    for shape, dtype, fwd, bwd, floor, best, who in summary:
        print(f"| {shape} | {dtype} | {fwd:.1f} | {bwd:.1f} | {floor:.1f} | {floor / bwd:.2f} | "
              f"{best:.1f} ({who}) | {(fwd + bwd) / best:.2f} | {(fwd + floor) / best:.2f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="ddetr-encoder,bevformer-sca")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--floor", action="store_true", help="the atomics-floor rows instead")
    parser.add_argument("--peer-dir", default="", help="folder holding msda_triton (--floor)")
    parser.add_argument("--cuda-op-dir", default="", help="Deformable-DETR models/ops (--floor)")
    args = parser.parse_args(argv)
    if args.smoke:
        assert os.environ.get("TRITON_INTERPRET") == "1", "--smoke needs TRITON_INTERPRET=1"
    else:
        import torch
        import triton

        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}")
    bench = _timer(args.smoke)
    if args.floor:
        from bench_gpu import add_cuda_op_dir

        from nkilib_msda.bench.peers import add_peer_dir

        add_cuda_op_dir(args.cuda_op_dir)
        add_peer_dir(args.peer_dir)
        summary: list = []
        for shape_name in args.shapes.split(","):
            for dtype_name in args.dtypes.split(","):
                run_floor(shape_name, dtype_name, args.smoke, bench, summary)
                if not args.smoke:
                    torch.cuda.empty_cache()
        print_floor_summary(summary)
        sys.stdout.flush()
        os._exit(0)  # no lingering compile workers or peers' threads
    for shape_name in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            run(shape_name, dtype_name, args.smoke, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
