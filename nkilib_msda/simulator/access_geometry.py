"""Geometry of one operand access: which bytes, partitions and contiguous runs an instruction
touches (:class:`Access`), from a static view or from element addresses.

The emulator resolves every read and write of an instruction into an :class:`Access` when it
announces the instruction (:mod:`nkilib_msda.simulator.events`); subscribers (the timing
recorder) read the facts, they never look at views or address arrays themselves. Only
duck-typed attributes of storages (``buffer``, ``partitions``, ``bytes_per_partition``) and
dtypes (``itemsize``, ``str``) are used, so this module imports nothing of the emulator (only
the package's hardware facts).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from nkilib_msda.hardware import TWO_BYTE_FLOAT_DTYPES

__all__ = ["Access", "view_access", "raw_access"]

_ON_CHIP = ("sbuf", "psum")
_TWO_BYTE_FLOATS = frozenset(TWO_BYTE_FLOAT_DTYPES)


class Access(NamedTuple):
    """One read or write of an instruction.

    - ``storage``: the storage touched (its identity keys the dependency regions);
    - ``lo``, ``hi``: byte range within a partition on chip (SBUF/PSUM), flat in HBM;
    - ``p0``, ``p1``: partitions touched (``0, 1`` in HBM);
    - ``nbytes``: bytes accessed; ``run_bytes``: bytes of one contiguous run (a DMA descriptor);
    - the operand facts of the cost formulas: ``buffer`` ("sbuf", "psum" or an HBM buffer),
      ``two_byte_float`` (bf16/fp16), ``contiguous`` (innermost free dim), ``partitions``,
      ``elems_per_partition``, ``fp32``.
    """

    storage: Any
    lo: int
    hi: int
    p0: int
    p1: int
    nbytes: int
    run_bytes: int
    buffer: str
    two_byte_float: bool
    contiguous: bool
    partitions: int
    elems_per_partition: int
    fp32: bool


_FLAGS: dict[Any, tuple[bool, bool]] = {}


def _dtype_flags(dtype: Any) -> tuple[bool, bool]:
    """(2-byte float, float32) of an NKI dtype."""
    flags = _FLAGS.get(dtype)
    if flags is None:
        name = str(dtype)
        flags = _FLAGS[dtype] = (name in _TWO_BYTE_FLOATS, name == "float32")
    return flags


def view_access(t: Any) -> Access | None:
    """The access of the static view ``t`` (``storage``, ``dtype``, ``shape``, ``strides``,
    ``offset`` in elements; on chip the first dim is the partition dim); None when empty.
    A view whose partition stride is not one partition, or that wraps past a partition, counts
    as the whole storage (conservative)."""
    storage = t.storage
    itemsize = t.dtype.itemsize
    shape, strides, offset = t.shape, t.strides, t.offset
    two, f32 = _dtype_flags(t.dtype)
    size = 1
    for n in shape:
        size *= n
    if size == 0:
        return None
    on_chip = storage.buffer in _ON_CHIP
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
    return Access(storage, lo, hi, p0, p1, size * itemsize, run * itemsize, storage.buffer, two,
                  contiguous, parts, per, f32)


def raw_access(storage: Any, addr: Any, dtype: Any, storage_order: bool = False
               ) -> Access | None:
    """The access of element addresses ``addr`` (a slice or an int array) of ``storage``
    seen as ``dtype``; None when empty.

    ``storage_order``: the run is the mean contiguous run of the addresses as stored (sorted;
    within a partition on chip), not in the order the instruction visits them (a DMA
    transpose reads its source rows whole and permutes them); otherwise a non-contiguous
    address array counts as runs of one element."""
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
    if storage.buffer in _ON_CHIP:
        ppe = max(storage.bytes_per_partition // itemsize, 1)
        p0, p1 = lo_e // ppe, (hi_e - 1) // ppe + 1
        if p1 - p0 == 1:
            lo, hi = (lo_e - p0 * ppe) * itemsize, (hi_e - p0 * ppe) * itemsize
        elif isinstance(addr, slice):  # a flat run across partitions: whole rows
            lo, hi = 0, storage.bytes_per_partition
        else:  # the columns the addresses touch in any partition (a transpose's block)
            cols = addr % ppe
            lo, hi = int(cols.min()) * itemsize, (int(cols.max()) + 1) * itemsize
        per = max(count // (p1 - p0), 1)
        run = per if contiguous else max(count // runs, 1) if runs else 1
    else:
        lo, hi, p0, p1 = lo_e * itemsize, hi_e * itemsize, 0, 1
        per = count
        run = count if contiguous else max(count // runs, 1) if runs else 1
    return Access(storage, lo, hi, p0, p1, count * itemsize, run * itemsize, storage.buffer, two,
                  contiguous, p1 - p0, per, f32)
