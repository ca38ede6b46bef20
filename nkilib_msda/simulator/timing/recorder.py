"""Online recording of a kernel's instruction stream as a dependency graph, scheduled as it runs.

One :class:`Timeline` per simulation (shared by the programs of an LNC 2 run), subscribed to
every program's instruction events (:mod:`nkilib_msda.simulator.events`): each compute, DMA
and barrier event, with its accesses already resolved by the emulator
(:mod:`nkilib_msda.simulator.access_geometry`), becomes a node of the graph:

- each compute engine, DMA issue queue and (DMA queue, DMA engine) lane of each core is a
  *resource* that runs its nodes in program order (:func:`core_resources`);
- a node starts when its resources are free and, plus a latency, when the nodes it depends
  on ended: read-after-write, write-after-read and write-after-write on the storage regions
  it touches. Regions are tracked per storage as a grid (SBUF/PSUM: groups of 8 partitions x
  byte chunks of a partition; HBM: flat byte chunks), at most ``_MAX_CHUNKS`` chunks per
  storage, so two accesses in one region are treated as overlapping (conservative). Shared-HBM regions
  are tracked per core: cross-core order comes only from ``core_barrier`` (a race-free
  kernel has no other);
- a node's duration is linear in the unknown parameters (``constants.PARAMS``): a constant
  plus a few ``coefficient x parameter`` terms, so :class:`~.schedule.Timing` can re-schedule
  the recorded graph for other parameter values without re-running the kernel.

:meth:`Timeline.graph` hands the result over as a frozen :class:`~.graph.TimingGraph`.
The online pass uses the nominal parameters; it decides, per region, which earlier node a
new node waits for (the latest-ending reader at nominal for write-after-read).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator.access_geometry import Access
from nkilib_msda.simulator.events import ComputeEvent, DmaEvent
from nkilib_msda.simulator.timing.constants import (PARAM_INDEX as _P, PARAM_NAMES, hardware_for,
                                                    param_vector)
from nkilib_msda.simulator.timing.costs import compute_cycles, matmul_cycles, transpose_cycles
from nkilib_msda.simulator.timing.graph import (COMPUTE_ENGINES, DMA_INDIRECT, DMA_NO_CHIP,
                                                DMA_TRANSPOSE, NODE_BARRIER, NODE_COMPUTE,
                                                NODE_ISSUE, NODE_TRANSFER, TimingGraph,
                                                core_resources, csr)
from nkilib_msda.simulator.timing.guard import TimingWarning, guarded

__all__ = ["Timeline", "TimingWarning"]

_MAX_CHUNKS = 256
_PARTITION_GROUP = 8
_MIN_CHUNK_BYTES = 64
_INDIRECT_KINDS = frozenset({"indirect_gather", "indirect_scatter", "indirect_rmw",
                             "indirect_transpose", "compute"})
_TRANSPOSE_KINDS = frozenset({"transpose", "indirect_transpose"})


class _Regions:
    """Last writer and latest-ending reader (nominal) of each region of one storage: a grid
    of partition groups (8 partitions, one DMA engine's share; one group for HBM) x byte
    chunks."""

    __slots__ = ("chunk", "w_end", "w_id", "r_end", "r_id")

    def __init__(self, groups: int, extent: int) -> None:
        self.chunk = max(_MIN_CHUNK_BYTES, -(-max(extent, 1) // _MAX_CHUNKS))
        shape = (max(groups, 1), -(-max(extent, 1) // self.chunk))
        self.w_end = np.zeros(shape)
        self.w_id = np.full(shape, -1, dtype=np.int64)
        self.r_end = np.zeros(shape)
        self.r_id = np.full(shape, -1, dtype=np.int64)


class _Program:
    """Per-core resource ids."""

    def __init__(self, base: int, names: tuple[str, ...]) -> None:
        self.base = base
        self.res = {name: base + i for i, name in enumerate(names)}


class Timeline:
    """The recorded graph of one simulation (see the module docstring): a subscriber of every
    program's instruction events (:mod:`nkilib_msda.simulator.events`)."""

    wants_accesses = True

    def __init__(self, target: str, num_programs: int) -> None:
        self.target = target
        self.hw = hardware_for(target)
        self.num_programs = num_programs
        self.core_names = core_resources(self.hw.dma_engines)
        per_core = len(self.core_names)
        self.programs = [_Program(p * per_core, self.core_names) for p in range(num_programs)]
        self.num_resources = per_core * num_programs
        self.free = [0.0] * self.num_resources
        self.nominal = param_vector(target)
        # node arrays (appended in execution order, which is a topological order)
        self.kind: list[int] = []
        self.core: list[int] = []
        self.res_lo: list[int] = []
        self.res_hi: list[int] = []
        self.const: list[float] = []
        self.terms: list[tuple[tuple[int, float], ...]] = []
        self.lat: list[int] = []
        self.preds: list[tuple[int, ...]] = []  # waited for, plus the node's latency
        self.order: list[tuple[int, ...]] = []  # waited for without latency (same DMA queue)
        self.name: list[str] = []
        self.queue: list[str] = []
        self.dma_flags: list[int] = []
        self.end: list[float] = []
        self.hbm_bytes = 0
        self._barrier_arrivals = 0
        self.failure: str | None = None  # the first recording error (see _guarded)

    # -- dependencies ------------------------------------------------------------------------
    def _regions(self, program: int, storage: Any) -> _Regions:
        key = f"timing:{program}"
        regions = storage.aux.get(key)
        if regions is None:
            if storage.buffer in ("sbuf", "psum"):
                groups = -(-max(storage.partitions, 1) // _PARTITION_GROUP)
                regions = _Regions(groups, storage.bytes_per_partition)
            else:
                regions = _Regions(1, storage.nbytes)
            storage.aux[key] = regions
        return regions

    def _deps(self, program: int, reads: tuple[Access, ...], writes: tuple[Access, ...]
              ) -> tuple[set[int], set[int], list[tuple[_Regions, Any, bool]]]:
        """(node ids waited for, those of them that wrote what is read, the regions to
        update)."""
        deps: set[int] = set()
        raw: set[int] = set()
        spans = []
        for accesses, is_write in ((reads, False), (writes, True)):
            for acc in accesses:
                reg = self._regions(program, acc.storage)
                c0 = acc.lo // reg.chunk
                c1 = max(c0 + 1, -(-acc.hi // reg.chunk))
                g0 = acc.p0 // _PARTITION_GROUP
                g1 = max(g0 + 1, -(-acc.p1 // _PARTITION_GROUP))
                single = g1 - g0 == 1 and c1 - c0 == 1
                box: Any = (g0, c0) if single else (slice(g0, g1), slice(c0, c1))
                spans.append((reg, box, is_write))
                tables = ((reg.w_end, reg.w_id), (reg.r_end, reg.r_id)) if is_write \
                    else ((reg.w_end, reg.w_id),)
                for ends, ids in tables:
                    if single:
                        node = int(ids[g0, c0])
                    else:
                        seg = ends[box]
                        row, col = divmod(int(seg.argmax()), seg.shape[1])
                        node = int(ids[g0 + row, c0 + col])
                    if node >= 0:
                        deps.add(node)
                        if not is_write:
                            raw.add(node)
        return deps, raw, spans

    @staticmethod
    def _update(spans: list[tuple[_Regions, Any, bool]], node: int, end: float) -> None:
        for reg, box, is_write in spans:
            if is_write:
                reg.w_end[box] = end
                reg.w_id[box] = node
                reg.r_end[box] = end
                reg.r_id[box] = node
            elif isinstance(box[0], int):  # one region: scalar update
                if reg.r_end[box] < end:
                    reg.r_end[box] = end
                    reg.r_id[box] = node
            else:
                seg = reg.r_end[box]
                later = seg < end
                if later.all():
                    seg[...] = end
                    reg.r_id[box] = node
                elif later.any():
                    seg[later] = end
                    reg.r_id[box][later] = node

    # -- nodes ---------------------------------------------------------------------------------
    def _duration(self, const: float, terms: tuple[tuple[int, float], ...]) -> float:
        return const + sum(c * self.nominal[i] for i, c in terms)

    def _add(self, kind: int, core: int, lo: int, hi: int, const: float,
             terms: tuple[tuple[int, float], ...], lat: int, deps: set[int], name: str,
             queue: str = "", order: set[int] | None = None, dma_flags: int = 0
             ) -> tuple[int, float]:
        free = self.free
        ends = self.end
        start = max(free[lo:hi]) if hi - lo > 1 else free[lo]
        if deps:
            start = max(start, max(ends[d] for d in deps)
                        + (self.nominal[lat] if lat >= 0 else 0.0))
        if order:
            start = max(start, max(ends[d] for d in order))
        end = start + self._duration(const, terms)
        for r in range(lo, hi):
            free[r] = end
        node = len(self.end)
        self.kind.append(kind)
        self.core.append(core)
        self.res_lo.append(lo)
        self.res_hi.append(hi)
        self.const.append(const)
        self.terms.append(terms)
        self.lat.append(lat)
        self.preds.append(tuple(sorted(deps)))
        self.order.append(tuple(sorted(order)) if order else ())
        self.name.append(name)
        self.queue.append(queue)
        self.dma_flags.append(dma_flags)
        self.end.append(end)
        return node, end

    @guarded
    def on_compute(self, program: int, event: ComputeEvent) -> None:
        """One compute instruction; a ``dma``-engine one (HBM memset, sendrecv) is a direct
        DMA of the bytes it writes; a ``sync`` one (core_barrier) is timed by
        :meth:`on_barrier`."""
        engine, opcode = event.engine, event.opcode
        reads, writes = event.reads, event.writes
        if engine == "dma":
            self._dma(program, opcode, "direct", -1, 0, None, None, reads, writes)
            return
        if engine == "sync":
            return
        if engine not in COMPUTE_ENGINES:
            raise ValueError(f"Timeline.on_compute: engine must be one of {COMPUTE_ENGINES} or "
                             f"dma, got {engine!r}")
        hw = self.hw
        clk = hw.clock_ghz[engine]
        ref = writes[0] if writes else (reads[0] if reads else None)
        parts = ref.partitions if ref is not None and ref.partitions else 1
        n = event.elements / parts
        rops, wops = list(reads), list(writes)
        overhead: tuple[tuple[int, float], ...] = ((_P["compute_overhead_cycles"], 1.0 / clk),)
        if engine == "tensor":
            overhead = ()
            if opcode == "nc_matmul" and len(rops) >= 2:
                cycles = matmul_cycles(hw, rops[0].elems_per_partition,
                                       rops[1].elems_per_partition, rops[0].fp32 or rops[1].fp32)
            else:  # nc_transpose on the PE array
                src = rops[0] if rops else ref
                cycles = transpose_cycles(hw, src.partitions if src else 1,
                                          src.elems_per_partition if src else int(n),
                                          bool(src and src.fp32))
        else:
            cycles = compute_cycles(hw, engine, opcode, n, rops, wops)
        deps, _, spans = self._deps(program, reads, writes)
        prog = self.programs[program]
        r = prog.res[engine]
        node, end = self._add(NODE_COMPUTE, program, r, r + 1, cycles / clk, overhead,
                              _P["dependency_latency_ns"], deps, opcode)
        self._update(spans, node, end)

    @guarded
    def on_dma(self, program: int, event: DmaEvent) -> None:
        """One DMA instruction (see :meth:`_dma`)."""
        self._dma(program, event.opcode, event.kind, event.nbytes, event.hbm_bytes,
                  event.descriptors, event.queue, event.reads, event.writes,
                  event.skipped_descriptors)

    def _dma(self, program: int, opcode: str, kind: str, nbytes: int, hbm_bytes: int,
             descriptors: Any, queue: str | None, reads: tuple[Access, ...],
             writes: tuple[Access, ...], skipped_descriptors: int = 0) -> None:
        """One DMA instruction: an issue node (hardware DGE queue, or software DGE on GpSimd)
        and a transfer node on the DMA engines its partitions map to.

        Descriptors: the indirect ones counted by the cost report, else one per contiguous
        run of the accesses as stored (at least one per partition). A direct
        ``dma_transpose`` thus counts its source rows: the architecture guide prices a DMA
        transpose as a share of DMA throughput (``dma_transpose_efficiency``), not as one
        descriptor per element of the permuted order; an address-array access (transpose,
        dynamic offset) into part of a larger SBUF allocation counts its runs within each
        partition, not one per element. ``nbytes < 0``: the bytes written.

        ``skipped_descriptors`` (rows an ``oob_mode.skip`` DMA drops) cost like moved ones in
        the descriptor terms (DGE generation and the DMA engines' per-descriptor time) but move
        no bytes: no page says the hardware drops them before generating their descriptors
        (docs/timing.md, "Skipped rows")."""
        hw = self.hw
        prog = self.programs[program]
        if nbytes < 0:
            nbytes = sum(a.nbytes for a in writes)
        self.hbm_bytes += int(hbm_bytes)
        chip = [a for a in writes + reads if a.buffer in ("sbuf", "psum")]
        if descriptors or skipped_descriptors:
            count = sum((descriptors or {}).values()) + skipped_descriptors
        else:
            # Only accesses that carry the transfer's data set the descriptor size (within a
            # factor 4 of the largest: a cast changes the element size); the 4-byte runtime
            # offset a dynamic-offset DMA reads moves no data.
            largest = max((a.nbytes for a in reads + writes), default=0)
            runs = [a.run_bytes for a in reads + writes
                    if a.run_bytes > 0 and 4 * a.nbytes >= largest]
            run = min(runs) if runs else max(nbytes, 1)
            count = max(-(-nbytes // max(run, 1)), chip[0].p1 - chip[0].p0 if chip else 1)
        per_engine = hw.partitions_per_dma_engine
        if chip:
            p0, p1 = chip[0].p0, chip[0].p1
            if skipped_descriptors:  # skipped rows' engines too: the index tile's partitions
                p0, p1 = min(a.p0 for a in chip), max(a.p1 for a in chip)
            e0 = min(p0 // per_engine, hw.dma_engines - 1)
            e1 = min(hw.dma_engines, max(e0 + 1, -(-p1 // per_engine)))
        else:
            e0, e1 = 0, min(hw.dma_engines, max(count, 1))
        engines = e1 - e0
        efficiency = 1.0
        on_chip_dst = any(a.buffer == "sbuf" for a in writes)
        if kind in _TRANSPOSE_KINDS:
            sbuf_src = any(a.buffer == "sbuf" for a in reads)
            efficiency = hw.dma_transpose_sbuf_efficiency if sbuf_src and on_chip_dst \
                else hw.dma_transpose_efficiency
        elif kind in ("compute", "indirect_rmw"):
            efficiency = hw.dma_accumulate_sbuf_efficiency if on_chip_dst \
                else hw.dma_accumulate_efficiency
        indirect = kind in _INDIRECT_KINDS or queue == "swdge"
        if queue not in ("sync", "act", "swdge"):
            # dge_mode unknown/none: software DGE where only it can (indirect DMAs, dma_compute
            # on NC-v3), else descriptors the compiler prepared ("static"), triggered by Sync.
            queue = "swdge" if indirect else "static"
        flags = ((DMA_INDIRECT if indirect else 0) | (DMA_TRANSPOSE if kind in _TRANSPOSE_KINDS
                                                       else 0) | (0 if chip else DMA_NO_CHIP))
        deps, raw, spans = self._deps(program, reads, writes)
        # Transfers of one queue run in order on the DMA engines: waiting for an earlier
        # transfer of the same queue needs no semaphore (no latency).
        same_queue = {d for d in deps if self.kind[d] == NODE_TRANSFER and self.queue[d] == queue
                      and self.core[d] == program}
        deps -= same_queue
        if queue == "swdge":
            r = prog.res["gpsimd"]
            # Software DGE builds descriptors from the index tiles: it waits for what the
            # DMA reads (its indices among them), not for its destination to be free.
            issue, _ = self._add(
                NODE_ISSUE, program, r, r + 1, 0.0,
                ((_P["swdge_fixed_ns"], 1.0), (_P["swdge_descriptor_ns"], float(count))),
                _P["dependency_latency_ns"], raw - same_queue, opcode + " (swdge)", "swdge")
        else:
            r = prog.res["queue_act" if queue == "act" else "queue_sync"]
            cost = "dma_trigger_ns" if queue == "static" else "hwdge_issue_ns"
            issue, _ = self._add(NODE_ISSUE, program, r, r + 1, 0.0, ((_P[cost], 1.0),), -1,
                                 set(), opcode + (" (trigger)" if queue == "static"
                                                  else " (hwdge)"), queue)
        indirect_desc = bool(descriptors) or skipped_descriptors > 0
        desc_param = _P["dma_indirect_descriptor_ns"] if indirect_desc else _P["dma_descriptor_ns"]
        const = nbytes / engines / (hw.dma_bytes_per_ns * efficiency)
        terms = ((desc_param, count / engines),)
        base = prog.res[f"{queue}:dma0"]
        node, end = self._add(NODE_TRANSFER, program, base + e0, base + e1, const, terms,
                              _P["dma_fixed_latency_ns"], deps | {issue}, opcode, queue,
                              order=same_queue, dma_flags=flags)
        self._update(spans, node, end)

    @guarded
    def on_barrier(self, program: int) -> None:
        """``core_barrier`` of an LNC 2 run: when the last program arrives, one node on every
        resource of every core (a full drain and release)."""
        self._barrier_arrivals += 1
        if self._barrier_arrivals < self.num_programs:
            return
        self._barrier_arrivals = 0
        self._add(NODE_BARRIER, -1, 0, self.num_resources, 0.0,
                  ((_P["barrier_latency_ns"], 1.0),), -1, set(), "core_barrier")

    # -- the hand-over ---------------------------------------------------------------------------
    def graph(self) -> TimingGraph:
        """The recorded graph, frozen for the scheduler."""
        n = len(self.end)
        coef = np.zeros((n, len(PARAM_NAMES)))
        for i, terms in enumerate(self.terms):
            for p, c in terms:
                coef[i, p] += c
        pred_ptr, pred_idx = csr(self.preds)
        order_ptr, order_idx = csr(self.order)
        return TimingGraph(
            target=self.target, num_programs=self.num_programs, core_names=self.core_names,
            dma_engines=self.hw.dma_engines, kind=np.asarray(self.kind, np.int64),
            core=np.asarray(self.core, np.int64), res_lo=np.asarray(self.res_lo, np.int64),
            res_hi=np.asarray(self.res_hi, np.int64), const=np.asarray(self.const, float),
            coef=coef, lat=np.asarray(self.lat, np.int64),
            dma_flags=np.asarray(self.dma_flags, np.int64), pred_ptr=pred_ptr,
            pred_idx=pred_idx, order_ptr=order_ptr, order_idx=order_idx,
            names=tuple(self.name), queues=tuple(self.queue), hbm_bytes=int(self.hbm_bytes))
