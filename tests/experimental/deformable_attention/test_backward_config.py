"""Unit tests of the backward kernel's plain-Python plan (no NKI needed)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nkilib_msda.experimental.deformable_attention.backward_config import (
    FP32_EXACT_INT_MAX, PARTITIONS, TRN2_SBUF_BUDGET, buffer_index, plan_backward)
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
    for cap in (None, 256, 10**6):  # pairs: 256 corner rows per DMA, K unchanged
        cfg = plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=cap)
        assert (cfg.scatter_pairs, cfg.num_buffers) == (True, 4)
    one_wide = problem(shapes=((5, 7), (3, 1)))
    assert not plan_backward(one_wide, "bfloat16").scatter_pairs


def test_gather_caps():
    p = problem()
    cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=1024)
    assert cfg.gather_columns == 8 and cfg.gather_method == "transpose"
    cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=200)
    assert cfg.gather_columns == 1
    for cap in (None, 10**6):
        cfg = plan_backward(p, "bfloat16", max_gather_indices_per_indirect=cap)
        assert cfg.gather_columns == 16  # packet limit 64 // (128 / 32)
    assert plan_backward(problem(c_h=256), "bfloat16").gather_columns == 32
    cfg = plan_backward(p, "bfloat16", gather_method="copy")
    assert (cfg.gather_pairs, cfg.gather_columns) == (True, 1)
    cfg = plan_backward(p, "bfloat16", gather_method="copy", max_gather_indices_per_indirect=255)
    assert not cfg.gather_pairs
    cfg = plan_backward(p, "bfloat16", gather_method="copy", max_gather_indices_per_indirect=48)
    assert (cfg.gather_partitions, cfg.gather_pairs) == (32, False)
    with pytest.raises(ValueError, match="max_gather_indices_per_indirect"):
        plan_backward(p, "bfloat16", max_gather_indices_per_indirect=64)
    assert plan_backward(p, "float32").gather_method == "copy"


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
    cfg = plan_backward(problem(n_h=n_h, shapes=shapes, n_p=4), "bfloat16",
                               max_scatter_indices_per_indirect=cap)
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


def test_default_k_keeps_buffer_traffic_below_scatter_traffic():
    decoder = problem(n_q=900, n_p=4, shapes=((200, 200),))  # G = 8: K would be 16
    cfg = plan_backward(decoder, "bfloat16", lnc=2)
    assert (cfg.scatter_partitions, cfg.num_buffers) == (8, 1)
    assert plan_backward(decoder, "bfloat16", max_scatter_indices_per_indirect=128).num_buffers == 16
    tsa = problem(n_q=40000, n_p=4, shapes=((200, 200),))
    assert plan_backward(tsa, "bfloat16", lnc=2).num_buffers == 8
    for cfg in (plan_backward(tsa, "bfloat16", lnc=2), plan_backward(problem(), "bfloat16", lnc=2)):
        p = cfg.problem
        buffer_bytes = 2 * cfg.scratch_hbm_bytes
        rmw_bytes = 2 * 4 * 4 * p.head_dim * p.num_samples
        assert buffer_bytes <= rmw_bytes
    assert plan_backward(problem(), "bfloat16", lnc=2).num_buffers == 4  # upstream's K kept
    # a given buffer set fixes K (chunked calls with different N_q stay compatible)
    assert plan_backward(decoder, "bfloat16", lnc=2, buffers_per_core=4).num_buffers == 4
