"""Unit tests of the MSDA forward tiling plan (plain Python, no kernel run)."""

from __future__ import annotations

import itertools

import pytest

from nkilib_msda.experimental.deformable_attention.plan.forward_config import (
    COORD_SCRATCH_WORDS, PARTITIONS, PSUM_BANK_BYTES, PSUM_BYTES, TRN2_SBUF_BUDGET,
    plan_forward)
from msda_cases import msda_problem as problem

TRN2_SBUF_PER_PARTITION = 224 * 1024


def test_budget_is_below_trn2_usable_sbuf():
    assert TRN2_SBUF_BUDGET < TRN2_SBUF_PER_PARTITION - 16 * 1024


@pytest.mark.parametrize("heads,head_dim,levels,points", list(itertools.product(
    (1, 4, 8, 16), (8, 32, 48, 144, 256, 512), (1, 4, 5, 8), (1, 4, 8))))
@pytest.mark.parametrize("dtype,gather", [("bfloat16", "transpose"), ("float16", "copy"),
                                          ("float32", "transpose")])
def test_every_supported_shape_fits_trn2(heads, head_dim, levels, points, dtype, gather):
    p = problem(queries=20000, heads=heads, head_dim=head_dim, points=points,
                levels=((7, 9),) * levels)
    for lnc in (1, 2):
        cfg = plan_forward(p, dtype, lnc=lnc, gather_method=gather)
        assert cfg.sbuf_bytes <= TRN2_SBUF_BUDGET
        assert cfg.psum_bytes <= PSUM_BYTES
        if cfg.gather_method == "transpose":
            assert cfg.psum_cols * head_dim * 2 <= PSUM_BANK_BYTES
            assert all(c1 - c0 <= 128 for c0, c1 in cfg.channel_tiles)
            assert cfg.channel_tiles[0][0] == 0 and cfg.channel_tiles[-1][1] == head_dim
        assert cfg.gather_method == ("copy" if dtype == "float32" else gather)


def test_sbuf_accounting_matches_the_listed_buffers():
    cfg = plan_forward(problem(), "bfloat16")
    n = cfg.samples(cfg.q_pack)
    bufs = cfg.sbuf_buffers()
    assert bufs["coord_scratch"] == (COORD_SCRATCH_WORDS * n * 4, 1)
    assert cfg.gather_method == "transpose"
    # Transpose path: natural-order indices are scratch; the per-tile copies are transposed.
    assert bufs["indices"] == (16 * n, 1)
    assert bufs["transpose_indices"] == (4 * cfg.index_words(cfg.q_pack), cfg.tile_bufs)
    assert cfg.sbuf_bytes == sum(size * copies for size, copies in bufs.values())
    copy = plan_forward(problem(), "bfloat16", gather_method="copy")
    assert copy.sbuf_buffers()["indices"] == (16 * copy.samples(copy.q_pack), copy.tile_bufs)
    assert "transpose_indices" not in copy.sbuf_buffers()


@pytest.mark.parametrize("heads,head_dim,points,levels,cap", [
    (8, 32, 8, 4, None), (8, 32, 4, 1, None), (2, 48, 3, 5, None), (4, 32, 3, 1, 384),
    (1, 8, 1, 1, None), (4, 144, 4, 2, None)])
def test_dma_blocks_cover_the_tile_and_own_disjoint_index_regions(heads, head_dim, points,
                                                                   levels, cap):
    """Every column of a tile is in one DMA block, in group order; block i's transposed
    indices (region i) fit the per-tile index tile, whatever q_pack."""
    cfg = plan_forward(problem(heads=heads, head_dim=head_dim, points=points,
                               levels=((5, 4),) * levels, queries=2048), "bfloat16",
                       max_indices_per_indirect=cap)
    for q_pack in {1, cfg.q_pack}:
        blocks = cfg.dma_blocks(q_pack)
        expected = [blk for g in cfg.reduce_groups(q_pack)
                    for blk in cfg.blocks(g.col0, g.cols, cfg.dma_cols)]
        assert list(blocks) == expected
        cols = [c for d0, dn in blocks for c in range(d0, d0 + dn)]
        assert cols == list(range(4 * cfg.samples(q_pack)))
        assert all(-(-dn // cfg.stack) <= cfg.dma_cols_per_instruction for _, dn in blocks)
        assert cfg.index_words(q_pack) == len(blocks) * cfg.stack * cfg.index_stride
        # every multi-column index tile starts 16-byte aligned (4 uint32 words)
        assert cfg.index_stride == 1 or cfg.index_stride % 4 == 0
        assert cfg.index_stride >= cfg.dma_cols_per_instruction
        assert cfg.index_words(q_pack) <= cfg.index_words(cfg.q_pack)


def test_pipelining_needs_two_tile_buffers():
    roomy = plan_forward(problem(), "bfloat16")
    assert roomy.tile_bufs == 2 and roomy.pipelined
    # Shrink the budget until only one copy of the per-tile buffers fits.
    budget = roomy.sbuf_bytes
    while plan_forward(problem(), "bfloat16", sbuf_budget=budget).tile_bufs == 2:
        budget -= 1024
    single = plan_forward(problem(), "bfloat16", sbuf_budget=budget)
    assert single.tile_bufs == 1 and not single.pipelined


@pytest.mark.parametrize("queries,lnc", [(1, 1), (1, 2), (127, 1), (128, 2), (263, 2),
                                         (501, 1), (1000, 2), (18000, 2), (40000, 1)])
def test_tiles_cover_each_core_range_exactly(queries, lnc):
    cfg = plan_forward(problem(queries=queries), "bfloat16", lnc=lnc)
    covered = []
    for core in range(lnc):
        lo, hi = cfg.core_range(core)
        q = lo
        for t in cfg.tiles(lo, hi):
            assert t.q_start == q and 1 <= t.partitions <= PARTITIONS
            assert t.q_pack in (1, cfg.q_pack)
            q += t.num_queries
            covered.extend(range(t.q_start, t.q_start + t.num_queries))
        assert q == hi
    assert covered == list(range(queries))


def test_q_pack_is_a_power_of_two_and_only_with_full_tiles():
    small = plan_forward(problem(queries=255), "bfloat16", lnc=1)
    assert small.q_pack == 1
    big = plan_forward(problem(queries=18000), "bfloat16", lnc=2)
    assert big.q_pack >= 2 and big.q_pack & (big.q_pack - 1) == 0
    assert -(-18000 // 2) >= big.q_pack * PARTITIONS


@pytest.mark.parametrize("heads,head_dim,points,levels", [
    (8, 32, 8, 4), (1, 8, 1, 1), (4, 256, 4, 4), (16, 512, 8, 8), (2, 144, 3, 5)])
def test_reduce_groups_cover_every_column_once(heads, head_dim, points, levels):
    cfg = plan_forward(problem(heads=heads, head_dim=head_dim, points=points,
                                       levels=((3, 3),) * levels, queries=1024), "bfloat16")
    for q_pack in {1, cfg.q_pack}:
        cols = []
        firsts = set()
        for g in cfg.reduce_groups(q_pack):
            assert g.cols <= cfg.group_cols_max
            assert g.cols % g.slots == 0
            if g.slots > 1 or g.cols == cfg.cols_per_slot:
                assert g.col0 == g.slot0 * cfg.cols_per_slot and g.first_piece
            if g.first_piece:
                firsts.update(range(g.slot0, g.slot0 + g.slots))
            cols.extend(range(g.col0, g.col0 + g.cols))
            blocks = cfg.blocks(g.col0, g.cols, cfg.dma_cols)
            assert sum(n for _, n in blocks) == g.cols and all(n <= cfg.dma_cols for _, n in blocks)
        assert cols == list(range(cfg.slots(q_pack) * cfg.cols_per_slot))
        assert firsts == set(range(cfg.slots(q_pack)))


@pytest.mark.parametrize("cap,cols", [(None, 8), (128, 1), (1000, 7), (4096, 32), (1 << 20, 128)])
def test_max_indices_per_indirect_caps_dma_columns(cap, cols):
    cfg = plan_forward(problem(), "bfloat16", max_indices_per_indirect=cap)
    assert cfg.stack == 4                                     # C_h = 32: 4 columns per PE transpose
    assert cfg.dma_cols == min(cols * cfg.stack, cfg.group_cols_max)
    assert cfg.dma_cols_per_instruction == min(cols, -(-cfg.group_cols_max // cfg.stack))
    assert cfg.dma_cols_per_instruction * PARTITIONS <= (cap or 1 << 30)


@pytest.mark.parametrize("head_dim,stack", [(8, 16), (32, 4), (48, 2), (64, 2), (65, 1), (256, 1)])
def test_stacking_fills_the_partitions_of_a_pe_transpose(head_dim, stack):
    cfg = plan_forward(problem(head_dim=head_dim), "float16")
    assert cfg.stack == stack and (stack == 1 or stack * head_dim <= PARTITIONS)
    assert cfg.psum_cols % cfg.stack == 0 or cfg.psum_cols == cfg.group_cols_max
    assert plan_forward(problem(head_dim=head_dim), "float16",
                                gather_method="copy").stack == 1


def test_copy_path_uses_one_index_column_per_dma():
    cfg = plan_forward(problem(), "bfloat16", gather_method="copy")
    assert cfg.gather_method == "copy" and cfg.dma_cols == 1 and cfg.psum_bytes == 0


def test_row_index_limit_is_enforced():
    ok = problem(levels=((1024, 1023),), heads=16)          # L * N_h just below 2^24
    plan_forward(ok, "bfloat16")
    too_big = problem(levels=((1024, 1024),), heads=16)     # L * N_h = 2^24
    with pytest.raises(ValueError, match=r"L \* N_h .* 2\^24"):
        plan_forward(too_big, "bfloat16")


def test_element_offsets_beyond_2_24_are_fine():
    p = problem(levels=((512, 512), (256, 256)), heads=8, head_dim=64)
    assert p.total_pixels * p.num_heads * p.head_dim >= 1 << 24
    plan_forward(p, "bfloat16")


@pytest.mark.parametrize("kw,err,match", [
    (dict(gather_method="gather"), ValueError, "gather_method"),
    (dict(max_indices_per_indirect=100), ValueError, "max_indices_per_indirect"),
    (dict(max_indices_per_indirect=1.5), TypeError, "max_indices_per_indirect"),
    (dict(lnc=3), ValueError, "lnc"),
])
def test_bad_options(kw, err, match):
    with pytest.raises(err, match=match):
        plan_forward(problem(), "bfloat16", **kw)


def test_reflection_is_rejected():
    with pytest.raises(ValueError, match="padding_mode"):
        plan_forward(problem(padding_mode="reflection"), "bfloat16")


def test_transpose_rejects_head_dim_beyond_a_psum_bank():
    with pytest.raises(ValueError, match="C_h"):
        plan_forward(problem(head_dim=2048), "bfloat16", gather_method="transpose")
    assert plan_forward(problem(head_dim=2048, heads=1), "bfloat16",
                                gather_method="copy").gather_method == "copy"


def test_impossible_shape_names_the_sbuf_limit():
    huge = problem(heads=64, points=64, levels=((2, 2),) * 16)
    with pytest.raises(ValueError, match="SBUF"):
        plan_forward(huge, "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_too_wide_head_dim_names_the_largest_c_h_that_fits(dtype):
    """The error says which C_h would fit, and that C_h does fit while one more does not."""
    import re

    wide = problem(heads=1, head_dim=65536, points=1, levels=((2, 2),))
    with pytest.raises(ValueError, match="the largest C_h that fits with these samples is") as err:
        plan_forward(wide, dtype, gather_method="copy")
    largest = int(re.search(r"is (\d+)$", str(err.value)).group(1))
    assert 0 < largest < 65536
    plan_forward(problem(heads=1, head_dim=largest, points=1, levels=((2, 2),)), dtype,
                 gather_method="copy")
    with pytest.raises(ValueError, match="does not fit SBUF"):
        plan_forward(problem(heads=1, head_dim=largest + 1, points=1, levels=((2, 2),)),
                             dtype, gather_method="copy")
