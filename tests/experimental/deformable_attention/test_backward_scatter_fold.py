"""The folded grad_value scatter (backward_scatter_fold): when the plan folds, and brute-forced
per-instruction uniqueness of its targets (plain Python, no NKI)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from nkilib_msda.experimental.deformable_attention.plan.backward_config import buffer_index, plan_backward
from nkilib_msda.experimental.deformable_attention.plan.backward_scatter_plan import (default_scatter_partitions,
                                                                                      plan_scatter_fold,
                                                                                      scatter_dma_cost)
from nkilib_msda.validation.msda import MSDAProblem
from nkilib_msda.workloads import NKI_LIBRARY_SHAPES, level_starts

PARTITIONS = 128


def problem(n_q=40, n_h=8, c_h=32, n_p=4, shapes=((60, 60),), layout="BLNC", padding="zeros", align=False):
    return MSDAProblem(batch=1, num_queries=n_q, num_heads=n_h, head_dim=c_h, num_levels=len(shapes),
                       num_points=n_p, spatial_shapes=tuple(shapes), level_start_index=level_starts(shapes),
                       value_layout=layout, sampling_locations_layout="BQHLP2", align_corners=align,
                       padding_mode=padding)


def test_fold_rule():
    assert plan_scatter_fold(32, None, False, True) == 4
    assert plan_scatter_fold(64, None, False, True) == 2
    for args in ((128, None, False, True), (16, None, False, True), (32, 32, False, True),
                 (32, None, True, True), (32, None, False, False)):
        assert plan_scatter_fold(*args) == 1, args


@pytest.mark.parametrize("lnc", [1, 2])
def test_decoders_fold_and_encoders_do_not(lnc):
    """The side-by-side decoders fold every slice to 128 live partitions; the encoders keep
    P_s = 128 unfolded (docs/kernels.md, "Folded scatter")."""
    for name, shape in NKI_LIBRARY_SHAPES.items():
        cfg = plan_backward(shape, "bfloat16", lnc)
        if name.startswith("decoder"):
            assert cfg.scatter_fold * cfg.scatter_partitions == PARTITIONS, name
            assert {"fidx", "fwork", "fold_pad"} <= {n for n, _, _ in cfg.sbuf_tiles}
        else:
            assert (cfg.scatter_fold, cfg.scatter_partitions) == (1, PARTITIONS), name
    # the folded choice is the cheapest folded P_s below 128
    p = NKI_LIBRARY_SHAPES["decoder-small"]
    cfg = plan_backward(p, "bfloat16", lnc)
    costs = {ps: scatter_dma_cost(p, lnc, 1, cfg.groups, ps, plan_scatter_fold(ps, None, False, True))
             for ps in (1, 2, 4, 8, 16, 32, 64)}
    assert costs[cfg.scatter_partitions] == min(costs.values())
    assert default_scatter_partitions(p, lnc, 1, cfg.groups, pairs=True) in (32, 64, 128)


def test_no_fold_with_a_cap_pairs_or_a_channel_tile():
    p = problem()
    assert plan_backward(p, "bfloat16").scatter_fold > 1
    assert plan_backward(p, "bfloat16", max_scatter_indices_per_indirect=32).scatter_fold == 1
    assert plan_backward(problem(layout="BNLC"), "bfloat16").scatter_fold == 1  # x-pairs
    wide = plan_backward(problem(c_h=2048, n_p=2), "float32")
    assert wide.channel_tiles == ((0, 2048),) and wide.scatter_fold == 1


def _sample_rows(p: MSDAProblem, loc: np.ndarray, skip_invalid: bool):
    """(rows, live) per (query, head, level, point, corner), corner = 2 * y-corner + x-corner,
    as the kernel forms them: clamped pixel rows, and invalid corners marked not live."""
    n_q, n_h, n_l, n_p = loc.shape[:4]
    rows = np.zeros((n_q, n_h, n_l, n_p, 4), np.int64)
    live = np.ones_like(rows, bool)
    for lvl, ((height, width), start) in enumerate(zip(p.spatial_shapes, p.level_start_index)):
        u, v = loc[:, :, lvl, :, 0], loc[:, :, lvl, :, 1]
        x = u * (width - 1) if p.align_corners else u * width - 0.5
        y = v * (height - 1) if p.align_corners else v * height - 0.5
        if p.padding_mode == "border":
            x, y = np.clip(x, 0, width - 1), np.clip(y, 0, height - 1)
        x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
        for c in range(4):
            yc, xc = y0 + c // 2, x0 + c % 2
            ok = (xc >= 0) & (xc < width) & (yc >= 0) & (yc < height)
            pix = start + np.clip(yc, 0, height - 1) * width + np.clip(xc, 0, width - 1)
            h = np.arange(n_h).reshape(1, n_h, 1)
            row = pix * n_h + h if p.value_layout == "BLNC" else h * p.total_pixels + pix
            rows[:, :, lvl, :, c] = row
            if skip_invalid:
                live[:, :, lvl, :, c] = ok
    return rows, live


def _duplicates_per_instruction(p: MSDAProblem, loc: np.ndarray, ps: int, skip_invalid: bool) -> int:
    """Duplicate targets over every folded instruction (P_s = ``ps``) of every block (LNC 1)."""
    cfg = plan_backward(p, "bfloat16")
    k = -(-ps // cfg.groups)
    cfg = replace(cfg, scatter_partitions=ps, scatter_fold=PARTITIONS // ps, k_base=k, num_buffers=k)
    d_fold = cfg.scatter_fold
    rows, live = _sample_rows(p, loc, skip_invalid)
    rows = rows.reshape(-1, p.num_points, 4)    # sample row (q, h, l) = q * G + h * N_l + l
    live = live.reshape(-1, p.num_points, 4)
    dups = 0
    n_rows = rows.shape[0]
    for block0 in range(0, n_rows, cfg.partitions_per_block):
        n = min(cfg.partitions_per_block, n_rows - block0)
        for ci in range(-(-n // ps)):
            for g in range(4 // d_fold):
                for point in range(p.num_points):
                    targets = []
                    for d in range(d_fold):              # partition d * P_s + r of the instruction
                        for r in range(ps):
                            j = ci * ps + r              # the sample row's partition in the block
                            if j >= n or not live[block0 + j, point, g * d_fold + d]:
                                continue                 # out-of-range index: skipped
                            targets.append(buffer_index(cfg, j) + rows[block0 + j, point, g * d_fold + d])
                    dups += len(targets) - len(set(targets))
    return dups


@pytest.mark.parametrize("ps", [32, 64])
@pytest.mark.parametrize("layout,padding,align", [("BLNC", "zeros", False), ("BNLC", "border", True),
                                                  ("BLNC", "border", False), ("BNLC", "zeros", False)])
def test_folded_targets_are_unique_per_instruction(layout, padding, align, ps):
    """Edge-heavy locations (many corners off the map), two levels, a ragged tail: no folded
    instruction adds twice to one buffer row; counting the clamped rows of off-map corners
    instead (no skip) does give duplicates, so the skip is what the proof needs."""
    p = problem(n_q=37, n_h=4, n_p=3, shapes=((9, 11), (3, 2)), layout=layout, padding=padding, align=align)
    rng = np.random.default_rng(3)
    loc = rng.uniform(-0.3, 1.3, (p.num_queries, p.num_heads, p.num_levels, p.num_points, 2))
    loc[::5, :, :, 0, :] = rng.integers(0, 12, (len(loc[::5]), p.num_heads, p.num_levels, 2)) / 11  # exact edges
    assert _duplicates_per_instruction(p, loc, ps, skip_invalid=True) == 0
    if padding == "zeros":
        assert _duplicates_per_instruction(p, loc, ps, skip_invalid=False) > 0
