"""Online recording of a kernel's instruction stream as a dependency graph, scheduled as it runs.

One :class:`Timeline` per simulation (shared by the programs of an LNC 2 run). The operand
access layer reports every read and write of the running instruction (:meth:`note_view`,
:meth:`note_raw`); when the instruction is counted in the cost report, :meth:`compute` /
:meth:`dma` turn the pending accesses into a node of the graph:

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

The online pass uses the nominal parameters; it decides, per region, which earlier node a
new node waits for (the latest-ending reader at nominal for write-after-read).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.hardware import TWO_BYTE_FLOAT_DTYPES
from nkilib_msda.simulator.timing.constants import PARAM_NAMES, hardware_for, param_vector
from nkilib_msda.simulator.timing.guard import TimingWarning, guarded
from nkilib_msda.simulator.timing.costs import (Operand, compute_cycles, matmul_cycles,
                                                transpose_cycles)

__all__ = ["Timeline", "TimingWarning", "CORE_RESOURCES", "COMPUTE_ENGINES", "DMA_QUEUES",
           "NODE_COMPUTE", "NODE_ISSUE", "NODE_TRANSFER", "NODE_BARRIER", "core_resources"]

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")
QUEUES = ("queue_sync", "queue_act")  # hardware-DGE / trigger issue resources
# DMA queues: each has its own in-order lane on every DMA engine (see core_resources)
DMA_QUEUES = ("static", "sync", "act", "swdge")
_P = {name: i for i, name in enumerate(PARAM_NAMES)}
NODE_COMPUTE, NODE_ISSUE, NODE_TRANSFER, NODE_BARRIER = 0, 1, 2, 3
_MAX_CHUNKS = 256
_PARTITION_GROUP = 8
_MIN_CHUNK_BYTES = 64
_TWO_BYTE_FLOATS = frozenset(TWO_BYTE_FLOAT_DTYPES)
_INDIRECT_KINDS = frozenset({"indirect_gather", "indirect_scatter", "indirect_rmw",
                             "indirect_transpose", "compute"})


def core_resources(dma_engines: int) -> tuple[str, ...]:
    """Resource names of one core: compute engines, issue queues, and one in-order lane per
    (DMA queue, DMA engine) named ``"<queue>:dma<j>"``. Transfers of one queue follow each
    other on an engine; transfers of different queues do not block each other (the engines
    serve their queues round-robin); their shared bandwidth is bounded by ``Timing``."""
    return COMPUTE_ENGINES + QUEUES + tuple(f"{q}:dma{j}" for q in DMA_QUEUES
                                            for j in range(dma_engines))


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


_FLAGS: dict[Any, tuple[bool, bool]] = {}


def _dtype_flags(dtype: Any) -> tuple[bool, bool]:
    """(2-byte float, float32) of an NKI dtype."""
    flags = _FLAGS.get(dtype)
    if flags is None:
        name = str(dtype)
        flags = _FLAGS[dtype] = (name in _TWO_BYTE_FLOATS, name == "float32")
    return flags


class _Program:
    """Per-core state: pending accesses and resource ids."""

    def __init__(self, base: int, names: tuple[str, ...]) -> None:
        self.base = base
        self.res = {name: base + i for i, name in enumerate(names)}
        self.reads: list[tuple[Any, ...]] = []  # noted, resolved by Timeline._take
        self.writes: list[tuple[Any, ...]] = []


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
        self.preds: list[tuple[int, ...]] = []  # waited for, plus the node's latency
        self.order: list[tuple[int, ...]] = []  # waited for without latency (same DMA queue)
        self.name: list[str] = []
        self.queue: list[str] = []
        self.end: list[float] = []
        self.hbm_bytes = 0
        self._barrier_arrivals = 0
        self.failure: str | None = None  # the first recording error (see _guarded)

    # -- accesses ------------------------------------------------------------------------
    def note_view(self, program: int, t: Any, is_write: bool) -> None:
        """A read or write of the static view ``t`` by the running instruction (resolved when
        the instruction is recorded)."""
        prog = self.programs[program]
        (prog.writes if is_write else prog.reads).append((t,))

    def note_raw(self, program: int, storage: Any, addr: Any, dtype: Any,
                 is_write: bool) -> None:
        """A read or write at element addresses ``addr`` (a slice or an int array)."""
        prog = self.programs[program]
        (prog.writes if is_write else prog.reads).append((storage, addr, dtype))

    @staticmethod
    def _view_access(t: Any) -> _Access | None:
        """The region, partitions and operand facts of the static view ``t`` (shape,
        strides, offset in elements)."""
        storage = t.storage
        itemsize = t.dtype.itemsize
        shape, strides, offset = t.shape, t.strides, t.offset
        two, f32 = _dtype_flags(t.dtype)
        size = 1
        for n in shape:
            size *= n
        if size == 0:
            return None
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
                p1 = p0 + parts
                if lo < 0 or hi > storage.bytes_per_partition:  # wraps into other partitions
                    p0, p1 = 0, max(storage.partitions, p1)
                    lo, hi = 0, storage.bytes_per_partition
            else:  # an access pattern across partitions: the whole storage (conservative)
                p0, p1, lo, hi = 0, max(storage.partitions, parts), 0, storage.bytes_per_partition
            per = size // max(parts, 1)
        else:
            lo, hi = (offset + lo_e) * itemsize, (offset + hi_e + 1) * itemsize
            p0, p1, parts, per = 0, 1, 1, size
        op = Operand(storage.buffer, two, contiguous, parts, per, f32)
        return _Access(storage, lo, hi, p0, p1, size * itemsize, run * itemsize, op)

    @staticmethod
    def _raw_access(storage: Any, addr: Any, dtype: Any,
                    storage_order: bool = False) -> _Access | None:
        """The same for element addresses ``addr`` (a slice or an int array).

        ``storage_order``: the run is the mean contiguous run of the addresses as stored
        (sorted; within a partition on chip), not in the order the instruction visits them
        (a DMA transpose reads its source rows whole and permutes them; see :meth:`dma`);
        otherwise a non-contiguous address array counts as runs of one element."""
        itemsize = dtype.itemsize
        runs = 0
        if isinstance(addr, slice):
            lo_e, hi_e = addr.start or 0, addr.stop
            count = hi_e - lo_e
            contiguous = True
        else:
            addr = np.asarray(addr)
            count = int(addr.size)
            if count == 0:
                return None
            lo_e, hi_e = int(addr.min()), int(addr.max()) + 1
            contiguous = count == hi_e - lo_e
            if storage_order and not contiguous:
                ordered = np.sort(addr, axis=None)
                runs = 1 + int(np.count_nonzero(np.diff(ordered) != 1))
        if count <= 0:
            return None
        two, f32 = _dtype_flags(dtype)
        if storage.buffer in ("sbuf", "psum"):
            ppe = max(storage.bytes_per_partition // itemsize, 1)
            p0, p1 = lo_e // ppe, (hi_e - 1) // ppe + 1
            if p1 - p0 == 1:
                lo, hi = (lo_e - p0 * ppe) * itemsize, (hi_e - p0 * ppe) * itemsize
            else:
                lo, hi = 0, storage.bytes_per_partition
            per = max(count // (p1 - p0), 1)
            run = per if contiguous else max(count // runs, 1) if runs else 1
        else:
            lo, hi, p0, p1 = lo_e * itemsize, hi_e * itemsize, 0, 1
            per = count
            run = count if contiguous else max(count // runs, 1) if runs else 1
        op = Operand(storage.buffer, two, contiguous, p1 - p0, per, f32)
        return _Access(storage, lo, hi, p0, p1, count * itemsize, run * itemsize, op)

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

    def _deps(self, program: int, reads: list[_Access], writes: list[_Access]
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
             queue: str = "", order: set[int] | None = None) -> tuple[int, float]:
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
        self.end.append(end)
        return node, end

    def _take(self, program: int, storage_order: bool = False
              ) -> tuple[list[_Access], list[_Access]]:
        """The running instruction's reads and writes, resolved; clears them.
        ``storage_order``: runs of address arrays as stored (see :meth:`_raw_access`)."""
        prog = self.programs[program]
        noted = prog.reads, prog.writes
        prog.reads, prog.writes = [], []
        out: tuple[list[_Access], list[_Access]] = ([], [])
        for entries, accesses in zip(noted, out):
            for entry in entries:
                acc = self._view_access(entry[0]) if len(entry) == 1 \
                    else self._raw_access(entry[0], entry[1], entry[2], storage_order)
                if acc is not None:
                    accesses.append(acc)
        return out

    @guarded
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
        deps, _, spans = self._deps(program, reads, writes)
        prog = self.programs[program]
        r = prog.res[engine]
        node, end = self._add(NODE_COMPUTE, program, r, r + 1, cycles / clk, overhead,
                              _P["dependency_latency_ns"], deps, opcode)
        self._update(spans, node, end)

    @guarded
    def dma(self, program: int, opcode: str, kind: str, direction: str, elements: int,
            nbytes: int, hbm_bytes: int, descriptors: dict[int, int] | None,
            queue: str | None = None, skipped_descriptors: int = 0) -> None:
        """One DMA instruction: an issue node (hardware DGE queue, or software DGE on GpSimd)
        and a transfer node on the DMA engines its partitions map to.

        Descriptors: the indirect ones counted by the cost report, else one per contiguous
        run of the accesses as stored (at least one per partition). A direct
        ``dma_transpose`` thus counts its source rows: the architecture guide prices a DMA
        transpose as a share of DMA throughput (``dma_transpose_efficiency``), not as one
        descriptor per element of the permuted order; an address-array access (transpose,
        dynamic offset) into part of a larger SBUF allocation counts its runs within each
        partition, not one per element.

        ``skipped_descriptors`` (rows an ``oob_mode.skip`` DMA drops) cost like moved ones in
        the descriptor terms (DGE generation and the DMA engines' per-descriptor time) but move
        no bytes: no page says the hardware drops them before generating their descriptors
        (docs/timing.md, "Skipped rows")."""
        reads, writes = self._take(program, storage_order=not descriptors)
        hw = self.hw
        prog = self.programs[program]
        if nbytes < 0:
            nbytes = sum(a.nbytes for a in writes)
        self.hbm_bytes += int(hbm_bytes)
        chip = [a for a in writes + reads if a.op.buffer in ("sbuf", "psum")]
        if descriptors or skipped_descriptors:
            count = sum((descriptors or {}).values()) + skipped_descriptors
        else:
            runs = [a.run_bytes for a in reads + writes if a.run_bytes > 0]
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
        on_chip_dst = any(a.op.buffer == "sbuf" for a in writes)
        if kind in ("transpose", "indirect_transpose"):
            sbuf_src = any(a.op.buffer == "sbuf" for a in reads)
            efficiency = hw.dma_transpose_sbuf_efficiency if sbuf_src and on_chip_dst \
                else hw.dma_transpose_efficiency
        elif kind in ("compute", "indirect_rmw"):
            efficiency = 1.0 if (self.target == "trn3" and on_chip_dst) \
                else hw.dma_accumulate_efficiency
        indirect = kind in _INDIRECT_KINDS or queue == "swdge"
        if queue not in ("sync", "act", "swdge"):
            # dge_mode unknown/none: software DGE where only it can (indirect DMAs, dma_compute
            # on NC-v3), else descriptors the compiler prepared ("static"), triggered by Sync.
            queue = "swdge" if indirect else "static"
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
                              order=same_queue)
        self._update(spans, node, end)

    @guarded
    def barrier(self, program: int) -> None:
        """``core_barrier`` of an LNC 2 run: when the last program arrives, one node on every
        resource of every core (a full drain and release)."""
        prog = self.programs[program]
        prog.reads, prog.writes = [], []
        self._barrier_arrivals += 1
        if self._barrier_arrivals < self.num_programs:
            return
        self._barrier_arrivals = 0
        self._add(NODE_BARRIER, -1, 0, self.num_resources, 0.0,
                  ((_P["barrier_latency_ns"], 1.0),), -1, set(), "core_barrier")
