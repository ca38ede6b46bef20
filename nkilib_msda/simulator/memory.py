"""Memory: raw-byte storages with a "written" mask, and the per-program SBUF/PSUM budget.

A :class:`Storage` holds raw bytes, so any view may reinterpret them. HBM storages are linear;
on-chip (SBUF/PSUM) storages are ``partitions x bytes_per_partition`` laid out
partition-major. :class:`MemoryTracker` counts live on-chip bytes per partition of one program
(a tile is live while Python references it) and raises NkiError over the target's budget.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.targets import Target

__all__ = ["Storage", "MemoryTracker", "ON_CHIP", "HBM_BUFFERS", "BUFFERS"]

ON_CHIP = frozenset({"sbuf", "psum"})
HBM_BUFFERS = frozenset({"private_hbm", "shared_hbm"})
BUFFERS = ON_CHIP | HBM_BUFFERS


class Storage:
    """Raw bytes of one allocation plus a byte-wise "has been written" mask."""

    def __init__(self, buffer: str, nbytes: int, *, partitions: int = 0,
                 bytes_per_partition: int = 0, name: str = "", program_id: int = 0) -> None:
        if buffer not in BUFFERS:
            raise ValueError(f"Storage: unknown buffer {buffer!r}")
        self.buffer = buffer
        self.nbytes = int(nbytes)
        self.partitions = int(partitions)
        self.bytes_per_partition = int(bytes_per_partition)
        padded = -(-max(self.nbytes, 1) // 8) * 8  # lets the mask be viewed as uint16/32/64
        self.data = np.empty(padded, dtype=np.uint8)
        self.init = np.zeros(padded, dtype=np.uint8)
        self.name = name
        self.program_id = program_id
        self.written = False  # any write since creation (drives write-back of inputs)
        self.fully_initialised = False  # every byte written: initialisation checks can be skipped
        self.aux: dict[str, Any] = {}  # per-instruction-family bookkeeping (e.g. matmul flags)
        self.read_only: str | None = None  # why writes are rejected (a loop induction register)

    @property
    def is_on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def poison(self, dtype: Any) -> None:
        """Fill with NaN (floats) or 4 (ints), as the official simulator does."""
        view = self.data.view(dtype.np) if self.data.size % dtype.itemsize == 0 else None
        if view is None:
            return
        view[...] = np.nan if dtype.is_float else 4
        self.init[...] = 0
        self.fully_initialised = False

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



class MemoryTracker:
    """Live SBUF/PSUM bytes per partition of one program, with the target's limits."""

    def __init__(self, target: Target, report: CostReport) -> None:
        self.target = target
        self.report = report
        self.live = {"sbuf": 0, "psum": 0}
        self._lock = threading.Lock()

    def limit(self, buffer: str) -> int:
        if buffer == "sbuf":
            return self.target.usable_sbuf_bytes_per_partition
        return self.target.psum_bytes_per_partition

    def allocate(self, owner: object, buffer: str, bytes_per_partition: int,
                 instruction: str) -> None:
        """Reserve ``bytes_per_partition`` until ``owner`` is garbage collected."""
        with self._lock:
            new_live = self.live[buffer] + bytes_per_partition
            if new_live > self.limit(buffer):
                raise nki_error(
                    instruction, f"{buffer.upper()} capacity",
                    f"allocating {bytes_per_partition} B/partition would bring live {buffer} to "
                    f"{new_live} B/partition, over the {self.target.name} budget of "
                    f"{self.limit(buffer)} B/partition")
            self.live[buffer] = new_live
            self.report.note_memory(self.live["sbuf"], self.live["psum"])
        weakref.finalize(owner, self._release, buffer, bytes_per_partition)

    def _release(self, buffer: str, nbytes: int) -> None:
        with self._lock:
            self.live[buffer] -= nbytes
