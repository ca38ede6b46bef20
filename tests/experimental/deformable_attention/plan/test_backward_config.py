"""Unit tests of the backward kernel's plain-Python plan (no NKI needed)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nkilib_msda.experimental.deformable_attention.plan.backward_config import (
    FP32_EXACT_INT_MAX, PARTITIONS, TRN2_SBUF_BUDGET, buffer_index, plan_backward)
from nkilib_msda.experimental.deformable_attention.plan.backward_scatter_plan import (
    SCATTER_DESCRIPTOR_OVERHEAD_BYTES, scatter_dma_cost)
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import GATHER_TRANSPOSE_BUFS, gather_split
from msda_cases import msda_problem

S4 = ((50, 45), (25, 21), (13, 9), (5, 7))


def problem(n_q=256, n_h=8, c_h=32, n_p=8, shapes=S4, batch=1, layout="BLNC"):
    return msda_problem(batch=batch, queries=n_q, heads=n_h, head_dim=c_h, points=n_p,
                        levels=shapes, value_layout=layout)


def test_default_plan_matches_upstream_k():
    cfg = plan_backward(problem(), "bfloat16")
    assert (cfg.groups, cfg.queries_per_block, cfg.partitions_per_block) == (32, 4, 128)
    assert (cfg.scatter_partitions, cfg.k_base, cfg.num_buffers) == (128, 4, 4)
    cfg = plan_backward(problem(n_h=4), "bfloat16")  # G = 16 -> K = 8 as upstream
    assert cfg.num_buffers == 8


def test_scatter_caps():
    p = problem()
    assert plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=100).scatter_partitions == 64
    cfg = plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=64)
    assert (cfg.k_base, cfg.num_buffers, cfg.scatter_pairs) == (2, 2, False)
    cfg = plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=200)
    assert (cfg.scatter_partitions, cfg.scatter_pairs) == (128, False)
    bnlc = problem(layout="BNLC")
    for cap in (None, 256, 10**6):  # pairs: 256 corner rows per DMA, K unchanged
        cfg = plan_backward(bnlc, "bfloat16", max_scatter_indices_per_indirect=cap)
        assert (cfg.scatter_pairs, cfg.num_buffers) == (True, 4)
        # BLNC pair rows are N_h rows apart: a three-level pattern, only with strided_pairs
        assert not plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=cap).scatter_pairs
        cfg = plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=cap, strided_pairs=True)
        assert (cfg.scatter_pairs, cfg.num_buffers) == (True, 4)
    one_wide = problem(shapes=((5, 7), (3, 1)), layout="BNLC")
    assert not plan_backward(one_wide, "bfloat16").scatter_pairs


def test_pairs_are_one_contiguous_run_unless_strided_pairs():
    """Default pairs move one 2*C_h run (AWS's BNLC form); the two-run form needs the knob."""
    for layout, strided in (("BNLC", False), ("BNLC", True), ("BLNC", True)):
        cfg = plan_backward(problem(layout=layout), "bfloat16", gather_method="copy",
                            strided_pairs=strided)
        assert cfg.gather_pairs and cfg.scatter_pairs
        pattern = cfg.row_pattern(32, True)
        assert pattern == ([[32, 128], [1, 64]] if layout == "BNLC" else [[32, 128], [8 * 32, 2], [1, 32]])
    assert cfg.row_pattern(32, False) == [[32, 128], [1, 32]]
    # channel tiles (C_t < C_h) split a BNLC pair into two runs: no pairs by default
    tight = plan_backward(problem(c_h=4096, n_p=4, layout="BNLC"), "float32", sbuf_budget=96 * 1024)
    assert tight.channel_tile_width < 4096 and not tight.scatter_pairs and not tight.gather_pairs


def test_gather_caps():
    p = problem()
    four = {"gather_layout": "four-corner"}
    cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=1024, **four)
    assert cfg.gather_columns == 8 and cfg.gather_method == "transpose"
    cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=200, **four)
    assert cfg.gather_columns == 1
    for cap in (None, 10**6):
        cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=cap, **four)
        assert cfg.gather_columns == 16  # packet limit 64 // (128 / 32)
    # corner blocks: one index column per sample (N_p = 8 per block), 128 channels each
    cfg = plan_backward(p, "bfloat16", gather_layout="corner-block")
    assert (cfg.corner_blocks, cfg.gather_columns, cfg.gather_index_columns) == (True, 8, 8)
    assert (cfg.gather_channels, cfg.psum_columns) == (128, 8)
    cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=512, gather_layout="corner-block")
    assert cfg.gather_columns == 4
    assert plan_backward(problem(c_h=256), "bfloat16").gather_columns == 32
    cfg = plan_backward(problem(layout="BNLC"), "bfloat16", gather_method="copy")
    assert (cfg.gather_pairs, cfg.gather_columns) == (True, 1)
    cfg = plan_backward(p, "bfloat16", gather_method="copy", max_gather_indices_per_indirect=255)
    assert not cfg.gather_pairs
    cfg = plan_backward(p, "bfloat16", gather_method="copy", max_gather_indices_per_indirect=48)
    assert (cfg.gather_partitions, cfg.gather_pairs) == (32, False)
    with pytest.raises(ValueError, match="max_gather_indices_per_indirect"):
        plan_backward(p, "bfloat16", max_gather_indices_per_indirect=64)
    assert plan_backward(p, "float32").gather_method == "copy"


def test_wide_heads_take_at_most_two_buffer_sets():
    """AWS's cap (its reduce races still-draining scatters for C_h > 256 with > 2 sets)."""
    assert plan_backward(problem(c_h=256), "bfloat16", num_scatter_buffers=8).scatter_sets == 8
    assert plan_backward(problem(c_h=288), "bfloat16", num_scatter_buffers=2).scatter_sets == 2
    with pytest.raises(ValueError, match=r"^num_scatter_buffers: expected at most 2 .*C_h = 288$"):
        plan_backward(problem(c_h=288), "bfloat16", num_scatter_buffers=3)


def test_bad_knobs_raise_named_errors():
    p = problem()
    for kwargs, name in [({"gather_method": "fast"}, "gather_method"),
                         ({"num_scatter_buffers": 0}, "num_scatter_buffers"),
                         ({"num_scatter_buffers": 9}, "num_scatter_buffers"),
                         ({"max_scatter_indices_per_indirect": 0}, "max_scatter_indices_per_indirect"),
                         ({"max_gather_indices_per_indirect": -1}, "max_gather_indices_per_indirect"),
                         ({"compute_grad_value": False, "compute_grad_sampling_locations": False,
                           "compute_grad_attention_weights": False}, "at least one")]:
        with pytest.raises(ValueError, match=name):
            plan_backward(p, "bfloat16", **kwargs)
    with pytest.raises(ValueError, match="num_heads"):
        plan_backward(problem(n_h=32, shapes=S4 + ((3, 3),)), "bfloat16")


def test_index_limits():
    big = problem(n_h=16, shapes=((1024, 1100),))  # 18 M rows >= 2^24
    with pytest.raises(ValueError, match="2\\^24"):
        plan_backward(big, "bfloat16")
    # 3.2 M rows with G = 1: K = 128 would overflow 2^24, the scatter partitions shrink to 4
    p = problem(n_h=1, shapes=((1600, 2000),), n_p=4)
    cfg = plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=128)
    assert cfg.max_scatter_index < FP32_EXACT_INT_MAX
    assert (cfg.scatter_partitions, cfg.num_buffers) == (4, 4)


@pytest.mark.parametrize("n_h,n_l,cap", [(8, 4, None), (1, 1, None), (3, 5, None), (16, 5, 64),
                                         (4, 4, 512), (2, 3, 384), (8, 1, 32), (5, 2, 2048)])
def test_scatter_targets_are_unique_per_instruction(n_h, n_l, cap):
    """Brute-force the proof in the module docstring on adversarial rows (all samples of one
    (h, l) hit the same pixel)."""
    shapes = tuple((3 + i, 4 + i) for i in range(n_l))
    # strided_pairs: BLNC pairs, whose second row (pix + 1) * N_h + h is derived per instruction
    cfg = plan_backward(problem(n_h=n_h, shapes=shapes, n_p=4), "bfloat16",
                        max_scatter_indices_per_indirect=cap, strided_pairs=True)
    rows = cfg.rows_per_batch
    g = cfg.groups
    for j0 in range(0, cfg.partitions_per_block, cfg.scatter_partitions):
        targets = set()
        parts = range(j0, min(j0 + cfg.scatter_partitions, cfg.partitions_per_block))
        for j, slot in itertools.product(parts, range(2 if cfg.scatter_pairs else 1)):
            h, l = divmod(j % g, n_l)
            pix = sum(a * b for a, b in shapes[:l]) + slot  # same pixel(s) for every sample of (h, l)
            row = pix * n_h + h
            target = buffer_index(cfg, j) + row
            assert target not in targets
            assert target < cfg.num_buffers * rows
            targets.add(target)


def test_super_tiles_cover_queries_once():
    for n_q, lnc in [(1, 1), (5, 2), (263, 1), (501, 2), (64, 2)]:
        cfg = plan_backward(problem(n_q=n_q, n_h=3, shapes=S4[:3]), "bfloat16", lnc=lnc)
        covered = []
        for core in range(lnc):
            for q0, blocks, parts in cfg.super_tiles(core):
                assert parts <= PARTITIONS and parts % cfg.groups == 0
                n = blocks * cfg.queries_per_block if parts == cfg.partitions_per_block else parts // cfg.groups
                covered += list(range(q0, q0 + n))
        assert covered == list(range(n_q))


def test_sbuf_plan_fits_and_shrinks():
    for c_h, n_p, dt in [(32, 8, "bfloat16"), (256, 8, "float32"), (160, 8, "bfloat16"), (8, 1, "float16")]:
        cfg = plan_backward(problem(c_h=c_h, n_p=n_p), dt)
        assert cfg.sbuf_bytes_per_partition <= TRN2_SBUF_BUDGET == cfg.sbuf_budget
    small = plan_backward(problem(c_h=256, n_p=8), "float32")
    large = plan_backward(problem(c_h=8, n_p=1), "bfloat16")
    assert small.blocks_per_tile <= large.blocks_per_tile
    tight = plan_backward(problem(), "bfloat16", sbuf_budget=40_000)
    assert tight.blocks_per_tile < plan_backward(problem(), "bfloat16").blocks_per_tile
    with pytest.raises(ValueError, match="SBUF"):
        plan_backward(problem(c_h=256), "float32", sbuf_budget=20_000)


def test_reduce_bands_partition_each_batch():
    cfg = plan_backward(problem(), "bfloat16", lnc=2)
    a, b = cfg.reduce_bands(0), cfg.reduce_bands(1)
    assert a[0] == 0 and a[1] == b[0] and b[1] == cfg.rows_per_batch * 32


def test_buffer_sets_and_scratch_bytes():
    p = problem(batch=2)
    cfg = plan_backward(p, "bfloat16", num_scatter_buffers=3, lnc=2, max_scatter_indices_per_indirect=128)
    assert cfg.buffer_shape == (2, 8, p.total_pixels * 8, 32)
    assert cfg.scratch_hbm_bytes == 3 * 2 * 8 * p.total_pixels * 8 * 32 * 4
    assert plan_backward(p, "bfloat16", compute_grad_value=False).scratch_hbm_bytes == 0
    assert np.all(np.diff([buffer_index(cfg, j) for j in range(0, 128, 32)]) == cfg.rows_per_batch)


def test_default_scatter_partitions_minimise_the_estimated_dma_work():
    decoder = problem(n_q=900, n_p=4, shapes=((200, 200),))  # G = 8: K would be 16 at P_s = 128
    tsa = problem(n_q=40000, n_p=4, shapes=((200, 200),))
    for p, lnc in ((decoder, 1), (decoder, 2), (tsa, 1), (tsa, 2), (problem(), 2)):
        cfg = plan_backward(p, "bfloat16", lnc=lnc)
        costs = {ps: scatter_dma_cost(p, lnc, 1, cfg.groups, ps) for ps in (1, 2, 4, 8, 16, 32, 64, 128)}
        assert costs[cfg.scatter_partitions] == min(costs.values())
        assert cfg.num_buffers == -(-cfg.scatter_partitions // cfg.groups)
    # Decoders: the buffers' zero + reduce outweigh a full-width scatter, a one-engine scatter
    # chain outweighs the buffers: in between.
    dec = plan_backward(decoder, "bfloat16", lnc=1)
    assert 8 < dec.scatter_partitions < 128
    assert plan_backward(decoder, "bfloat16", max_scatter_indices_per_indirect=128).num_buffers == 16
    # Encoders: the scatter dominates, every partition scatters at once.
    assert plan_backward(tsa, "bfloat16", lnc=2).scatter_partitions == 128
    assert plan_backward(problem(), "bfloat16", lnc=2).num_buffers == 4  # upstream's K kept
    # More buffer sets make buffers dearer and the scatter chains parallel: never more K.
    assert plan_backward(decoder, "bfloat16", num_scatter_buffers=4).num_buffers <= dec.num_buffers
    # a given buffer set fixes K (chunked calls with different N_q stay compatible)
    assert plan_backward(decoder, "bfloat16", lnc=2, buffers_per_core=4).num_buffers == 4


def test_scatter_dma_cost_terms():
    p = problem(n_q=900, n_p=4, shapes=((200, 200),))
    rows = p.batch * p.total_pixels * p.num_heads
    samples = p.batch * p.num_queries * p.num_heads * p.num_levels * p.num_points
    # P_s = 8, G = 8: K = 1 buffer; each scatter is a 128-partition DMA on all 16 engines
    # whose 120 other rows are skipped but still cost their descriptor (128 / 8 = 16 each).
    expected = (2 * 4 * rows * p.head_dim / 16
                + 4 * samples * (8 * p.head_dim + 16 * SCATTER_DESCRIPTOR_OVERHEAD_BYTES) / 16)
    assert scatter_dma_cost(p, 1, 1, 8, 8) == pytest.approx(expected)
    # LNC 2 halves the scatter per core; P_s = 128 has no skipped rows.
    assert scatter_dma_cost(p, 2, 1, 8, 128) == pytest.approx(
        16 * 2 * 4 * rows * p.head_dim / 16
        + 4 * samples / 2 * (8 * p.head_dim + SCATTER_DESCRIPTOR_OVERHEAD_BYTES) / 16)


# ------------------------------------------------------------------ channel tiles
DETR_OP_LEVELS = ((6, 4), (3, 2))  # Deformable-DETR's own op test: N_h = 2, N_l = 2, N_p = 2


def detr_problem(c_h: int, layout: str = "BLNC"):
    return problem(n_q=2, n_h=2, c_h=c_h, n_p=2, shapes=DETR_OP_LEVELS, layout=layout)


def _tile_names(cfg) -> set[str]:
    return {name for name, _, _ in cfg.sbuf_tiles}


def _tiles_cover_channels(cfg) -> None:
    c_h = cfg.problem.head_dim
    starts = [c0 for c0, _ in cfg.channel_tiles]
    assert starts == list(range(0, c_h, cfg.channel_tile_width))
    assert sum(c for _, c in cfg.channel_tiles) == c_h
    assert all(0 < c <= cfg.channel_tile_width for _, c in cfg.channel_tiles)


def test_one_channel_tile_whenever_the_whole_row_fits():
    """Shapes that fitted before keep one full-width channel tile (the untiled kernel)."""
    for c_h, n_p, dt in [(32, 8, "bfloat16"), (256, 8, "float32"), (144, 4, "float16"), (2048, 2, "float32")]:
        cfg = plan_backward(problem(c_h=c_h, n_p=n_p), dt)
        assert cfg.channel_tiles == ((0, c_h),) and cfg.channel_tile_width == c_h
        assert "dot_part" not in _tile_names(cfg)
        assert cfg.describe()["channel_tiles"] == 1


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
def test_detr_3096_fp32_is_split_into_two_tiles(layout):
    """The shape the untiled backward refused (235,952 B per partition) now fits in halves."""
    cfg = plan_backward(detr_problem(3096, layout), "float32")
    assert cfg.channel_tiles == ((0, 1548), (1548, 1548))
    assert cfg.sbuf_bytes_per_partition <= TRN2_SBUF_BUDGET
    assert "dot_part" in _tile_names(cfg)
    shapes = {name: shape for name, shape, _ in cfg.sbuf_tiles}
    assert shapes["grad"][-1] == shapes["work"][-1] == shapes["gathered"][-1] == 1548
    # without the gathers there are no partial dot products to sum
    assert "dot_part" not in _tile_names(plan_backward(detr_problem(3096), "float32",
                                                       compute_grad_sampling_locations=False,
                                                       compute_grad_attention_weights=False))


@pytest.mark.parametrize("dt,method", [("float32", "copy"), ("bfloat16", "copy"), ("bfloat16", "transpose")])
def test_tiling_starts_one_channel_past_the_largest_single_tile(dt, method):
    def tiles(c_h):
        return len(plan_backward(detr_problem(c_h), dt, gather_method=method).channel_tiles)

    lo, hi = 1, 20_000  # the largest C_h with one tile lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tiles(mid) == 1 else (lo, mid)
    last = plan_backward(detr_problem(lo), dt, gather_method=method)
    assert last.blocks_per_tile == 1  # one full-width tile is preferred to more blocks
    first = plan_backward(detr_problem(lo + 1), dt, gather_method=method)
    assert len(first.channel_tiles) == 2
    for cfg in (last, first):
        assert cfg.sbuf_bytes_per_partition <= TRN2_SBUF_BUDGET
        _tiles_cover_channels(cfg)
    if method == "transpose":  # every tile but the last is whole 128-channel transposes
        assert first.channel_tile_width % 128 == 0
    else:
        assert first.channel_tile_width == -(-(lo + 1) // 2)


def test_channel_tile_widths_and_transpose_chunks():
    from nkilib_msda.experimental.deformable_attention.plan.backward_config import BackwardConfig
    from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import channel_tile_widths

    for c_h in (1, 7, 128, 129, 1000, 3096):
        for method in ("copy", "transpose"):
            widths = channel_tile_widths(c_h, method)
            assert widths[0] == c_h and widths[-1] == 1
            assert all(a > b for a, b in zip(widths, widths[1:]))
            if method == "transpose":
                assert all(w % 128 == 0 for w in widths if 128 < w < c_h)
    assert BackwardConfig.transpose_chunks(300) == ((0, 128), (128, 128), (256, 44))
    assert BackwardConfig.transpose_chunks(40) == ((0, 40),)


def test_narrow_transpose_tiles_shrink_the_gather_columns():
    """Below 128 channels per tile the packet limit allows fewer index columns per DMA."""
    p = problem(c_h=256, n_p=8)
    wide = plan_backward(p, "bfloat16")
    assert wide.gather_columns == 32
    for budget in range(wide.sbuf_bytes_per_partition, 0, -2048):
        cfg = plan_backward(p, "bfloat16", sbuf_budget=budget)
        if cfg.channel_tile_width < 128:
            break
    assert cfg.sbuf_bytes_per_partition <= budget
    assert cfg.gather_columns <= 64 // (128 // cfg.channel_tile_width)
    assert all(c <= 128 for c0, c in cfg.transpose_chunks(cfg.channel_tile_width))


def test_every_head_dim_the_forward_accepts_runs_backward():
    """The forward's largest C_h (and the C_h of Deformable-DETR's op test) plan backward too."""
    from nkilib_msda.experimental.deformable_attention.plan.forward_config import plan_forward

    def forward_fits(p, dt, method):
        try:
            plan_forward(p, dt, gather_method=method)
            return True
        except ValueError:
            return False

    for n_h, n_p, shapes in [(1, 1, ((4, 3),)), (2, 2, DETR_OP_LEVELS), (8, 4, S4), (8, 8, ((4, 3),))]:
        for dt, method in [("float32", "copy"), ("bfloat16", "copy"), ("bfloat16", "transpose"),
                           ("float16", "copy")]:
            lo, hi = 1, 40_000  # the forward's largest C_h lies in [lo, hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                fits = forward_fits(problem(n_h=n_h, c_h=mid, n_p=n_p, shapes=shapes), dt, method)
                lo, hi = (mid, hi) if fits else (lo, mid)
            for c_h in (30, 71, 1025, 2048, 3096, lo):
                p = problem(n_h=n_h, c_h=c_h, n_p=n_p, shapes=shapes)
                if not forward_fits(p, dt, method):
                    continue
                for lnc in (1, 2):
                    cfg = plan_backward(p, dt, lnc=lnc, gather_method=method)
                    assert cfg.sbuf_bytes_per_partition <= TRN2_SBUF_BUDGET
                    _tiles_cover_channels(cfg)


def test_what_cannot_fit_names_the_points_limit():
    p = problem(c_h=64, n_p=8)
    budget = 27_000  # the fp32 reduction tiles alone take 24,576 B
    with pytest.raises(ValueError, match=r"SBUF: .* over the budget 27,000 .*N_p = 8 .*at most N_p = ") as err:
        plan_backward(p, "float32", sbuf_budget=budget)
    limit = int(str(err.value).rsplit("at most N_p = ", 1)[1].split()[0])
    assert 1 <= limit < 8
    plan_backward(problem(c_h=64, n_p=limit), "float32", sbuf_budget=budget)
    with pytest.raises(ValueError, match="SBUF"):
        plan_backward(problem(c_h=64, n_p=limit + 1), "float32", sbuf_budget=budget)


@pytest.mark.parametrize("channels", [8, 16, 32, 48, 64, 96, 128])
@pytest.mark.parametrize("columns", [1, 3, 16, 32])
def test_transpose_gather_bands(channels, columns):
    """A transpose gather's columns go to 128 // band transposes on partition bands that the PE
    transpose may read (starts 0/32/64/96 for <= 32 partitions, 0/64 for <= 64), every column
    to one band, using the DMA engines of the whole band range."""
    band, m = gather_split(columns, channels)
    stack = PARTITIONS // band
    assert channels <= band and band in (32, 64, 128)
    limits = {0: 128, 32: 32, 64: 64, 96: 32}
    for j in range(stack):
        assert channels <= limits[j * band]
    owners = [k // m for k in range(columns)]
    assert max(owners) < stack and m == -(-columns // stack)


def test_transposed_tiles_are_double_buffered_bands():
    # without the grad_value scatter nothing is pipelined: two transposed tiles in turn
    cfg = plan_backward(problem(), "bfloat16", gather_layout="four-corner", compute_grad_value=False)
    tiles = {name: shape for name, shape, _ in cfg.sbuf_tiles}
    band, m = gather_split(cfg.gather_columns, 32)
    assert band == 32 and tiles["transposed"] == (GATHER_TRANSPOSE_BUFS, m * PARTITIONS)
    assert GATHER_TRANSPOSE_BUFS >= 2
    cfg = plan_backward(problem(), "bfloat16", gather_layout="corner-block", compute_grad_value=False)
    tiles = {name: shape for name, shape, _ in cfg.sbuf_tiles}
    band, m = gather_split(cfg.gather_columns, 128)
    assert band == 128 and tiles["transposed"] == (GATHER_TRANSPOSE_BUFS, m * PARTITIONS)
    assert tiles["consts"] == (18,)


@pytest.mark.parametrize("layout", ["four-corner", "corner-block"])
def test_pipelined_plan_holds_a_super_tile_of_gathers_and_the_next_tiles_copies(layout):
    p = problem()
    cfg = plan_backward(p, "bfloat16", gather_layout=layout)
    tiles = {name: (shape, dt) for name, shape, dt in cfg.sbuf_tiles}
    t, f = cfg.blocks_per_tile, cfg.blocks_per_tile * p.num_points
    index_cols = p.num_points if cfg.corner_blocks else cfg.columns_per_block
    per_block = -(-index_cols // cfg.gather_columns) * len(cfg.transpose_chunks(32) if not cfg.corner_blocks else (0,))
    assert cfg.pipelined and 2 <= cfg.scatter_work_bufs <= t
    assert tiles["transposed"][0][0] == t * per_block  # every gather of a super-tile in flight
    assert tiles["swork"] == ((cfg.scatter_work_bufs, 4 * p.num_points, 32), "float32")
    assert tiles["grad_alt"] == tiles["grad"] and tiles["vbits_alt"] == tiles["vbits"] == ((f, 4), "int32")
    assert tiles["sidx_alt"] == tiles["sidx"]
    assert cfg.sbuf_bytes_per_partition <= cfg.sbuf_budget


def test_scatter_data_takes_a_second_tile_only_in_leftover_sbuf():
    p = problem()
    # the copy gather is never pipelined: work and one swork tile in turn
    cfg = plan_backward(p, "bfloat16", gather_method="copy")
    tiles = {name: (shape, dt) for name, shape, dt in cfg.sbuf_tiles}
    assert not cfg.pipelined and cfg.scatter_work_bufs == 2 and cfg.scatter_fold == 1
    assert tiles["swork"] == ((1, 4 * p.num_points, 32), "float32") and tiles["work"][0] == (4 * p.num_points, 32)
    assert "grad_alt" not in tiles
    extra = 4 * p.num_points * 32 * 4
    # a budget one byte short of the second tile: the same blocks and width, one data tile
    tight = plan_backward(p, "bfloat16", gather_method="copy", sbuf_budget=cfg.sbuf_bytes_per_partition - 1)
    assert (tight.blocks_per_tile, tight.channel_tiles) == (cfg.blocks_per_tile, cfg.channel_tiles)
    assert tight.scatter_work_bufs == 1 and "swork" not in {name for name, _, _ in tight.sbuf_tiles}
    assert tight.sbuf_bytes_per_partition == cfg.sbuf_bytes_per_partition - extra
    # a transpose plan whose pipelined tiles do not fit falls back to the same blocks, unpipelined
    full = plan_backward(p, "bfloat16", gather_layout="four-corner")
    unpiped = plan_backward(p, "bfloat16", gather_layout="four-corner", sbuf_budget=full.sbuf_bytes_per_partition
                            - (full.scatter_work_bufs - 1) * extra - 1)
    assert full.pipelined and not unpiped.pipelined and unpiped.scatter_work_bufs == 2
    assert (unpiped.blocks_per_tile, unpiped.channel_tiles) == (full.blocks_per_tile, full.channel_tiles)
    # no second tile without the unfolded scatter: grad_value not wanted, or the folded scatter
    no_value = plan_backward(p, "bfloat16", compute_grad_value=False)
    assert no_value.scatter_work_bufs == 1 and "swork" not in {name for name, _, _ in no_value.sbuf_tiles}
    decoder = plan_backward(problem(n_q=900, n_p=4, shapes=((150, 150),)), "bfloat16", lnc=2)
    assert decoder.scatter_fold > 1 and decoder.scatter_work_bufs == 1 and not decoder.pipelined
    assert "swork" not in {name for name, _, _ in decoder.sbuf_tiles}
