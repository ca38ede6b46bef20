"""Tiling plans: mode choice against the SBUF budget, token split between programs, errors."""

from __future__ import annotations

import pytest

from nkilib_msda.experimental.block_attn_res.tiling import (
    PLANNER_SBUF_BUDGET, TOKEN_TILE, check_rmsnorm_eps, plan_backward, plan_forward)

BUDGET = PLANNER_SBUF_BUDGET["trn2"]


@pytest.mark.parametrize("shape,fwd_mode,bwd_mode", [
    ((26, 8192, 512), ("slab", 2), ("slab", 2)),      # doc shape A: the slab fits
    ((33, 4096, 1536), ("stream", 2), ("slab", 1)),   # shape B: two slabs do not fit
    ((9, 8192, 4096), ("stream", 2), ("slab", 1)),    # shape C
    ((9, 4096, 7168), ("stream", 2), ("stream", 2)),  # Kimi K3 width
    ((128, 256, 2304), ("stream", 2), ("stream", 2)),
])
def test_mode_choice_and_budget(shape, fwd_mode, bwd_mode):
    n_src, tokens, dim = shape
    fwd = plan_forward(n_src, tokens, dim, "bfloat16", lnc=2)
    bwd = plan_backward(n_src, tokens, dim, "bfloat16", lnc=2)
    assert (fwd.mode, fwd.buffers) == fwd_mode and (bwd.mode, bwd.buffers) == bwd_mode
    for plan in (fwd, bwd):
        assert plan.total_sbuf_bytes <= BUDGET == plan.sbuf_budget


@pytest.mark.parametrize("shape,groups", [
    ((26, 8192, 512), [(0, 26)]),
    ((33, 4096, 1536), [(0, 17), (17, 16)]),  # two slabs of 33 do not fit: two even groups
    ((9, 8192, 4096), [(0, 5), (5, 4)]),
    ((9, 4096, 7168), [(0, 3), (3, 3), (6, 3)]),
])
def test_forward_groups_are_even_and_cover_the_sources(shape, groups):
    plan = plan_forward(*shape, "bfloat16", lnc=2)
    assert plan.groups() == groups and plan.group == groups[0][1]


def test_forced_group_and_stream():
    assert plan_forward(26, 256, 512, "bfloat16", force_group=4).groups()[-1] == (24, 2)
    assert plan_forward(26, 256, 512, "bfloat16", force_mode="stream").group == 13
    assert plan_forward(1, 256, 512, "bfloat16", force_mode="stream").mode == "slab"
    with pytest.raises(ValueError, match="group: expected 1..26"):
        plan_forward(26, 256, 512, "bfloat16", force_group=27)


def test_fp32_wide_rows_fall_back_to_single_buffering():
    plan = plan_backward(9, 1024, 7168, "float32")
    assert (plan.mode, plan.buffers) == ("stream", 1) and plan.total_sbuf_bytes <= BUDGET


def test_too_wide_rows_are_rejected_with_the_sizes_tried():
    with pytest.raises(ValueError, match="dim: no tiling fits"):
        plan_forward(4, 128, 20000, "float32")
    with pytest.raises(ValueError, match="dim: D=70000 exceeds one PSUM bank"):
        plan_backward(1, 128, 70000, "bfloat16", sbuf_budget=10**9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_sources=0), "num_sources"), (dict(num_sources=129), "num_sources"),
    (dict(dim=0), "num_tokens, dim"), (dict(dtype="float64"), "dtype"), (dict(lnc=3), "lnc"),
    (dict(force_mode="online"), "mode"),
])
def test_argument_errors(kwargs, match):
    args = dict(num_sources=4, num_tokens=256, dim=512, dtype="bfloat16", lnc=1)
    args.update(kwargs)
    for planner in (plan_forward, plan_backward):
        with pytest.raises(ValueError, match=match):
            planner(**args)


@pytest.mark.parametrize("tokens,lnc", [(1, 1), (1, 2), (2, 2), (128, 2), (130, 2), (1000, 2),
                                        (1000, 1), (129, 2), (257, 2), (385, 2), (8192, 2)])
def test_tiles_cover_tokens_once_and_match_across_programs(tokens, lnc):
    """Tiles cover every token once, in order; at LNC=2 both programs run the same number of
    tiles of the same sizes (even BT) or sizes that differ in one tile by one token (odd BT)."""
    plan = plan_forward(3, tokens, 256, "bfloat16", lnc=lnc)
    rows = []
    per_program = [plan.tiles_of(pid) for pid in range(lnc)]
    for tiles in per_program:
        for start, count in tiles:
            assert 1 <= count <= TOKEN_TILE
            rows.extend(range(start, start + count))
    assert rows == list(range(tokens))
    assert len(per_program[0]) == plan.tiles_per_program == -(-tokens // (TOKEN_TILE * lnc))
    if lnc == 2 and tokens > 1:
        sizes = [[count for _, count in tiles] for tiles in per_program]
        assert len(sizes[0]) == len(sizes[1])
        diffs = sorted(a - b for a, b in zip(*sizes))
        expected = [0] * len(diffs) if tokens % 2 == 0 else [0] * (len(diffs) - 1) + [1]
        assert diffs == expected, sizes
    if lnc == 2 and tokens == 1:
        assert per_program[1] == ()


@pytest.mark.parametrize("dim,lnc,band,staged", [(512, 2, 256, False), (200, 2, 100, False),
                                                  (257, 2, 129, True), (7168, 2, 3584, False),
                                                  (257, 1, 257, False)])
def test_weight_gradient_bands(dim, lnc, band, staged):
    plan = plan_backward(4, 256, dim, "bfloat16", lnc=lnc)
    assert (plan.weight_band, plan.stage_weight_band) == (band, staged)
    assert plan.weight_band_chunks == -(-band // 128)


@pytest.mark.parametrize("plan", [plan_forward, plan_backward])
def test_too_wide_rows_name_d_and_the_largest_d_that_fits(plan):
    import re

    with pytest.raises(ValueError, match=r"D=20000 is too large: the largest D that fits") as err:
        plan(4, 128, 20000, "bfloat16")
    largest = int(re.search(r"fits with these arguments is (\d+)$", str(err.value)).group(1))
    assert plan(4, 128, largest, "bfloat16").dim == largest
    with pytest.raises(ValueError, match="no tiling fits"):
        plan(4, 128, largest + 1, "bfloat16")


def test_rmsnorm_eps_must_keep_sqrt_in_its_documented_range():
    """An all-zero source row takes nl.sqrt(eps); the activation table's sqrt range starts at
    2^-116, so the NKI forward rejects eps = 0 (and NaN/inf) with RMSNorm, one line naming it."""
    for eps in (2.0 ** -116, 1e-6, 1.0, 2.0 ** 116):
        check_rmsnorm_eps(eps, True)
    for eps in (0.0, -1e-6, 2.0 ** -117, float("nan"), float("inf"), 2.0 ** 117):
        with pytest.raises(ValueError, match=r"^rmsnorm_eps: expected a number in \[2\^-116") as err:
            check_rmsnorm_eps(eps, True)
        assert "\n" not in str(err.value)
    check_rmsnorm_eps(0.0, False)   # no RMSNorm: no square root
