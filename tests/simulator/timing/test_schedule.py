"""Timing model: scheduling of small kernels (overlap, dependencies, DMA, LNC 2, API)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _core_helpers import in_kernel, load, store
from nkilib_msda.simulator import lnc as nki_lnc
from nkilib_msda.simulator import nisa, nl
from nkilib_msda.simulator.timing.constants import PARAM_NAMES, params_for

RNG = np.random.default_rng(19)
F = 512  # elements per partition: above MIN_II, so durations follow N


def _timing(body, *arrays, **kw):
    *_, report = in_kernel(body, *arrays, report=True, **kw)
    return report.timing


def _chain(t, steps, engine):
    """``steps`` dependent ``x * 1.0`` instructions on ``engine``, each into a new tile."""
    for _ in range(steps):
        nxt = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=nxt, data=t, op0=nl.multiply, operand0=1.0, engine=engine)
        t = nxt
    return t


def _vector_chain(steps):
    def body(h):
        return store(_chain(load(h), steps, nisa.engine.vector))
    return body


def _x(shape=(128, F)):
    return RNG.standard_normal(shape).astype(np.float32)


def test_dependent_chain_on_one_engine_takes_the_sum_of_its_times():
    x = _x()
    t4, t8 = _timing(_vector_chain(4), x), _timing(_vector_chain(8), x)
    one = (t8.engine_busy_us["vector"] - t4.engine_busy_us["vector"]) / 4
    # fp32 tensor_scalar: N cycles at 0.96 GHz plus the static overhead (nominal 64 cycles)
    assert one == pytest.approx((F + t4.params["compute_overhead_cycles"]) / 0.96 / 1e3)
    latency = t4.params["dependency_latency_ns"] / 1e3
    assert t8.estimate_us - t4.estimate_us == pytest.approx(4 * (one + latency), rel=1e-6)
    # without the dependency latency, the chain is exactly the sum of the durations
    no_latency = {"dependency_latency_ns": 0.0}
    assert t8.evaluate(no_latency) - t4.evaluate(no_latency) == pytest.approx(4 * one, rel=1e-6)


def test_independent_work_on_two_engines_overlaps():
    x, y = _x(), _x()
    steps = 8

    def body(kind):
        def run(hx, hy):
            a, b = load(hx), load(hy)
            if kind in ("vector", "both"):
                a = _chain(a, steps, nisa.engine.vector)
            if kind in ("scalar", "both"):
                b = _chain(b, steps, nisa.engine.scalar)
            return store(a), store(b)
        return run

    base, vec, sca, both = (_timing(body(k), x, y).estimate_us
                            for k in ("none", "vector", "scalar", "both"))
    work_v, work_s, work_both = vec - base, sca - base, both - base
    assert min(work_v, work_s) > 0.3 * max(work_v, work_s)  # comparable amounts of work
    assert work_both == pytest.approx(max(work_v, work_s), rel=0.1)  # near the larger ...
    assert work_both < 0.75 * (work_v + work_s)  # ... not the sum


def test_cross_engine_dependency_serialises():
    x = _x()

    def alternating(hx):
        t = load(hx)
        for _ in range(4):
            t = _chain(t, 1, nisa.engine.vector)
            t = _chain(t, 1, nisa.engine.scalar)
        return store(t)

    def independent(hx):
        t = load(hx)
        a = _chain(t, 4, nisa.engine.vector)
        b = _chain(t, 4, nisa.engine.scalar)
        return store(a), store(b)

    alt, ind = _timing(alternating, x), _timing(independent, x)
    busy = alt.engine_busy_us["vector"] + alt.engine_busy_us["scalar"]
    assert busy == pytest.approx(ind.engine_busy_us["vector"] + ind.engine_busy_us["scalar"])
    # every Vector and Scalar instruction is on the critical path, one after the other
    assert alt.critical_path_us["vector"] == pytest.approx(alt.engine_busy_us["vector"])
    assert alt.critical_path_us["scalar"] == pytest.approx(alt.engine_busy_us["scalar"])
    assert alt.makespan_us > busy
    # the independent version overlaps the two engines
    assert ind.critical_path_us.get("vector", 0) + ind.critical_path_us.get("scalar", 0) < \
        0.7 * busy
    assert alt.estimate_us - ind.estimate_us > 0.3 * busy


def _copy_kernel(rows, cols):
    def body(h):
        t = nl.ndarray((rows, cols), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h)
        o = nl.ndarray((rows, cols), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o
    return body


def test_dma_only_kernel_follows_bytes_and_descriptors():
    small = _timing(_copy_kernel(128, 1024), _x((128, 1024)))
    large = _timing(_copy_kernel(128, 4096), _x((128, 4096)))
    zero_desc = {"dma_descriptor_ns": 0.0}
    # bytes: 2 transfers x 128 x (4096 - 1024) x 4 B more, at 16 engines x 23 B/ns
    extra_bytes = 2 * 128 * (4096 - 1024) * 4
    assert large.evaluate(zero_desc) - small.evaluate(zero_desc) == pytest.approx(
        extra_bytes / (16 * 23.0) / 1e3, rel=1e-6)
    # descriptors: one per partition row; 128 rows over 16 engines = 8 per engine and
    # transfer, so each ns of per-descriptor cost adds 2 x 8 ns
    d1 = small.evaluate({"dma_descriptor_ns": 1.0})
    d101 = small.evaluate({"dma_descriptor_ns": 101.0})
    assert d101 - d1 == pytest.approx(2 * 8 * 100 / 1e3, rel=1e-6)
    # a quarter of the bytes on 8 partitions use one engine: 4x slower than large
    narrow = _timing(_copy_kernel(8, 4096 * 4), _x((8, 4096 * 4)))
    assert narrow.evaluate(zero_desc) - small.evaluate(zero_desc) > \
        2.5 * (large.evaluate(zero_desc) - small.evaluate(zero_desc))
    assert small.engine_busy_us["dma"] > 0 and small.bound_by != "vector"


def _split_kernel(steps):
    """Each program takes its half of the rows (LNC 2) or all of them (LNC 1)."""
    def body(h):
        n = nl.num_programs()
        pid = nl.program_id(0)
        rows = h.shape[0] // n
        out = nl.ndarray(h.shape, h.dtype, buffer=nl.shared_hbm)
        for r in range(pid * rows, (pid + 1) * rows, 128):
            t = nl.ndarray((128, h.shape[1]), h.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=h[r:r + 128, :])
            t = _chain(t, steps, nisa.engine.vector)
            nisa.dma_copy(dst=out[r:r + 128, :], src=t)
        return out
    return body


def test_evenly_split_lnc2_kernel_takes_about_half_the_lnc1_time():
    x = _x((1024, F))
    one = _timing(_split_kernel(6), x, lnc=1)
    two = _timing(_split_kernel(6), x, lnc=2)
    floor = one.params["launch_floor_us"]
    assert two.num_programs == 2 and one.num_programs == 1
    assert (two.estimate_us - floor) / (one.estimate_us - floor) == pytest.approx(0.5, abs=0.08)
    events = two.trace_events()
    assert {e["pid"] for e in events if e.get("ph") == "X"} == {0, 1}


def test_core_barrier_synchronises_the_cores():
    x = _x((256, F))

    def body(h):
        pid = nl.program_id(0)
        t = load(h[0:128, :]) if pid == 0 else load(h[128:256, :])
        t = _chain(t, 10 if pid == 0 else 1, nisa.engine.vector)  # core 0 is busier
        nki_lnc.core_barrier(h, (0, 1))
        t = _chain(t, 1, nisa.engine.vector)
        out = nl.ndarray((128, F), nl.float32, buffer=nl.shared_hbm)
        if pid == 0:
            nisa.dma_copy(dst=out, src=t)
        return out

    timing = _timing(body, x, lnc=2)
    barrier = [e for e in timing.trace_events() if e.get("name") == "core_barrier"]
    assert barrier, "the barrier is on the trace"
    ends = {}
    for e in timing.trace_events():
        if e.get("ph") == "X" and e["name"] == "tensor_scalar":
            ends.setdefault(e["pid"], []).append(e["ts"])
    # core 1's instruction after the barrier starts after core 0's ten-step chain
    assert max(ends[1]) > sorted(ends[0])[9]


def test_band_evaluate_and_monotonicity():
    t = _timing(_vector_chain(3), _x())
    assert t.low_us <= t.estimate_us <= t.high_us
    assert t.low_us < t.high_us
    assert t.evaluate() == pytest.approx(t.estimate_us, rel=1e-12)
    assert t.evaluate(t.params) == pytest.approx(t.estimate_us, rel=1e-12)
    low = {p.name: p.low for p in params_for("trn2")}
    high = {p.name: p.high for p in params_for("trn2")}
    assert t.evaluate(low) == pytest.approx(t.low_us) and t.evaluate(high) == pytest.approx(t.high_us)
    for name in PARAM_NAMES:
        values = [t.evaluate({name: v}) for v in np.linspace(low[name], high[name], 4)]
        assert all(b >= a - 1e-9 for a, b in zip(values, values[1:])), name
    grow = t.evaluate({"dependency_latency_ns": 1000.0})
    assert grow > t.estimate_us  # the chain's latencies are on the critical path
    assert t.lower_bound_us <= t.estimate_us
    assert t.lower_bound(low) <= t.lower_bound() == pytest.approx(t.lower_bound_us)
    assert t.lower_bound(high) <= t.high_us and t.lower_bound(low) <= t.low_us


def test_trace_is_json_with_events_for_every_engine_that_worked(tmp_path):
    def body(h):
        t = load(h)
        a = _chain(t, 2, nisa.engine.vector)
        b = _chain(t, 2, nisa.engine.scalar)
        c = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c, data1=t, data2=t, op=nl.add, engine=nisa.engine.gpsimd)
        p = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=a[:, 0:128], moving=b[:, 0:128])
        s = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        return store(s), store(c)

    t = _timing(body, _x())
    path = tmp_path / "trace.json"
    t.to_chrome_trace(path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    busy_tracks = {names[e["tid"]] for e in events if e.get("ph") == "X"}
    worked = {k for k, v in t.engine_busy_us.items() if v > 0}
    assert {"tensor", "vector", "scalar", "gpsimd", "queue_sync"} <= worked
    for engine in worked:
        if engine == "dma":
            assert any(n.startswith("dma") for n in busy_tracks)
        else:
            assert engine in busy_tracks, engine
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events if e.get("ph") == "X")
    assert doc["otherData"]["estimate_us"] == pytest.approx(t.estimate_us)


def test_timing_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("NKILIB_MSDA_EMULATOR_TIMING", "0")
    *_, report = in_kernel(_vector_chain(1), _x(), report=True)
    assert report.timing is None


def test_a_timing_failure_warns_and_leaves_the_emulation_intact(monkeypatch):
    from nkilib_msda.simulator.timing import TimingWarning, recorder

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(recorder, "compute_cycles", broken)
    x = _x()
    with pytest.warns(TimingWarning, match="boom"):
        out, report = in_kernel(_vector_chain(2), x, report=True)
    assert report.timing is None
    np.testing.assert_array_equal(out, x)


def test_dma_queues_do_not_block_each_other_but_keep_their_own_order():
    table = _x((1000, 64))
    rows = RNG.integers(0, 1000, (128, 1)).astype(np.uint32)

    def body(h, ht, hi):
        idx = load(hi)
        t = _chain(load(h), 20, nisa.engine.vector)  # ~15 us of Vector work
        late = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=late, src=t)  # static queue: waits for the chain
        g = nl.ndarray((128, 64), ht.dtype, buffer=nl.sbuf)  # software DGE: independent
        nisa.dma_copy(dst=g, src=ht.ap([[64, 128], [1, 64]], offset=0, vector_offset=idx,
                                       indirect_dim=0))
        return late, store(g)

    t = _timing(body, _x(), table, rows)
    spans = {}
    for e in t.trace_events():
        if e.get("ph") == "X" and e["name"] == "dma_copy" and e["cat"].startswith("dma_"):
            spans.setdefault(e["args"]["node"], e["ts"])
    starts = [spans[k] for k in sorted(spans)]  # program order: idx, x, late, gather, store(g)
    assert len(starts) == 5
    idx_load, x_load, late, gather, last = starts
    assert gather < late  # the swdge gather passes the waiting static-queue store
    assert last >= late  # the final store is on the static queue, behind the waiting one
