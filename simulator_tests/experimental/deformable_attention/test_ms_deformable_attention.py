"""NKI forward kernel in the emulator against the float64 reference (same rounded inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msda_cases import (MATRIX_CASES, MSDACase, assert_close,
                        make_inputs, with_)
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    plan_forward_from_args, ms_deformable_attention)
from nkilib_msda.reference import ms_deformable_attention_ref
from nki_route import simulate

SMALL_LEVELS = ((6, 5), (3, 4), (1, 1), (1, 7))


def run_kernel(args: dict, lnc: int = 2, report: bool = False, **kw):
    return simulate(ms_deformable_attention, lnc=lnc, report=report)(**args, **kw)


def check_case(c: MSDACase, lnc: int = 2, seed: int = 0, **kw) -> np.ndarray:
    args = make_inputs(c, seed=seed)
    out = run_kernel(args, lnc=lnc, **kw)
    assert out.dtype == args["value"].dtype
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype, c.label())
    return out


@pytest.mark.parametrize("c", MATRIX_CASES)
def test_matrix(c):
    """The upstream cases and the BEVFormer sizes (msda_cases.MATRIX_CASES)."""
    check_case(c, lnc=2)


@pytest.mark.parametrize("value_dtype,gather", [
    ("float16", "transpose"), ("float16", "copy"), ("float32", "copy"), ("float32", "transpose"),
    ("bfloat16", "copy")])
@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
def test_dtypes_and_gather_methods(value_dtype, gather, layout):
    c = MSDACase(num_queries=200, spatial_shapes=SMALL_LEVELS, value_layout=layout,
                 value_dtype=value_dtype, param_dtype="float32" if value_dtype == "float32"
                 else "float16")
    cfg = plan_forward_from_args(**make_inputs(c), gather_method=gather)
    assert cfg.gather_method == ("copy" if value_dtype == "float32" else gather)
    check_case(c, lnc=1, gather_method=gather)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_parameter_dtypes(param_dtype):
    check_case(MSDACase(num_queries=130, spatial_shapes=SMALL_LEVELS, param_dtype=param_dtype,
                        locations_layout="B2QHLP"), lnc=1)


@pytest.mark.parametrize("gather", ["transpose", "copy"])
def test_lnc1_equals_lnc2(gather):
    """Sharding queries over two cores gives the same result (and both match the reference)."""
    c = MSDACase(num_queries=261, num_heads=4, spatial_shapes=SMALL_LEVELS, value_layout="BNLC")
    one = check_case(c, lnc=1, gather_method=gather)
    two = check_case(c, lnc=2, gather_method=gather)
    np.testing.assert_array_equal(one.astype(np.float32), two.astype(np.float32))


@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("cap", [128, 384, 1024, 4096, 16384])
def test_batched_gathers(cap):
    """max_indices_per_indirect sets the index columns per indirect DMA (cap // 128)."""
    c = MSDACase(num_queries=140, num_heads=4, num_points=3, spatial_shapes=SMALL_LEVELS,
                 locations_layout="B2QHLP")
    args = make_inputs(c)
    cfg = plan_forward_from_args(**args, max_indices_per_indirect=cap)
    assert cfg.dma_cols_per_instruction <= cap // 128
    out, rep = run_kernel(args, lnc=1, report=True, max_indices_per_indirect=cap)
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype)
    stats = rep.to_dict()
    assert _max_indices_per_indirect(stats) <= cap


@pytest.mark.parametrize("head_dim", [8, 48, 144, 256])
@pytest.mark.parametrize("gather", ["transpose", "copy"])
def test_head_dims(head_dim, gather):
    c = MSDACase(num_queries=130, num_heads=2, head_dim=head_dim, num_points=2,
                 spatial_shapes=SMALL_LEVELS, value_layout="BNLC" if head_dim % 3 else "BLNC")
    check_case(c, lnc=2, gather_method=gather)


def test_many_heads_and_levels():
    c = MSDACase(num_queries=40, num_heads=16, head_dim=16, num_points=8,
                 spatial_shapes=((9, 11), (1, 1), (1, 13), (5, 1), (2, 3), (4, 4)))
    check_case(c, lnc=2)


def _hostile_locations(shape, rng) -> np.ndarray:
    specials = np.array([np.nan, np.inf, -np.inf, 1e38, -1e38, 3.0, -2.5, 1.0, 0.0, 1e-30,
                         0.9999, -0.0], np.float32)
    loc = rng.random(shape, dtype=np.float32)
    pick = rng.random(shape) < 0.5
    loc[pick] = rng.choice(specials, size=int(pick.sum()))
    return loc


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("gather", ["transpose", "copy"])
def test_hostile_coordinates(align_corners, padding_mode, gather):
    """NaN / +-inf / 1e38 coordinates stay in bounds; NaN samples contribute nothing."""
    c = MSDACase(num_queries=150, num_heads=2, head_dim=16, num_points=4,
                 spatial_shapes=((4, 6), (1, 1), (1, 5), (3, 1)), padding_mode=padding_mode,
                 align_corners=align_corners, param_dtype="float32", locations_layout="B2QHLP")
    args = make_inputs(c)
    args["sampling_locations"] = _hostile_locations(args["sampling_locations"].shape,
                                                    np.random.default_rng(7))
    out = run_kernel(args, lnc=2, gather_method=gather)
    ref = ms_deformable_attention_ref(**args)
    assert np.all(np.isfinite(ref))
    assert_close(out, ref, c.value_dtype)


@pytest.mark.parametrize("param_dtype,layout", [("float16", "BQHLP2"), ("bfloat16", "B2QHLP")])
def test_hostile_coordinates_low_precision(param_dtype, layout):
    """The same specials stored as fp16 / bf16 locations (1e38 becomes inf in fp16)."""
    c = MSDACase(num_queries=130, num_heads=2, head_dim=16, num_points=4,
                 spatial_shapes=((4, 6), (1, 1), (1, 5)), param_dtype=param_dtype,
                 locations_layout=layout, value_layout="BNLC")
    args = make_inputs(c)
    loc = _hostile_locations(args["sampling_locations"].shape, np.random.default_rng(3))
    with np.errstate(over="ignore"):  # 1e38 -> inf in fp16, on purpose
        args["sampling_locations"] = loc.astype(args["sampling_locations"].dtype)
    out = run_kernel(args, lnc=2)
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype)


def test_nan_sample_contributes_nothing():
    c = MSDACase(num_queries=3, num_heads=1, head_dim=8, num_points=1, spatial_shapes=((3, 3),),
                 param_dtype="float32", value_dtype="float32")
    args = make_inputs(c)
    args["sampling_locations"][...] = np.nan
    args["sampling_locations"][0, 1, 0, 0, 0, 0] = 0.5   # y still NaN: still nothing
    out = run_kernel(args, lnc=1)
    np.testing.assert_array_equal(out, np.zeros_like(out))


def test_exact_row_indices_beyond_element_limit():
    """L * N_h * C_h >= 2^24 still works: indices are rows, scaled by the DMA stride."""
    levels = ((512, 512), (256, 256))       # L = 327,680; L * N_h * C_h = 2^24 * 1.25
    c = MSDACase(num_queries=128, num_heads=1, head_dim=64, num_points=2,
                 spatial_shapes=levels, value_layout="BNLC")
    args = make_inputs(c)
    assert c.total_pixels * c.num_heads * c.head_dim >= 1 << 24
    # Put samples near the far corner of the last level so high rows are gathered.
    loc = args["sampling_locations"].astype(np.float32)
    loc[..., 1, :, :] = 0.97 + 0.03 * loc[..., 1, :, :]
    args["sampling_locations"] = loc
    out = run_kernel(args, lnc=1)
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype)


def test_row_index_limit_raises_before_work():
    c = MSDACase(num_queries=1, num_heads=16, head_dim=1, num_points=1,
                 spatial_shapes=((1024, 1024),))
    value = np.zeros((1, 1024 * 1024, 16, 1), np.float16)     # L * N_h = 2^24 rows
    args = make_inputs(with_(c, spatial_shapes=((1, 1),)))
    args.update(value=value, spatial_shapes=((1024, 1024),), level_start_index=(0,))
    with pytest.raises(ValueError, match=r"2\^24"):
        run_kernel(args, lnc=1)


@pytest.mark.parametrize("bad,match", [
    (dict(gather_method="scatter"), "gather_method"),
    (dict(max_indices_per_indirect=64), "max_indices_per_indirect"),
    (dict(padding_mode="reflection"), "padding_mode"),
    (dict(value_layout="NLBC"), "value_layout"),
])
def test_argument_errors(bad, match):
    args = make_inputs(MSDACase(num_queries=4, spatial_shapes=((2, 2),)))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        run_kernel(args, lnc=1)


def _max_indices_per_indirect(stats: dict) -> int:
    """Largest descriptors-per-instruction over the indirect DMA kinds (from the report)."""
    worst = 0
    for key, d in stats.get("dma", {}).items():
        if "indirect" in str(key) and d.get("instructions"):
            worst = max(worst, -(-d["descriptors"] // d["instructions"]))
    return worst


# ------------------------------------------------------------------ property-based shapes


@st.composite
def small_cases(draw):
    levels = tuple(draw(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 12)),
                                 min_size=1, max_size=3)))
    value_dtype = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    return MSDACase(
        batch=draw(st.integers(1, 2)), num_queries=draw(st.integers(1, 300)),
        num_heads=draw(st.sampled_from([1, 2, 3, 4, 16])),
        head_dim=draw(st.sampled_from([8, 12, 16, 40, 48, 144, 160])),
        num_points=draw(st.integers(1, 4)), spatial_shapes=levels,
        value_layout=draw(st.sampled_from(["BLNC", "BNLC"])),
        locations_layout=draw(st.sampled_from(["BQHLP2", "B2QHLP"])),
        align_corners=draw(st.booleans()),
        padding_mode=draw(st.sampled_from(["zeros", "border"])),
        value_dtype=value_dtype,
        param_dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])))


@given(c=small_cases(), lnc=st.sampled_from([1, 2]),
       gather=st.sampled_from(["transpose", "copy"]), seed=st.integers(0, 2**16))
def test_random_small_shapes(c, lnc, gather, seed):
    if c.num_heads == 16:   # keep the example cheap
        c = with_(c, num_queries=min(c.num_queries, 40), head_dim=8)
    check_case(c, lnc=lnc, seed=seed, gather_method=gather,
               max_indices_per_indirect=None if seed % 3 else 128 * (1 + seed % 7))


@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("gather", ["transpose", "copy"])
@pytest.mark.parametrize("layout", ["BQHLP2", "B2QHLP"])
def test_cost_report_traffic_is_compulsory(gather, layout):
    """4 descriptors of C_h * dtype bytes per sample; parameters and output cross HBM once;
    peak SBUF/PSUM as planned by the config."""
    c = MSDACase(num_queries=512, num_heads=4, num_points=3, spatial_shapes=SMALL_LEVELS,
                 locations_layout=layout)
    args = make_inputs(c)
    cfg = plan_forward_from_args(**args, gather_method=gather, lnc=2)
    out, rep = run_kernel(args, lnc=2, report=True, gather_method=gather)
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype)
    samples = c.batch * c.num_queries * c.num_heads * c.num_levels * c.num_points
    kind = "indirect_transpose" if gather == "transpose" else "indirect_gather"
    stats = rep.to_dict()["dma"]
    gathered = stats[f"{kind}/hbm_to_sbuf"]
    assert gathered["descriptors"] == 4 * samples
    assert gathered["descriptor_bytes_min"] == gathered["descriptor_bytes_max"] == c.head_dim * 2
    params = args["sampling_locations"].nbytes + args["attention_weights"].nbytes
    assert stats["direct/hbm_to_sbuf"]["hbm_bytes"] == params
    assert stats["direct/sbuf_to_hbm"]["hbm_bytes"] == out.nbytes
    assert set(stats) == {f"{kind}/hbm_to_sbuf", "direct/hbm_to_sbuf", "direct/sbuf_to_hbm"}
    assert rep.peak_sbuf_bytes_per_partition <= cfg.sbuf_bytes
    assert rep.peak_psum_bytes_per_partition <= cfg.psum_bytes


@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("gather,kind", [("copy", "indirect_gather"),
                                         ("transpose", "indirect_transpose")])
def test_ragged_tiles_gather_only_real_queries(gather, kind):
    """Padded partitions of ragged tiles fetch nothing: both paths issue 128-row indirect
    DMAs (strict mode checks it) whose padded indices are out of bounds and skipped."""
    c = MSDACase(num_queries=70, num_heads=2, num_points=2, spatial_shapes=SMALL_LEVELS,
                 value_layout="BNLC")
    args = make_inputs(c)
    out, rep = run_kernel(args, lnc=2, report=True, gather_method=gather)
    assert_close(out, ms_deformable_attention_ref(**args), c.value_dtype)
    stats = rep.to_dict()["dma"][f"{kind}/hbm_to_sbuf"]
    samples = 70 * 2 * 4 * 2
    assert stats["descriptors"] == 4 * samples
    assert stats["hbm_bytes"] == 4 * samples * c.head_dim * 2
    padded = 4 * (2 * 128 - 70) * 2 * 4 * 2       # two cores, 35 real partitions each
    assert stats["skipped_descriptors"] == padded


@pytest.mark.parametrize("kernel", ["forward", "backward"])
def test_no_levels_names_spatial_shapes_not_an_empty_tensor(kernel):
    """N_l = 0 makes value (L = 0), the locations and the weights empty; the emulator rejects
    empty tensors before the kernel runs, so it asks the kernel's own argument check first:
    the error names spatial_shapes (it used to blame value's shape)."""
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention_bwd
    from nkilib_msda.simulator import simulate

    args = dict(value=np.zeros((1, 0, 2, 8), np.float32), spatial_shapes=(), level_start_index=(),
                sampling_locations=np.zeros((1, 5, 2, 0, 1, 2), np.float32),
                attention_weights=np.zeros((1, 5, 2, 0, 1), np.float32))
    with pytest.raises(ValueError, match=r"^spatial_shapes: expected at least one \(H, W\) pair, got \(\)$"):
        if kernel == "forward":
            simulate(ms_deformable_attention)(**args)
        else:
            simulate(ms_deformable_attention_bwd)(np.zeros((1, 5, 16), np.float32), **args)
