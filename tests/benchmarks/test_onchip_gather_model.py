"""benchmarks/onchip_gather_model.py: the arithmetic on one hand-computed level, the fit and
uint16 limits, and the per-scenario verdict on a synthetic side-by-side cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from onchip_gather_model import (FAST_CYCLES, SLOW_CYCLES, level_cost,  # noqa: E402
                                 shape_verdict)

from nkilib_msda.workloads import NKI_LIBRARY_SHAPES  # noqa: E402


def test_basic_level0_by_hand() -> None:
    lv = level_cost(NKI_LIBRARY_SHAPES["basic"], 0)   # 50 x 45, B 2, N_q 256, N_h 8, N_p 8, C_h 32
    assert lv.map_bytes == 50 * 45 * 32 * 2 == 144_000
    assert lv.fits_one_partition                      # 144,000 <= 204,800 (trn2 planner budget)
    assert lv.ngather_fill_bytes == 144_000 * 128 * 8 * 2 == 294_912_000
    assert lv.local_partition_bytes == 52 * 47 * 2 == 4_888
    assert lv.local_fill_bytes == 144_000 * 8 * 2
    assert lv.elements == 2 * 256 * 8 * 8 * 4 * 32 == 4_194_304
    # 4,194,304 / 128 partitions = 32,768 cycles at 1.2 GHz = 27.3 µs; 16x that
    assert lv.gpsimd_us(FAST_CYCLES) == pytest.approx(32_768 / 1.2e3)
    assert lv.gpsimd_us(SLOW_CYCLES) == pytest.approx(16 * 32_768 / 1.2e3)
    # 294,912,000 B over 16 engines x 23 B/ns
    assert lv.ngather_fill_us == pytest.approx(294_912_000 / 368 / 1e3)


def test_limits_and_errors() -> None:
    lv = level_cost(NKI_LIBRARY_SHAPES["tsa-base"], 0)   # 200 x 200: 2.56 MB per head
    assert not lv.fits_one_partition and lv.fits_16_partitions
    assert lv.local_offsets_fit_uint16                   # 202 * 202 = 40,804 < 65,536
    with pytest.raises(ValueError, match="level: expected 0 <= level < 1, got 1"):
        level_cost(NKI_LIBRARY_SHAPES["tsa-base"], 1)


def _row(low: float, est: float, high: float, vector: float = 100.0) -> dict:
    scenarios = {s: {"low_us": low, "estimate_us": est, "high_us": high}
                 for s in ("nominal/nominal", "serial/nominal")}
    scenarios["serial/nominal"] = {"low_us": 10 * low, "estimate_us": 10 * est, "high_us": 10 * high}
    return {"timing": {"scenarios": scenarios, "engine_busy_us": {"vector": vector}}}


def test_verdict_counts_only_scenarios_where_ours_is_slower() -> None:
    case = NKI_LIBRARY_SHAPES["decoder-small"]
    # ours at 1,000 / 10,000 µs nominal; the design's fast end is launch + max(fill, gather,
    # Vector 100) and its slow end adds all three, both well under 10,000 and over 100
    runs = {"ours/fwd/decoder-small/lnc1": _row(800.0, 1000.0, 3000.0),
            "aws/fwd/decoder-small/lnc1": _row(500.0, 600.0, 900.0)}
    v = shape_verdict(case, runs)
    assert v.ngather_us is None                          # 1.44 MB per head: no single partition
    assert v.local_us is not None
    fast, slow = v.local_us
    assert 100.0 < fast < slow < 1000.0
    assert sorted(v.wins(v.local_us, 1)) == ["nominal/nominal", "serial/nominal"]
    assert v.aws_fastest_us == 500.0
    # where ours is faster than the design's slow end, no win is counted
    runs["ours/fwd/decoder-small/lnc1"] = _row(10.0, slow - 1.0, slow)
    v = shape_verdict(case, runs)
    assert v.wins(v.local_us, 1) == ["serial/nominal"]
    assert v.wins(v.local_us, 1, corner=0) == []        # our low corners: 10 and 100 µs < slow
    with pytest.raises(KeyError, match="ours/fwd/basic/lnc1"):
        shape_verdict(NKI_LIBRARY_SHAPES["basic"], runs)
