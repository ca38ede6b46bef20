"""Memory: raw-byte storages with a "written" mask, and the per-program SBUF/PSUM budget.

A :class:`Storage` holds raw bytes, so any view may reinterpret them. HBM storages are linear;
on-chip (SBUF/PSUM) storages are ``partitions x bytes_per_partition`` laid out
partition-major. :class:`MemoryTracker` counts live on-chip bytes per partition of one program
(a tile is live while Python references it; ``address=`` placements are counted as placed
memory) and raises NkiError over the target's budget.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from nkilib_msda.simulator.errors import hazard, nki_error
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.targets import Target

__all__ = ["Storage", "MemoryTracker", "RaceFlags", "ON_CHIP", "HBM_BUFFERS", "BUFFERS"]

ON_CHIP = frozenset({"sbuf", "psum"})
HBM_BUFFERS = frozenset({"private_hbm", "shared_hbm"})
BUFFERS = ON_CHIP | HBM_BUFFERS


class Storage:
    """Raw bytes of one allocation plus a byte-wise "has been written" mask.

    ``data`` (the bytes) and ``init`` (the mask) are created on first use: many kernels
    allocate tiles they never touch (AWS's modular allocator hands out whole circular-buffer
    lists up front; attention_cte at seqlen 8192 writes 0.5 of its 2.7 GB of allocations), and
    filling pages that are never read costs a page fault per 4 KiB. A storage poisoned before
    first use is filled then, so its bytes read exactly as if it had been filled at
    allocation (:meth:`poison`)."""

    def __init__(self, buffer: str, nbytes: int, *, partitions: int = 0,
                 bytes_per_partition: int = 0, name: str = "", program_id: int = 0) -> None:
        if buffer not in BUFFERS:
            raise ValueError(f"Storage: unknown buffer {buffer!r}")
        self.buffer = buffer
        self.nbytes = int(nbytes)
        self.partitions = int(partitions)
        self.bytes_per_partition = int(bytes_per_partition)
        self.padded = -(-max(self.nbytes, 1) // 8) * 8  # lets the mask be viewed as uint16/32/64
        self._poison_dtype: Any = None  # the poison still to apply when ``data`` is created
        self.name = name
        self.program_id = program_id
        self.written = False  # any write since creation (drives write-back of inputs)
        self.fully_initialised = False  # every byte written: initialisation checks can be skipped
        self.aux: dict[str, Any] = {}  # per-instruction-family bookkeeping (e.g. matmul flags)
        self.read_only: str | None = None  # why writes are rejected (a loop induction register)
        self.race: RaceFlags | None = None  # LNC 2 shared_hbm only: cross-core race bookkeeping
        self.bytes_read = 0  # shared_hbm only: bytes read by instructions (progress display)

    def __getattr__(self, name: str) -> Any:
        """Creates ``data`` and ``init`` on their first use (only called for attributes not
        yet set): ``data`` uninitialised and then poisoned if :meth:`poison` was called,
        ``init`` zeroed (calloc'd pages stay untouched until written)."""
        if name not in ("data", "init") or "padded" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.data = np.empty(self.padded, dtype=np.uint8)
        self.init = np.zeros(self.padded, dtype=np.uint8)
        if self._poison_dtype is not None:
            self._fill_poison(self._poison_dtype)
            self._poison_dtype = None
        return self.__dict__[name]

    @property
    def materialised(self) -> bool:
        """Whether ``data`` and ``init`` exist yet (a never-used storage has neither)."""
        return "data" in self.__dict__

    @property
    def is_on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def poison(self, dtype: Any) -> None:
        """Fill with NaN (floats) or 4 (ints), as the official simulator does; marks every
        byte unwritten. Before ``data`` exists the fill is applied when it is created."""
        if self.padded % dtype.itemsize:
            return
        self.fully_initialised = False
        if not self.materialised:
            self._poison_dtype = dtype
            return
        self._fill_poison(dtype)
        self.init[...] = 0

    def _fill_poison(self, dtype: Any) -> None:
        self.data.view(dtype.np)[...] = np.nan if dtype.is_float else 4

    def numel(self, itemsize: int) -> int:
        return self.nbytes // itemsize

    def ppe(self, itemsize: int) -> int:
        """Elements per partition for an on-chip storage seen as dtype of ``itemsize``."""
        return self.bytes_per_partition // itemsize

    def __repr__(self) -> str:
        if self.is_on_chip:
            return (f"Storage({self.buffer}, {self.partitions} partitions x "
                    f"{self.bytes_per_partition} B, {self.name!r})")
        return f"Storage({self.buffer}, {self.nbytes} B, {self.name!r})"


class RaceFlags:
    """Byte-wise accesses to one shared storage in the current barrier phase, per program.

    One flag byte per data byte holds every program's marks: bit ``2p`` "program p read this
    byte", bit ``2p + 1`` "program p wrote it", since the last ``core_barrier`` (phase
    ``phase``); a new phase clears them (accesses in different phases are ordered by the
    barrier). Packing the marks keeps the tracking at one byte per shared byte at LNC 2
    (separate read and write masks per program took four). ``any_read`` / ``any_write`` let
    checks skip a program that did not touch the storage in this phase; ``reported`` limits
    warnings to one per kind of race and phase."""

    def __init__(self, padded: int, programs: int) -> None:
        if programs > 4:
            raise ValueError(f"RaceFlags: at most 4 programs fit one flag byte, got {programs}")
        self.phase = 0
        self.programs = programs
        self.bits = np.zeros(padded, dtype=np.uint8)
        self.any_read = [False] * programs
        self.any_write = [False] * programs
        self.reported: set[str] = set()

    @staticmethod
    def read_bit(program: int) -> int:
        return 1 << (2 * program)

    @staticmethod
    def write_bit(program: int) -> int:
        return 2 << (2 * program)

    def enter_phase(self, phase: int) -> None:
        if phase == self.phase:
            return
        self.phase = phase
        if any(self.any_read) or any(self.any_write):
            self.bits[...] = 0
        self.any_read = [False] * self.programs
        self.any_write = [False] * self.programs
        self.reported = set()


class MemoryTracker:
    """Live SBUF/PSUM bytes per partition of one program, with the target's limits.

    A tile is live while Python references it. Tiles allocated without ``address=`` add
    their bytes per partition. Tiles placed with ``address=(partition, byte)`` (or a byte
    offset) occupy that byte range: tiles placed at the same range are one allocation, and
    the placed bytes counted are the union of the live placed ranges (the allocator reuses
    addresses; R09). Two live placed tiles whose ranges overlap without being the same
    allocation are reported (once per program) as an ``NkiHazardWarning`` "overlapping
    placement" (strict mode: NkiError): a tile's Python lifetime can outlast its use, so the emulator cannot prove the
    overlap is a bug. Placed tiles do not share data in the emulator.
    """

    def __init__(self, target: Target, report: CostReport, strict: bool = False) -> None:
        self.target = target
        self._overlap_reported = False
        self.report = report
        self.strict = strict
        self.live = {"sbuf": 0, "psum": 0}
        self._auto = {"sbuf": 0, "psum": 0}
        # buffer -> {(p0, partitions, start, nbytes): live tile count}
        self._placed: dict[str, dict[tuple[int, int, int, int], int]] = {"sbuf": {}, "psum": {}}
        self._lock = threading.Lock()

    def limit(self, buffer: str) -> int:
        if buffer == "sbuf":
            return self.target.usable_sbuf_bytes_per_partition
        return self.target.psum_bytes_per_partition

    def physical(self, buffer: str) -> int:
        if buffer == "sbuf":
            return self.target.sbuf_bytes_per_partition
        return self.target.psum_bytes_per_partition

    def allocate(self, owner: object, buffer: str, bytes_per_partition: int,
                 instruction: str, address: Any = None, partitions: int = 1) -> None:
        """Reserve ``bytes_per_partition`` (at ``address`` when given) until ``owner`` is
        garbage collected."""
        placement = _placement(address, instruction)
        if placement is None:
            self._allocate_auto(owner, buffer, bytes_per_partition, instruction)
            return
        p0, start = placement
        key = (p0, int(partitions), start, int(bytes_per_partition))
        if start + bytes_per_partition > self.physical(buffer) or start < 0:
            raise nki_error(instruction, f"{buffer.upper()} placement",
                            f"address={address!r} with {bytes_per_partition} B/partition ends at "
                            f"byte {start + bytes_per_partition}, outside the "
                            f"{self.physical(buffer)} B/partition {buffer} of {self.target.name}")
        overlap = None
        with self._lock:
            placed = self._placed[buffer]
            if key not in placed:
                overlap = next((k for k in placed if _overlaps(k, key)), None)
            self._check_capacity(buffer, instruction, self._auto[buffer],
                                 _union_bytes(list(placed) + [key]), bytes_per_partition)
            placed[key] = placed.get(key, 0) + 1
            self._update(buffer)
        if overlap is not None and not self._overlap_reported:
            # Once per program: allocators such as nki-library's SbufManager reuse addresses
            # thousands of times per kernel while old Python handles are still alive.
            self._overlap_reported = True
            hazard(instruction, "overlapping placement",
                   f"{buffer} tile at address (partition {p0}, byte {start}), {partitions} "
                   f"partitions x {bytes_per_partition} B, overlaps the live tile at (partition "
                   f"{overlap[0]}, byte {overlap[2]}), {overlap[1]} partitions x {overlap[3]} B "
                   "without being the same allocation (reported once per program)",
                   strict=self.strict, stacklevel=4)
        weakref.finalize(owner, self._release_placed, buffer, key)

    def _allocate_auto(self, owner: object, buffer: str, nbytes: int, instruction: str) -> None:
        with self._lock:
            self._check_capacity(buffer, instruction, self._auto[buffer] + nbytes,
                                 _union_bytes(self._placed[buffer]), nbytes)
            self._auto[buffer] += nbytes
            self._update(buffer)
        weakref.finalize(owner, self._release, buffer, nbytes)

    def _check_capacity(self, buffer: str, instruction: str, auto: int, placed: int,
                        nbytes: int) -> None:
        new_live = auto + placed
        if new_live > self.limit(buffer):
            raise nki_error(
                instruction, f"{buffer.upper()} capacity",
                f"allocating {nbytes} B/partition would bring live {buffer} to "
                f"{new_live} B/partition, over the {self.target.name} budget of "
                f"{self.limit(buffer)} B/partition")

    def _update(self, buffer: str) -> None:
        self.live[buffer] = self._auto[buffer] + _union_bytes(self._placed[buffer])
        self.report.note_memory(self.live["sbuf"], self.live["psum"])

    def _release(self, buffer: str, nbytes: int) -> None:
        with self._lock:
            self._auto[buffer] -= nbytes
            self.live[buffer] -= nbytes

    def _release_placed(self, buffer: str, key: tuple[int, int, int, int]) -> None:
        with self._lock:
            placed = self._placed[buffer]
            placed[key] -= 1
            if placed[key] == 0:
                del placed[key]
            self.live[buffer] = self._auto[buffer] + _union_bytes(placed)


def _placement(address: Any, instruction: str) -> tuple[int, int] | None:
    """``address=`` as (start partition, byte offset in the partition); None when unplaced."""
    if address is None:
        return None
    if isinstance(address, (int, np.integer)) and not isinstance(address, bool):
        return 0, int(address)
    if isinstance(address, (tuple, list)) and len(address) == 2 and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in address):
        return int(address[0]), int(address[1])
    raise nki_error(instruction, "address",
                    f"address must be a byte offset or a (partition, byte offset) pair, got "
                    f"{address!r}")


def _overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether two placements (p0, partitions, start, nbytes) share a byte of a partition."""
    parts = a[0] < b[0] + b[1] and b[0] < a[0] + a[1]
    return parts and a[2] < b[2] + b[3] and b[2] < a[2] + a[3]


def _union_bytes(keys: Any) -> int:
    """Bytes per partition covered by the union of the placed byte ranges (any partition)."""
    spans = sorted((k[2], k[2] + k[3]) for k in keys)
    total, end = 0, None
    for lo, hi in spans:
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total
