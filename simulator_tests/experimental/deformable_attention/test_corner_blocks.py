"""Corner-block forward (``gather_layout="corner-block"``) in the strict emulator against the
float64 reference on the same rounded inputs: every layout, padding mode, align_corners, LNC 1
and 2, ragged tails, samples on and off the map edges, non-finite values; plus its cost-report
invariants (one indirect descriptor of 4 * C_h values per sample)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_nonfinite import (
    _cast, _f64, assert_same_support_and_close, make_problem)

from msda_cases import MSDACase, assert_close, make_inputs
from nkilib_msda.experimental.deformable_attention.corner_blocks import build_chunks
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    ms_deformable_attention, plan_forward_from_args)
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import build_chunk_cells
from nkilib_msda.reference import ms_deformable_attention_ref
from nkilib_msda.simulator import simulate

LEVELS = ((6, 5), (3, 4), (1, 1), (1, 7))


def _spread_locations(args: dict, seed: int) -> dict:
    """Locations in [-0.3, 1.3]: many samples straddle or leave the map edges (cells x = -1,
    x = W - 1, the zero cell)."""
    rng = np.random.default_rng(seed)
    loc = args["sampling_locations"]
    args["sampling_locations"] = rng.uniform(-0.3, 1.3, loc.shape).astype(loc.dtype)
    return args


def _run(args: dict, lnc: int, report: bool = False, **kw):
    return simulate(ms_deformable_attention, lnc=lnc, report=report)(
        **args, gather_layout="corner-block", **kw)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("value_layout,locations_layout,align", [
    ("BLNC", "BQHLP2", False), ("BNLC", "B2QHLP", True), ("BLNC", "B2QHLP", True),
    ("BNLC", "BQHLP2", False)])
def test_matches_reference(lnc, padding_mode, value_layout, locations_layout, align):
    """A ragged query count (261 = 2 * 128 + 5), batch 2, edge-heavy locations."""
    c = MSDACase(batch=2, num_queries=261, num_heads=4, num_points=3, spatial_shapes=LEVELS,
                 value_layout=value_layout, locations_layout=locations_layout,
                 align_corners=align, padding_mode=padding_mode)
    args = _spread_locations(make_inputs(c, seed=lnc), seed=7 + lnc)
    assert plan_forward_from_args(**args, gather_layout="corner-block", lnc=lnc).corner_blocks
    out = _run(args, lnc)
    assert out.dtype == args["value"].dtype
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype, c.label())


@pytest.mark.parametrize("head_dim,value_dtype", [(8, "bfloat16"), (16, "float16"),
                                                  (32, "bfloat16")])
def test_head_dims_and_dtypes(head_dim, value_dtype):
    """C_h = 8 / 16 / 32: 4 / 2 / 1 cell transposes stack into the 128 partitions."""
    c = MSDACase(num_queries=140, num_heads=8, head_dim=head_dim, num_points=4,
                 spatial_shapes=((9, 11), (4, 3)), value_dtype=value_dtype)
    args = _spread_locations(make_inputs(c, seed=3), seed=4)
    assert_close(_run(args, 1), ms_deformable_attention_ref(**args), value_dtype, c.label())


def test_wide_map_several_build_chunks():
    """A map wider than one build strip and taller than 128 rows (two row bands; the short
    second band stacks all its strips on the partitions)."""
    c = MSDACase(num_queries=130, num_heads=8, num_points=2, spatial_shapes=((131, 40),))
    args = _spread_locations(make_inputs(c, seed=5), seed=6)
    cfg = plan_forward_from_args(**args, gather_layout="corner-block")
    xw = build_chunk_cells(cfg.problem, "bfloat16")
    # cell rows -1..126 one strip per chunk; rows 127..130 (4 partitions) stack every strip
    assert xw < 41 and len(build_chunks(cfg.problem, xw)) == -(-41 // xw) + 1
    assert_close(_run(args, 2), ms_deformable_attention_ref(**args), "bfloat16")


def test_lnc1_equals_lnc2_and_four_corner_layout():
    """LNC 1 and 2 agree bitwise; the four-corner kernel agrees within the tolerance."""
    c = MSDACase(num_queries=200, num_heads=4, spatial_shapes=LEVELS, value_layout="BNLC")
    args = _spread_locations(make_inputs(c, seed=8), seed=9)
    one, two = _run(args, 1), _run(args, 2)
    np.testing.assert_array_equal(one.astype(np.float32), two.astype(np.float32))
    four = simulate(ms_deformable_attention, lnc=1)(**args)
    assert_close(one, four.astype(np.float64), "bfloat16")


def test_one_descriptor_per_sample():
    """Every sample is one indirect descriptor of 4 * C_h values; the value is read twice and
    the scratch written once by the build (direct DMAs)."""
    c = MSDACase(batch=2, num_queries=256, num_heads=8, num_points=4, spatial_shapes=LEVELS)
    args = make_inputs(c, seed=10)
    out, rep = _run(args, 2, report=True)
    samples = c.batch * c.num_queries * c.num_heads * c.num_levels * c.num_points
    gathers = [v for (kind, _), v in rep.dma.items() if kind == "indirect_transpose"]
    assert sum(v.descriptors for v in gathers) == samples
    assert sum(v.descriptor_bytes for v in gathers) == samples * 4 * c.head_dim * 2
    assert not [k for k, _ in rep.dma if k.startswith("indirect") and k != "indirect_transpose"]
    assert_close(out, ms_deformable_attention_ref(**args), "bfloat16")


@pytest.mark.parametrize("padding_mode,align,layout", [("zeros", False, "BLNC"),
                                                       ("zeros", True, "BNLC"),
                                                       ("border", False, "BLNC")])
def test_nonfinite(padding_mode, align, layout):
    """Poisoned pixels (inf/NaN) next to off-map corners and NaN/inf coordinates leave the
    output finite wherever the reference is; samples that really read the poison are not."""
    bad, _ = make_problem(11, 130, padding_mode, align, layout, "BQHLP2",
                          dependent_queries=(0, 129))
    args = _cast(bad, ml_dtypes.bfloat16, np.float32)
    out = _run(args, 1)
    ref = ms_deformable_attention_ref(**_f64(args))
    assert_same_support_and_close(out, ref, 1e-2, "forward")
    assert not np.all(np.isfinite(ref)) and np.isfinite(ref).mean() > 0.9


def test_arguments():
    """The keyword is validated; "auto" follows the planner; unsupported shapes say why."""
    c = MSDACase(num_queries=130, spatial_shapes=LEVELS)
    args = make_inputs(c)
    with pytest.raises(ValueError, match="gather_layout"):
        plan_forward_from_args(**args, gather_layout="diagonal")
    with pytest.raises(ValueError, match="gather_layout='corner-block'.*C_h=64"):
        plan_forward_from_args(**make_inputs(MSDACase(num_queries=130, head_dim=64,
                                                      spatial_shapes=LEVELS)),
                               gather_layout="corner-block")
    with pytest.raises(ValueError, match="gather_layout='corner-block'.*float32"):
        plan_forward_from_args(**make_inputs(MSDACase(num_queries=130, value_dtype="float32",
                                                      param_dtype="float32",
                                                      spatial_shapes=LEVELS)),
                               gather_layout="corner-block")
    assert not plan_forward_from_args(**args).corner_blocks
    # 130 queries on these tiny maps: the scratch bound (> 5x value) keeps four corners
    assert not plan_forward_from_args(**args, gather_layout="auto").corner_blocks


def test_nonfinite_weight_of_an_off_map_sample():
    """An infinite attention weight on a sample with no corner in the map contributes nothing
    (as in the reference): the corner bits are ANDed into the weights, not only the factors."""
    bad, _ = make_problem(12, 130, "zeros", False, "BLNC", "BQHLP2", outside_fraction=0.0)
    loc, att = bad["sampling_locations"], bad["attention_weights"]
    off = np.zeros(att.shape, bool)
    off[:, ::3, :, 0, 0] = True                      # every third query, level 0, point 0
    loc[off, 0] = -np.inf                            # both x corners left of the map
    att[off] = np.inf
    args = _cast(bad, ml_dtypes.bfloat16, np.float32)
    ref = ms_deformable_attention_ref(**_f64(args))
    out = _run(args, 1)
    assert_same_support_and_close(out, ref, 1e-2, "forward")
    assert np.isfinite(ref[:, ::3]).all()
