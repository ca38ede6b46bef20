"""Backward kernel knobs, flag subsets, dumps, chunked reuse, determinism, hostile inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msda_cases import MSDACase, with_
from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
from nkilib_msda.reference import ms_deformable_attention_bwd_ref
from nkilib_msda.validation.msda import validate_msda_args
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd import (
    GRAD_NAMES, PAIR_LEVELS, SMALL_LEVELS, backward_inputs, check_gradients, relative_error, run_bwd, tolerances)

BASE = MSDACase(num_queries=23, num_heads=4, head_dim=16, num_points=3, spatial_shapes=PAIR_LEVELS)


def config_for(grad, args, lnc=1, **kw):
    problem = validate_msda_args(args["value"], args["spatial_shapes"], args["level_start_index"],
                                 args["sampling_locations"], args["attention_weights"], args["value_layout"],
                                 args["sampling_locations_layout"], args["align_corners"], args["padding_mode"],
                                 grad_output=grad)
    names = ("gather_method", "max_gather_indices_per_indirect", "max_scatter_indices_per_indirect",
             "num_scatter_buffers", "strided_pairs")
    return plan_backward(problem, str(args["value"].dtype), lnc, **{k: kw[k] for k in names if k in kw})


# ------------------------------------------------------------------ knob matrix
KNOBS = [
    ({}, dict(gather_columns=6, scatter_pairs=True)),  # packet limit 64 // (128 / 16)
    ({"gather_method": "copy"}, dict(gather_pairs=True, scatter_pairs=True)),
    ({"gather_method": "copy", "max_gather_indices_per_indirect": 200}, dict(gather_pairs=False)),
    ({"gather_method": "copy", "max_gather_indices_per_indirect": 40}, dict(gather_partitions=32)),
    ({"max_gather_indices_per_indirect": 128}, dict(gather_columns=1)),
    ({"max_gather_indices_per_indirect": 5 * 128}, dict(gather_columns=4)),
    ({"max_scatter_indices_per_indirect": 128}, dict(scatter_pairs=False, num_buffers=8)),
    ({"max_scatter_indices_per_indirect": 48}, dict(scatter_partitions=32, num_buffers=2)),
    ({"max_scatter_indices_per_indirect": 1}, dict(scatter_partitions=1, num_buffers=1)),
    ({"max_scatter_indices_per_indirect": 4096}, dict(scatter_pairs=True, num_buffers=8)),
    ({"num_scatter_buffers": 2}, dict(scatter_sets=2)),
    ({"num_scatter_buffers": 8, "max_scatter_indices_per_indirect": 64}, dict(scatter_sets=8)),
]


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("knobs,expected", KNOBS, ids=lambda x: str(x))
def test_knob_matrix(knobs, expected, layout):
    padding = "border" if len(knobs) % 2 else "zeros"
    c = with_(BASE, value_layout=layout, padding_mode=padding, align_corners=layout == "BNLC",
              locations_layout="B2QHLP" if layout == "BLNC" else "BQHLP2")
    grad, args = backward_inputs(c)
    # BLNC pairs (two runs N_h rows apart) exist only with the strided_pairs opt-in: the
    # matrix runs it there, so strict mode re-checks its per-instruction unique targets
    knobs = dict(knobs, strided_pairs=True) if layout == "BLNC" else knobs
    cfg = config_for(grad, args, **knobs)
    for field, want in expected.items():  # the knob really changes the plan
        assert getattr(cfg, field) == want, (field, getattr(cfg, field), want)
    *outs, report = run_bwd(grad, args, lnc=1, report=True, **knobs)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)
    samples = c.batch * c.num_queries * c.num_heads * c.num_levels * c.num_points
    rows_per_scatter = 2 if cfg.scatter_pairs else 1
    scatters = sum(s.instructions for (kind, _), s in report.dma.items() if kind == "indirect_rmw")
    assert report.dma_descriptors("indirect_rmw") == 4 * samples * (1 if layout == "BLNC" or not cfg.scatter_pairs
                                                                     else 0.5)
    assert scatters == sum(-(-n // cfg.scatter_partitions) for n in _live_partitions(cfg)) * (
        4 * c.num_points // rows_per_scatter)


def _live_partitions(cfg):
    """Live partitions of every block (one batch, all cores)."""
    sizes = []
    for core in range(cfg.lnc):
        for _, blocks, parts in cfg.super_tiles(core):
            sizes += [parts] * blocks
    return sizes


def test_no_pairs_with_one_pixel_wide_levels():
    c = with_(BASE, spatial_shapes=SMALL_LEVELS, value_layout="BNLC")
    grad, args = backward_inputs(c)
    for kw in ({}, {"gather_method": "copy", "max_scatter_indices_per_indirect": 1024}):
        cfg = config_for(grad, args, **kw)
        assert not cfg.scatter_pairs and not cfg.gather_pairs
        check_gradients(run_bwd(grad, args, **kw), ms_deformable_attention_bwd_ref(grad, **args), c)


# ------------------------------------------------------------------ flags and dumps
FLAG_SETS = [f for f in itertools.product((True, False), repeat=3) if any(f)]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "".join("VLA"[i] for i in range(3) if f[i]))
def test_gradient_flag_subsets(flags):
    c = with_(BASE, value_layout="BNLC" if flags[1] else "BLNC")
    grad, args = backward_inputs(c)
    kw = dict(zip(("compute_grad_value", "compute_grad_sampling_locations", "compute_grad_attention_weights"), flags))
    outs = run_bwd(grad, args, lnc=2, **kw)
    assert len(outs) == sum(flags)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c, flags)


def test_all_flags_false_is_an_error():
    grad, args = backward_inputs(BASE)
    with pytest.raises(ValueError, match="at least one True"):
        run_bwd(grad, args, compute_grad_value=False, compute_grad_sampling_locations=False,
                compute_grad_attention_weights=False)


@pytest.mark.parametrize("lnc", [1, 2])
def test_dumps_order_shapes_and_iota_roundtrip(lnc):
    c = with_(BASE, batch=2)
    grad, args = backward_inputs(c)
    cfg = config_for(grad, args, lnc=lnc)
    outs = run_bwd(grad, args, lnc=lnc, compute_grad_attention_weights=False, dump_iota_k_scale=True,
                   dump_grad_value_buffers=True, dump_reduced_grad_value=True)
    gv, gsl, iota, buffers, reduced = outs
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    check_gradients((gv, gsl), refs, c, (True, True, False))
    assert iota.shape == (128, 1) and iota.dtype == np.int32
    expected = (np.arange(128) % cfg.scatter_partitions // cfg.groups) * cfg.rows_per_batch
    np.testing.assert_array_equal(iota[:, 0], expected)
    assert buffers.shape == cfg.buffer_shape == (2, lnc * cfg.num_buffers, cfg.rows_per_batch, 16)
    assert buffers.dtype == np.float32 and reduced.dtype == np.float32
    np.testing.assert_array_equal(buffers.sum(axis=1, dtype=np.float64).reshape(reduced.shape) != 0,
                                  reduced != 0)
    assert relative_error(reduced, refs[0]) < 1e-5
    # a precomputed partition->buffer table gives bitwise the same result
    again = run_bwd(grad, args, lnc=lnc, compute_grad_attention_weights=False, iota_k_scale_in=iota)
    np.testing.assert_array_equal(again[0].view(np.uint16), gv.view(np.uint16))


# ------------------------------------------------------------------ chunked accumulation
@pytest.mark.parametrize("lnc,batch,layout,split", [(1, 1, "BLNC", 13), (2, 2, "BNLC", 13), (1, 2, "BNLC", 13),
                                                   (1, 1, "BLNC", 2)])
def test_reuse_chain_returns_each_chunks_own_contribution(lnc, batch, layout, split):
    """split=2: the first chunk alone would pick K=1 and the second K=8; the given buffers fix K."""
    c = with_(BASE, num_queries=30, batch=batch, value_layout=layout)
    grad, args = backward_inputs(c)
    chunks = []
    for sl in (slice(0, split), slice(split, None)):
        cargs = dict(args)
        cargs["attention_weights"] = np.ascontiguousarray(args["attention_weights"][:, sl])
        loc = args["sampling_locations"]
        cargs["sampling_locations"] = np.ascontiguousarray(loc[:, sl] if c.locations_layout == "BQHLP2"
                                                           else loc[:, :, sl])
        chunks.append((np.ascontiguousarray(grad[:, sl]), cargs))
    (g1, a1), (g2, a2) = chunks
    gv1, _, _, iota, bufs1, red1 = run_bwd(g1, a1, lnc=lnc, dump_iota_k_scale=True, dump_grad_value_buffers=True,
                                          dump_reduced_grad_value=True)
    buffers = bufs1.copy()
    gv2, gsl2, gaw2, bufs2, red2 = run_bwd(g2, a2, lnc=lnc, iota_k_scale_in=iota, grad_value_buffers_in=buffers,
                                           prev_reduced_grad_value=red1, dump_grad_value_buffers=True,
                                           dump_reduced_grad_value=True)
    ref1 = ms_deformable_attention_bwd_ref(g1, **a1)
    ref2 = ms_deformable_attention_bwd_ref(g2, **a2)
    ref_all = ms_deformable_attention_bwd_ref(grad, **args)
    check_gradients((gv1,), ref1, c, (True, False, False))
    check_gradients((gv2, gsl2, gaw2), ref2, c)  # only the second chunk's contribution
    assert relative_error(red2, ref_all[0]) < 1e-5  # the buffers kept accumulating
    np.testing.assert_array_equal(bufs2, buffers)  # the input buffers were updated in place
    assert relative_error(gv2.astype(np.float64), red2 - red1) < 1e-2


def test_reuse_argument_errors():
    grad, args = backward_inputs(BASE)
    with pytest.raises(ValueError, match="grad_value_buffers_in"):
        run_bwd(grad, args, grad_value_buffers_in=np.zeros((1, 2, 3, 4), np.float32))
    cfg = config_for(grad, args)
    good = np.zeros(cfg.buffer_shape, np.float32)
    with pytest.raises(ValueError, match="num_scatter_buffers"):
        run_bwd(grad, args, grad_value_buffers_in=good, num_scatter_buffers=2)
    with pytest.raises(ValueError, match="iota_k_scale_in"):
        run_bwd(grad, args, iota_k_scale_in=np.zeros((128, 1), np.float32))
    with pytest.raises(ValueError, match="prev_reduced_grad_value"):
        run_bwd(grad, args, prev_reduced_grad_value=np.zeros((3,), np.float32))
    with pytest.raises(ValueError, match="dump_grad_value_buffers"):
        run_bwd(grad, args, compute_grad_value=False, dump_grad_value_buffers=True)
    for kw, name in [({"gather_method": "gpu"}, "gather_method"), ({"num_scatter_buffers": 9}, "num_scatter_buffers"),
                     ({"max_scatter_indices_per_indirect": 0}, "max_scatter_indices_per_indirect"),
                     ({"max_gather_indices_per_indirect": 100}, "max_gather_indices_per_indirect"),
                     ({"padding_mode": "reflection"}, "padding_mode")]:
        with pytest.raises(ValueError, match=name):
            run_bwd(grad, {**args, **{k: v for k, v in kw.items() if k == "padding_mode"}},
                    **{k: v for k, v in kw.items() if k != "padding_mode"})


# ------------------------------------------------------------------ determinism and hazards
@pytest.mark.parametrize("knobs", [{}, {"num_scatter_buffers": 3, "max_scatter_indices_per_indirect": 64}])
def test_two_runs_are_bitwise_equal(knobs):
    c = with_(BASE, batch=2, num_queries=40)
    grad, args = backward_inputs(c)
    first = run_bwd(grad, args, lnc=2, **knobs)
    second = run_bwd(grad, args, lnc=2, **knobs)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_maximal_collisions():
    """Every query samples the same pixels per (h, l): the emulator rejects any scatter with a
    duplicate destination row, so passing proves the K-buffer assignment under worst-case collisions."""
    c = with_(BASE, num_queries=40, value_layout="BLNC")
    grad, args = backward_inputs(c)
    args["sampling_locations"] = np.full_like(args["sampling_locations"], 0.3)
    for knobs in ({}, {"max_scatter_indices_per_indirect": 64}, {"max_scatter_indices_per_indirect": 128}):
        check_gradients(run_bwd(grad, args, lnc=2, **knobs), ms_deformable_attention_bwd_ref(grad, **args), c)


@pytest.mark.parametrize("padding,align", [("zeros", False), ("border", True), ("zeros", True), ("border", False)])
def test_hostile_coordinates(padding, align):
    c = with_(BASE, spatial_shapes=((4, 5), (1, 1), (3, 1), (1, 6)), padding_mode=padding, align_corners=align,
              value_dtype="float32", param_dtype="float32")
    grad, args = backward_inputs(c)
    loc = args["sampling_locations"]
    rng = np.random.default_rng(3)
    hostile = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -7.5, 0.0, 1.0, 0.5, 2.0, -1.0],
                       dtype=np.float32)
    mask = rng.random(loc.shape) < 0.5
    loc[mask] = rng.choice(hostile, size=int(mask.sum()))
    outs = run_bwd(grad, args, lnc=2)
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    check_gradients(outs, refs, c)
    nan_sample = np.isnan(loc).any(axis=-1)  # BQHLP2: (B, N_q, N_h, N_l, N_p)
    assert np.all(outs[1][nan_sample] == 0.0) and np.all(outs[2][nan_sample] == 0.0)


# ------------------------------------------------------------------ random small shapes
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_hypothesis_small_shapes(data):
    levels = tuple(data.draw(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3)))
    c = MSDACase(
        batch=data.draw(st.integers(1, 2)), num_queries=data.draw(st.integers(1, 12)),
        num_heads=data.draw(st.integers(1, 5)), head_dim=data.draw(st.sampled_from([8, 16, 48])),
        num_points=data.draw(st.integers(1, 3)), spatial_shapes=levels,
        value_layout=data.draw(st.sampled_from(["BLNC", "BNLC"])),
        locations_layout=data.draw(st.sampled_from(["BQHLP2", "B2QHLP"])),
        align_corners=data.draw(st.booleans()), padding_mode=data.draw(st.sampled_from(["zeros", "border"])),
        value_dtype=data.draw(st.sampled_from(["bfloat16", "float16", "float32"])))
    knobs = data.draw(st.sampled_from([{}, {"gather_method": "copy"}, {"max_scatter_indices_per_indirect": 32},
                                       {"num_scatter_buffers": 2}]))
    grad, args = backward_inputs(c, seed=data.draw(st.integers(0, 1000)))
    outs = run_bwd(grad, args, lnc=data.draw(st.sampled_from([1, 2])), **knobs)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)


def test_grad_value_error_stays_at_bf16_rounding():
    """fp32 buffers + one cast: grad_value error <= 1e-2 (in practice ~ bf16 half-ulp) with B > 1."""
    c = with_(BASE, batch=3, num_queries=60, num_points=4)
    grad, args = backward_inputs(c)
    gv = run_bwd(grad, args, lnc=2)[0]
    ref = ms_deformable_attention_bwd_ref(grad, **args)[0]
    assert relative_error(gv, ref) <= tolerances("bfloat16")["grad_value"]
    # elementwise: within one bf16 rounding of the exact value (2^-8 relative) plus fp32 noise
    err = np.abs(gv.astype(np.float64) - ref)
    assert np.all(err <= np.abs(ref) * 2.0 ** -8 + 1e-5 * np.max(np.abs(ref)))
    assert GRAD_NAMES[0] == "grad_value"


@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_pair_partner_pixel_does_not_cancel_corner_terms(padding):
    """x-pairs fetch (min(x0, W-2), +1): near the right edge the pair's left pixel is no corner.

    A huge value there must not cancel the real corner's dot product (dc = D0 + sel*(D1 - D0)
    lost it entirely), and a tiny x0 coefficient must not be cancelled by the x1 one in the
    pair's scatter coefficients (S0 = (c0 + c1) - c1).
    """
    c = MSDACase(num_queries=4, num_heads=1, head_dim=8, num_points=1, spatial_shapes=((2, 4),),
                 value_dtype="float32", param_dtype="float32", padding_mode=padding)
    grad, args = backward_inputs(c)
    loc = args["sampling_locations"]
    loc[..., 0] = 0.93 if padding == "zeros" else 1.2   # x in (W-1, W), or clipped to W-1
    loc[..., 1] = 0.3
    loc[0, 0, ..., 0] = np.float32((1.99993 + 0.5) / 4)  # x0 = 1 with (1 - dx) ~ 7e-5
    loc[0, 0, ..., 1] = np.float32(0.1234567)             # y ~ -0.25: only image row 0
    args["attention_weights"][0, 0] = np.float32(0.7654321)  # a coefficient with many bits
    args["value"][0, 6, 0, :] = 1e7                      # pixel (1, W-2): no query's corner
    cfg = config_for(grad, args, gather_method="copy", strided_pairs=True)   # BLNC pairs
    assert cfg.gather_pairs and cfg.scatter_pairs
    outs = run_bwd(grad, args, lnc=1, gather_method="copy", strided_pairs=True)
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    check_gradients(outs, refs, c)
    gv, ref_gv = outs[0][0, 1, 0], refs[0][0, 1, 0]   # pixel (0, 1): the tiny x0 corner
    np.testing.assert_allclose(gv, ref_gv, rtol=1e-5, atol=0)
