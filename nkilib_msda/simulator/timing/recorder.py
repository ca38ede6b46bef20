"""Online recording of a kernel's instruction stream as a dependency graph, scheduled as it runs.

One :class:`Timeline` per simulation (shared by the programs of an LNC 2 run). The operand
access layer reports every read and write of the running instruction (:meth:`note_view`,
:meth:`note_raw`); when the instruction is counted in the cost report, :meth:`compute` /
:meth:`dma` turn the pending accesses into a node of the graph:

- each engine (and DMA queue, and each of the 16 DMA engines) of each core is a *resource*
  that runs its nodes in program order;
- a node starts when its resources are free and, plus a latency, when the nodes it depends
  on ended: read-after-write, write-after-read and write-after-write on the storage regions
  it touches. Regions are tracked per storage in byte chunks (SBUF/PSUM: bytes within a
  partition, all partitions together; HBM: flat bytes), at most ``_MAX_CHUNKS`` per storage,
  so two accesses in one chunk are treated as overlapping (conservative). Shared-HBM regions
  are tracked per core: cross-core order comes only from ``core_barrier`` (a race-free
  kernel has no other);
- a node's duration is linear in the unknown parameters (``constants.PARAMS``): a constant
  plus a few ``coefficient x parameter`` terms, so :class:`~.schedule.Timing` can re-schedule
  the recorded graph for other parameter values without re-running the kernel.

The online pass uses the nominal parameters; it decides, per region, which earlier node a
new node waits for (the latest-ending reader at nominal for write-after-read).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator.timing.constants import PARAM_NAMES, hardware_for, param_vector
from nkilib_msda.simulator.timing.costs import (Operand, compute_cycles, matmul_cycles,
                                                transpose_cycles)

__all__ = ["Timeline", "CORE_RESOURCES", "COMPUTE_ENGINES", "NODE_COMPUTE", "NODE_ISSUE",
           "NODE_TRANSFER", "NODE_BARRIER"]

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")
QUEUES = ("queue_sync", "queue_act", "queue_swdge")
_P = {name: i for i, name in enumerate(PARAM_NAMES)}
NODE_COMPUTE, NODE_ISSUE, NODE_TRANSFER, NODE_BARRIER = 0, 1, 2, 3
_MAX_CHUNKS = 256
_MIN_CHUNK_BYTES = 64
_TWO_BYTE_FLOATS = frozenset({"bfloat16", "float16"})
_INDIRECT_KINDS = frozenset({"indirect_gather", "indirect_scatter", "indirect_rmw",
                             "indirect_transpose", "compute"})


def core_resources(dma_engines: int) -> tuple[str, ...]:
    return COMPUTE_ENGINES + QUEUES[:2] + tuple(f"dma{j}" for j in range(dma_engines))


CORE_RESOURCES = core_resources(16)


class _Access:
    """One read or write of the running instruction."""

    __slots__ = ("storage", "lo", "hi", "p0", "p1", "nbytes", "run_bytes", "op")

    def __init__(self, storage: Any, lo: int, hi: int, p0: int, p1: int, nbytes: int,
                 run_bytes: int, op: Operand) -> None:
        self.storage = storage
        self.lo, self.hi = lo, hi  # byte range (within a partition on chip; flat in HBM)
        self.p0, self.p1 = p0, p1  # partitions (0, 1 for HBM)
        self.nbytes = nbytes
        self.run_bytes = run_bytes  # bytes of one contiguous run (a DMA descriptor)
        self.op = op


class _Regions:
    """Last writer and latest-ending reader (nominal) of each byte chunk of one storage."""

    __slots__ = ("chunk", "w_end", "w_id", "r_end", "r_id")

    def __init__(self, extent: int) -> None:
        self.chunk = max(_MIN_CHUNK_BYTES, -(-max(extent, 1) // _MAX_CHUNKS))
        n = -(-max(extent, 1) // self.chunk)
        self.w_end = np.zeros(n)
        self.w_id = np.full(n, -1, dtype=np.int64)
        self.r_end = np.zeros(n)
        self.r_id = np.full(n, -1, dtype=np.int64)


def _dtype_flags(dtype: Any) -> tuple[bool, bool]:
    name = str(dtype)
    return name in _TWO_BYTE_FLOATS, name == "float32"


class _Program:
    """Per-core state: pending accesses and resource ids."""

    def __init__(self, base: int, names: tuple[str, ...]) -> None:
        self.base = base
        self.res = {name: base + i for i, name in enumerate(names)}
        self.reads: list[_Access] = []
        self.writes: list[_Access] = []


class Timeline:
    """The recorded graph of one simulation (see the module docstring)."""

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
        self.preds: list[tuple[int, ...]] = []
        self.name: list[str] = []
        self.queue: list[str] = []
        self.end: list[float] = []
        self.hbm_bytes = 0
        self._barrier_arrivals = 0

    # -- accesses ------------------------------------------------------------------------
    def note_view(self, program: int, t: Any, is_write: bool) -> None:
        """A read or write of the static view ``t`` (shape, strides, offset in elements)."""
        storage = t.storage
        itemsize = t.dtype.itemsize
        shape, strides, offset = t.shape, t.strides, t.offset
        two, f32 = _dtype_flags(t.dtype)
        size = 1
        for n in shape:
            size *= n
        if size == 0:
            return
        on_chip = storage.buffer in ("sbuf", "psum")
        free_from = 1 if on_chip and shape else 0
        lo_e = hi_e = 0
        for n, s in zip(shape[free_from:], strides[free_from:]):
            if s < 0:
                lo_e += (n - 1) * s
            else:
                hi_e += (n - 1) * s
        run = 1
        expected = 1
        for n, s in zip(reversed(shape[free_from:]), reversed(strides[free_from:])):
            if n == 1:
                continue
            if s != expected:
                break
            run *= n
            expected *= n
        contiguous = not shape[free_from:] or shape[-1] == 1 or strides[-1] == 1
        if on_chip:
            ppe = storage.bytes_per_partition // itemsize
            parts = shape[0] if shape else 1
            if shape and (strides[0] == ppe or parts == 1) and ppe:
                p0, col = divmod(offset, ppe)
                lo, hi = (col + lo_e) * itemsize, (col + hi_e + 1) * itemsize
                if lo < 0 or hi > storage.bytes_per_partition:
                    lo, hi = 0, storage.bytes_per_partition
            else:
                p0, lo, hi = 0, 0, storage.bytes_per_partition
            p1 = p0 + parts
            per = size // max(parts, 1)
        else:
            lo, hi = (offset + lo_e) * itemsize, (offset + hi_e + 1) * itemsize
            p0, p1, parts, per = 0, 1, 1, size
        op = Operand(storage.buffer, two, contiguous, parts, per, f32)
        acc = _Access(storage, lo, hi, p0, p1, size * itemsize, run * itemsize, op)
        prog = self.programs[program]
        (prog.writes if is_write else prog.reads).append(acc)

    def note_raw(self, program: int, storage: Any, addr: Any, dtype: Any,
                 is_write: bool) -> None:
        """A read or write at element addresses ``addr`` (a slice or an int array)."""
        itemsize = dtype.itemsize
        if isinstance(addr, slice):
            lo_e, hi_e = addr.start or 0, addr.stop
            count = hi_e - lo_e
            contiguous = True
        else:
            addr = np.asarray(addr)
            count = int(addr.size)
            if count == 0:
                return
            lo_e, hi_e = int(addr.min()), int(addr.max()) + 1
            contiguous = count == hi_e - lo_e
        if count <= 0:
            return
        two, f32 = _dtype_flags(dtype)
        if storage.buffer in ("sbuf", "psum"):
            ppe = max(storage.bytes_per_partition // itemsize, 1)
            p0, p1 = lo_e // ppe, (hi_e - 1) // ppe + 1
            if p1 - p0 == 1:
                lo, hi = (lo_e - p0 * ppe) * itemsize, (hi_e - p0 * ppe) * itemsize
            else:
                lo, hi = 0, storage.bytes_per_partition
            per = max(count // (p1 - p0), 1)
            run = per if contiguous else 1
        else:
            lo, hi, p0, p1 = lo_e * itemsize, hi_e * itemsize, 0, 1
            per = count
            run = count if contiguous else 1
        op = Operand(storage.buffer, two, contiguous, p1 - p0, per, f32)
        acc = _Access(storage, lo, hi, p0, p1, count * itemsize, run * itemsize, op)
        prog = self.programs[program]
        (prog.writes if is_write else prog.reads).append(acc)

    # -- dependencies ------------------------------------------------------------------------
    def _regions(self, program: int, storage: Any) -> _Regions:
        key = ("timing", program)
        regions = storage.aux.get(key)
        if regions is None:
            extent = storage.bytes_per_partition if storage.buffer in ("sbuf", "psum") \
                else storage.nbytes
            regions = storage.aux[key] = _Regions(extent)
        return regions

    def _deps(self, program: int, reads: list[_Access], writes: list[_Access]
              ) -> tuple[set[int], float, list[tuple[_Regions, int, int, bool]]]:
        """(node ids waited for, their latest nominal end, the chunk ranges to update)."""
        deps: set[int] = set()
        ready = 0.0
        spans = []
        for accesses, is_write in ((reads, False), (writes, True)):
            for acc in accesses:
                reg = self._regions(program, acc.storage)
                c0 = acc.lo // reg.chunk
                c1 = max(c0 + 1, -(-acc.hi // reg.chunk))
                spans.append((reg, c0, c1, is_write))
                tables = ((reg.w_end, reg.w_id), (reg.r_end, reg.r_id)) if is_write \
                    else ((reg.w_end, reg.w_id),)
                for ends, ids in tables:
                    seg = ends[c0:c1]
                    j = int(seg.argmax())
                    node = int(ids[c0 + j])
                    if node >= 0:
                        deps.add(node)
                        ready = max(ready, float(seg[j]))
        return deps, ready, spans

    @staticmethod
    def _update(spans: list[tuple[_Regions, int, int, bool]], node: int, end: float) -> None:
        for reg, c0, c1, is_write in spans:
            if is_write:
                reg.w_end[c0:c1] = end
                reg.w_id[c0:c1] = node
                reg.r_end[c0:c1] = end
                reg.r_id[c0:c1] = node
            else:
                seg = reg.r_end[c0:c1]
                later = seg < end
                if later.all():
                    seg[...] = end
                    reg.r_id[c0:c1] = node
                elif later.any():
                    seg[later] = end
                    reg.r_id[c0:c1][later] = node

    # -- nodes ---------------------------------------------------------------------------------
    def _duration(self, const: float, terms: tuple[tuple[int, float], ...]) -> float:
        return const + sum(c * self.nominal[i] for i, c in terms)

    def _add(self, kind: int, core: int, lo: int, hi: int, const: float,
             terms: tuple[tuple[int, float], ...], lat: int, deps: set[int], ready: float,
             name: str, queue: str = "") -> tuple[int, float]:
        free = self.free
        start = max(free[lo:hi]) if hi - lo > 1 else free[lo]
        if deps:
            start = max(start, ready + (self.nominal[lat] if lat >= 0 else 0.0))
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
        self.name.append(name)
        self.queue.append(queue)
        self.end.append(end)
        return node, end

    def _take(self, program: int) -> tuple[list[_Access], list[_Access]]:
        prog = self.programs[program]
        reads, writes = prog.reads, prog.writes
        prog.reads, prog.writes = [], []
        return reads, writes

    def compute(self, program: int, engine: str, opcode: str, elements: int) -> None:
        """One compute instruction (``engine`` as in the cost report)."""
        if engine == "dma":
            self.dma(program, opcode, "direct", "", elements, -1, 0, None)
            return
        reads, writes = self._take(program)
        if engine == "sync":
            return  # core_barrier: handled by barrier()
        if engine not in COMPUTE_ENGINES:
            engine = "vector"
        hw = self.hw
        clk = hw.clock_ghz[engine]
        ref = writes[0].op if writes else (reads[0].op if reads else None)
        parts = ref.partitions if ref is not None and ref.partitions else 1
        n = elements / parts
        rops = [a.op for a in reads]
        wops = [a.op for a in writes]
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
        deps, ready, spans = self._deps(program, reads, writes)
        prog = self.programs[program]
        r = prog.res[engine]
        node, end = self._add(NODE_COMPUTE, program, r, r + 1, cycles / clk, overhead,
                              _P["dependency_latency_ns"], deps, ready, opcode)
        self._update(spans, node, end)

    def dma(self, program: int, opcode: str, kind: str, direction: str, elements: int,
            nbytes: int, hbm_bytes: int, descriptors: dict[int, int] | None,
            queue: str | None = None) -> None:
        """One DMA instruction: an issue node (hardware DGE queue, or software DGE on GpSimd)
        and a transfer node on the DMA engines its partitions map to."""
        reads, writes = self._take(program)
        hw = self.hw
        prog = self.programs[program]
        if nbytes < 0:
            nbytes = sum(a.nbytes for a in writes)
        self.hbm_bytes += int(hbm_bytes)
        chip = [a for a in writes + reads if a.op.buffer in ("sbuf", "psum")]
        if descriptors:
            count = sum(descriptors.values())
        else:
            runs = [a.run_bytes for a in reads + writes if a.run_bytes > 0]
            run = min(runs) if runs else max(nbytes, 1)
            count = max(-(-nbytes // max(run, 1)), chip[0].p1 - chip[0].p0 if chip else 1)
        per_engine = hw.partitions_per_dma_engine
        if chip:
            e0 = min(chip[0].p0 // per_engine, hw.dma_engines - 1)
            e1 = min(hw.dma_engines, max(e0 + 1, -(-chip[0].p1 // per_engine)))
        else:
            e0, e1 = 0, min(hw.dma_engines, max(count, 1))
        engines = e1 - e0
        efficiency = 1.0
        on_chip_dst = any(a.op.buffer == "sbuf" for a in writes)
        if kind in ("transpose", "indirect_transpose"):
            sbuf_src = any(a.op.buffer == "sbuf" for a in reads)
            efficiency = hw.dma_transpose_sbuf_efficiency if sbuf_src and on_chip_dst \
                else hw.dma_transpose_efficiency
        elif kind in ("compute", "indirect_rmw"):
            efficiency = 1.0 if (self.target == "trn3" and on_chip_dst) \
                else hw.dma_accumulate_efficiency
        indirect = kind in _INDIRECT_KINDS or queue == "swdge"
        if queue is None or queue not in ("sync", "act", "swdge"):
            queue = "swdge" if indirect else "sync"
        deps, ready, spans = self._deps(program, reads, writes)
        if queue == "swdge":
            r = prog.res["gpsimd"]
            read_deps = set(deps)  # the descriptors need the index tiles
            issue, issue_end = self._add(
                NODE_ISSUE, program, r, r + 1, 0.0,
                ((_P["swdge_fixed_ns"], 1.0), (_P["swdge_descriptor_ns"], float(count))),
                _P["dependency_latency_ns"], read_deps, ready, opcode + " (swdge)", "swdge")
        else:
            r = prog.res["queue_" + queue]
            issue, issue_end = self._add(NODE_ISSUE, program, r, r + 1, 0.0,
                                         ((_P["hwdge_issue_ns"], 1.0),), -1, set(), 0.0,
                                         opcode + " (hwdge)", queue)
        desc_param = _P["dma_indirect_descriptor_ns"] if descriptors else _P["dma_descriptor_ns"]
        const = nbytes / engines / (hw.dma_bytes_per_ns * efficiency)
        terms = ((desc_param, count / engines),)
        base = prog.res["dma0"]
        node, end = self._add(NODE_TRANSFER, program, base + e0, base + e1, const, terms,
                              _P["dma_fixed_latency_ns"], deps | {issue},
                              max(ready, issue_end), opcode, queue)
        self._update(spans, node, end)

    def barrier(self, program: int) -> None:
        """``core_barrier`` of an LNC 2 run: when the last program arrives, one node on every
        resource of every core (a full drain and release)."""
        self._take(program)
        self._barrier_arrivals += 1
        if self._barrier_arrivals < self.num_programs:
            return
        self._barrier_arrivals = 0
        self._add(NODE_BARRIER, -1, 0, self.num_resources, 0.0,
                  ((_P["barrier_latency_ns"], 1.0),), -1, set(), 0.0, "core_barrier")
