"""Letting the calibration data vote on the timing model's structure
(nkilib_msda/tools/calibration/structures.py): on synthetic graphs whose structures are known,
and on a real recorded graph re-mapped through ``timing.scenarios``."""

import pickle

import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nki, nl, simulate
from nkilib_msda.simulator.timing.scenarios import STRUCTURES
from nkilib_msda.tools.calibration import fit, structures

RNG = np.random.default_rng()


class _FakeTiming:
    """Modelled time ``factor * (x * work + 10)`` µs (one unknown ``x``); ``scenarios`` maps
    ``"<structure>/nominal"`` to the same graph with that structure's factor."""

    def __init__(self, work, factors, structure="nominal"):
        self.work, self.factors, self.structure = work, factors, structure

    def ranges(self):
        return {"x": (1.0, 2.0, 5.0)}

    def evaluate(self, params):
        return self.factors[self.structure] * (params.get("x", 2.0) * self.work + 10.0)

    @property
    def scenarios(self):
        return {f"{s}/nominal": _FakeTiming(self.work, self.factors, s) for s in STRUCTURES}


def _samples(kernel, works, factors, truth):
    """Records whose recorded time is the model at x = 2 under structure ``truth``, with a
    few percent of noise."""
    return [fit.Sample(kernel, f"{kernel}|w={w}",
                       _FakeTiming(w, factors, truth).evaluate({}) * RNG.uniform(0.97, 1.03),
                       _FakeTiming(w, factors)) for w in works]


@pytest.mark.parametrize("truth", STRUCTURES)
def test_the_structure_that_made_the_records_is_preferred(truth):
    pytest.importorskip("scipy")
    # the structures differ on the few-partition records only (factor != 1 on half of them)
    others = {s: float(RNG.uniform(1.3, 1.6)) for s in STRUCTURES}
    slow = dict(others, **{truth: 1.0})
    works = RNG.uniform(1.0, 300.0, 8)
    fit_set = _samples("demo_fit", works[:4], dict.fromkeys(STRUCTURES, 1.0), truth) + \
        _samples("demo_fit", works[4:], slow, truth)
    check_set = _samples("demo_check", RNG.uniform(1.0, 300.0, 3), slow, truth)
    result = structures.compare_structures(fit_set, check_set)
    assert result["preferred"] == truth
    row = result["structures"][truth]
    assert row["both_nominal"]["median_abs_err"] < 0.04
    assert row["both_nominal"]["n"] == 11
    for s in STRUCTURES:
        if s != truth:
            assert result["structures"][s]["both_nominal"]["worst_factor"] > 1.25
    # per record: the ratio under each structure, at nominal parameters
    for s in fit_set[4:] + check_set:
        ratios = result["ratios"][s.key]
        assert ratios[truth] == pytest.approx(1.0, abs=0.04)
        for other in STRUCTURES:
            assert ratios[other] == pytest.approx(slow[other] / slow[truth], rel=0.04)
    table = structures.structure_table(result)
    assert table.count(f"| {truth} | fit + check |") == 1
    # the records the nominal structure gets wrong by 25 % or more, with every structure's ratio
    listed = structures.record_table(result).splitlines()[2:]
    assert len(listed) == (0 if truth == "nominal" else len(fit_set[4:] + check_set))


def test_an_unknown_structure_or_an_empty_fit_set_is_refused():
    with pytest.raises(ValueError, match="structure: expected one of"):
        structures.restructured([], "everything")
    with pytest.raises(ValueError, match="fit_set must hold at least one sample"):
        structures.compare_structures([], [])


def test_a_recorded_graph_is_re_mapped_to_each_structure():
    """A flat HBM->HBM copy (one contiguous run: one DMA engine under ``nominal``, all 16
    under ``spread``): the re-mapped sample of a pickled graph models it faster spread, and
    ``nominal`` leaves the sample unchanged."""
    x = RNG.standard_normal((int(RNG.integers(512, 1024)), 1024)).astype(np.float32)

    def kernel(h):
        out = nl.ndarray(h.shape, h.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=h)
        return out

    out, report = simulate(nki.jit(kernel), report=True)(x)
    np.testing.assert_array_equal(out, x)
    timing = pickle.loads(pickle.dumps(report.timing))  # as the calibration cache keeps it
    sample = fit.Sample("demo", "demo|copy", 100.0, timing)
    by = {s: structures.restructured([sample], s)[0] for s in STRUCTURES}
    assert by["nominal"] is sample
    assert by["spread"].timing.scenario == "spread/nominal"
    nominal_us = by["nominal"].timing.evaluate({})
    assert nominal_us == pytest.approx(report.timing.estimate_us)
    assert by["spread"].timing.evaluate({}) < 0.5 * nominal_us
    assert by["spread"].timing.evaluate({}) == pytest.approx(
        report.timing.scenarios["spread/nominal"].estimate_us)


def test_the_spread_all_hypothesis_moves_direct_copies_that_no_structure_moves():
    """A direct HBM->SBUF copy into 8 partitions (one DMA engine by the documented partition
    rule): every model structure leaves it alone; ``spread-all`` puts it on 16 engines."""
    parts = 8
    x = RNG.standard_normal((parts, int(RNG.integers(16_384, 32_768)))).astype(np.float32)

    def kernel(h):
        t = nl.ndarray(h.shape, h.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h)
        out = nl.ndarray(h.shape, h.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    out, report = simulate(nki.jit(kernel), report=True)(x)
    np.testing.assert_array_equal(out, x)
    sample = fit.Sample("demo", "demo|narrow", 100.0, pickle.loads(pickle.dumps(report.timing)))
    us = {s: structures.restructured([sample], s)[0].timing.evaluate({})
          for s in STRUCTURES + structures.HYPOTHESES}
    assert us["spread"] == pytest.approx(us["nominal"]) and us["serial"] == pytest.approx(us["nominal"])
    assert us["spread-all"] < 0.5 * us["nominal"]


def test_records_are_grouped_by_family_and_attention_kind():
    assert structures.record_group("mlp_cte|batch=1,hidden=4096") == "mlp_cte"
    assert structures.record_group("attention_cte|bs=4,cp_degree=2,cp_rank_id=1,kv_seqlen=1024"
                                   ) == "attention_cte: context parallel"
    assert structures.record_group("attention_cte|bs=2,prior_len=4096,prior_used_len=1,seqlen_q=8"
                                   ) == "attention_cte: prefix cache"
    assert structures.record_group("attention_cte|bs=1,seqlen_kv=256,seqlen_q=256"
                                   ) == "attention_cte: other"


def test_the_group_table_counts_records_off_by_more_than_2x():
    rng = np.random.default_rng()
    ratios = rng.uniform(0.3, 3.0, 9)
    comparison = {"structures": {"nominal": {}, "spread": {}},
                  "ratios": {f"mlp_cte|batch={i}": {"nominal": r, "spread": 1.0}
                             for i, r in enumerate(ratios)}}
    row = structures.group_table(comparison).splitlines()[2]
    worst = np.maximum(ratios, 1 / ratios)
    assert row.startswith("| mlp_cte | 9 | ")
    assert f"{np.median(np.abs(ratios - 1)):.1%} / {worst.max():.2f}× ({int((worst > 2).sum())} > 2×)" in row
    assert row.endswith("| 0.0% / 1.00× (0 > 2×) |")
