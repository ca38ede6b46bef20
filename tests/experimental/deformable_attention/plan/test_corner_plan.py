"""The corner-block planner facts (plain Python): cells, scratch, support, the auto rule, the
forward plan with corner blocks."""

from __future__ import annotations

import pytest

from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (
    AUTO_MIN_SAMPLES_PER_CELL, build_sbuf_bytes, cell_starts, choose_forward_layout,
    corner_block_supported, corner_cells, resolve_gather_layout, samples_per_cell,
    scratch_bytes)
from nkilib_msda.experimental.deformable_attention.plan.forward_config import plan_forward
from nkilib_msda.validation.msda import MSDAProblem


def problem(n_q: int = 4096, shapes: tuple = ((50, 45), (25, 21)), c_h: int = 32,
            layout: str = "BLNC", batch: int = 1, n_p: int = 4) -> MSDAProblem:
    starts, acc = [], 0
    for h, w in shapes:
        starts.append(acc)
        acc += h * w
    return MSDAProblem(batch=batch, num_queries=n_q, num_heads=8, head_dim=c_h,
                       num_levels=len(shapes), num_points=n_p, spatial_shapes=tuple(shapes),
                       level_start_index=tuple(starts), value_layout=layout,
                       sampling_locations_layout="BQHLP2", align_corners=False,
                       padding_mode="zeros")


def test_cells_and_scratch() -> None:
    p = problem(shapes=((3, 4), (2, 2)), batch=2)
    assert cell_starts(p) == (0, 20)
    assert corner_cells(p) == 20 + 9 + 1
    assert scratch_bytes(p, "bfloat16", "corner-block") == 2 * 30 * 8 * 4 * 32 * 2
    assert scratch_bytes(p, "bfloat16", "four-corner") == 0
    assert samples_per_cell(p) == pytest.approx(4096 * 2 * 4 / 30)


def test_auto_rule_encoder_vs_decoder() -> None:
    encoder = problem(n_q=20000, shapes=((100, 100),))
    decoder = problem(n_q=300, shapes=((150, 150),))
    assert samples_per_cell(encoder) >= AUTO_MIN_SAMPLES_PER_CELL > samples_per_cell(decoder)
    for lnc in (1, 2):
        assert choose_forward_layout(encoder, "bfloat16", lnc) == "corner-block"
        assert choose_forward_layout(decoder, "bfloat16", lnc) == "four-corner"


def test_unsupported_cases_keep_four_corners() -> None:
    assert not corner_block_supported(problem(c_h=64), "bfloat16")
    assert not corner_block_supported(problem(c_h=24), "bfloat16")   # 128 // 24 = 5 columns
    assert not corner_block_supported(problem(), "float32")
    assert corner_block_supported(problem(c_h=8), "float16")
    assert choose_forward_layout(problem(n_q=20000, c_h=64), "bfloat16") == "four-corner"
    # tiny maps: (H+1)(W+1) > 1.25 HW, so the scratch bound decides despite many samples
    tiny = problem(n_q=20000, shapes=((3, 3), (2, 2)))
    assert samples_per_cell(tiny) > AUTO_MIN_SAMPLES_PER_CELL
    assert scratch_bytes(tiny, "bfloat16", "corner-block") > 5 * 13 * 8 * 32 * 2
    assert choose_forward_layout(tiny, "bfloat16") == "four-corner"


def test_resolve_gather_layout() -> None:
    enc = problem(n_q=20000, shapes=((100, 100),))
    assert resolve_gather_layout("corner-block", enc, "bfloat16", 1, "transpose")
    assert resolve_gather_layout("auto", enc, "bfloat16", 2, "transpose")
    assert not resolve_gather_layout("auto", enc, "bfloat16", 2, "copy")
    assert not resolve_gather_layout("four-corner", enc, "bfloat16", 1, "transpose")
    with pytest.raises(ValueError, match="gather_layout"):
        resolve_gather_layout("diagonal", enc, "bfloat16", 1, "transpose")
    with pytest.raises(ValueError, match="gather_method='transpose'"):
        resolve_gather_layout("corner-block", enc, "bfloat16", 1, "copy")


def test_forward_plan_with_corner_blocks() -> None:
    """The forward plan reserves the build tiles, keeps whole samples per DMA block and
    refuses an unsupported shape."""
    p = problem(n_p=3, shapes=((50, 45), (25, 21), (13, 9)))
    cfg = plan_forward(p, "bfloat16", lnc=2, corner_blocks=True)
    assert cfg.corner_blocks
    assert cfg.sbuf_buffers()["corner_build"] == (build_sbuf_bytes(p, "bfloat16"), 1)
    assert all(d0 % 4 == 0 and dn % 4 == 0 for d0, dn in cfg.dma_blocks(cfg.q_pack))
    assert "corner_build" not in plan_forward(p, "bfloat16", lnc=2).sbuf_buffers()
    with pytest.raises(ValueError, match="corner_blocks"):
        plan_forward(problem(c_h=64), "bfloat16", corner_blocks=True)
    with pytest.raises(ValueError, match="corner_blocks"):
        plan_forward(p, "float32", corner_blocks=True)
