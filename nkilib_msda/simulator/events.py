"""Instruction events: the one place where the emulator announces what an instruction does.

Each program of a run has one :class:`InstructionEvents`. The operand access layer reports
every read and write of the running instruction (:meth:`~InstructionEvents.access_view`,
:meth:`~InstructionEvents.access_raw`); the instruction then announces itself once, as a
:class:`ComputeEvent` (any engine, ``"dma"`` and ``"sync"`` included), a :class:`DmaEvent`
(a DMA with its kind, direction, bytes and descriptors) or a barrier. The event carries the
instruction's accesses resolved into :class:`~.access_geometry.Access` facts.

Subscribers (:class:`Subscriber`) receive every event in program order: the cost report
(counts) and, when timing is on, the timing recorder (the dependency graph). Subscribers
never see views or address arrays, and they never call each other.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Protocol, Sequence

from nkilib_msda.simulator.access_geometry import Access, raw_access, view_access

__all__ = ["ENGINES", "DMA_KINDS", "DMA_DIRECTIONS", "ComputeEvent", "DmaEvent", "Subscriber",
           "InstructionEvents", "check_engine", "check_dma"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "sync")
DMA_KINDS = ("direct", "indirect_gather", "indirect_scatter", "indirect_rmw", "transpose",
             "indirect_transpose", "compute")
DMA_DIRECTIONS = ("hbm_to_sbuf", "sbuf_to_hbm", "hbm_to_hbm", "sbuf_to_sbuf", "mixed_to_sbuf",
                  "mixed_to_hbm")


class ComputeEvent(NamedTuple):
    """One instruction counted on ``engine`` (one of :data:`ENGINES`): ``elements`` processed,
    its reads and writes. ``engine == "dma"``: a DMA-engine instruction the emulator does not
    classify as a DMA kind (an HBM memset, an LNC sendrecv); ``"sync"``: a core barrier."""

    engine: str
    opcode: str
    elements: int
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]


class DmaEvent(NamedTuple):
    """One DMA instruction: ``kind`` (:data:`DMA_KINDS`), ``direction``
    (:data:`DMA_DIRECTIONS`), ``elements``, ``nbytes`` written to the destination,
    ``hbm_bytes`` read from plus written to HBM, ``descriptors`` as a histogram
    ``{bytes_per_descriptor: count}`` (indirect DMAs; None otherwise), descriptors
    skipped (out-of-bounds indices), and ``queue`` ("sync"/"act": hardware DGE, "swdge":
    software DGE, None: chosen by kind)."""

    opcode: str
    kind: str
    direction: str
    elements: int
    nbytes: int
    hbm_bytes: int
    descriptors: Mapping[int, int] | None
    skipped_descriptors: int
    queue: str | None
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]


class Subscriber(Protocol):
    """What listens to a program's instructions. ``wants_accesses``: whether the events must
    carry resolved accesses (resolving costs time; the cost report does not need them)."""

    wants_accesses: bool

    def on_compute(self, program: int, event: ComputeEvent) -> None: ...

    def on_dma(self, program: int, event: DmaEvent) -> None: ...

    def on_barrier(self, program: int) -> None: ...


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"instruction event: engine must be one of {ENGINES}, got {engine!r}")


def check_dma(kind: str, direction: str) -> None:
    if kind not in DMA_KINDS:
        raise ValueError(f"DMA event: kind must be one of {DMA_KINDS}, got {kind!r}")
    if direction not in DMA_DIRECTIONS:
        raise ValueError(f"DMA event: direction must be one of {DMA_DIRECTIONS}, got "
                         f"{direction!r}")


_NO_ACCESSES: tuple[Access, ...] = ()


class InstructionEvents:
    """The event source of one program (see the module docstring)."""

    __slots__ = ("program", "subscribers", "wants_accesses", "_reads", "_writes")

    def __init__(self, program: int, subscribers: Sequence[Subscriber]) -> None:
        self.program = program
        self.subscribers = tuple(subscribers)
        self.wants_accesses = any(s.wants_accesses for s in self.subscribers)
        # pending accesses of the running instruction, resolved when it is announced
        self._reads: list[tuple[Any, ...]] = []
        self._writes: list[tuple[Any, ...]] = []

    # -- accesses of the running instruction ---------------------------------------------
    def access_view(self, t: Any, is_write: bool) -> None:
        """A read or write of the static view ``t``."""
        if self.wants_accesses:
            (self._writes if is_write else self._reads).append((t,))

    def access_raw(self, storage: Any, addr: Any, dtype: Any, is_write: bool) -> None:
        """A read or write at element addresses ``addr`` (a slice or an int array)."""
        if self.wants_accesses:
            (self._writes if is_write else self._reads).append((storage, addr, dtype))

    def _take(self, storage_order: bool) -> tuple[tuple[Access, ...], tuple[Access, ...]]:
        """The pending reads and writes, resolved; clears them. ``storage_order``: runs of
        address arrays as stored (a DMA without counted descriptors: see ``raw_access``)."""
        if not self._reads and not self._writes:
            return _NO_ACCESSES, _NO_ACCESSES
        noted = self._reads, self._writes
        self._reads, self._writes = [], []
        out: list[tuple[Access, ...]] = []
        for entries in noted:
            resolved = []
            for entry in entries:
                acc = view_access(entry[0]) if len(entry) == 1 \
                    else raw_access(entry[0], entry[1], entry[2], storage_order)
                if acc is not None:
                    resolved.append(acc)
            out.append(tuple(resolved))
        return out[0], out[1]

    # -- instructions ------------------------------------------------------------------------
    def compute(self, engine: str, opcode: str, elements: int) -> None:
        """One instruction of ``opcode`` on ``engine`` processing ``elements`` elements."""
        check_engine(engine)
        reads, writes = self._take(storage_order=engine == "dma")
        event = ComputeEvent(engine, opcode, int(elements), reads, writes)
        for s in self.subscribers:
            s.on_compute(self.program, event)

    def dma(self, opcode: str, kind: str, direction: str, elements: int, nbytes: int,
            hbm_bytes: int = 0, descriptors: Mapping[int, int] | None = None,
            skipped_descriptors: int = 0, queue: str | None = None) -> None:
        """One DMA instruction (see :class:`DmaEvent`)."""
        check_dma(kind, direction)
        reads, writes = self._take(storage_order=not descriptors)
        event = DmaEvent(opcode, kind, direction, int(elements), int(nbytes), int(hbm_bytes),
                         descriptors, int(skipped_descriptors), queue, reads, writes)
        for s in self.subscribers:
            s.on_dma(self.program, event)

    def barrier(self) -> None:
        """``core_barrier`` (or a sendrecv rendezvous) of an LNC 2 run reached by this
        program; pending accesses are dropped."""
        self._reads, self._writes = [], []
        for s in self.subscribers:
            s.on_barrier(self.program)
