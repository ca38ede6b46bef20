"""Corner-block gathers of the backward (``gather_layout="corner-block"``) in the strict
emulator (uninitialised reads and hazards, the cross-core race detector included, fail the
test) against the float64 reference on the same rounded inputs: both value and location
layouts, zeros and border padding, align_corners, LNC 1 and 2, batch 2, ragged query counts,
edge-heavy locations, C_h 8/16/32, bf16 and fp16, poisoned pixels reached only by masked
corners, NaN/inf coordinates; determinism; one indirect gather descriptor of 4 * C_h values
per sample in the cost report; the planner's choice."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd import (
    backward_inputs, check_gradients, run_bwd)
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_nonfinite import (
    HEADS, HEAD_DIM, _cast, _f64, assert_same_support_and_close, make_problem)

from msda_cases import MSDACase
from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import choose_forward_layout
from nkilib_msda.reference import ms_deformable_attention_bwd_ref
from nkilib_msda.simulator import simulate
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import ms_deformable_attention_bwd
from nkilib_msda.validation.msda import MSDAProblem
from nkilib_msda.workloads import NKI_LIBRARY_SHAPES

LEVELS = ((6, 5), (3, 4), (1, 1), (1, 7))
CB = {"gather_layout": "corner-block"}


def _problem(c: MSDACase) -> MSDAProblem:
    return MSDAProblem(
        batch=c.batch, num_queries=c.num_queries, num_heads=c.num_heads, head_dim=c.head_dim,
        num_levels=len(c.spatial_shapes), num_points=c.num_points,
        spatial_shapes=tuple(c.spatial_shapes), level_start_index=c.level_start_index,
        value_layout=c.value_layout, sampling_locations_layout=c.locations_layout,
        align_corners=c.align_corners, padding_mode=c.padding_mode)


def _edge_heavy(args: dict, seed: int) -> dict:
    """Locations in [-0.3, 1.3]: many samples straddle or leave the map edges (cells x = -1,
    x = W - 1, the zero cell)."""
    loc = args["sampling_locations"]
    args["sampling_locations"] = np.random.default_rng(seed).uniform(-0.3, 1.3, loc.shape).astype(loc.dtype)
    return args


def _check(c: MSDACase, lnc: int, seed: int, **kw) -> list:
    grad, args = backward_inputs(c, seed)
    args = _edge_heavy(args, seed + 100)
    assert plan_backward(_problem(c), c.value_dtype, lnc, gather_layout="corner-block").corner_blocks
    outs = run_bwd(grad, args, lnc=lnc, **CB, **kw)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)
    return outs


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("value_layout,locations_layout,align", [
    ("BLNC", "BQHLP2", False), ("BNLC", "B2QHLP", True)])
def test_matches_reference(lnc, padding_mode, value_layout, locations_layout, align):
    """Batch 2, a ragged query count (3 blocks of 4 queries + 1), edge-heavy locations."""
    c = MSDACase(batch=2, num_queries=13, num_heads=8, num_points=3, spatial_shapes=LEVELS,
                 value_layout=value_layout, locations_layout=locations_layout,
                 align_corners=align, padding_mode=padding_mode)
    _check(c, lnc, seed=lnc)


@pytest.mark.slow
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("value_layout,locations_layout,align", [
    ("BLNC", "B2QHLP", True), ("BNLC", "BQHLP2", False)])
def test_matches_reference_other_layouts(lnc, padding_mode, value_layout, locations_layout, align):
    """The other value/location layout pairings, several super-tiles (T blocks) per core."""
    c = MSDACase(batch=2, num_queries=141, num_heads=4, num_points=4, spatial_shapes=LEVELS,
                 value_layout=value_layout, locations_layout=locations_layout,
                 align_corners=align, padding_mode=padding_mode)
    _check(c, lnc, seed=10 + lnc)


@pytest.mark.parametrize("head_dim,value_dtype", [(8, "bfloat16"), (16, "float16"), (32, "bfloat16")])
def test_head_dims_and_dtypes(head_dim, value_dtype):
    """C_h = 8 / 16 / 32: cells of 32 / 64 / 128 channels, 4 / 2 / 1 partition bands."""
    c = MSDACase(num_queries=37, num_heads=4, head_dim=head_dim, num_points=4,
                 spatial_shapes=((9, 11), (4, 3)), value_dtype=value_dtype)
    _check(c, 1, seed=3)


def test_equals_four_corner_and_is_deterministic():
    """The four-corner and corner-block kernels agree within rounding; grad_value, which
    the gathers do not touch, bitwise; two runs are bitwise equal (LNC 2)."""
    c = MSDACase(batch=2, num_queries=21, num_heads=8, num_points=2, spatial_shapes=LEVELS,
                 value_layout="BNLC")
    grad, args = backward_inputs(c, 5)
    args = _edge_heavy(args, 6)
    first = run_bwd(grad, args, lnc=2, **CB)
    second = run_bwd(grad, args, lnc=2, **CB)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    four = run_bwd(grad, args, lnc=2, gather_layout="four-corner")
    np.testing.assert_array_equal(first[0].view(np.uint8), four[0].view(np.uint8))
    for got, want in zip(first[1:], four[1:]):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2,
                                   atol=1e-2 * float(np.max(np.abs(want.astype(np.float64)))))


@pytest.mark.parametrize("padding,align,layout", [("zeros", False, "BLNC"), ("zeros", True, "BNLC"),
                                                  ("border", False, "BLNC")])
def test_nonfinite(padding, align, layout):
    """Poisoned (inf/NaN) pixels next to off-map corners and NaN/inf coordinates: every
    gradient is finite exactly where the reference is, and close to it; samples that really
    read the poison are not finite."""
    bad, _ = make_problem(12, 70, padding, align, layout, "BQHLP2", dependent_queries=(5,))
    args = _cast(bad, ml_dtypes.bfloat16, np.float32)
    grad = np.random.default_rng(13).standard_normal((1, 70, HEADS * HEAD_DIM)).astype(args["value"].dtype)
    outs = simulate(ms_deformable_attention_bwd, lnc=1)(grad, **args, **CB)
    refs = ms_deformable_attention_bwd_ref(grad.astype(np.float64), **_f64(args))
    for name, got, ref in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                              outs, refs):
        assert_same_support_and_close(got, ref, 2.5e-2, name)
    assert not np.all(np.isfinite(refs[2]))


def test_nonfinite_grad_output_of_an_unread_query():
    """An inf grad_output row of a query whose samples all read the zero cell: its own
    gradients are exactly 0 (a stored zero times inf would be NaN without the corner masks)."""
    bad, _ = make_problem(14, 40, "zeros", False, "BLNC", "BQHLP2")
    args = _cast(bad, ml_dtypes.bfloat16, np.float32)
    args["sampling_locations"][:, 7, ..., 0] = -np.inf
    grad = np.random.default_rng(15).standard_normal((1, 40, HEADS * HEAD_DIM))
    grad[:, 7] = np.inf
    grad = grad.astype(args["value"].dtype)
    outs = simulate(ms_deformable_attention_bwd, lnc=1)(grad, **args, **CB)
    refs = ms_deformable_attention_bwd_ref(grad.astype(np.float64), **_f64(args))
    for name, got, ref in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                              outs, refs):
        assert_same_support_and_close(got, ref, 2.5e-2, name)
    assert np.all(outs[1][:, 7] == 0.0) and np.all(outs[2][:, 7] == 0.0)


def test_one_gather_descriptor_per_sample():
    """Each sample is one indirect transpose descriptor of 4 * C_h values; the scatter keeps
    four read-modify-write descriptors per sample (BLNC: no x-pairs)."""
    c = MSDACase(batch=2, num_queries=32, num_heads=8, num_points=4, spatial_shapes=LEVELS)
    grad, args = backward_inputs(c, 7)
    *outs, rep = run_bwd(grad, args, lnc=2, report=True, **CB)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)
    samples = c.batch * c.num_queries * c.num_heads * len(c.spatial_shapes) * c.num_points
    gathers = [v for (kind, _), v in rep.dma.items() if kind == "indirect_transpose"]
    assert sum(v.descriptors for v in gathers) == samples
    assert sum(v.descriptor_bytes for v in gathers) == samples * 4 * c.head_dim * 2
    scatters = [v for (kind, _), v in rep.dma.items() if kind == "indirect_rmw"]
    assert sum(v.descriptors for v in scatters) == 4 * samples


def test_planner_choice():
    """"auto" follows the forward's rule (corner blocks on the encoder shapes, four corners
    on the decoders); the choice changes nothing without gathers; "corner-block" is refused
    where it cannot run, naming the argument."""
    for name in ("basic", "tsa-small", "sca-small", "decoder-small", "decoder-base"):
        p = _problem(NKI_LIBRARY_SHAPES[name])
        for lnc in (1, 2):
            cfg = plan_backward(p, "bfloat16", lnc)
            assert cfg.corner_blocks == (choose_forward_layout(p, "bfloat16", lnc) == "corner-block")
            assert cfg.corner_blocks == name.startswith(("basic", "tsa", "sca"))
    p = _problem(NKI_LIBRARY_SHAPES["basic"])
    assert not plan_backward(p, "bfloat16", gather_layout="four-corner").corner_blocks
    assert not plan_backward(p, "bfloat16", compute_grad_sampling_locations=False,
                             compute_grad_attention_weights=False, gather_layout="corner-block").corner_blocks
    with pytest.raises(ValueError, match="gather_layout"):
        plan_backward(p, "bfloat16", gather_layout="diagonal")
    with pytest.raises(ValueError, match="gather_layout='corner-block'.*float32"):
        plan_backward(p, "float32", gather_layout="corner-block")
    with pytest.raises(ValueError, match="gather_layout='corner-block'.*C_h=64"):
        plan_backward(_problem(MSDACase(head_dim=64, spatial_shapes=LEVELS)), "bfloat16",
                      gather_layout="corner-block")


@pytest.mark.parametrize("flags", [(False, True, False), (False, False, True), (True, False, False)],
                         ids=["L", "A", "V"])
def test_gradient_flag_subsets(flags):
    """Either sample gradient alone gathers from the corner blocks; grad_value alone builds
    nothing (no gathers run)."""
    c = MSDACase(batch=2, num_queries=13, num_heads=8, num_points=3, spatial_shapes=LEVELS)
    grad, args = backward_inputs(c, 21)
    args = _edge_heavy(args, 22)
    kw = dict(zip(("compute_grad_value", "compute_grad_sampling_locations",
                   "compute_grad_attention_weights"), flags))
    assert plan_backward(_problem(c), c.value_dtype, 2, gather_layout="corner-block",
                         **kw).corner_blocks == (not flags[0])
    outs = run_bwd(grad, args, lnc=2, **CB, **kw)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c, flags)


def test_reuse_chain_with_given_buffers():
    """Two calls accumulating into the same grad_value buffers (iota_k_scale_in,
    grad_value_buffers_in, prev_reduced_grad_value) with corner-block gathers in both."""
    c = MSDACase(batch=2, num_queries=30, num_heads=8, num_points=2, spatial_shapes=LEVELS,
                 value_layout="BNLC")
    grad, args = backward_inputs(c, 23)
    chunks = []
    for sl in (slice(0, 13), slice(13, None)):
        part = dict(args, attention_weights=np.ascontiguousarray(args["attention_weights"][:, sl]),
                    sampling_locations=np.ascontiguousarray(args["sampling_locations"][:, sl]))
        chunks.append((np.ascontiguousarray(grad[:, sl]), part))
    (g1, a1), (g2, a2) = chunks
    gv1, _, _, iota, bufs1, red1 = run_bwd(g1, a1, lnc=2, dump_iota_k_scale=True, dump_grad_value_buffers=True,
                                          dump_reduced_grad_value=True, **CB)
    gv2, gsl2, gaw2, red2 = run_bwd(g2, a2, lnc=2, iota_k_scale_in=iota, grad_value_buffers_in=bufs1.copy(),
                                    prev_reduced_grad_value=red1, dump_reduced_grad_value=True, **CB)
    check_gradients((gv1,), ms_deformable_attention_bwd_ref(g1, **a1), c, (True, False, False))
    check_gradients((gv2, gsl2, gaw2), ms_deformable_attention_bwd_ref(g2, **a2), c)
    ref_all = ms_deformable_attention_bwd_ref(grad, **args)[0]
    assert float(np.max(np.abs(red2 - ref_all))) <= 1e-5 * float(np.max(np.abs(ref_all)))
