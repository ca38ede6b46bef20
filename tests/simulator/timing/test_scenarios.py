"""Timing scenarios (simulator/timing/scenarios.py): each structure changes exactly the
DMA-engine rule it names, each parameter set pins what it names, and ``nominal/nominal`` is
``report.timing``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _core_helpers import in_kernel, load, store
from nkilib_msda.simulator import nisa, nl
from nkilib_msda.simulator.timing.constants import params_for
from nkilib_msda.simulator.timing.scenarios import (PARAMETER_SETS, SCENARIOS, STRUCTURES,
                                                    pinned_params)

RNG = np.random.default_rng()
BF16 = ml_dtypes.bfloat16


def _timing(body, *arrays, **kw):
    *_, report = in_kernel(body, *arrays, report=True, **kw)
    return report.timing


def _dma_busy(timing, name):
    """µs of work on the busiest DMA engine (all queues) under scenario ``name``."""
    return timing.scenarios[name].engine_busy_us["dma"]


def _four_indirect_transposes(banded: bool, table: np.ndarray, index: np.ndarray):
    """Four indirect ``dma_transpose`` gathers of 32-element bf16 rows of ``table`` (by
    ``index``, 128 x cols): into partitions 0-31 of four tiles (AWS's forward), or into the
    four 32-partition bands of one 128-partition tile (ours)."""
    rows = 128 * index.shape[1]

    def body(v, ix):
        idx = load(ix)
        big = nl.ndarray((128, rows), v.dtype, buffer=nl.sbuf)
        for k in range(4):
            dst = big[32 * k:32 * (k + 1), :] if banded else \
                nl.ndarray((32, rows), v.dtype, buffer=nl.sbuf)
            nisa.dma_transpose(dst=dst, src=v.ap([[32, rows], [1, 32]], vector_offset=idx))
        return None

    return _timing(body, table, index)


def test_an_indirect_transpose_into_32_partitions_is_4x_slower_only_under_the_partition_rule():
    table = RNG.standard_normal((1000, 32)).astype(BF16)
    index = RNG.integers(0, 1000, (128, int(RNG.integers(16, 33)))).astype(np.uint32)
    one_band = _four_indirect_transposes(False, table, index)
    banded = _four_indirect_transposes(True, table, index)
    for params in PARAMETER_SETS:
        nominal = f"nominal/{params}"
        spread = f"spread/{params}"
        assert _dma_busy(one_band, nominal) / _dma_busy(banded, nominal) == \
            pytest.approx(4.0, rel=0.04), params  # the index load adds to both
        assert _dma_busy(one_band, spread) / _dma_busy(banded, spread) == \
            pytest.approx(1.0, rel=0.01), params
        # spreading the banded one changes nothing: it already uses all 16 engines
        assert _dma_busy(banded, spread) == pytest.approx(_dma_busy(banded, nominal), rel=0.01)


def test_a_flat_hbm_to_hbm_copy_is_16x_faster_spread():
    rows = int(RNG.integers(512, 1024))
    x = RNG.standard_normal((rows, 1024)).astype(np.float32)  # 2-4 MiB, one contiguous run

    def body(h):
        out = nl.ndarray(h.shape, h.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=h)
        return out

    out, report = in_kernel(body, x, report=True)
    np.testing.assert_array_equal(out, x)
    t = report.timing
    for params in PARAMETER_SETS:
        one, spread = _dma_busy(t, f"nominal/{params}"), _dma_busy(t, f"spread/{params}")
        assert one / spread == pytest.approx(16.0, rel=0.01)
        # serial moves only software-DGE transfers: a static-queue copy is untouched
        assert t.scenarios[f"serial/{params}"].estimate_us == \
            t.scenarios[f"nominal/{params}"].estimate_us
    floor = t.params["launch_floor_us"]
    assert (t.estimate_us - floor) / (t.scenarios["spread/nominal"].estimate_us - floor) > 8


def test_spread_keeps_the_documented_rule_of_a_direct_copy_into_few_partitions():
    x = RNG.standard_normal((8, 4096)).astype(np.float32)  # 8 partitions: one engine
    t = _timing(lambda h: store(load(h)), x)
    for params in PARAMETER_SETS:
        assert t.scenarios[f"spread/{params}"].estimate_us == \
            t.scenarios[f"nominal/{params}"].estimate_us


def _swdge_spans(timing):
    """(start, end) µs of core 0's software-DGE transfers, from the Chrome trace."""
    events = timing.trace_events()
    tid = next(e["tid"] for e in events if e.get("ph") == "M" and e["pid"] == 0
               and e["args"].get("name") == "queue_swdge")
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e["pid"] == 0 and e["tid"] == tid)


def test_serial_puts_a_cores_software_dge_transfers_one_after_another():
    table = RNG.standard_normal((1000, 64)).astype(np.float32)
    index = RNG.integers(0, 1000, (128, 1)).astype(np.uint32)

    def body(ht, hi):
        idx = load(hi)
        g = nl.ndarray((128, 64), ht.dtype, buffer=nl.sbuf)
        for k in range(4):  # four independent gathers into disjoint partition bands
            nisa.dma_copy(dst=g[32 * k:32 * (k + 1), :],
                          src=ht.ap([[64, 32], [1, 64]], offset=0,
                                    vector_offset=idx[32 * k:32 * (k + 1), :], indirect_dim=0))
        return store(g)

    out, report = in_kernel(body, table, index, report=True)
    np.testing.assert_array_equal(out, table[index[:, 0]])
    t = report.timing
    parallel = _swdge_spans(t.scenarios["nominal/nominal"])
    serial = _swdge_spans(t.scenarios["serial/nominal"])
    assert len(parallel) == len(serial) == 4
    assert any(b[0] < a[1] for a, b in zip(parallel, parallel[1:]))  # overlapping
    assert all(b[0] >= a[1] - 1e-9 for a, b in zip(serial, serial[1:]))  # one at a time
    for (s0, e0), (s1, e1) in zip(parallel, serial):  # one engine instead of four
        assert e1 - s1 == pytest.approx(4 * (e0 - s0), rel=1e-6)
    work = sum(e - s for s, e in serial)
    assert t.scenarios["serial/nominal"].engine_busy_us["dma"] >= work - 1e-6


def test_the_nominal_scenario_is_report_timing():
    x = RNG.standard_normal((128, 512)).astype(np.float32)
    table = RNG.standard_normal((500, 64)).astype(np.float32)
    index = RNG.integers(0, 500, (128, 1)).astype(np.uint32)

    def body(h, ht, hi):
        idx = load(hi)
        g = nl.ndarray((128, 64), ht.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=g, src=ht.ap([[64, 128], [1, 64]], offset=0, vector_offset=idx,
                                       indirect_dim=0))
        y = load(h)
        z = nl.ndarray(y.shape, y.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=z, data=y, op0=nl.multiply, operand0=3.0)
        return store(z), store(g)

    for lnc in (1, 2):
        t = _timing(body, x, table, index, lnc=lnc)
        s = t.scenarios["nominal/nominal"]
        assert s is not t and s.scenario == "nominal/nominal" == t.scenario
        for field in ("estimate_us", "low_us", "high_us", "bound_by", "lower_bound_us",
                      "engine_busy_us", "critical_path_us", "makespan_us", "params"):
            assert getattr(s, field) == getattr(t, field), field
        assert list(t.scenarios) == list(SCENARIOS) and len(t.scenarios) == 9
        # every scenario has the fields of report.timing, and its band holds its estimate
        for name in SCENARIOS:
            sc = t.scenarios[name]
            assert sc.low_us <= sc.estimate_us <= sc.high_us, name
            assert sc.evaluate() == pytest.approx(sc.estimate_us)


def test_parameter_sets_pin_the_ends_of_the_named_ranges():
    ranges = {p.name: p for p in params_for("trn2")}
    swdge = pinned_params("trn2", "swdge-bound")
    assert swdge == {"swdge_descriptor_ns": ranges["swdge_descriptor_ns"].high,
                     "swdge_fixed_ns": ranges["swdge_fixed_ns"].high,
                     "dma_indirect_descriptor_ns": ranges["dma_indirect_descriptor_ns"].low}
    desc = pinned_params("trn2", "descriptor-bound")
    assert desc == {"swdge_descriptor_ns": ranges["swdge_descriptor_ns"].low,
                    "swdge_fixed_ns": ranges["swdge_fixed_ns"].low,
                    "dma_indirect_descriptor_ns": ranges["dma_indirect_descriptor_ns"].high}
    assert pinned_params("trn2", "nominal") == {}
    assert set(STRUCTURES) == {"nominal", "spread", "serial"}


def test_an_unknown_scenario_is_a_key_error_naming_the_choices():
    t = _timing(lambda h: store(load(h)), RNG.standard_normal((4, 8)).astype(np.float32))
    with pytest.raises(KeyError, match="spread/nominal"):
        t.scenarios["spread/everything"]


def test_the_robust_ratio_pairs_scenarios_and_corners():
    from nkilib_msda.simulator.timing.scenarios import robust_ratio

    def band(est, low, high):
        return {"estimate_us": est, "low_us": low, "high_us": high}

    ours = {"nominal/nominal": band(10, 5, 20), "spread/nominal": band(30, 20, 40)}
    theirs = {"nominal/nominal": band(40, 10, 80), "spread/nominal": band(31, 21, 60),
              "serial/nominal": band(1, 1, 1)}
    # paired: nominal 0.25 / 0.5 / 0.25; spread 0.97 / 0.95 / 0.67; serial has no pair
    assert robust_ratio(ours, theirs) == (30 / 31, "spread/nominal", "nominal")
    assert robust_ratio(ours, {"serial/nominal": band(1, 1, 1)}) is None
