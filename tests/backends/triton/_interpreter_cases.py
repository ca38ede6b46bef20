"""Triton-interpreter correctness cases (run in a subprocess with TRITON_INTERPRET=1).

Each case draws fresh random inputs, runs the Triton backend on CPU tensors through the
interpreter and compares forward and all gradients with the NumPy float64 reference on the
same rounded inputs (relative L2). Prints one JSON object {case: {"ok", "errors", "note"}}.
Usage: TRITON_INTERPRET=1 python tests/backends/triton/_interpreter_cases.py [case ...]
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before importing triton"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.check_gpu import (  # noqa: E402
    NONFINITE_SHAPES, border_pixels, make_inputs, nonfinite_value_inputs)
from benchmarks.edge_numerics import check_edge_numerics  # noqa: E402
from nkilib_msda.backends.triton import backend as tb  # noqa: E402
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref  # noqa: E402
from nkilib_msda.validation.msda import validate_msda_args  # noqa: E402
from nkilib_msda.workloads import GPU_TOLERANCES, relative_l2 as rel_l2  # noqa: E402

SHAPES = ((5, 7), (3, 4))


def make(seed, batch=2, queries=11, heads=2, channels=8, points=3, dtype=torch.float32,
         value_layout="BLNC", loc_layout="BQHLP2", shapes=SHAPES):
    """The GPU check's inputs (benchmarks/check_gpu.py) on the CPU; 20 % of the location range
    falls outside the map on each side."""
    return make_inputs(batch, queries, heads, channels, shapes, points, dtype, value_layout,
                       loc_layout, spread=1.4, device="cpu", seed=seed)


def compare(value, loc, attn, grad, shapes, options, plan_changes=None, compute=(True, True, True),
            deterministic=False):
    """Errors [out, grad_value, grad_loc, grad_attn]; uncomputed gradients must be exact zeros."""
    problem = validate_msda_args(value, shapes, None, loc, attn, **options)
    plan = tb.plan_launch(problem, str(value.dtype).replace("torch.", ""))
    plan = tb.with_configs(plan, **(plan_changes or {}))
    out = tb.msda_forward(value, problem, loc, attn, plan=plan)
    grads = tb.msda_backward(grad, value, problem, loc, attn, compute=compute,
                             deterministic=deterministic, plan=plan)
    args = [t.double().numpy() for t in (value, loc, attn)]
    ref_out = ms_deformable_attention_ref(args[0], shapes, None, args[1], args[2], **options)
    ref_grads = ms_deformable_attention_bwd_ref(grad.double().numpy(), args[0], shapes, None, args[1],
                                                args[2], **options)
    errors = [rel_l2(out, ref_out)]
    for want, got, ref in zip(compute, grads, ref_grads):
        errors.append(rel_l2(got, ref) if want else (0.0 if bool((got == 0).all()) else float("inf")))
    shapes_ok = (out.shape == problem.output_shape and grads[0].shape == value.shape
                 and grads[1].shape == loc.shape and grads[2].shape == attn.shape)
    return errors, shapes_ok, grads


def opts(value_layout="BLNC", loc_layout="BQHLP2", align_corners=False, padding_mode="zeros"):
    return dict(value_layout=value_layout, sampling_locations_layout=loc_layout,
                align_corners=align_corners, padding_mode=padding_mode)


def _blocks(fwd_q=16, bwd_q=16, samples_q=4):
    """Tiles: the forward, the points backward (deterministic mode, or backward_kernel="points")
    and the all-samples backward (the fast-mode default); queries=11 leaves tail blocks."""
    return dict(forward=tb.KernelConfig(fwd_q, 4), backward=tb.KernelConfig(bwd_q, 4),
                samples_backward=tb.KernelConfig(samples_q, 4))


def case_fp32_blnc_zeros():
    v, l, a, g = make(1)
    return compare(v, l, a, g, SHAPES, opts(), _blocks())[:2]


def case_fp32_bnlc_b2qhlp_border_align_c6():
    v, l, a, g = make(2, channels=6, value_layout="BNLC", loc_layout="B2QHLP")
    return compare(v, l, a, g, SHAPES, opts("BNLC", "B2QHLP", True, "border"), _blocks())[:2]


def case_fp32_blnc_b2qhlp_zeros_align_head_fastest():
    v, l, a, g = make(3, loc_layout="B2QHLP", queries=9)
    changes = dict(_blocks(8, 4), head_slowest=False)
    return compare(v, l, a, g, SHAPES, opts("BLNC", "B2QHLP", True, "zeros"), changes)[:2]


def case_bf16_bnlc_zeros():
    v, l, a, g = make(4, dtype=torch.bfloat16, value_layout="BNLC")
    return compare(v, l, a, g, SHAPES, opts("BNLC"), _blocks())[:2]


def case_fp16_blnc_border():
    v, l, a, g = make(5, dtype=torch.float16)
    return compare(v, l, a, g, SHAPES, opts(padding_mode="border"), _blocks())[:2]


def case_samples_kernel_lp_not_pow2():
    v, l, a, g = make(6, points=3, channels=5)  # N_l*N_p = 6 -> padded to 8
    changes = dict(_blocks(4, 16), forward_kernel="samples")
    return compare(v, l, a, g, SHAPES, opts(align_corners=True), changes)[:2]


def case_int64_indexing_forced():
    v, l, a, g = make(7, value_layout="BNLC", loc_layout="B2QHLP")
    changes = dict(_blocks(), index64=True)
    return compare(v, l, a, g, SHAPES, opts("BNLC", "B2QHLP"), changes, deterministic=True)[:2]


def case_deterministic_bitwise():
    v, l, a, g = make(8, channels=6, queries=13)
    errors, ok, grads = compare(v, l, a, g, SHAPES, opts(), _blocks(), deterministic=True)
    problem = validate_msda_args(v, SHAPES, None, l, a, "BLNC", "BQHLP2", False, "zeros")
    again = tb.msda_backward(g, v, problem, l, a, deterministic=True,
                             plan=tb.with_configs(tb.plan_launch(problem, "float32"), **_blocks()))
    return errors, ok and all(torch.equal(x, y) for x, y in zip(grads, again))


def case_bf16_kept_scratch_repeated():
    """16-bit values with the fp32 accumulator kept between calls (the decoder default): three
    backwards of one signature with fresh grad_output, each against the reference, the kept
    accumulator all zeros after each (the cast clears it); then the per-call accumulator."""
    worst = [0.0] * 4
    ok = True
    for seed, scratch in ((30, "kept"), (31, "kept"), (32, "kept"), (33, "fresh")):
        v, l, a, g = make(4, dtype=torch.bfloat16)
        g = make(seed, dtype=torch.bfloat16)[3]
        changes = dict(_blocks(), grad_value_scratch=scratch)
        errors, shapes_ok, _ = compare(v, l, a, g, SHAPES, opts(), changes)
        worst = [max(w, e) for w, e in zip(worst, errors)]
        kept = tb._context(validate_msda_args(v, SHAPES, None, l, a, "BLNC", "BQHLP2", False, "zeros"), v, l)._scratch
        ok = ok and shapes_ok and len(kept) == 1 and all(bool((t == 0).all()) for t in kept.values())
    return worst, ok


def case_samples_backward():
    """The all-samples backward (fast-mode default): both layouts, both padding modes, fp32 and
    bf16, N_l*N_p not a power of two, C_h not a power of two, tail query blocks, compute subsets."""
    return _backward_kernel_cases("samples")


def case_points_backward_fast_mode():
    """The points backward in fast mode (atomics), over the same configurations."""
    return _backward_kernel_cases("points")


def case_multi_query_programs():
    """The all-samples backward with 4 queries per program and the points backward over the
    configurations above, then both forwards and the deterministic backward with three
    batches, tail query blocks and forced 64-bit offsets (once the cases of the removed
    (query blocks, batch, heads) grid switch)."""
    worst, ok = _backward_kernel_cases("samples", dict(samples_backward=tb.KernelConfig(4, 4)))
    points_worst, points_ok = _backward_kernel_cases("points")
    worst = [max(w, e) for w, e in zip(worst, points_worst)]
    v, l, a, g = make(25, batch=3, queries=13, value_layout="BNLC", loc_layout="B2QHLP")
    for changes, deterministic in ((dict(_blocks(4, 4, 2), forward_kernel="samples"), False),
                                   (dict(_blocks(8, 4), index64=True), True)):
        errors, shapes_ok, _ = compare(v, l, a, g, SHAPES, opts("BNLC", "B2QHLP"),
                                       changes, deterministic=deterministic)
        worst = [max(w, e) for w, e in zip(worst, errors)]
        ok = ok and shapes_ok
    return worst, ok and points_ok


def _backward_kernel_cases(kernel, extra=None):
    worst = [0.0] * 4
    ok = True
    configs = ((20, "BLNC", "BQHLP2", False, "zeros", torch.float32, 3, 8, (True, True, True)),
               (21, "BNLC", "B2QHLP", True, "border", torch.float32, 2, 6, (True, True, True)),
               (22, "BLNC", "B2QHLP", True, "zeros", torch.bfloat16, 3, 8, (True, True, True)),
               (23, "BNLC", "BQHLP2", False, "border", torch.float32, 3, 5, (False, True, False)),
               (24, "BLNC", "BQHLP2", False, "zeros", torch.float32, 1, 8, (True, False, True)))
    for seed, vl, ll, ac, pm, dtype, points, channels, compute in configs:
        v, l, a, g = make(seed, queries=11, points=points, channels=channels, dtype=dtype,
                          value_layout=vl, loc_layout=ll)
        changes = dict(_blocks(4, 4, 4), backward_kernel=kernel, **(extra or {}))
        errors, shapes_ok, _ = compare(v, l, a, g, SHAPES, opts(vl, ll, ac, pm), changes,
                                       compute=compute)
        # bf16 rows: held to the bf16 tolerance by scaling onto the case's fp32 one
        scale = 1.0 if dtype == torch.float32 else GPU_TOLERANCES["float32"] / GPU_TOLERANCES["bfloat16"]
        worst = [max(w, e * scale) for w, e in zip(worst, errors)]
        ok = ok and shapes_ok
    return worst, ok


def case_compute_subsets():
    v, l, a, g = make(9)
    e1, ok1, _ = compare(v, l, a, g, SHAPES, opts(), _blocks(), compute=(False, True, False))
    e2, ok2, _ = compare(v, l, a, g, SHAPES, opts(), _blocks(), compute=(True, False, True))
    return [max(x, y) for x, y in zip(e1, e2)], ok1 and ok2


def case_nonfinite_coordinates():
    """NaN contributes nothing (zero gradient); +-inf / huge behave like far-outside points."""
    v, l, a, g = make(10, batch=1)
    clean = l.clone()
    l[0, :3, 0, 0, 0, 0] = float("nan")
    clean[0, :3, 0, 0, 0, :] = -10.0
    l[0, 3:6, 1, 1, 1, 1] = float("inf")
    clean[0, 3:6, 1, 1, 1, 1] = 10.0
    l[0, 6:9, 0, 1, 2, 0] = -1e30
    clean[0, 6:9, 0, 1, 2, 0] = -10.0
    problem = validate_msda_args(v, SHAPES, None, l, a, "BLNC", "BQHLP2", False, "zeros")
    plan = tb.with_configs(tb.plan_launch(problem, "float32"), **_blocks())
    out = tb.msda_forward(v, problem, l, a, plan=plan)
    grads = tb.msda_backward(g, v, problem, l, a, plan=plan)
    args = [t.double().numpy() for t in (v, clean, a)]
    ref_out = ms_deformable_attention_ref(args[0], SHAPES, None, args[1], args[2])
    ref_grads = ms_deformable_attention_bwd_ref(g.double().numpy(), args[0], SHAPES, None, args[1], args[2])
    errors = [rel_l2(out, ref_out)] + [rel_l2(x, r) for x, r in zip(grads, ref_grads)]
    return errors, bool(torch.isfinite(grads[1]).all())


def case_nonfinite_values_outside_map():
    """A masked corner contributes nothing even when the pixel it is clamped to holds inf/NaN
    (forward and every gradient); an in-map corner reading inf/NaN still propagates."""
    clean, bad, l, a, g = nonfinite_value_inputs(1, 10, 2, 8, device="cpu", seed=11)
    problem = validate_msda_args(bad, NONFINITE_SHAPES, None, l, a, "BLNC", "BQHLP2", False, "zeros")
    results = []
    for changes in (_blocks(), dict(_blocks(4, 4), forward_kernel="samples",
                                    backward_kernel="samples")):
        plan = tb.with_configs(tb.plan_launch(problem, "float32"), **changes)
        out = tb.msda_forward(bad, problem, l, a, plan=plan)
        grads = tb.msda_backward(g, bad, problem, l, a, plan=plan)
        det = tb.msda_backward(g, bad, problem, l, a, plan=plan, deterministic=True)
        results.append((out, grads, det))
    args = [t.double().numpy() for t in (clean, l, a)]
    ref_out = ms_deformable_attention_ref(args[0], NONFINITE_SHAPES, None, args[1], args[2])
    ref_grads = ms_deformable_attention_bwd_ref(g.double().numpy(), args[0], NONFINITE_SHAPES,
                                                None, args[1], args[2])
    errors = [0.0] * 4
    for out, grads, det in results:
        for i, got in enumerate([out, *grads]):
            errors[i] = max(errors[i], rel_l2(got, ([ref_out, *ref_grads])[i]))
        errors[1] = max(errors[1], rel_l2(det[0], ref_grads[0]))
    # Propagation: an interior pixel read by in-map corners holds inf -> the same outputs and
    # gradients are non-finite as in the float64 reference.
    hot = bad.clone()
    hot[:, 2 * 7 + 3] = float("inf")  # level 0, row 2, column 3 (interior)
    hot[:, border_pixels(NONFINITE_SHAPES)] = clean[:, border_pixels(NONFINITE_SHAPES)]
    out = tb.msda_forward(hot, problem, l, a)
    grads = tb.msda_backward(g, hot, problem, l, a)
    hot64 = hot.double().numpy()
    want = [ms_deformable_attention_ref(hot64, NONFINITE_SHAPES, None, args[1], args[2]),
            *ms_deformable_attention_bwd_ref(g.double().numpy(), hot64, NONFINITE_SHAPES, None,
                                             args[1], args[2])]
    patterns = [np.array_equal(np.isfinite(got.double().numpy()), np.isfinite(ref))
                for got, ref in zip([out, *grads], want)]
    propagates = not np.isfinite(want[0]).all()
    return errors, all(patterns) and propagates


def case_edge_numerics():
    """Infinite attention weights and grad_output near the float32 maximum: the documented
    answer (benchmarks/edge_numerics.py) through the public function on CPU tensors."""
    problems = check_edge_numerics("triton", "cpu")
    if problems:
        raise AssertionError("; ".join(problems))
    return [0.0] * 4, True


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}
# Cases in a 2-byte dtype; every other case is held to the fp32 tolerance.
CASE_DTYPE = {"bf16_bnlc_zeros": "bfloat16", "fp16_blnc_border": "float16",
              "bf16_kept_scratch_repeated": "bfloat16"}


def main(names) -> int:
    results = {}
    for name in names or list(CASES):
        try:
            errors, structural_ok = CASES[name]()
            tol = GPU_TOLERANCES[CASE_DTYPE.get(name, "float32")]
            ok = structural_ok and all(e <= tol for e in errors)
            results[name] = {"ok": ok, "errors": errors, "tolerance": tol, "note": ""}
        except Exception as exc:  # reported per case by the pytest wrapper
            results[name] = {"ok": False, "errors": [], "tolerance": 0.0, "note": repr(exc)}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
