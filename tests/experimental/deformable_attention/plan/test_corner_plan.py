"""The corner-block cost model and decision (plain Python): counts, scratch, scenario rules."""

from __future__ import annotations

import pytest

from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (
    PARAMETER_SETS, STRUCTURES, backward_phases, cell_starts, choose_forward_layout,
    corner_block_supported, corner_cells, forward_phases, modelled_us, scenario_params,
    scratch_bytes)
from nkilib_msda.simulator.timing.constants import params_for
from nkilib_msda.validation.msda import MSDAProblem


def _problem(n_q: int = 4096, shapes: tuple = ((50, 45), (25, 21)), c_h: int = 32,
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


def _indirect(phases) -> tuple[float, float]:
    desc = sum(t.descriptors for ph in phases for t in ph.transfers if t.swdge)
    nbytes = sum(t.nbytes for ph in phases for t in ph.transfers if t.swdge)
    return desc, nbytes


def test_cells_and_scratch() -> None:
    p = _problem(shapes=((3, 4), (2, 2)), batch=2)
    assert cell_starts(p) == (0, 20)
    assert corner_cells(p) == 20 + 9 + 1
    assert scratch_bytes(p, "bfloat16", "corner-block") == 2 * 30 * 8 * 4 * 32 * 2
    assert scratch_bytes(p, "bfloat16", "four-corner") == 0


def test_forward_counts_quarter_descriptors_same_bytes() -> None:
    p = _problem()
    samples = p.batch * p.num_queries * p.num_heads * p.num_levels * p.num_points
    for lnc in (1, 2):
        four, four_bytes = _indirect(forward_phases(p, "bfloat16", lnc, "four-corner"))
        block, block_bytes = _indirect(forward_phases(p, "bfloat16", lnc, "corner-block"))
        assert four == 4 * samples / lnc
        assert block == samples / lnc
        assert block_bytes == four_bytes
    # the corner-block forward has a build phase, the four-corner one does not
    assert [ph.name for ph in forward_phases(p, "bfloat16", 1, "corner-block")] == ["build", "main"]
    assert [ph.name for ph in forward_phases(p, "bfloat16", 1, "four-corner")] == ["main"]


def test_scenario_params_move_only_what_they_name() -> None:
    ps = {q.name: q for q in params_for("trn2")}
    nominal = scenario_params("nominal", "nominal")
    swdge = scenario_params("serial", "swdge-bound")
    desc = scenario_params("spread", "descriptor-bound")
    assert swdge["swdge_descriptor_ns"] == ps["swdge_descriptor_ns"].high
    assert swdge["dma_indirect_descriptor_ns"] == ps["dma_indirect_descriptor_ns"].low
    assert desc["swdge_fixed_ns"] == ps["swdge_fixed_ns"].low
    assert desc["dma_indirect_descriptor_ns"] == ps["dma_indirect_descriptor_ns"].high
    for name in nominal:
        if name not in ("swdge_descriptor_ns", "swdge_fixed_ns", "dma_indirect_descriptor_ns"):
            assert swdge[name] == desc[name] == nominal[name]
    with pytest.raises(ValueError, match="structure"):
        scenario_params("sideways", "nominal")
    with pytest.raises(ValueError, match="parameters"):
        scenario_params("nominal", "medium")


def test_serial_structure_slows_indirect_work_only() -> None:
    p = _problem()
    four = forward_phases(p, "bfloat16", 1, "four-corner")
    assert modelled_us(four, 1, "serial") > 4 * modelled_us(four, 1, "nominal")
    assert modelled_us(four, 1, "spread") == pytest.approx(modelled_us(four, 1, "nominal"))


def test_time_is_monotone_in_the_band() -> None:
    p = _problem()
    for design in ("four-corner", "corner-block", "x-pair"):
        ph = forward_phases(p, "bfloat16", 2, design)
        for st in STRUCTURES:
            low, high = modelled_us(ph, 2, st, "low"), modelled_us(ph, 2, st, "high")
            for ps in PARAMETER_SETS:
                assert low <= modelled_us(ph, 2, st, ps) <= high


def test_decision_encoder_vs_decoder() -> None:
    encoder = _problem(n_q=20000, shapes=((100, 100),))
    decoder = _problem(n_q=300, shapes=((150, 150),))
    for lnc in (1, 2):
        assert choose_forward_layout(encoder, "bfloat16", lnc) == "corner-block"
        assert choose_forward_layout(decoder, "bfloat16", lnc) == "four-corner"


def test_unsupported_cases_keep_four_corners() -> None:
    assert not corner_block_supported(_problem(c_h=64), "bfloat16")
    assert not corner_block_supported(_problem(), "float32")
    assert choose_forward_layout(_problem(n_q=20000, c_h=64), "bfloat16", 1) == "four-corner"
    # tiny maps: (H+1)(W+1) > 1.25 HW, the scratch bound decides
    tiny = _problem(n_q=20000, shapes=((3, 3), (2, 2)))
    assert scratch_bytes(tiny, "bfloat16", "corner-block") > 5 * 13 * 8 * 32 * 2
    assert choose_forward_layout(tiny, "bfloat16", 1) == "four-corner"


def test_backward_designs() -> None:
    p = _problem()
    names = [ph.name for ph in backward_phases(p, "bfloat16", 2, "corner-block")]
    assert names == ["build", "zero", "main", "reduce", "fold"]
    assert [ph.name for ph in backward_phases(p, "bfloat16", 2, "four-corner")] == \
        ["zero", "main", "reduce"]
    with pytest.raises(ValueError, match="design"):
        backward_phases(p, "bfloat16", 2, "diagonal")


def test_forward_plan_with_corner_blocks() -> None:
    """The forward plan reserves the build tiles, keeps whole samples per DMA block and
    refuses an unsupported shape."""
    from nkilib_msda.experimental.deformable_attention.plan.corner_plan import build_sbuf_bytes
    from nkilib_msda.experimental.deformable_attention.plan.forward_config import plan_forward
    p = _problem(n_p=3, shapes=((50, 45), (25, 21), (13, 9)))
    cfg = plan_forward(p, "bfloat16", lnc=2, corner_blocks=True)
    assert cfg.corner_blocks and cfg.sbuf_buffers()["corner_build"] == (build_sbuf_bytes(p, "bfloat16"), 1)
    assert all(d0 % 4 == 0 and dn % 4 == 0 for d0, dn in cfg.dma_blocks(cfg.q_pack))
    assert "corner_build" not in plan_forward(p, "bfloat16", lnc=2).sbuf_buffers()
    with pytest.raises(ValueError, match="corner_blocks"):
        plan_forward(_problem(c_h=64), "bfloat16", corner_blocks=True)
    with pytest.raises(ValueError, match="corner_blocks"):
        plan_forward(p, "float32", corner_blocks=True)
