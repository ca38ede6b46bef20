"""The folded grad_value scatter (backward_scatter_fold) in the strict emulator against the
float64 reference: decoder-like shapes (few queries over a large map) where the plan folds
D = 128 // P_s slices per scatter, both value layouts, both padding modes, LNC 1 and 2,
ragged tails, edge-heavy locations; the emulator re-checks every scatter's unique targets."""

from __future__ import annotations

import numpy as np
import pytest

from msda_cases import MSDACase
from nkilib_msda.reference import ms_deformable_attention_bwd_ref
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd import (
    backward_inputs, check_gradients, run_bwd)
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd_knobs import config_for

CASES = [
    # 40 queries: 2 full blocks + a 64-partition tail
    MSDACase(name="blnc-zeros", num_queries=40, num_heads=8, head_dim=16, num_points=4, spatial_shapes=((60, 60),)),
    # a 1x1 level disables x-pairs in BNLC, so the scatter folds there too
    MSDACase(name="bnlc-border", num_queries=21, num_heads=8, head_dim=16, num_points=3,
             spatial_shapes=((48, 50), (1, 1)), value_layout="BNLC", padding_mode="border", align_corners=True,
             locations_layout="B2QHLP"),
    MSDACase(name="blnc-fp32", num_queries=19, num_heads=4, head_dim=8, num_points=2, spatial_shapes=((40, 44),),
             value_dtype="float32"),
    MSDACase(name="batch2-fp16", batch=2, num_queries=27, num_heads=8, head_dim=16, num_points=2,
             spatial_shapes=((50, 40),), value_dtype="float16"),
]


def _edge_heavy(args: dict, seed: int) -> dict:
    loc = args["sampling_locations"]
    args["sampling_locations"] = np.random.default_rng(seed).uniform(-0.3, 1.3, loc.shape).astype(loc.dtype)
    return args


@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_folded_scatter(c, lnc):
    grad, args = backward_inputs(c, seed=lnc)
    args = _edge_heavy(args, lnc)
    cfg = config_for(grad, args, lnc=lnc)
    assert cfg.scatter_fold > 1 and cfg.scatter_fold * cfg.scatter_partitions == 128, cfg.describe()
    *outs, report = run_bwd(grad, args, lnc=lnc, report=True)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)
    # one scatter per (live slice, corner group, point) of each block: D times fewer than unfolded
    live_slices = 0
    for core in range(lnc):
        for _, blocks, parts in cfg.super_tiles(core):
            live_slices += blocks * -(-parts // cfg.scatter_partitions)
    scatters = sum(s.instructions for (kind, _), s in report.dma.items() if kind == "indirect_rmw")
    assert scatters == c.batch * live_slices * (4 // cfg.scatter_fold) * c.num_points


@pytest.mark.parametrize("c", CASES[:1], ids=lambda c: c.name)
def test_folded_equals_unfolded_within_rounding(c):
    """The same P_s unfolded (a cap of P_s indices per scatter) adds the same terms in another
    order: both within the reference tolerance and within fp32 rounding of each other."""
    grad, args = backward_inputs(c, seed=5)
    args = _edge_heavy(args, 5)
    cfg = config_for(grad, args)
    folded = run_bwd(grad, args)
    unfolded = run_bwd(grad, args, max_scatter_indices_per_indirect=cfg.scatter_partitions)
    assert config_for(grad, args, max_scatter_indices_per_indirect=cfg.scatter_partitions).scatter_fold == 1
    ref = ms_deformable_attention_bwd_ref(grad, **args)
    check_gradients(folded, ref, c)
    check_gradients(unfolded, ref, c)
    scale = float(np.max(np.abs(unfolded[0].astype(np.float64))))
    assert np.max(np.abs(folded[0].astype(np.float64) - unfolded[0].astype(np.float64))) <= 2e-2 * scale
    for a, b in zip(folded[1:], unfolded[1:]):  # the gathers are unchanged: bitwise equal
        np.testing.assert_array_equal(a, b)
