"""The emulated ``nki.language`` (``nl``) namespace: buffers, dtypes, allocation, launch
queries, tile sizes, loop helpers, and (from :mod:`alu`) the op identities and math wrappers."""

from __future__ import annotations

import builtins
import math
import warnings
from enum import Enum
from typing import Any

import numpy as np

from nkilib_msda.hardware import PARTITIONS as _PARTITIONS
from nkilib_msda.hardware import PE_ARRAY_SIZE as _PE_ARRAY_SIZE
from nkilib_msda.simulator.access import mark_initialised, write
from nkilib_msda.simulator.alu import *  # noqa: F401,F403
from nkilib_msda.simulator.alu import __all__ as _alu_all
from nkilib_msda.simulator.context import current, current_or_none
from nkilib_msda.simulator.dtypes import (bfloat16, bool_, cast_values, float8_e4m3,  # noqa: F401
                                          float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float16,
                                          float32, int8, int16, int32, tfloat32, to_nki_dtype,
                                          uint8, uint16, uint32)
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.targets import get_target
from nkilib_msda.simulator.tensor import NkiTensor, Storage

DType = str  # nl.DType: dtypes are string-like

_OWN = [
    "DType",
    "MemoryRegion", "sbuf", "psum", "hbm", "private_hbm", "shared_hbm",
    "bfloat16", "bool_", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
    "float16", "float32", "int8", "int16", "int32", "tfloat32", "uint8", "uint16", "uint32",
    "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "shared_constant",
    "shared_identity_matrix", "program_id", "num_programs", "program_ndim", "tile_size", "ds",
    "range", "affine_range", "sequential_range", "static_range", "device_print", "no_reorder",
    "NKIObject", "load", "store", "NkiTensor", "fori_loop", "while_loop", "is_hbm", "is_on_chip",
    "is_psum", "is_sbuf",
]
__all__ = _OWN + [n for n in _alu_all if n not in _OWN]


class MemoryRegion(str, Enum):
    """Buffer kinds, an Enum of string values as in NKI 0.8's ``nki.language.MemoryRegion``
    (_modules/nki/language.html): ``nl.hbm`` is an alias of ``nl.private_hbm``.

    A tensor's ``.buffer`` is the region's name string, and members compare equal to it, so
    ``t.buffer == nl.sbuf`` and ``t.buffer in (nl.hbm, nl.shared_hbm)`` behave as in NKI (R10):
    ``nl.hbm == nl.private_hbm``; ``nl.shared_hbm`` differs from both."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    __str__ = str.__str__


sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = private_hbm  # nl.hbm aliases private_hbm
shared_hbm = MemoryRegion.shared_hbm


def is_hbm(buffer: Any) -> bool:
    """True for ``nl.hbm`` / ``nl.private_hbm`` / ``nl.shared_hbm`` (or a tensor's ``.buffer``)."""
    return buffer in (private_hbm, shared_hbm)


def is_on_chip(buffer: Any) -> bool:
    """True for ``nl.sbuf`` / ``nl.psum``."""
    return buffer in (sbuf, psum)


def is_psum(buffer: Any) -> bool:
    return buffer == psum


def is_sbuf(buffer: Any) -> bool:
    return buffer == sbuf


def _buffer_name(buffer: Any, what: str) -> str:
    if isinstance(buffer, MemoryRegion):
        return buffer.value
    raise nki_error(what, "buffer", f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or "
                                    f"nl.shared_hbm (named members, not strings), got {buffer!r}")


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if isinstance(shape, list):
        raise nki_error(what, "shape", "shape must be a tuple (lists are rejected in beta 2)")
    if not isinstance(shape, tuple) or not shape:
        raise nki_error(what, "shape", f"shape must be a non-empty tuple of ints, got {shape!r}")
    out = []
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise nki_error(what, "shape", f"dims must be positive ints, got {shape!r}")
        out.append(int(n))
    return tuple(out)


def _allocate(shape: tuple[int, ...], dtype: Any, buf: str, name: str, address: Any,
              what: str) -> NkiTensor:
    ctx = current()
    dt = to_nki_dtype(dtype)
    if buf in ("sbuf", "psum"):
        if len(shape) < 2:
            raise nki_error(what, "on-chip rank",
                            f"on-chip tensors are (partitions, free...) and at least 2-D, got {shape}")
        if shape[0] > ctx.target.num_partitions:
            raise nki_error(what, "partition limit",
                            f"dim 0 of an on-chip tensor is the partition dim: {shape[0]} > "
                            f"{ctx.target.num_partitions}")
        bpp = math.prod(shape[1:]) * dt.itemsize
        if buf == "psum" and address is not None:
            addr = address if isinstance(address, (int, np.integer)) else None
            if isinstance(address, tuple) and address and isinstance(address[-1], (int, np.integer)):
                addr = address[-1]
            if addr is not None and addr % ctx.target.psum_bank_bytes:
                raise nki_error(what, "PSUM address",
                                f"PSUM placements must be bank-aligned ({ctx.target.psum_bank_bytes} "
                                f"B), got address={address}")
        # address= places a tensor (counted as placed memory, R09); data is not aliased.
        storage = Storage(buf, shape[0] * bpp, partitions=shape[0], bytes_per_partition=bpp,
                          name=name, program_id=ctx.program_id)
        ctx.memory.allocate(storage, buf, bpp, what, address=address, partitions=shape[0])
    elif buf == "shared_hbm":
        nbytes = math.prod(shape) * dt.itemsize

        def make() -> Storage:
            s = Storage(buf, nbytes, name=name, program_id=ctx.program_id)
            s.poison(dt)
            return s

        def check(existing: Storage) -> None:
            if existing.nbytes != nbytes:
                raise nki_error(what, "LNC shared_hbm mismatch",
                                f"program {ctx.program_id} allocation #{ctx.shared_allocation_count}"
                                f" ({shape}, {dt}) does not match the other program's "
                                f"({existing.nbytes} B): both programs must allocate shared_hbm "
                                "tensors in the same order")

        storage = ctx.shared_allocation(make, check)
        return NkiTensor(storage, dt, shape, name=name)
    else:
        storage = Storage(buf, math.prod(shape) * dt.itemsize, name=name,
                          program_id=ctx.program_id)
    storage.poison(dt)
    return NkiTensor(storage, dt, shape, name=name)


def ndarray(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "",
            address: Any = None) -> NkiTensor:
    """Allocate an uninitialised tensor (NaN / 4 poisoned; reading it unwritten raises)."""
    return _allocate(_shape(shape, "ndarray"), dtype, _buffer_name(buffer, "ndarray"),
                     name, address, "ndarray")


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """Allocate and fill (a memset on chip, a DMA write in HBM)."""
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    write(t, np.full(t.size, fill_value), "full")
    current().events.compute("vector" if t.is_on_chip else "dma", "memset", t.size)
    return t


def zeros(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    return full(shape, 0, dtype, buffer=buffer, name=name)


def ones(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    return full(shape, 1, dtype, buffer=buffer, name=name)


_REGIONS = {"sbuf": sbuf, "psum": psum, "private_hbm": private_hbm, "shared_hbm": shared_hbm}


def empty_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return ndarray(x.shape, dtype or x.dtype, buffer=buffer or _REGIONS[x.buffer], name=name)


def zeros_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or _REGIONS[x.buffer], name=name)


def shared_constant(constant: Any, dtype: Any = None, name: str = "") -> NkiTensor:
    """A shared_hbm tensor holding ``constant`` (a NumPy array)."""
    arr = np.asarray(constant)
    dt = to_nki_dtype(dtype if dtype is not None else arr.dtype)
    t = ndarray(arr.shape if arr.ndim else (1,), dt, buffer=shared_hbm, name=name)
    values = cast_values(arr.reshape(-1), dt)
    t.storage.data.view(dt.np)[t.addresses().reshape(-1)] = values
    mark_initialised(t.storage, t.addresses(), dt.itemsize)
    return t


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: Any = None, name: str = "") -> NkiTensor:
    """An (n, n) identity tile in SBUF (for PE transposes); written into ``dst`` when given."""
    t = dst if dst is not None else ndarray((n, n), dtype, buffer=sbuf, name=name or "identity")
    write(t, np.eye(n, dtype=np.float32).reshape(-1), "shared_identity_matrix")
    return t


# -- launch queries ---------------------------------------------------------------------------
# NKI 0.7/0.8: the kernel is specialized on every physical core of the LNC whether or not a
# launch grid is given (announce-intent-eos-nki-spmd-launch-grid.html; lnc.html, v2.33.1).
def program_ndim() -> int:
    """Number of launch-grid dims: 1 with a bracket launch ``kernel[lnc]`` (or the package's
    ``simulate(lnc=...)``), 0 without a grid ("0 if no grid", nki.language.program_ndim page)
    -- also at LNC 2 set by NEURON_LOGICAL_NC_CONFIG, where both cores still run the kernel."""
    return current().program_ndim


def _check_axis(axis: Any, what: str) -> None:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or axis != 0:
        raise nki_error(what, "axis", f"axis must be 0 (the LNC has one dimension), got {axis!r}")


def program_id(axis: int = 0) -> int:
    """This physical core's index in the LNC (0 .. degree-1), with or without a launch grid."""
    _check_axis(axis, "program_id")
    return current().program_id


def num_programs(axes: int = 0) -> int:
    """The LNC degree (1 or 2), with or without a launch grid."""
    _check_axis(axes, "num_programs")
    return current().num_programs


class _TileSize:
    """``nl.tile_size``: hardware tile limits; SBUF/PSUM sizes follow the running target.

    Fields as documented on nki.language.tile_size.html (latest and v2.33.0) and in the
    ``_TileSize`` stub: pmax, psum_fmax (deprecated since 0.4: use psum_bank_fmax),
    psum_bank_fmax(_bytes), psum_fmax_bytes (v2.30 name), psum_num_banks, sbuf_size_bytes,
    sbuf_fmax, sbuf_fmax_bytes, gemm_stationary_fmax, gemm_moving_fmax, bn_stats_fmax,
    psum_min_align, sbuf_min_align, total_available_sbuf_size (deprecated since 0.4: use
    sbuf_fmax_bytes). Deprecated fields emit DeprecationWarning.
    Assumed values (the pages name the fields, not all numbers): bn_stats_fmax 512 (the BN_STATS
    free-size limit), psum_min_align 4 and sbuf_min_align 1 bytes (one fp32 / one byte).
    """

    pmax = _PARTITIONS
    gemm_stationary_fmax = _PE_ARRAY_SIZE
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    @staticmethod
    def _target():
        ctx = current_or_none()
        return ctx.target if ctx is not None else get_target()

    @property
    def psum_bank_fmax(self) -> int:
        return self._target().psum_bank_bytes // 4

    @property
    def psum_bank_fmax_bytes(self) -> int:
        return self._target().psum_bank_bytes

    @property
    def psum_fmax(self) -> int:
        """Deprecated since 0.4.0 (use psum_bank_fmax): 512 fp32 elements per PSUM bank."""
        warnings.warn("nl.tile_size.psum_fmax is deprecated since NKI 0.4; use psum_bank_fmax",
                      DeprecationWarning, stacklevel=2)
        return self.psum_bank_fmax

    @property
    def psum_fmax_bytes(self) -> int:
        return self._target().psum_bank_bytes

    @property
    def psum_num_banks(self) -> int:
        return self._target().psum_num_banks

    @property
    def sbuf_size_bytes(self) -> int:
        """Total SBUF bytes, all partitions."""
        t = self._target()
        return t.sbuf_bytes_per_partition * t.num_partitions

    @property
    def sbuf_fmax_bytes(self) -> int:
        """Usable SBUF bytes per partition."""
        return self._target().usable_sbuf_bytes_per_partition

    @property
    def sbuf_fmax(self) -> int:
        """Usable SBUF per partition in fp32 elements."""
        return self.sbuf_fmax_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        """Deprecated since 0.4.0 (use sbuf_fmax_bytes): usable SBUF bytes per partition."""
        warnings.warn("nl.tile_size.total_available_sbuf_size is deprecated since NKI 0.4; use "
                      "sbuf_fmax_bytes", DeprecationWarning, stacklevel=2)
        return self.sbuf_fmax_bytes

    def __repr__(self) -> str:
        return (f"nl.tile_size(pmax={self.pmax}, psum_bank_fmax={self.psum_bank_fmax}, "
                f"sbuf_fmax_bytes={self.sbuf_fmax_bytes})")


tile_size = _TileSize()


def ds(start: int, size: int) -> slice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""
    for v, n in ((start, "start"), (size, "size")):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise nki_error("ds", n, f"{n} must be an int, got {type(v).__name__}")
    if size < 0 or start < 0:  # size 0 is an empty range (nki-library shards can be empty)
        raise nki_error("ds", "range", f"ds(start={start}, size={size}): need start >= 0, size >= 0")
    return slice(int(start), int(start) + int(size), 1)


def range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:  # noqa: A001
    """``nl.range`` / ``affine_range`` / ``sequential_range`` / ``static_range(start, stop=None,
    step=1)``: a plain Python range (loops unroll at specialization)."""
    return builtins.range(start) if stop is None else builtins.range(start, stop, step)


# affine_range / sequential_range / static_range are deprecated aliases of range in 0.6.
affine_range = range
sequential_range = range
static_range = range


def _loop_int(v: Any, name: str, what: str) -> int:
    """An int loop bound: a Python int, or a runtime scalar (NkiScalar / (1,1) register)."""
    if isinstance(v, NkiTensor):
        from nkilib_msda.simulator.access import read

        if v.size != 1:
            raise nki_error(what, name, f"{name} register must hold one value, got shape {v.shape}")
        return int(read(v, what).reshape(-1)[0])
    if hasattr(v, "__nki_scalar_value__"):
        return int(v.__nki_scalar_value__())
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise nki_error(what, name, f"{name} must be an int or a runtime scalar, got {type(v).__name__}")
    return int(v)


def fori_loop(lower: Any, upper: Any, body_fun: Any, step: int = 1) -> None:
    """Runtime loop: ``body_fun(reg)`` for ``reg`` = lower, lower+step, ... < upper, where
    ``reg`` is a read-only (1, 1) int32 register (usable as ``.ap(scalar_offset=reg)``); the
    bounds may be ints or runtime scalars (``nisa.scalar_load``). Writing the induction register
    is undefined behaviour and raises NkiError "loop induction register". Emulated eagerly."""
    lo, hi, body = lower, upper, body_fun
    ctx = current()
    if getattr(ctx, "no_reorder_depth", 0) > 0:
        raise nki_error("fori_loop", "inside no_reorder",
                        "runtime loops (fori_loop / while_loop) are not allowed inside "
                        "`with nl.no_reorder():`")
    lo = _loop_int(lo, "lower", "fori_loop")
    hi = _loop_int(hi, "upper", "fori_loop")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step <= 0:
        raise nki_error("fori_loop", "step", f"step must be a positive int, got {step!r}")
    storage = Storage("sbuf", 4, partitions=1, bytes_per_partition=4, name="fori_loop register",
                      program_id=ctx.program_id)
    storage.read_only = "loop induction register"
    reg = NkiTensor(storage, int32, (1, 1))
    for i in builtins.range(int(lo), int(hi), int(step)):
        storage.data.view(np.int32)[0] = i  # the loop itself updates the register
        storage.init[:4] = 1
        body(reg)


def while_loop(init: Any, body_fun: Any) -> None:
    """Runtime while loop: ``r = init; while r != 0: r = body_fun(r)`` (the condition is checked
    before each iteration; ``init`` and the body's return value are runtime scalars or (1, 1)
    int registers). Emulated eagerly."""
    ctx = current()
    if getattr(ctx, "no_reorder_depth", 0) > 0:
        raise nki_error("while_loop", "inside no_reorder",
                        "runtime loops (fori_loop / while_loop) are not allowed inside "
                        "`with nl.no_reorder():`")
    cond = init
    while _loop_int(cond, "condition", "while_loop") != 0:
        cond = body_fun(cond)
        if cond is None:
            raise nki_error("while_loop", "body_fun", "body_fun must return the next condition")


def device_print(print_prefix: str, tensor: Any) -> None:
    """Print a tensor's values (or any value) with ``print_prefix``."""
    prefix, x = print_prefix, tensor
    from nkilib_msda.simulator.access import read

    if isinstance(x, NkiTensor):
        print(prefix, read(x, "device_print"))
    else:
        print(prefix, x)


class no_reorder:
    """``with nl.no_reorder():`` — the emulator is already in order; it only tracks the block
    so that runtime loops inside it (not allowed) are rejected."""

    def __enter__(self) -> "no_reorder":
        ctx = current_or_none()
        if ctx is not None:
            ctx.no_reorder_depth = getattr(ctx, "no_reorder_depth", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        ctx = current_or_none()
        if ctx is not None:
            ctx.no_reorder_depth = getattr(ctx, "no_reorder_depth", 1) - 1
        return None


_REMOVED_IN_BETA_2 = {
    "arange": "use slices, nl.ds or .ap() access patterns",
    "mgrid": "use slices, nl.ds or .ap() access patterns",
    "par_dim": "dim 0 of an on-chip tensor is always the partition dim",
    "spmd_dim": "launch with kernel[lnc] (lnc = 1 or 2)",
    "nc": "launch with kernel[lnc] (lnc = 1 or 2)",
}


_REMOVED_IN_0_7 = {
    "dynamic_range": "use nl.fori_loop(lower, upper, body_fun) or nl.while_loop(init, body_fun)",
}


def __getattr__(name: str) -> Any:
    """Removed names raise NkiError instead of AttributeError; documented names the emulator
    does not model resolve to a callable that raises NkiError "not modelled"."""
    if name in _REMOVED_IN_BETA_2:
        raise nki_error(f"nl.{name}", "removed in beta 2",
                        f"nl.{name} does not exist in NKI beta 2: {_REMOVED_IN_BETA_2[name]}")
    if name in _REMOVED_IN_0_7:
        raise nki_error(f"nl.{name}", "removed in NKI 0.7",
                        f"nl.{name} was removed by NKI 0.7 tracing: {_REMOVED_IN_0_7[name]}")
    from nkilib_msda.simulator.unmodelled import NL_UNMODELLED, unmodelled

    if name in NL_UNMODELLED:
        return unmodelled(f"nl.{name}")
    raise AttributeError(f"module 'nki.language' has no attribute {name!r}")


class NKIObject:
    """Base class for user objects passed as kernel arguments (frozen dataclasses work too)."""


def load(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """Experimental ``nl.load``: DMA ``src`` into a new SBUF tile of the same shape."""
    from nkilib_msda.simulator.isa.dma import dma_copy

    if src.is_on_chip and src.buffer == "psum":
        raise nki_error("load", "buffer access", "nl.load cannot read PSUM (DMA cannot access PSUM)")
    dst = ndarray(src.shape, dtype or src.dtype, buffer=sbuf)
    dma_copy(dst=dst, src=src)
    return dst


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """Experimental ``nl.store``: DMA ``value`` into ``dst`` (PSUM rejected)."""
    from nkilib_msda.simulator.isa.dma import dma_copy

    dma_copy(dst=dst, src=value)
