"""Reading and writing tensor views, and the operand checks shared by all instructions.

Layer: above tensors/views, below the ALU semantics and the instructions (it never imports
them). Every write maintains the storage's "written" mask. Reading an element that was never
written is undefined behaviour on hardware; as in the official simulator, new allocations
hold NaN / the integer fill pattern and such reads simply return it
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/guides/nki_simulator.html).
In strict mode (``simulate(..., strict=True)`` / ``NKILIB_MSDA_EMULATOR_STRICT=1``) the read
raises NkiError "uninitialized read".

Cross-core races (LNC 2): every read and write of a ``shared_hbm`` storage (inputs, outputs,
``nl.shared_hbm`` allocations) is recorded per program and per barrier phase (the number of
``nki.lnc.core_barrier`` calls the program has passed). An access by one program to an element
the other program wrote in the same phase (read-after-write, write-after-write), or a write to
an element the other program read in the same phase (write-after-read), is unordered on
hardware (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.lnc.core_barrier.html):
``NkiHazardWarning`` "cross-core race" (strict mode: NkiError). The emulator runs the programs
one after the other, so without the check such a kernel silently reads the earlier program's
data. Nothing is tracked at LNC 1.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from nkilib_msda.simulator.context import current_or_none
from nkilib_msda.simulator.dtypes import cast_values
from nkilib_msda.simulator.errors import hazard, nki_error
from nkilib_msda.simulator.memory import RaceFlags
from nkilib_msda.simulator.tensor import (MAX_PARTITIONS, DynamicAccess, IndirectAccess,
                                          NkiTensor, Storage)

__all__ = ["read", "read_f32", "write", "store", "store_masked", "read_raw", "write_raw", "partition_info",
           "check_compute_partitions", "check_same_shape_per_partition", "check_buffer",
           "require_tensor", "mark_initialised", "check_initialised", "may_overlap",
           "strict_mode", "report_hazard", "note_access"]

_MASK_VIEW = {1: (np.uint8, 0x01), 2: (np.uint16, 0x0101), 4: (np.uint32, 0x01010101),
              8: (np.uint64, 0x0101010101010101)}


def require_tensor(t: Any, instruction: str, operand: str = "operand") -> NkiTensor:
    """Static NkiTensor operands only (compute engines cannot use indirect/dynamic views)."""
    if isinstance(t, NkiTensor):
        return t
    if isinstance(t, (IndirectAccess, DynamicAccess)):
        raise nki_error(instruction, "dynamic access",
                        f"{operand} is a dynamic/indirect access ({t!r}); only DMA instructions "
                        "accept vector_offset/scalar_offset/dynamic select views")
    raise nki_error(instruction, "operand type",
                    f"{operand} must be an NKI tensor, got {type(t).__name__}")


def strict_mode() -> bool:
    """Whether the running simulation is strict (False outside a kernel)."""
    ctx = current_or_none()
    return ctx is not None and ctx.options.strict


def report_hazard(instruction: str, rule: str, detail: str) -> None:
    """A hazard of the running simulation: NkiHazardWarning, or NkiError in strict mode."""
    hazard(instruction, rule, detail, strict=strict_mode(), stacklevel=4)


def check_initialised(storage: Storage, addr: Any, itemsize: int, instruction: str,
                      what: str = "") -> None:
    """Strict mode: raise if any element at ``addr`` (int array or slice, elements of
    ``itemsize``) was never written. Otherwise a no-op (the read returns the fill pattern)."""
    if storage.fully_initialised or not strict_mode():
        return
    view_dtype, full = _MASK_VIEW[itemsize]
    flags = storage.init.view(view_dtype)[addr]
    # Each mask byte is 0 or 1, so the minimum equals ``full`` iff every byte is set.
    if flags.size and flags.min() != full:
        _raise_uninitialised(storage, flags, full, instruction, what)


def _raise_uninitialised(storage: Storage, flags: np.ndarray, full: int, instruction: str,
                         what: str) -> None:
    bad = int(np.count_nonzero(flags != full))
    raise nki_error(instruction, "uninitialized read",
                    f"{bad} of {flags.size} elements read from {what or storage.name or 'a tensor'}"
                    f" ({storage.buffer}) were never written (allocations are uninitialised)")


def mark_initialised(storage: Storage, addr: Any, itemsize: int) -> None:
    storage.written = True
    if storage.fully_initialised:
        return
    view_dtype, full = _MASK_VIEW[itemsize]
    storage.init.view(view_dtype)[addr] = full
    if isinstance(addr, slice) and addr.start == 0 and addr.stop * itemsize >= storage.nbytes:
        storage.fully_initialised = True  # later checks on this storage are free


def _race_flags(storage: Storage) -> tuple[RaceFlags, Any] | None:
    """(the storage's race flags, the context) when cross-core races are tracked for it."""
    if storage.buffer != "shared_hbm":
        return None
    ctx = current_or_none()
    if ctx is None or not ctx.shared.race_tracking:
        return None
    flags = storage.race
    if flags is None:  # only one program runs at a time: no lock needed
        flags = storage.race = RaceFlags(storage.data.size, ctx.num_programs)
    flags.enter_phase(ctx.barrier_phase)
    return flags, ctx


def _select(buf: np.ndarray, itemsize: int, addr: Any, view: NkiTensor | None,
            mask: np.ndarray | None) -> np.ndarray:
    """The accessed elements of a byte mask ``buf``: ``addr`` (int array / slice) or the
    strided ``view`` (optionally only where ``mask`` is set), seen with ``itemsize``."""
    mask_dtype = _MASK_VIEW[itemsize][0]
    if view is None:
        return buf.view(mask_dtype)[addr]
    selected = view.np_view(buf, mask_dtype, itemsize)
    return selected if mask is None else selected[mask]


def _mark(buf: np.ndarray, bit: int, itemsize: int, addr: Any, view: NkiTensor | None,
          mask: np.ndarray | None) -> None:
    """Set flag ``bit`` in every byte of the accessed elements of ``buf``."""
    mask_dtype, full = _MASK_VIEW[itemsize]
    pattern = mask_dtype(bit * full)
    if view is None:
        buf.view(mask_dtype)[addr] |= pattern
    elif mask is None:
        view.np_view(buf, mask_dtype, itemsize)[...] |= pattern
    else:
        view.np_view(buf, mask_dtype, itemsize)[mask] |= pattern


def _changed(storage: Storage, itemsize: int, addr: Any, view: NkiTensor | None,
             mask: np.ndarray | None, values: Any) -> np.ndarray | bool:
    """Which written elements change their bytes (``values``: the new values, in access
    order); True when unknown."""
    if values is None:
        return True
    mask_dtype = _MASK_VIEW[itemsize][0]
    old = _select(storage.data, itemsize, addr, view, mask)
    new = np.asarray(values)
    if new.dtype.itemsize != itemsize or new.size not in (1, old.size):
        return True
    new = np.ascontiguousarray(new).view(mask_dtype)
    return old != (new.reshape(old.shape) if new.size == old.size else new.reshape(()))


def note_access(storage: Storage, itemsize: int, instruction: str, is_write: bool,
                addr: Any = None, view: NkiTensor | None = None,
                mask: np.ndarray | None = None, what: str = "", values: Any = None) -> None:
    """Record a shared-HBM access of the running LNC 2 program and report a cross-core race
    with the other program's accesses of the same barrier phase (see the module docstring).
    Call before a write lands; ``values`` (the new values) lets a write that leaves the bytes
    unchanged pass (no ordering of it can be observed)."""
    tracked = _race_flags(storage)
    if tracked is None:
        return
    flags, ctx = tracked
    me = ctx.program_id
    changed: Any = None  # computed once, only when a write conflicts
    mask_dtype, full = _MASK_VIEW[itemsize]
    for other in range(flags.programs):
        if other == me:
            continue
        conflicts = []
        found = [(flags.write_bit(other), "wrote", "write-after-write" if is_write
                  else "read-after-write")] if flags.any_write[other] else []
        if is_write and flags.any_read[other]:
            found.append((flags.read_bit(other), "read", "write-after-read"))
        for bit, verb, kind in found:
            hit = (_select(flags.bits, itemsize, addr, view, mask) & mask_dtype(bit * full)) != 0
            if is_write and hit.any():
                if changed is None:
                    changed = _changed(storage, itemsize, addr, view, mask, values)
                hit &= changed  # a write that keeps every byte cannot be observed
            n = int(np.count_nonzero(hit))
            if n:
                conflicts.append((n, verb, kind))
        for n, verb, kind in conflicts:
            if kind in flags.reported and not ctx.options.strict:
                continue
            flags.reported.add(kind)
            name = what or storage.name or "an unnamed tensor"
            hazard(instruction, "cross-core race",
                   f"program {me} {'writes' if is_write else 'reads'} {n} elements of {name} "
                   f"(shared_hbm) that program {other} {verb} in the same barrier phase "
                   f"{flags.phase} ({kind}); the cores run concurrently, so the order is "
                   "undefined without nki.lnc.core_barrier between the accesses",
                   strict=ctx.options.strict, stacklevel=5)
    if is_write:
        _mark(flags.bits, flags.write_bit(me), itemsize, addr, view, mask)
        flags.any_write[me] = True
    else:
        _mark(flags.bits, flags.read_bit(me), itemsize, addr, view, mask)
        flags.any_read[me] = True


def _note_timing_view(t: NkiTensor, is_write: bool) -> None:
    """Tell the running simulation's timing recorder about an access of the view ``t``."""
    ctx = current_or_none()
    if ctx is not None:
        ctx.events.access_view(t, is_write)


def _note_timing_raw(storage: Storage, addr: Any, dtype: Any, is_write: bool) -> None:
    ctx = current_or_none()
    if ctx is not None:
        ctx.events.access_raw(storage, addr, dtype, is_write)


def read_raw(storage: Storage, addr: Any, dtype: Any, instruction: str,
             what: str = "", note_timing: bool = True) -> np.ndarray:
    """Values (a new array) at element addresses ``addr`` (int array or slice) of
    ``storage`` seen as ``dtype``; raises on uninitialised elements. ``note_timing``: report
    the access to the timing model (callers that report a view themselves pass False)."""
    check_initialised(storage, addr, dtype.itemsize, instruction, what)
    if note_timing:
        _note_timing_raw(storage, addr, dtype, False)
    values = storage.data.view(dtype.np)[addr]
    if storage.buffer == "shared_hbm":
        note_access(storage, dtype.itemsize, instruction, False, addr=addr, what=what)
        storage.bytes_read += values.nbytes
    return values.copy() if isinstance(addr, slice) else values


def check_writable(storage: Storage, instruction: str = "write") -> None:
    """Writes to a read-only storage (a ``fori_loop`` induction register) are rejected."""
    if storage.read_only is not None:
        raise nki_error(instruction, storage.read_only,
                        f"{storage.name or 'this register'} is read-only: the loop induction "
                        "register of nl.fori_loop cannot be written by the kernel")


def write_raw(storage: Storage, addr: Any, values: np.ndarray, dtype: Any,
              instruction: str = "write", note_timing: bool = True) -> None:
    """Store ``values`` (already cast) at ``addr``; marks them initialised."""
    if storage.read_only is not None:
        check_writable(storage, instruction)
    if note_timing:
        _note_timing_raw(storage, addr, dtype, True)
    if storage.buffer == "shared_hbm":
        note_access(storage, dtype.itemsize, instruction, True, addr=addr, values=values)
    storage.data.view(dtype.np)[addr] = values
    mark_initialised(storage, addr, dtype.itemsize)


def read(t: Any, instruction: str) -> np.ndarray:
    """Values of a static view, shape ``t.shape``, dtype ``t.dtype.np`` (a new array)."""
    t = require_tensor(t, instruction)
    _note_timing_view(t, False)
    flat = t.run_slice()
    if flat is not None:
        return read_raw(t.storage, flat, t.dtype, instruction, t.name,
                        note_timing=False).reshape(t.shape)
    # Strided views read through NumPy strides (no address arrays): same elements.
    storage = t.storage
    itemsize = t.dtype.itemsize
    if not storage.fully_initialised and strict_mode():
        mask_dtype, full = _MASK_VIEW[itemsize]
        flags = t.np_view(storage.init, mask_dtype, itemsize)
        if flags.size and flags.min() != full:
            _raise_uninitialised(storage, flags, full, instruction, t.name)
    if storage.buffer == "shared_hbm":
        note_access(storage, itemsize, instruction, False, view=t, what=t.name)
        storage.bytes_read += t.size * itemsize
    return t.np_view(storage.data, t.dtype.np, itemsize).copy()


def read_f32(t: Any, instruction: str) -> np.ndarray:
    """Values of a static view converted to float32 (the engines' compute type)."""
    values = read(t, instruction)
    return values.astype(np.float32)


def write(t: Any, values: Any, instruction: str) -> None:
    """Cast ``values`` (exactly ``t.size`` elements, row-major) to ``t.dtype`` and store."""
    t = require_tensor(t, instruction, "dst")
    values = np.asarray(values)
    if values.size != t.size:
        raise nki_error(instruction, "element count",
                        f"writing {values.size} values into {t.name or 'dst'} of shape {t.shape}")
    store(t, cast_values(values, t.dtype).reshape(-1), instruction)


def store(t: NkiTensor, values: np.ndarray, instruction: str) -> None:
    """Store ``values`` (already ``t.dtype.np``, ``t.size`` elements, row-major) into the
    static view ``t``; a destination that addresses an element twice raises."""
    _note_timing_view(t, True)
    flat = t.run_slice()
    if flat is not None:
        write_raw(t.storage, flat, values, t.dtype, instruction, note_timing=False)
        return
    check_writable(t.storage, instruction)
    _check_no_double_write(t, instruction)
    # Strided destinations are written through NumPy strides (no address arrays).
    storage = t.storage
    itemsize = t.dtype.itemsize
    if storage.buffer == "shared_hbm":
        note_access(storage, itemsize, instruction, True, view=t, what=t.name,
                    values=values.reshape(t.shape))
    t.np_view(storage.data, t.dtype.np, itemsize)[...] = values.reshape(t.shape)
    storage.written = True
    if not storage.fully_initialised:
        mask_dtype, full = _MASK_VIEW[itemsize]
        t.np_view(storage.init, mask_dtype, itemsize)[...] = full


def store_masked(t: NkiTensor, values: np.ndarray, mask: np.ndarray, instruction: str) -> None:
    """Store ``values`` (``t.dtype.np``, one per selected element) where the bool ``mask``
    (shape ``t.shape``) is set; other elements keep their contents and "written" state."""
    storage = t.storage
    check_writable(storage, instruction)
    _check_no_double_write(t, instruction)
    _note_timing_view(t, True)
    itemsize = t.dtype.itemsize
    if storage.buffer == "shared_hbm":
        note_access(storage, itemsize, instruction, True, view=t, mask=mask, what=t.name,
                    values=values)
    t.np_view(storage.data, t.dtype.np, itemsize)[mask] = values
    storage.written = True
    if not storage.fully_initialised:
        mask_dtype, full = _MASK_VIEW[itemsize]
        t.np_view(storage.init, mask_dtype, itemsize)[mask] = full


def _check_no_double_write(t: NkiTensor, instruction: str) -> None:
    if may_overlap(t.shape, t.strides):
        addr = t.addresses().reshape(-1)
        if np.unique(addr).size != addr.size:
            raise nki_error(instruction, "overlapping destination",
                            "the destination view writes some elements more than once "
                            "(stride-0 / broadcast or overlapping pattern)")


def may_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """False when the strided view provably addresses every element once."""
    dims = sorted((abs(s), n) for s, n in zip(strides, shape) if n > 1)
    extent = 1  # elements spanned by the inner dims
    for s, n in dims:
        if s < extent:
            return True
        extent = s * (n - 1) + extent
    return False


def partition_info(t: Any) -> tuple[int, int, int]:
    """(start_partition, num_partitions, elements_per_partition) of an on-chip view."""
    t = require_tensor(t, "partition_info")
    if not t.is_on_chip:
        raise nki_error("partition_info", "buffer", f"{t.name} is in {t.buffer}, not on chip")
    num = t.shape[0] if t.shape else 1
    per = t.size // num if num else 0
    return t.start_partition, num, per


def check_compute_partitions(instruction: str, *tensors: Any) -> None:
    """Compute-engine partition rule (docs/emulator.md): <= 128 partitions, and the
    start partition must be 0 (any count), 32 (<= 32), 64 (<= 64) or 96 (<= 32); and at
    most ``MAX_COMPUTE_FREE_LEVELS`` free access-pattern levels (§3, §7a.4)."""
    for t in tensors:
        if t is None:
            continue
        t = require_tensor(t, instruction)
        if not t.is_on_chip:
            raise nki_error(instruction, "engine access",
                            f"{t.name or 'operand'} is in {t.buffer}; compute engines only "
                            "access SBUF/PSUM")
        start, num, _ = partition_info(t)
        if num > MAX_PARTITIONS:
            raise nki_error(instruction, "partition limit", f"{num} partitions > {MAX_PARTITIONS}")
        levels = free_levels(t) if len(t.shape) > 2 else 1
        if levels > MAX_COMPUTE_FREE_LEVELS:
            raise nki_error(instruction, "free levels",
                            f"{t.name or 'operand'} {t.shape} (strides {t.strides}) needs {levels} "
                            f"free access-pattern levels after merging contiguous dims; compute "
                            f"instructions take at most {MAX_COMPUTE_FREE_LEVELS} (copy it to a "
                            "contiguous tile first)")
        limit = {0: MAX_PARTITIONS, 32: 32, 64: 64, 96: 32}.get(start)
        if limit is None or num > limit:
            raise nki_error(instruction, "start partition",
                            f"Invalid access of {num} partitions starting at partition {start} "
                            f"({t.name}): allowed starts are 0 (<=128), 32 (<=32), 64 (<=64), "
                            "96 (<=32)")


MAX_COMPUTE_FREE_LEVELS = 3  # "hardware allows <= 4 free levels, most instructions <= 3"


def free_levels(t: NkiTensor) -> int:
    """Free access-pattern levels of an on-chip view once size-1 dims are dropped and
    row-major contiguous neighbours merged (what an instruction's access pattern needs)."""
    levels = 0
    inner = None  # (count, stride) of the last merged level
    for n, s in zip(reversed(t.shape[1:]), reversed(t.strides[1:])):
        if n == 1:
            continue
        if inner is not None and s == inner[1] * inner[0]:
            inner = (inner[0] * n, inner[1])
            continue
        levels += 1
        inner = (n, s)
    return levels


def check_same_shape_per_partition(instruction: str, *tensors: Any) -> None:
    """Equal partition counts and equal elements per partition (free shapes may differ)."""
    infos = []
    for t in tensors:
        if t is None:
            continue
        t = require_tensor(t, instruction)
        _, num, per = partition_info(t)
        infos.append((t, num, per))
    if not infos:
        return
    _, num0, per0 = infos[0]
    for t, num, per in infos[1:]:
        if num != num0 or per != per0:
            raise nki_error(instruction, "operand agreement",
                            f"operands must have equal partition counts and elements per "
                            f"partition: {infos[0][0].shape} ({num0} x {per0}) vs {t.shape} "
                            f"({num} x {per})")


def check_buffer(instruction: str, operand_name: str, t: Any, allowed: Iterable[str]) -> None:
    """Raise unless ``t`` lives in one of ``allowed`` (names: sbuf, psum, private_hbm,
    shared_hbm; "hbm" stands for both HBM buffers)."""
    allowed = set(allowed)
    if "hbm" in allowed:
        allowed |= {"private_hbm", "shared_hbm"}
    buf = t.buffer
    if buf not in allowed:
        raise nki_error(instruction, "buffer access",
                        f"{operand_name} is in {buf}; {instruction} accepts {sorted(allowed)}")
