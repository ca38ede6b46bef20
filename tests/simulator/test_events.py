"""Instruction events: the one source of what an instruction does, the cost report and the
timing recorder as its subscribers (simulator/events.py, simulator/access_geometry.py)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from _core_helpers import in_kernel, load, store
from nkilib_msda.simulator import nisa, nl
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.events import ComputeEvent, DmaEvent, InstructionEvents
from nkilib_msda.simulator.memory import Storage
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.timing import Timeline, Timing

RNG = np.random.default_rng(5)


class _Recorder:
    """A subscriber that keeps every event."""

    wants_accesses = True

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_compute(self, program: int, event: ComputeEvent) -> None:
        self.events.append(("compute", event))

    def on_dma(self, program: int, event: DmaEvent) -> None:
        self.events.append(("dma", event))

    def on_barrier(self, program: int) -> None:
        self.events.append(("barrier", None))


def _subscribe(recorder: _Recorder) -> None:
    """Add ``recorder`` to the running program's event source."""
    ctx = current()
    ctx.events = InstructionEvents(ctx.program_id, [*ctx.events.subscribers, recorder])


def test_a_kernel_announces_each_instruction_once_with_its_accesses():
    rec = _Recorder()
    rows = int(RNG.integers(9, 120))
    x = RNG.standard_normal((rows, 64)).astype(np.float32)

    def body(h):
        _subscribe(rec)
        t = load(h)
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=out, data=t, op0=nl.multiply, operand0=2.0)
        return store(out)

    got, report = in_kernel(body, x, report=True)
    np.testing.assert_array_equal(got, 2 * x)
    kinds = [k for k, _ in rec.events]
    assert kinds == ["dma", "compute", "dma"]
    load_ev, op_ev, store_ev = (e for _, e in rec.events)
    assert isinstance(load_ev, DmaEvent) and load_ev.direction == "hbm_to_sbuf"
    (dst,) = load_ev.writes
    assert (dst.buffer, dst.p0, dst.p1, dst.nbytes) == ("sbuf", 0, rows, rows * 64 * 4)
    assert (dst.lo, dst.hi, dst.run_bytes) == (0, 64 * 4, 64 * 4)
    (src,) = load_ev.reads
    assert src.buffer.endswith("hbm") and (src.p0, src.p1) == (0, 1) and src.contiguous
    assert isinstance(op_ev, ComputeEvent) and op_ev.engine == "vector"
    assert op_ev.elements == rows * 64 and op_ev.writes[0].elems_per_partition == 64
    assert store_ev.direction == "sbuf_to_hbm"
    # the report counted the same instructions it was told about
    assert report.instruction_count("dma") == 2
    assert report.instruction_count("vector", "tensor_scalar") == 1
    assert report.timing is not None and report.timing.num_nodes == 5  # issue + transfer per DMA, one compute


def test_an_unknown_engine_raises_naming_it():
    events = InstructionEvents(0, [CostReport()])
    with pytest.raises(ValueError, match=r"engine must be one of .* got 'warp'"):
        events.compute("warp", "op", 1)
    with pytest.raises(ValueError, match=r"kind must be one of .* got 'teleport'"):
        events.dma("dma_copy", "teleport", "hbm_to_sbuf", 1, 4)


def test_the_timeline_refuses_an_unknown_engine_instead_of_timing_it_as_vector():
    tl = Timeline("trn2", 1)
    tl.on_compute(0, ComputeEvent("warp", "op", 128, (), ()))
    assert tl.failure is not None and "warp" in tl.failure


def test_accesses_are_resolved_only_for_subscribers_that_want_them():
    report_only = InstructionEvents(0, [CostReport()])
    storage = Storage("sbuf", 128 * 64, partitions=128, bytes_per_partition=64)

    class F32:
        itemsize = 4

        def __str__(self) -> str:
            return "float32"

    report_only.access_raw(storage, slice(0, 16), F32(), True)
    rec = _Recorder()
    both = InstructionEvents(0, [CostReport(), rec])
    both.access_raw(storage, np.arange(16, 48), F32(), False)  # partitions 1 and 2
    both.compute("gpsimd", "iota", 32)
    (kind, event), = rec.events
    assert report_only._reads == [] and report_only._writes == []
    (acc,) = event.reads
    assert (acc.p0, acc.p1, acc.partitions, acc.nbytes) == (1, 3, 2, 128)


def test_the_graph_is_frozen_and_a_timing_pickles_as_its_graph():
    x = RNG.standard_normal((128, 256)).astype(np.float32)
    *_, report = in_kernel(lambda h: store(load(h)), x, report=True)
    timing = report.timing
    graph = timing.graph
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.target = "trn3"  # type: ignore[misc]
    with pytest.raises(ValueError):
        graph.const[0] = 1.0
    again = pickle.loads(pickle.dumps(timing))
    assert isinstance(again, Timing)
    assert (again.estimate_us, again.low_us, again.high_us, again.bound_by) == (
        timing.estimate_us, timing.low_us, timing.high_us, timing.bound_by)
