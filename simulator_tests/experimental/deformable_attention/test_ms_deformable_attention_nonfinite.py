"""Non-finite values never leak into results that do not depend on them.

A corner outside the map is gathered from the pixel its index was clamped to; that pixel may
hold inf or NaN. The corner must contribute exactly nothing (0 * inf is NaN), to the output
and to every gradient. An in-map corner that reads inf/NaN must still propagate it (the fix
must not mask real dependence). Checked on the float64 NumPy reference and on the NKI forward
and backward kernels run directly in the emulator.

Inputs: value ~ N(0, 1) with the left column (x = 0) and the bottom row (y = H - 1) of every
level poisoned (inf for head 0, NaN for head 1, -inf for head 2). "Clean" samples keep all
four corners off the poisoned pixels; "outside" samples have both corners of one axis off the
map (their clamped indices land on the poisoned pixels), or a NaN / +-inf coordinate;
"dependent" samples read a poisoned pixel through an in-map corner of positive weight.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    ms_deformable_attention)
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import (
    ms_deformable_attention_bwd)
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.simulator import jit as _sim_jit
from nki_route import simulate

LEVELS = ((6, 5), (3, 4))
HEADS, HEAD_DIM, POINTS = 3, 32, 2
POISON = (np.inf, np.nan, -np.inf)   # per head


@pytest.fixture(autouse=True)
def _strict_emulator(monkeypatch):
    """Kernel runs here are strict like the other kernel tests (uninitialised reads fail), where the
    emulator has a strict mode."""
    strict_env = getattr(_sim_jit, "STRICT_ENV", None)
    if strict_env:
        monkeypatch.setenv(strict_env, "1")


def _level_starts(levels):
    starts, total = [], 0
    for h, w in levels:
        starts.append(total)
        total += h * w
    return tuple(starts), total


def _normalized(px: np.ndarray, size: int, align_corners: bool) -> np.ndarray:
    if align_corners:
        return px / (size - 1)
    return (px + 0.5) / size


def make_problem(seed: int, num_queries: int, padding_mode: str, align_corners: bool,
                 value_layout: str = "BLNC", locations_layout: str = "BQHLP2",
                 outside_fraction: float = 0.5, dependent_queries: tuple[int, ...] = (),
                 batch: int = 1):
    """(poisoned args, clean args) as float64 arrays; clean = poison replaced by 0.0."""
    rng = np.random.default_rng(seed)
    starts, total = _level_starts(LEVELS)
    value = rng.standard_normal((batch, total, HEADS, HEAD_DIM))
    poisoned = np.zeros((total,), bool)
    for (h, w), s in zip(LEVELS, starts):
        pix = np.arange(h * w).reshape(h, w)
        poisoned[s + pix[:, 0]] = True
        poisoned[s + pix[h - 1, :]] = True
    clean = value.copy()
    for head, bad in enumerate(POISON):
        value[:, poisoned, head, :] = bad
        clean[:, poisoned, head, :] = 0.0

    shape = (batch, num_queries, HEADS, len(LEVELS), POINTS)
    loc = np.empty(shape + (2,))
    for level, (h, w) in enumerate(LEVELS):
        # clean: x in (1, W - 1) px, y in (0, H - 2) px -> corners avoid column 0, row H - 1
        x = rng.uniform(1.05, w - 1.05, shape[:3] + (POINTS,))
        y = rng.uniform(0.05, h - 2.05, shape[:3] + (POINTS,))
        loc[..., level, :, 0] = _normalized(x, w, align_corners)
        loc[..., level, :, 1] = _normalized(y, h, align_corners)
        if padding_mode == "zeros":
            # both x corners left of the map (clamped onto column 0), or both y corners below
            # it (clamped onto row H - 1), or a far / infinite coordinate
            out = rng.random(shape[:3] + (POINTS,)) < outside_fraction
            kind = rng.integers(0, 4, out.shape)
            left = _normalized(rng.uniform(-1.95, -1.05, out.shape), w, align_corners)
            below = _normalized(rng.uniform(h + 0.05, h + 0.95, out.shape), h, align_corners)
            lx = loc[..., level, :, 0]
            ly = loc[..., level, :, 1]
            lx[out & (kind == 0)] = left[out & (kind == 0)]
            ly[out & (kind == 1)] = below[out & (kind == 1)]
            lx[out & (kind == 2)] = -np.inf
            ly[out & (kind == 3)] = 7.5
    # NaN coordinates (any padding mode): the sample is skipped, its index clamps near (0, 0)
    nan = rng.random(shape) < 0.15
    axis = rng.integers(0, 2, shape)
    loc[nan & (axis == 0), 0] = np.nan
    loc[nan & (axis == 1), 1] = np.nan
    for q in dependent_queries:   # head 0/1/2, level 0, point 0 reads column 0 with weight 0.7
        loc[:, q, :, 0, 0, 0] = _normalized(np.float64(0.3), LEVELS[0][1], align_corners)
        loc[:, q, :, 0, 0, 1] = _normalized(np.float64(1.5), LEVELS[0][0], align_corners)
    att = rng.uniform(0.1, 1.0, shape)
    att /= att.sum(axis=(-1, -2), keepdims=True)
    if value_layout == "BNLC":
        value, clean = (np.ascontiguousarray(v.transpose(0, 2, 1, 3)) for v in (value, clean))
    if locations_layout == "B2QHLP":
        loc = np.ascontiguousarray(np.moveaxis(loc, -1, 1))
    common = dict(spatial_shapes=LEVELS, level_start_index=starts, sampling_locations=loc,
                  attention_weights=att, value_layout=value_layout,
                  sampling_locations_layout=locations_layout, align_corners=align_corners,
                  padding_mode=padding_mode)
    return dict(value=value, **common), dict(value=clean, **common)


def _cast(args: dict, value_dtype, param_dtype) -> dict:
    out = dict(args)
    out["value"] = args["value"].astype(value_dtype)
    out["sampling_locations"] = args["sampling_locations"].astype(param_dtype)
    out["attention_weights"] = args["attention_weights"].astype(param_dtype)
    return out


def _f64(args: dict) -> dict:
    out = dict(args)
    for k in ("value", "sampling_locations", "attention_weights"):
        out[k] = np.asarray(args[k]).astype(np.float64)
    return out


def assert_same_support_and_close(got, ref, rtol: float, what: str) -> None:
    """Non-finite exactly where the reference is; finite parts within rtol * max|ref|."""
    got = np.asarray(got).astype(np.float64)
    fin_ref, fin_got = np.isfinite(ref), np.isfinite(got)
    bad = np.flatnonzero(fin_ref != fin_got)
    assert bad.size == 0, (f"{what}: {bad.size} elements differ in finiteness, first at flat "
                           f"index {bad[:5]} (got {got.ravel()[bad[:5]]}, ref {ref.ravel()[bad[:5]]})")
    if fin_ref.any():
        scale = max(float(np.max(np.abs(ref[fin_ref]))), 1e-30)
        err = float(np.max(np.abs(got[fin_ref] - ref[fin_ref]))) / scale
        assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol}"


# ------------------------------------------------------------------ NumPy reference


@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("value_layout", ["BLNC", "BNLC"])
def test_reference_outside_corners_contribute_nothing(padding_mode, align_corners, value_layout):
    """Poisoned and clean maps give bitwise-equal, finite results when nothing in-map reads
    the poison; the backward too (all three gradients)."""
    bad, clean = make_problem(1, 23, padding_mode, align_corners, value_layout)
    out = ms_deformable_attention_ref(**bad)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, ms_deformable_attention_ref(**clean))
    grad = np.random.default_rng(2).standard_normal(out.shape)
    got = ms_deformable_attention_bwd_ref(grad, **bad)
    want = ms_deformable_attention_bwd_ref(grad, **clean)
    for name, g, w in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                          got, want):
        assert np.all(np.isfinite(g)), name
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
def test_reference_keeps_real_dependence(padding_mode):
    """A sample reading a poisoned pixel through an in-map corner stays non-finite (output,
    grad_attention_weights and grad_sampling_locations of that sample); nothing else does."""
    dep = (3, 11)
    bad, clean = make_problem(3, 17, padding_mode, False, dependent_queries=dep)
    out = ms_deformable_attention_ref(**bad).reshape(1, 17, HEADS, HEAD_DIM)
    dependent = np.zeros(out.shape, bool)
    dependent[:, list(dep)] = True
    assert not np.any(np.isfinite(out[dependent]))
    np.testing.assert_array_equal(out[~dependent], ms_deformable_attention_ref(**clean).reshape(
        out.shape)[~dependent])
    grad = np.random.default_rng(4).standard_normal((1, 17, HEADS * HEAD_DIM))
    gv, gl, ga = ms_deformable_attention_bwd_ref(grad, **bad)
    assert np.all(np.isfinite(gv))  # grad_value never reads value
    sample = np.zeros(ga.shape, bool)
    sample[:, list(dep), :, 0, 0] = True
    assert not np.any(np.isfinite(ga[sample])) and np.all(np.isfinite(ga[~sample]))
    assert not np.any(np.isfinite(gl[sample].sum(-1))) and np.all(np.isfinite(gl[~sample]))


def test_reference_nonfinite_grad_output_of_an_unread_query():
    """A query whose samples all miss the map contributes nothing to grad_value even with an
    inf grad_output, and its own location/attention gradients are exactly 0."""
    bad, clean = make_problem(5, 9, "zeros", False, outside_fraction=0.0)
    loc = bad["sampling_locations"]
    loc[:, 4, ..., 0] = -np.inf        # query 4 samples nothing
    grad = np.random.default_rng(6).standard_normal((1, 9, HEADS * HEAD_DIM))
    finite_grad = grad.copy()
    finite_grad[:, 4] = 0.0
    grad[:, 4] = np.inf
    gv, gl, ga = ms_deformable_attention_bwd_ref(grad, **bad)
    gv0, gl0, ga0 = ms_deformable_attention_bwd_ref(finite_grad, **bad)
    np.testing.assert_array_equal(gv, gv0)
    assert np.all(ga[:, 4] == 0.0) and np.all(gl[:, 4] == 0.0)
    np.testing.assert_array_equal(np.delete(ga, 4, axis=1), np.delete(ga0, 4, axis=1))


def test_reference_emits_no_floating_point_warnings_even_under_seterr_raise():
    """0 * inf, inf - inf and overflow inside the reference never surface as NumPy warnings
    or FloatingPointError, even when the caller set np.seterr(all="raise")."""
    bad, _ = make_problem(7, 13, "zeros", False, dependent_queries=(2,))
    bad["sampling_locations"][0, 5, 0, 0, 0, 0] = 1e300   # overflows u * W
    grad = np.random.default_rng(8).standard_normal((1, 13, HEADS * HEAD_DIM))
    grad[0, 6, 0] = np.inf
    old = np.seterr(all="raise")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ms_deformable_attention_ref(**bad)
            ms_deformable_attention_bwd_ref(grad, **bad)
            for mode in ("border", "reflection"):
                ms_deformable_attention_ref(**dict(bad, padding_mode=mode))
                ms_deformable_attention_bwd_ref(grad, **dict(bad, padding_mode=mode))
        assert np.geterr()["invalid"] == "raise"   # the caller's settings are restored
    finally:
        np.seterr(**old)


# ------------------------------------------------------------------ NKI kernels (emulator)

KERNEL_CASES = [
    # (padding, align_corners, value layout, locations layout, value dtype, gather method)
    ("zeros", False, "BLNC", "BQHLP2", "bfloat16", "transpose"),
    ("zeros", True, "BNLC", "B2QHLP", "bfloat16", "transpose"),
    ("zeros", False, "BNLC", "BQHLP2", "float32", "copy"),
    ("zeros", True, "BLNC", "B2QHLP", "bfloat16", "copy"),
    ("border", False, "BLNC", "B2QHLP", "bfloat16", "transpose"),
    ("border", True, "BNLC", "BQHLP2", "float32", "copy"),
]


def _kernel_args(case, seed: int, num_queries: int, dependent=()):
    padding, align, vlayout, llayout, vdtype, _ = case
    bad, _clean = make_problem(seed, num_queries, padding, align, vlayout, llayout,
                               dependent_queries=dependent)
    dt = ml_dtypes.bfloat16 if vdtype == "bfloat16" else np.float32
    return _cast(bad, dt, np.float32)


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_kernel_outside_corners_and_dependence(case):
    """Kernel output is finite wherever the reference is (outside corners next to poisoned
    pixels, NaN/inf coordinates, a ragged 130-query tile) and non-finite where a sample
    really reads the poison."""
    args = _kernel_args(case, 11, 130, dependent=(0, 129))
    out = simulate(ms_deformable_attention, lnc=1)(**args, gather_method=case[5])
    ref = ms_deformable_attention_ref(**_f64(args))
    assert_same_support_and_close(out, ref, 1e-2 if case[4] == "bfloat16" else 1e-5,
                                  "forward")
    assert not np.all(np.isfinite(ref)) and np.isfinite(ref).mean() > 0.9


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("caps", [None, 128], ids=["pairs", "single"])
def test_backward_kernel_outside_corners_and_dependence(case, caps):
    """All three gradients: finite exactly where the reference is, and close to it. ``caps``
    128 disables the (x0, x1) pair gathers/scatters; None uses them where possible (BLNC pairs
    through the strided_pairs opt-in)."""
    args = _kernel_args(case, 12, 70, dependent=(5,))
    rng = np.random.default_rng(13)
    grad = rng.standard_normal((1, 70, HEADS * HEAD_DIM)).astype(args["value"].dtype)
    outs = simulate(ms_deformable_attention_bwd, lnc=1)(
        grad, **args, gather_method=case[5], max_gather_indices_per_indirect=caps,
        max_scatter_indices_per_indirect=caps, strided_pairs=caps is None)
    refs = ms_deformable_attention_bwd_ref(grad.astype(np.float64), **_f64(args))
    tol = 1e-4 if case[4] == "float32" else 2.5e-2
    for name, got, ref in zip(("grad_value", "grad_sampling_locations",
                               "grad_attention_weights"), outs, refs):
        assert_same_support_and_close(got, ref, tol, name)
    assert not np.all(np.isfinite(refs[2]))


@pytest.mark.parametrize("caps", [None, 128], ids=["pairs", "single"])
def test_backward_kernel_nonfinite_grad_output_of_an_unread_query(caps):
    """An inf grad_output row of a query that samples nothing leaves grad_value finite (no
    0 * inf scattered into the clamped rows) and its own gradients exactly 0."""
    case = KERNEL_CASES[0]
    args = _kernel_args(case, 14, 40)
    loc = args["sampling_locations"]
    loc[:, 7, ..., 0] = -np.inf
    grad = np.random.default_rng(15).standard_normal((1, 40, HEADS * HEAD_DIM))
    grad[:, 7] = np.inf
    grad = grad.astype(args["value"].dtype)
    outs = simulate(ms_deformable_attention_bwd, lnc=1)(
        grad, **args, max_gather_indices_per_indirect=caps, max_scatter_indices_per_indirect=caps,
        strided_pairs=caps is None)
    refs = ms_deformable_attention_bwd_ref(grad.astype(np.float64), **_f64(args))
    for name, got, ref in zip(("grad_value", "grad_sampling_locations",
                               "grad_attention_weights"), outs, refs):
        assert_same_support_and_close(got, ref, 2.5e-2, name)
    assert np.all(np.asarray(outs[2], np.float64)[:, 7] == 0.0)
    assert np.all(np.isfinite(np.asarray(outs[0], np.float64)))
