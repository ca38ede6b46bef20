"""Pipelined super-tiles of the MSDA backward (plan.pipelined: super-tile i + 1 loaded, prepared
and gathered before super-tile i's scatters) in the strict emulator: against the float64
reference, and bitwise equal to the same call emitted one super-tile after another (the scatters
keep their order, so the fp32 sums do too). Cases have several super-tiles per core and a
ragged last one (a partial block), corner-block and four-corner gathers, BLNC and BNLC
(x-pair scatters), LNC 1 and 2."""

from __future__ import annotations

import numpy as np
import pytest

from msda_cases import MSDACase
from nkilib_msda.experimental.deformable_attention.plan import backward_config
from nkilib_msda.reference import ms_deformable_attention_bwd_ref
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd import (
    backward_inputs, check_gradients, run_bwd)
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd_knobs import config_for

# G = 32 sample rows per query: 4 queries per block, 64 per 16-block super-tile
CASES = [
    MSDACase(name="blnc-ragged", num_queries=150, num_heads=8, head_dim=16, num_points=2,
             spatial_shapes=((12, 10), (6, 5), (3, 3), (2, 2))),
    MSDACase(name="bnlc-pairs-batch2", batch=2, num_queries=70, num_heads=8, head_dim=16, num_points=2,
             spatial_shapes=((9, 11), (5, 6), (3, 4), (2, 2)), value_layout="BNLC", padding_mode="border",
             locations_layout="B2QHLP"),
]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("layout", ["corner-block", "four-corner"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_pipelined_super_tiles_match_reference_and_serial_order(c, layout, lnc, monkeypatch):
    grad, args = backward_inputs(c, seed=lnc + 3)
    cfg = config_for(grad, args, lnc=lnc)
    cfg = backward_config.plan_backward(cfg.problem, str(args["value"].dtype), lnc, gather_layout=layout)
    assert cfg.pipelined and cfg.corner_blocks == (layout == "corner-block"), cfg.describe()
    assert max(len(list(cfg.super_tiles(core))) for core in range(lnc)) >= 2
    outs = run_bwd(grad, args, lnc=lnc, gather_layout=layout)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)
    # the same call with pipelining planned out (no ring of scatter data tiles can start)
    monkeypatch.setattr(backward_config, "SCATTER_WORK_BUFS", cfg.blocks_per_tile + 1)
    serial = backward_config.plan_backward(cfg.problem, str(args["value"].dtype), lnc, gather_layout=layout)
    assert not serial.pipelined
    for got, want in zip(outs, run_bwd(grad, args, lnc=lnc, gather_layout=layout)):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))
