"""The modelled time of a recorded kernel: :class:`Timing` (``report.timing``).

The recorded graph (recorder.py) is re-scheduled here for any parameter values: node
durations are linear in the parameters, and a node starts when its resources are free and
(plus the dependency latency) its predecessors ended. The schedule is a longest path through
a fixed graph, so it is non-decreasing in every node duration and therefore in every
parameter: all parameters ``low`` give ``low_us``, all ``high`` give ``high_us``.

Kernel time = ``launch_floor_us`` + max(makespan over the cores, HBM time, busiest DMA
engine), where HBM time is the launch's HBM bytes (both cores) over its share of the chip's
HBM bandwidth (``lnc / hbm_contending_cores`` of it), and the busiest DMA engine's time is the
work of all queues on it (the queues' lanes run side by side in the schedule but share the
engine's bandwidth).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from nkilib_msda.simulator.timing.constants import (PARAM_INDEX as _P, PARAM_NAMES, hardware_for,
                                                    param_vector, params_for)
from nkilib_msda.simulator.timing.graph import (COMPUTE_ENGINES, NODE_BARRIER, NODE_COMPUTE,
                                                NODE_ISSUE, NODE_TRANSFER, TimingGraph)
from nkilib_msda.simulator.timing.scenarios import NOMINAL, Scenarios

__all__ = ["Timing"]


class Timing:
    """Modelled time of one simulated kernel (all cores of an LNC 2 run together).

    - ``estimate_us``: nominal parameters, launch floor included;
    - ``low_us`` / ``high_us``: every unknown parameter at its low / high end (the schedule
      is monotone in the parameters, so these bound every choice inside the ranges);
    - ``bound_by``: what the critical path spends most of its time on: a compute engine
      (``tensor``, ``vector``, ``scalar``, ``gpsimd``), ``dma_bandwidth`` (bytes on the DMA
      engines), ``dma_descriptors`` (per-descriptor DMA cost), ``dma_latency`` (DMA fixed
      latency), ``dma_issue`` (DGE queues), ``dependency_latency``, ``barrier``, ``hbm``
      (HBM share), ``dma_engines`` (the busiest DMA engine's work over all its queues exceeds
      the schedule), or ``launch`` (the launch floor exceeds the rest);
    - ``engine_busy_us``: per resource, the busy time of the busiest core (``dma``: the
      busiest of the 16 DMA engines; ``queue_sync``/``queue_act``: hardware DGE issue);
    - ``lower_bound_us``: the launch floor plus the largest of: one engine's busy time, DMA
      bytes over all DMA engines' bandwidth, descriptors times the per-descriptor cost over
      the DMA engines, and the HBM time (nominal parameters, per core);
    - ``critical_path_us``: the critical path's time by category (as ``bound_by``);
    - ``evaluate(params)``: re-schedule the recorded graph with some parameters overridden;
    - ``scenario``: the name of this timing's scenario (``"nominal/nominal"`` for
      ``report.timing``); ``scenarios``: every scenario's timing, by name (built on first
      access from the recorded graph; see :mod:`.scenarios`).

    ``graph``: the graph to schedule (already re-mapped to the scenario's structure);
    ``pinned``: parameters fixed by the scenario (the band varies the others); ``recorded``:
    the graph as recorded (default ``graph``), from which ``scenarios`` are derived.
    """

    def __init__(self, graph: TimingGraph, pinned: Mapping[str, float] | None = None,
                 scenario: str = NOMINAL, recorded: TimingGraph | None = None) -> None:
        self.graph = graph
        self.scenario = scenario
        self.pinned = dict(pinned or {})
        self._recorded = recorded if recorded is not None else graph
        self._scenarios: Scenarios[Timing] | None = None
        target = self.target = graph.target
        self.num_programs = graph.num_programs
        core_names = self.core_names = graph.core_names
        self._kind, self._core = graph.kind, graph.core
        self._res_lo, self._res_hi = graph.res_lo, graph.res_hi
        self._const, self._coef, self._lat = graph.const, graph.coef, graph.lat
        self._names, self._queues = graph.names, graph.queues
        self.hbm_bytes = graph.hbm_bytes
        self.num_nodes = graph.num_nodes
        nominal_p = param_vector(target, self.pinned)
        self.params: dict[str, float] = dict(zip(PARAM_NAMES, nominal_p))
        per_core = len(core_names)
        # resource -> (core, DMA engine) slot of the shared-bandwidth bound, -1 for others
        engines = graph.dma_engines
        self._slot = [core * engines + int(name.rsplit("dma", 1)[1]) if ":dma" in name else -1
                      for core in range(self.num_programs) for name in core_names]
        self._track = [name.split(":", 1)[1] if ":dma" in name else name for name in core_names]
        assert len(self._slot) == per_core * self.num_programs
        # plain lists for the scheduling loop (converted once)
        self._loop = (graph.res_lo.tolist(), graph.res_hi.tolist(), graph.pred_ptr.tolist(),
                      graph.pred_idx.tolist(), graph.order_ptr.tolist(),
                      graph.order_idx.tolist(), graph.lat.tolist())
        nominal = self._run(nominal_p, trace=True)
        self.estimate_us = nominal["total_ns"] / 1e3
        self.low_us = self._run(param_vector(target, self.pinned, "low"))["total_ns"] / 1e3
        self.high_us = self._run(param_vector(target, self.pinned, "high"))["total_ns"] / 1e3
        self._start, self._end, self._dur = nominal["start"], nominal["end"], nominal["dur"]
        self.makespan_us = nominal["makespan_ns"] / 1e3
        self.hbm_us = nominal["hbm_ns"] / 1e3
        self.dma_engine_us = nominal["dma_engine_ns"] / 1e3  # busiest DMA engine, all queues
        self.critical_path_us = {k: v / 1e3 for k, v in nominal["critical"].items()}
        self.engine_busy_us = self._busy()
        self.lower_bound_us = self._lower_bound(nominal_p) / 1e3
        self.bound_by = self._bound_by(nominal)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as the recorded graph: unpickling re-schedules it with this code."""
        return (Timing, (self.graph, self.pinned, self.scenario, self._recorded))

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_timeline(cls, tl: Any) -> "Timing":
        """The timing of a finished recording (a :class:`~.recorder.Timeline`)."""
        return cls(tl.graph())

    # -- scheduling --------------------------------------------------------------------------
    def _hbm_ns(self, p: list[float]) -> float:
        hw = hardware_for(self.target)
        share = self.num_programs / max(p[_P["hbm_contending_cores"]], self.num_programs)
        return self.hbm_bytes / (hw.hbm_bytes_per_ns_chip * share)

    def _run(self, p: list[float], trace: bool = False) -> dict[str, Any]:
        n = self.num_nodes
        pv = np.asarray(p, dtype=float)
        dur = (self._const + self._coef @ pv).tolist() if n else []
        res_lo, res_hi, ptr, idx, optr, oidx, lat = self._loop
        plist = pv.tolist()
        lat_values = [plist[i] if i >= 0 else 0.0 for i in lat]
        free = [0.0] * (len(self.core_names) * self.num_programs)
        last_on = [-1] * len(free)
        slot = self._slot
        engine_work = [0.0] * (self.graph.dma_engines * self.num_programs)
        start = [0.0] * n
        end = [0.0] * n
        bind = [-1] * n  # the node whose end decided this node's start (trace only)
        for i in range(n):
            lo, hi = res_lo[i], res_hi[i]
            if hi - lo == 1:
                s = free[lo]
                b = last_on[lo]
            else:
                s, b = 0.0, -1
                for r in range(lo, hi):
                    if free[r] > s:
                        s, b = free[r], last_on[r]
            a, z = ptr[i], ptr[i + 1]
            if z > a:
                ready, rb = 0.0, -1
                for j in idx[a:z]:
                    if end[j] > ready:
                        ready, rb = end[j], j
                ready += lat_values[i]
                if ready > s:
                    s, b = ready, rb
            a, z = optr[i], optr[i + 1]
            for j in oidx[a:z]:
                if end[j] > s:
                    s, b = end[j], j
            d = dur[i]
            e = s + d
            start[i] = s
            end[i] = e
            bind[i] = b
            for r in range(lo, hi):
                free[r] = e
                last_on[r] = i
                if slot[r] >= 0:
                    engine_work[slot[r]] += d
        makespan = max(end) if n else 0.0
        hbm = self._hbm_ns(p)
        # The queues' lanes of one DMA engine share its bandwidth: the kernel takes at least
        # the busiest engine's total work.
        dma_engine = max(engine_work) if engine_work else 0.0
        floor = p[_P["launch_floor_us"]] * 1e3
        out: dict[str, Any] = {"makespan_ns": makespan, "hbm_ns": hbm, "dma_engine_ns": dma_engine,
                               "floor_ns": floor,
                               "total_ns": floor + max(makespan, hbm, dma_engine)}
        if trace:
            out.update(start=start, end=end, dur=dur,
                       critical=self._critical(start, end, dur, bind, pv))
        return out

    def _category(self, i: int) -> str:
        kind = int(self._kind[i])
        if kind == NODE_COMPUTE:
            return self.core_names[int(self._res_lo[i]) % len(self.core_names)]
        if kind == NODE_ISSUE:
            return "gpsimd" if self._queues[i] == "swdge" else "dma_issue"
        if kind == NODE_BARRIER:
            return "barrier"
        return "dma_bandwidth"

    def _trace_category(self, i: int, pv: np.ndarray) -> str:
        """:meth:`_category`, with a transfer split as :meth:`_critical` splits its time:
        ``dma_descriptors`` where its per-descriptor part (at ``pv``) is at least half of its
        duration, else ``dma_bandwidth`` (so a picture of the trace names what ``bound_by``
        names)."""
        if int(self._kind[i]) != NODE_TRANSFER:
            return self._category(i)
        desc = float(self._coef[i] @ pv)
        return "dma_descriptors" if 2 * desc >= self._dur[i] else "dma_bandwidth"

    def _critical(self, start: list[float], end: list[float], dur: list[float],
                  bind: list[int], pv: np.ndarray) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        if not end:
            return dict(out)
        i = int(np.argmax(end))
        while i >= 0:
            cat = self._category(i)
            if int(self._kind[i]) == NODE_TRANSFER:
                desc = float(self._coef[i] @ pv)
                out["dma_descriptors"] += desc
                out["dma_bandwidth"] += dur[i] - desc
            else:
                out[cat] += dur[i]
            b = bind[i]
            gap = float(start[i] - (end[b] if b >= 0 else 0.0))
            if gap > 0:
                out["dma_latency" if int(self._kind[i]) == NODE_TRANSFER
                    else "dependency_latency"] += gap
            i = b
        return {k: float(v) for k, v in out.items()}

    def _bound_by(self, nominal: dict[str, Any]) -> str:
        floor, makespan, hbm = nominal["floor_ns"], nominal["makespan_ns"], nominal["hbm_ns"]
        shared = nominal["dma_engine_ns"]
        if floor >= max(makespan, hbm, shared):
            return "launch"
        if hbm > max(makespan, shared):
            return "hbm"
        if shared > makespan:
            return "dma_engines"
        crit = nominal["critical"]
        return max(crit, key=crit.get) if crit else "launch"

    def _busy(self, dur: Any = None) -> dict[str, float]:
        """Busy µs per resource name on the busiest core (``dur``: node durations in ns,
        default the nominal ones)."""
        per_core = len(self.core_names)
        busy = np.zeros(per_core * self.num_programs)
        dur = np.asarray(self._dur if dur is None else dur, dtype=float)
        keep = self._kind != NODE_BARRIER
        for lo, hi, d in zip(self._res_lo[keep].tolist(), self._res_hi[keep].tolist(),
                             dur[keep].tolist()):
            busy[lo:hi] += d
        out: dict[str, float] = {}
        by_core = busy.reshape(self.num_programs, per_core) / 1e3
        engines: dict[str, Any] = {}
        for k, name in enumerate(self.core_names):
            if ":dma" in name:  # sum the queues' lanes of one DMA engine
                track = self._track[k]
                engines[track] = engines.get(track, 0.0) + by_core[:, k]
            else:
                out[name] = float(by_core[:, k].max())
        out["dma"] = max((float(v.max()) for v in engines.values()), default=0.0)
        return out

    def _lower_bound(self, p: list[float]) -> float:
        pv = np.asarray(p)
        floor = p[_P["launch_floor_us"]] * 1e3
        best = self._hbm_ns(p)
        busy = self._busy(self._const + self._coef @ pv if self.num_nodes else [])
        for engine in COMPUTE_ENGINES:
            best = max(best, busy.get(engine, 0.0) * 1e3)
        transfer = self._kind == NODE_TRANSFER
        width = (self._res_hi - self._res_lo).astype(float)
        for core in range(self.num_programs):
            sel = (self._core == core) & transfer
            # bytes over the bandwidth of all 16 DMA engines; descriptors x per-descriptor cost
            engines = self.graph.dma_engines
            best = max(best, float((self._const[sel] * width[sel]).sum()) / engines)
            best = max(best, float((self._coef[sel] @ pv * width[sel]).sum()) / engines)
        return floor + best

    # -- public ------------------------------------------------------------------------------
    def evaluate(self, params: Mapping[str, float] | None = None) -> float:
        """Modelled µs of the recorded graph with ``params`` (by name) overriding this
        scenario's nominal values; the kernel is not re-run."""
        return self._run(param_vector(self.target, {**self.pinned, **(params or {})}))[
            "total_ns"] / 1e3

    def lower_bound(self, params: Mapping[str, float] | None = None) -> float:
        """``lower_bound_us`` for ``params`` (by name) overriding this scenario's nominal
        values."""
        return self._lower_bound(param_vector(self.target, {**self.pinned, **(params or {})})
                                 ) / 1e3

    @property
    def scenarios(self) -> Scenarios["Timing"]:
        """Every scenario's timing by name (``"<structure>/<parameters>"``, see
        :mod:`.scenarios`); each is scheduled on first access."""
        if self._scenarios is None:
            recorded = self._recorded
            self._scenarios = Scenarios(
                recorded, lambda g, pinned, name: Timing(g, pinned, name, recorded))
        return self._scenarios

    def ranges(self) -> dict[str, tuple[float, float, float]]:
        """The unknown parameters' (low, nominal, high) for this target."""
        return {p.name: (p.low, p.nominal, p.high) for p in params_for(self.target)}

    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome trace events: one process per core, one thread per engine / queue / DMA
        engine; times in µs at nominal parameters; ``cat`` in ``bound_by``'s words
        (:meth:`_trace_category`)."""
        per_core = len(self.core_names)
        tracks = list(dict.fromkeys(self._track)) + ["queue_static", "queue_swdge"]
        tid = {name: k for k, name in enumerate(tracks)}
        used: set[tuple[int, str]] = set()
        events: list[dict[str, Any]] = []
        pv = np.asarray(param_vector(self.target))
        for i in range(self.num_nodes):
            kind = int(self._kind[i])
            ts, dur = self._start[i] / 1e3, self._dur[i] / 1e3
            lo, hi = int(self._res_lo[i]), int(self._res_hi[i])
            if kind == NODE_BARRIER:
                cores = list(range(self.num_programs))
                names = ["sync"]
            else:
                cores = [lo // per_core]
                names = [self._track[r % per_core] for r in range(lo, hi)]
                if kind == NODE_TRANSFER and self._queues[i]:
                    names.append("queue_" + self._queues[i])
            for core in cores:
                for name in names:
                    used.add((core, name))
                    events.append({"name": self._names[i], "cat": self._trace_category(i, pv),
                                   "ph": "X",
                                   "ts": ts, "dur": dur, "pid": core, "tid": tid[name],
                                   "args": {"node": i}})
        meta: list[dict[str, Any]] = []
        for core in range(self.num_programs):
            meta.append({"name": "process_name", "ph": "M", "pid": core, "tid": 0,
                         "args": {"name": f"core {core} ({self.target})"}})
            for name in tracks:
                if (core, name) in used:
                    meta.append({"name": "thread_name", "ph": "M", "pid": core,
                                 "tid": tid[name], "args": {"name": name}})
        return meta + events

    def to_chrome_trace(self, path: str | Path) -> None:
        """Write ``{"traceEvents": [...]}`` (chrome://tracing, Perfetto) to ``path``."""
        doc = {"traceEvents": self.trace_events(), "displayTimeUnit": "ns",
               "otherData": {"target": self.target, "estimate_us": self.estimate_us,
                             "low_us": self.low_us, "high_us": self.high_us,
                             "bound_by": self.bound_by, "params": self.params}}
        Path(path).write_text(json.dumps(doc))

    def summary(self) -> str:
        where = "" if self.scenario == NOMINAL else f"scenario {self.scenario}; "
        return (f"{where}modelled time {self.estimate_us:,.1f} us (band {self.low_us:,.1f} .. "
                f"{self.high_us:,.1f} us; bound by {self.bound_by}; lower bound "
                f"{self.lower_bound_us:,.1f} us; target {self.target}, {self.num_programs} "
                f"core(s), launch floor included)")

    def __repr__(self) -> str:
        return f"Timing({self.summary()})"
