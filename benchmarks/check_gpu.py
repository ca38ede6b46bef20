"""GPU correctness check of the Triton backend against a float64 reference.

Run on a CUDA machine:  python benchmarks/check_gpu.py [--skip-large] [--shard I/N]
Every case draws fresh random inputs, rounds them to the run dtype, and compares the Triton
forward and all three gradients with float64 grid_sample + autograd on the same rounded
inputs (relative L2). Before each case a 256 MiB NaN-filled block is freed back to the caching
allocator, so outputs the kernels fail to write show up as NaN. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from nkilib_msda.backends.triton import backend as tb
from nkilib_msda.reference.grid_sample import msda_grid_sample_with_grads, relative_l2
from nkilib_msda.validation.layouts import level_starts
from nkilib_msda.validation.msda import validate_msda_args
from nkilib_msda.workloads import DDETR_LEVELS, GPU_ACCUMULATED_BF16_TOLERANCE, GPU_TOLERANCES

TOL = {getattr(torch, name): tol for name, tol in GPU_TOLERANCES.items()}
ACC_TOL = GPU_ACCUMULATED_BF16_TOLERANCE
SHAPES_SMALL = ((13, 17), (7, 9), (4, 5))


def make_inputs(batch, queries, heads, channels, shapes, points, dtype, value_layout, loc_layout,
                spread=1.3, device="cuda", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    pixels = sum(h * w for h, w in shapes)
    value = torch.randn(batch, pixels, heads, channels, device=device, generator=gen)
    loc = torch.rand(batch, queries, heads, len(shapes), points, 2, device=device, generator=gen)
    loc = (loc - 0.5) * spread + 0.5  # some samples fall outside the map
    attn = torch.rand(batch, queries, heads, len(shapes), points, device=device, generator=gen)
    attn = attn / attn.sum((-1, -2), keepdim=True)
    grad = torch.randn(batch, queries, heads * channels, device=device, generator=gen)
    value, loc, attn, grad = (t.to(dtype) for t in (value, loc, attn, grad))
    if value_layout == "BNLC":
        value = value.transpose(1, 2).contiguous()
    if loc_layout == "B2QHLP":
        loc = loc.permute(0, 5, 1, 2, 3, 4).contiguous()
    return value, loc, attn, grad


def poison_allocator() -> None:
    block = torch.full((64 << 20,), float("nan"), device="cuda")
    del block


def check_case(name, dtype, *, batch=2, queries=97, heads=4, channels=32, shapes=SHAPES_SMALL,
               points=3, value_layout="BLNC", loc_layout="BQHLP2", align_corners=False,
               padding_mode="zeros", deterministic=False, compute=(True, True, True), seed=0,
               forward_kernel="points", plan_changes=None):
    poison_allocator()
    value, loc, attn, grad = make_inputs(batch, queries, heads, channels, shapes, points, dtype,
                                         value_layout, loc_layout, seed=seed)
    problem = validate_msda_args(value, shapes, None, loc, attn, value_layout, loc_layout,
                                 align_corners, padding_mode)
    options = dict(value_layout=value_layout, sampling_locations_layout=loc_layout,
                   align_corners=align_corners, padding_mode=padding_mode)
    ref = msda_grid_sample_with_grads(value.double(), shapes, loc.double(), attn.double(),
                                      grad.double(), **options)
    plan = tb.with_configs(tb.plan_launch(problem, str(dtype)), forward_kernel=forward_kernel,
                           **(plan_changes or {}))
    out = tb.msda_forward(value, problem, loc, attn, plan=plan)
    grads = tb.msda_backward(grad, value, problem, loc, attn, compute=compute,
                             deterministic=deterministic, plan=plan if plan_changes else None)
    errors = [relative_l2(out, ref[0])]
    for want, got, expected in zip(compute, grads, ref[1:]):
        if want:
            errors.append(relative_l2(got, expected))
        else:
            errors.append(0.0 if bool((got == 0).all()) else float("inf"))
    ok = all(e <= TOL[dtype] for e in errors)
    if deterministic:  # a second run must be bitwise identical
        again = tb.msda_backward(grad, value, problem, loc, attn, compute=compute, deterministic=True)
        same = all(torch.equal(a, b) for a, b in zip(grads, again))
        ok = ok and same
        name += " bitwise=" + ("yes" if same else "NO")
    return name, str(dtype).replace("torch.", ""), errors, ok


def check_nonfinite():
    """NaN / inf / huge coordinates: no fault, NaN samples contribute nothing."""
    shapes = SHAPES_SMALL
    value, loc, attn, grad = make_inputs(1, 33, 2, 16, shapes, 2, torch.float32, "BLNC", "BQHLP2")
    loc[0, :8, 0, 0, 0, 0] = float("nan")
    loc[0, 8:16, 0, 1, 0, 1] = float("inf")
    loc[0, 16:24, 1, 2, 1, 0] = -1e30
    problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    out = tb.msda_forward(value, problem, loc, attn)
    grads = tb.msda_backward(grad, value, problem, loc, attn)
    torch.cuda.synchronize()
    clean = loc.clone()
    clean[0, :8, 0, 0, 0] = -10.0  # far outside: contributes nothing in zeros mode
    clean[0, 8:16, 0, 1, 0, 1] = 10.0
    clean[0, 16:24, 1, 2, 1, 0] = -10.0
    ref = msda_grid_sample_with_grads(value.double(), shapes, clean.double(), attn.double(),
                                      grad.double())
    errors = [relative_l2(out, ref[0])] + [relative_l2(g, r) for g, r in zip(grads, ref[1:])]
    ok = all(e <= TOL[torch.float32] for e in errors) and bool(torch.isfinite(grads[1]).all())
    return "nan/inf/huge coordinates", "float32", errors, ok


NONFINITE_SHAPES = ((6, 7), (5, 6))


def border_pixels(shapes):
    """Flat pixel indices (over all levels) of every level's edge pixels."""
    out = []
    for (h, w), start in zip(shapes, level_starts(shapes)):
        out += [start + y * w + x for y in range(h) for x in range(w)
                if y in (0, h - 1) or x in (0, w - 1)]
    return out


def nonfinite_value_inputs(batch, queries, heads, channels, device="cuda", seed=0):
    """(clean, bad, loc, attn, grad) in fp32 on NONFINITE_SHAPES (3 points): interior samples
    (no corner on an edge pixel) plus samples far outside the map, whose masked corners are
    clamped onto edge pixels; ``bad`` holds inf / -inf / NaN there, ``clean`` zeros."""
    value, loc, attn, grad = make_inputs(batch, queries, heads, channels, NONFINITE_SHAPES, 3,
                                         torch.float32, "BLNC", "BQHLP2", device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed + 5)
    loc = 0.35 + 0.3 * torch.rand(loc.shape, device=device, generator=gen)
    loc[:, ::2, 0, 0, 0, :] = -0.6  # every corner left of / above the map
    loc[:, 1::3, 1, 1, 1, :] = 1.6  # every corner right of / below the map
    loc[:, 2::4, heads - 1, 1, 2, 0] = -3.0  # x outside, y inside: still all four corners masked
    border = border_pixels(NONFINITE_SHAPES)
    clean = value.clone()
    clean[:, border] = 0.0
    bad = value.clone()
    for i, pixel in enumerate(border):
        bad[:, pixel] = (float("inf"), float("-inf"), float("nan"))[i % 3]
    return clean, bad, loc, attn, grad


def check_nonfinite_values(deterministic):
    """Pixels that only masked (out-of-map, clamped) corners touch hold inf/-inf/NaN: nothing
    may leak (forward, every gradient); then an interior pixel holding inf that in-map corners
    read must make exactly the reference's outputs non-finite."""
    shapes = NONFINITE_SHAPES
    clean, bad, loc, attn, grad = nonfinite_value_inputs(2, 41, 4, 32)
    problem = validate_msda_args(bad, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    ref = msda_grid_sample_with_grads(clean.double(), shapes, loc.double(), attn.double(),
                                      grad.double())
    errors = [0.0] * 4
    for kernel in ("points", "samples"):
        plan = tb.with_configs(tb.plan_launch(problem, "float32"), forward_kernel=kernel)
        got = [tb.msda_forward(bad, problem, loc, attn, plan=plan),
               *tb.msda_backward(grad, bad, problem, loc, attn, deterministic=deterministic)]
        errors = [max(e, relative_l2(g, r)) for e, g, r in zip(errors, got, ref)]
    hot = clean.clone()
    hot[:, 2 * 7 + 3] = float("inf")  # level 0, row 2, column 3: read by in-map corners
    want = msda_grid_sample_with_grads(hot.double(), shapes, loc.double(), attn.double(),
                                       grad.double())
    got = [tb.msda_forward(hot, problem, loc, attn),
           *tb.msda_backward(grad, hot, problem, loc, attn, deterministic=deterministic)]
    same = all(torch.equal(torch.isfinite(g), torch.isfinite(w)) for g, w in zip(got, want))
    ok = all(e <= TOL[torch.float32] for e in errors) and same and not bool(torch.isfinite(want[0]).all())
    name = "inf/NaN in pixels only masked corners touch" + (" deterministic" if deterministic else "")
    return name + f" (propagation pattern {'same' if same else 'DIFFERS'})", "float32", errors, ok


def check_launch_paths():
    """Direct compiled-kernel launches and the JIT path give bitwise-equal results, and the
    first direct launch of every launcher passes its check against Triton's own launch (no
    fallback, no warning): deterministic and fast mode (atomic grad_value), fp32 and bf16."""
    import warnings

    value, loc, attn, grad = make_inputs(2, 97, 4, 32, SHAPES_SMALL, 3, torch.float32, "BLNC",
                                         "BQHLP2")
    problem = validate_msda_args(value, SHAPES_SMALL, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    runs, contexts = [], [tb._context(problem, value, loc)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fast in (False, True, True):
            tb._FAST_LAUNCH[0] = fast
            runs.append([tb.msda_forward(value, problem, loc, attn),
                         *tb.msda_backward(grad, value, problem, loc, attn, deterministic=True)])
        for dtype in (torch.float32, torch.bfloat16):  # fast mode: JIT, then the checked launch
            low = [t.to(dtype) for t in (value, loc, attn, grad)]
            low_problem = validate_msda_args(low[0], SHAPES_SMALL, None, low[1], low[2], "BLNC",
                                             "BQHLP2", False, "zeros")
            contexts.append(tb._context(low_problem, low[0], low[1]))
            for _ in range(3):
                tb.msda_forward(low[0], low_problem, low[1], low[2])
                tb.msda_backward(low[3], low[0], low_problem, low[1], low[2], deterministic=False)
    tb._FAST_LAUNCH[0] = True
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
    runners = [r for ctx in contexts for launcher in ctx._launchers.values()
               for r in launcher._runners.values()]
    bare = bool(runners) and all(getattr(r, "fallback", None) is not None for r in runners)
    warned = [str(w.message) for w in caught if "nkilib_msda" in str(w.message)]
    ref = msda_grid_sample_with_grads(value.double(), SHAPES_SMALL, loc.double(), attn.double(),
                                      grad.double())
    errors = [relative_l2(g, r) for g, r in zip(runs[1], ref)]
    name = (f"direct vs JIT launch bitwise={'yes' if same else 'NO'}, {len(runners)} direct "
            f"launchers checked on their first launch (all direct={'yes' if bare else 'NO'}, "
            f"warnings={len(warned)})")
    ok = same and bare and not warned and all(e <= TOL[torch.float32] for e in errors)
    return name, "float32", errors, ok


def check_kept_accumulator():
    """With the plan's kept scratch, 16-bit values keep their fp32 grad_value accumulator
    between calls, cleared by the cast kernel: three backwards with fresh grad_output on the
    current stream, one on a side stream and two CUDA-graph replays (captured calls allocate
    their own) all match the reference, and every kept accumulator holds zeros afterwards."""
    value, loc, attn, _ = make_inputs(2, 97, 4, 32, SHAPES_SMALL, 3, torch.bfloat16, "BLNC",
                                      "BQHLP2", seed=40)
    problem = validate_msda_args(value, SHAPES_SMALL, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    plan = tb.with_configs(tb.plan_launch(problem, "bfloat16"), grad_value_scratch="kept")
    grads = [torch.randn(problem.output_shape, device="cuda").to(torch.bfloat16) for _ in range(5)]
    results = []  # (grad_output, (grad_value, grad_loc, grad_attn))

    def backward(grad):
        return tb.msda_backward(grad, value, problem, loc, attn, deterministic=False, plan=plan)

    results += [(g, backward(g)) for g in grads[:3]]
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        results.append((grads[3], backward(grads[3])))
    main.wait_stream(side)
    static_grad = grads[4].clone()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        backward(static_grad)  # warm-up outside the capture
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_grads = backward(static_grad)
    for g in (grads[0], grads[4]):
        static_grad.copy_(g)
        graph.replay()
        results.append((g, tuple(t.clone() for t in static_grads)))
    torch.cuda.synchronize()
    errors = [0.0] * 3
    for g, got in results:
        ref = msda_grid_sample_with_grads(value.double(), SHAPES_SMALL, loc.double(),
                                          attn.double(), g.double())
        errors = [max(e, relative_l2(x, r)) for e, x, r in zip(errors, got, ref[1:])]
    pool = tb._context(problem, value, loc)._scratch
    zeroed = len(pool) >= 2 and all(bool((t == 0).all()) for t in pool.values())
    name = f"kept grad_value accumulator: repeated, side stream, graph replay (cleared={zeroed})"
    return name, "bfloat16", [0.0, *errors], zeroed and max(errors) <= TOL[torch.bfloat16]


def check_int64():
    """B*L*N_h*C_h > 2**31: batch 4 lives entirely beyond int32 offsets."""
    shapes = ((1024, 1024),)
    batch, heads, channels = 5, 4, 128
    value, loc, attn, grad = make_inputs(batch, 64, heads, channels, shapes, 4, torch.bfloat16,
                                         "BLNC", "BQHLP2")
    problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    assert value.numel() > 2**31 and tb.needs_int64(problem)
    out = tb.msda_forward(value, problem, loc, attn)
    gv, gl, ga = tb.msda_backward(grad, value, problem, loc, attn)
    last = slice(batch - 1, batch)
    ref = msda_grid_sample_with_grads(value[last].double(), shapes, loc[last].double(),
                                      attn[last].double(), grad[last].double())
    errors = [relative_l2(out[last], ref[0]), relative_l2(gv[last], ref[1]),
              relative_l2(gl[last], ref[2]), relative_l2(ga[last], ref[3])]
    del value, gv
    return "int64 offsets (value 2.7e9 elements)", "bfloat16", errors, all(e <= TOL[torch.bfloat16] for e in errors)


def check_encoder_bf16():
    shapes = DDETR_LEVELS
    pixels = sum(h * w for h, w in shapes)
    value, loc, attn, _ = make_inputs(2, pixels, 8, 32, shapes, 4, torch.bfloat16, "BLNC", "BQHLP2",
                                      spread=1.0)
    problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    out = tb.msda_forward(value, problem, loc, attn)
    from nkilib_msda.reference.grid_sample import msda_grid_sample
    ref = msda_grid_sample(value.double(), shapes, loc.double(), attn.double())
    err = relative_l2(out, ref)
    rows = [(f"ddetr_enc forward (<= {ACC_TOL:g})", "bfloat16", [err], err <= ACC_TOL)]
    for kernel in ("points", "samples"):
        plan = tb.with_configs(tb.plan_launch(problem, "bfloat16"), forward_kernel=kernel,
                               forward=tb.KernelConfig(8 if kernel == "samples" else 32, 4))
        err = relative_l2(tb.msda_forward(value, problem, loc, attn, plan=plan), ref)
        rows.append((f"ddetr_enc forward kernel={kernel}", "bfloat16", [err], err <= ACC_TOL))
    grad = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16)
    ref_grads = msda_grid_sample_with_grads(value.double(), shapes, loc.double(), attn.double(),
                                            grad.double())
    for acc in ("float32", "native", "float32 points-backward", "float32 kept"):
        plan = tb.with_configs(tb.plan_launch(problem, "bfloat16"),
                               grad_value_accumulator=acc.split()[0],
                               backward_kernel="points" if "points" in acc else "samples",
                               grad_value_scratch="kept" if "kept" in acc else "fresh")
        grads = tb.msda_backward(grad, value, problem, loc, attn, plan=plan, deterministic=False)
        errs = [relative_l2(g, r) for g, r in zip(grads, ref_grads[1:])]
        if acc == "native":  # informational: bf16 atomics are not the default (too inaccurate)
            rows.append(("ddetr_enc backward accumulator=native (info)", "bfloat16", errs, None))
        else:  # grad_value must stay fp32-accumulated: rel-L2 <= ACC_TOL in bf16
            rows.append((f"ddetr_enc backward accumulator={acc} (grad_value <= {ACC_TOL:g})", "bfloat16",
                         errs, max(errs) <= TOL[torch.bfloat16] and errs[0] <= ACC_TOL))
    return rows


def cases():
    combos = [("BLNC", "BQHLP2", False, "zeros"), ("BNLC", "BQHLP2", True, "border"),
              ("BLNC", "B2QHLP", True, "zeros"), ("BNLC", "B2QHLP", False, "border")]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for vl, ll, ac, pm in combos:
            yield f"{vl}/{ll} ac={ac} {pm}", dtype, dict(value_layout=vl, loc_layout=ll,
                                                           align_corners=ac, padding_mode=pm)
        yield "C_h=24 Q=50 P=5", dtype, dict(channels=24, queries=50, points=5)
        yield "deterministic", dtype, dict(deterministic=True)
    yield "deterministic BNLC C_h=20", torch.float32, dict(deterministic=True, channels=20,
                                                            value_layout="BNLC")
    yield "compute=(F,T,F)", torch.float32, dict(compute=(False, True, False))
    yield "compute=(T,F,F)", torch.bfloat16, dict(compute=(True, False, False))
    yield "C_h=8 N_h=1 P=1 B=3", torch.float32, dict(channels=8, heads=1, points=1, batch=3)
    yield "C_h=64 Q=1", torch.bfloat16, dict(channels=64, queries=1)
    for i, (vl, ll, ac, pm) in enumerate(combos):  # the fast-mode points backward
        yield f"points-backward {vl}/{ll} ac={ac} {pm}", (
            torch.float32, torch.bfloat16)[i % 2], dict(
            value_layout=vl, loc_layout=ll, align_corners=ac, padding_mode=pm, queries=61,
            plan_changes=dict(backward_kernel="points"))
    yield "samples-backward 4 q/program C_h=20 P=5", torch.float32, dict(
        channels=20, points=5, queries=61,
        plan_changes=dict(samples_backward=tb.KernelConfig(4, 4)))
    for i, (vl, ll, ac, pm) in enumerate(combos):  # 2 queries per program (BEV TSA's fp32 plan)
        dtype = (torch.float32, torch.bfloat16)[i // 2]
        yield f"samples-backward 2 q/program {vl}/{ll} ac={ac} {pm}", dtype, dict(
            value_layout=vl, loc_layout=ll, align_corners=ac, padding_mode=pm, queries=61,
            points=4 + i, plan_changes=dict(samples_backward=tb.KernelConfig(2, 2)))
    for i, (vl, ll, ac, pm) in enumerate(combos):
        yield f"samples-kernel {vl}/{ll} ac={ac} {pm} C_h={32 - 4 * i}", torch.float32, dict(
            value_layout=vl, loc_layout=ll, align_corners=ac, padding_mode=pm, channels=32 - 4 * i,
            forward_kernel="samples")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-large", action="store_true", help="skip the 5 GB int64 case")
    parser.add_argument("--only-large", action="store_true",
                        help="only the launch-path, encoder and int64 cases")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="run every N-th check starting at the I-th (parallel processes)")
    args = parser.parse_args(argv)
    rows = []
    start = time.time()

    def add(*new_rows):
        for row in new_rows:
            rows.append(row)
            name, dtype, errors, ok = row
            verdict = "INFO" if ok is None else ("PASS" if ok else "FAIL")
            print(f"{verdict} {name} {dtype} {', '.join(f'{e:.1e}' for e in errors)}", flush=True)

    index, count = (int(x) for x in args.shard.split("/"))
    checks = []
    if not args.only_large:
        checks += [(lambda i=i, c=c: [check_case(c[0], c[1], seed=i, **c[2])])
                   for i, c in enumerate(cases())]
        checks += [lambda: [check_nonfinite()], lambda: [check_nonfinite_values(False)],
                   lambda: [check_nonfinite_values(True)]]
    checks += [lambda: [check_launch_paths()], lambda: [check_kept_accumulator()],
               check_encoder_bf16]
    if not args.skip_large:
        checks.append(lambda: [check_int64()])
    for check in checks[index::count]:
        add(*check())
        torch.cuda.empty_cache()
    print("\n| case | dtype | rel L2: out, grad_value, grad_loc, grad_attn | ok |\n|---|---|---|---|")
    for name, dtype, errors, ok in rows:
        verdict = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        print(f"| {name} | {dtype} | {', '.join(f'{e:.1e}' for e in errors)} | {verdict} |")
    rows = [r for r in rows if r[3] is not None]
    failed = sum(not r[3] for r in rows)
    print(f"\n{len(rows) - failed}/{len(rows)} passed in {time.time() - start:.0f} s on "
          f"{torch.cuda.get_device_name()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
