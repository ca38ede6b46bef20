"""NKI tensors: storages, strided views and access patterns.

A :class:`Storage` holds raw bytes, so any view may reinterpret them (``view(dtype)``,
``.ap(dtype=...)``). HBM storages are linear; on-chip (SBUF/PSUM) storages are
``partitions x bytes_per_partition``, laid out partition-major, so an element of dtype ``d``
at (partition p, free element f) has the flat element index ``p * ppe(d) + f`` with
``ppe(d) = bytes_per_partition // d.itemsize``. An :class:`NkiTensor` is (storage, dtype,
shape, strides, offset) with every address in elements of its own dtype.

Dynamic views whose addresses depend on values in SBUF (``.ap(vector_offset=...)``,
``.ap(scalar_offset=...)``, ``select(dim, sbuf_scalar)``, ``vector_select``) are
:class:`IndirectAccess` / :class:`DynamicAccess` objects that only DMA instructions accept.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from nkilib_msda.simulator.context import current_or_none
from nkilib_msda.simulator.dtypes import NkiDtype, int32, to_nki_dtype, uint32
from nkilib_msda.simulator.errors import hazard, nki_error
from nkilib_msda.simulator.dynamic_views import DynamicAccess, IndirectAccess, is_dynamic
from nkilib_msda.simulator.geometry import (MAX_ONCHIP_FREE_LEVELS, MAX_PARTITIONS, _GEOMETRY,
                                            _as_int, _c_strides, _index, _is_c_contiguous, _is_run,
                                            _parse_pattern, _ViewBase)
from nkilib_msda.simulator.memory import BUFFERS, HBM_BUFFERS, ON_CHIP, Storage

__all__ = ["Storage", "NkiTensor", "IndirectAccess", "DynamicAccess", "ON_CHIP", "HBM_BUFFERS",
           "BUFFERS", "is_dynamic", "MAX_PARTITIONS"]


# ``tile[...] = value`` runs instructions, which live above this layer: the instruction-level
# implementation is installed by simulator/wrappers.py (see set_assign_handler).
_ASSIGN_HANDLER: Callable[[Any, Any, str], None] | None = None


def set_assign_handler(handler: Callable[[Any, Any, str], None]) -> None:
    """Install the implementation of ``NkiTensor.__setitem__`` (dst view, value, instruction)."""
    global _ASSIGN_HANDLER
    _ASSIGN_HANDLER = handler


class NkiTensor(_ViewBase):
    """A strided view of a storage: element i is at ``offset + sum(strides * i)``."""

    __slots__ = ("storage", "dtype", "shape", "strides", "offset", "name", "_addr", "_flat")

    def __init__(self, storage: Storage, dtype: Any, shape: Sequence[int],
                 strides: Sequence[int] | None = None, offset: int = 0, name: str = "") -> None:
        self.storage = storage
        self.dtype = to_nki_dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.strides: tuple[int, ...]
        if strides is not None:
            self.strides = tuple(int(s) for s in strides)
        else:
            self.strides = _c_strides(self.shape)
            if storage.is_on_chip and self.shape:
                self.strides = (storage.ppe(self.dtype.itemsize),) + self.strides[1:]
        self.offset = int(offset)
        self.name = name or storage.name
        self._addr: np.ndarray | None = None
        self._flat: Any = None

    # -- basics ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"NkiTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"buffer={self.buffer}, offset={self.offset}, strides={self.strides})")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __bool__(self) -> bool:
        return True

    def __iter__(self):  # NKI tensors are not Python iterables
        raise TypeError("NkiTensor is not iterable; index it or pass it to an nisa instruction")

    def addresses(self) -> np.ndarray:
        """Flat element indices (int64, shape ``self.shape``, read-only) into the storage
        viewed as ``dtype``."""
        if self._addr is None:
            self._addr = _GEOMETRY.get(self.shape, self.strides, self.offset)
        return self._addr

    def flat_index(self) -> Any:
        """Row-major flat index of the view: a ``slice`` when it covers a contiguous ascending
        run of the storage (fast NumPy slicing), else the flat int64 address array."""
        if self._flat is None:
            if _is_run(self.shape, self.strides):
                self._flat = slice(self.offset, self.offset + self.size)
            else:
                self._flat = self.addresses().reshape(-1)
        return self._flat

    def run_slice(self) -> slice | None:
        """The storage slice this view covers when it is a contiguous ascending run (row-major
        order), else None; never builds an address array."""
        flat = self._flat
        if flat is None:
            if not _is_run(self.shape, self.strides):
                return None
            flat = self._flat = slice(self.offset, self.offset + self.size)
        return flat if isinstance(flat, slice) else None

    def np_view(self, buf: np.ndarray, np_dtype: Any, itemsize: int) -> np.ndarray:
        """This view's elements as a NumPy strided view (shape ``self.shape``) of ``buf``, a
        flat uint8 buffer seen with elements of ``itemsize`` bytes (``np_dtype``). Views
        share memory with ``buf``; the bounds are checked by the ndarray constructor."""
        strides = tuple(s * itemsize for s in self.strides)
        return np.ndarray(self.shape, dtype=np_dtype, buffer=buf, offset=self.offset * itemsize,
                          strides=strides)

    @property
    def partition_stride(self) -> int:
        return self.storage.ppe(self.dtype.itemsize)

    @property
    def start_partition(self) -> int:
        return self.offset // self.partition_stride if self.is_on_chip else 0

    def _derive(self, shape: Sequence[int], strides: Sequence[int], offset: int,
                dtype: NkiDtype | None = None) -> "NkiTensor":
        """A view of the same storage; ``shape``/``strides`` are already-validated ints."""
        view = object.__new__(NkiTensor)
        view.storage = self.storage
        view.dtype = dtype or self.dtype
        view.shape = tuple(shape)
        view.strides = tuple(strides)
        view.offset = int(offset)
        view.name = self.name
        view._addr = None
        view._flat = None
        return view

    def get_pattern(self) -> list[list[int]]:
        """The view's access pattern as [[stride, count], ...], outermost first."""
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def is_contiguous(self) -> bool:
        """True if the view covers a contiguous run of its storage in row-major order
        (on-chip: the free dims are contiguous inside each partition)."""
        if self.is_on_chip:
            return _is_c_contiguous(self.shape[1:], self.strides[1:])
        return _is_c_contiguous(self.shape, self.strides)

    # -- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> "NkiTensor":
        return _index(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if _ASSIGN_HANDLER is None:
            raise nki_error("tensor.__setitem__", "not available",
                            "item assignment is installed by nkilib_msda.simulator.wrappers")
        _ASSIGN_HANDLER(self[key], value, "tensor.__setitem__")

    # -- view methods (0.5+) ---------------------------------------------------------------
    def _dim(self, dim: int, what: str) -> int:
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
            raise nki_error(what, "dim type", f"dim must be an int, got {type(dim).__name__}")
        d = int(dim) + self.ndim if dim < 0 else int(dim)
        if not 0 <= d < self.ndim:
            raise nki_error(what, "dim out of range", f"dim={dim} for a {self.ndim}-D tensor")
        return d

    def _no_partition_change(self, d: int, what: str) -> None:
        if self.is_on_chip and d == 0:
            raise nki_error(what, "partition dim",
                            f"cannot change dim 0 (the partition dim) of an on-chip tensor "
                            f"({self.buffer} {self.shape})")

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        """View of ``start:end:step`` along ``dim`` (bounds must lie inside the dim)."""
        d = self._dim(dim, "slice")
        key = [slice(None)] * self.ndim
        key[d] = slice(start, end, step)
        return _index(self, tuple(key), what="slice")

    def select(self, dim: int, index: Any) -> "NkiTensor | DynamicAccess":
        """Drop ``dim`` by picking ``index`` (an int, or a (1,1) SBUF int tensor: dynamic)."""
        d = self._dim(dim, "select")
        self._no_partition_change(d, "select")
        if isinstance(index, NkiTensor):
            shape = self.shape[:d] + self.shape[d + 1:]
            strides = self.strides[:d] + self.strides[d + 1:]
            return DynamicAccess(self, [[s, n] for s, n in zip(strides, shape)], self.offset,
                                 index, self.strides[d], self.dtype, "select",
                                 limit=self.shape[d])
        n = self.shape[d]
        i = _as_int(index, "select", "index")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise nki_error("select", "index out of range", f"index {index} for dim {d} of size {n}")
        shape = self.shape[:d] + self.shape[d + 1:]
        strides = self.strides[:d] + self.strides[d + 1:]
        if self.is_on_chip and len(shape) < 2:  # on-chip views stay >= 2-D, as indexing
            shape, strides = shape + (1,), strides + (1,)
        return self._derive(shape, strides, self.offset + i * self.strides[d])

    def permute(self, dims: Sequence[int]) -> "NkiTensor":
        dims = tuple(int(x) for x in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise nki_error("permute", "bad permutation", f"{dims} for a {self.ndim}-D tensor")
        if self.is_on_chip and dims[0] != 0:
            raise nki_error("permute", "partition dim",
                            f"on-chip dim 0 must stay dim 0, got dims={dims}")
        return self._derive([self.shape[k] for k in dims], [self.strides[k] for k in dims],
                            self.offset)

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        """Repeat a size-1 dim ``size`` times (stride 0); never dim 0 (the access-pattern rules say
        "not dim 0" without restricting it to on-chip tensors, so HBM dim 0 is rejected too)."""
        d = self._dim(dim, "broadcast")
        self._no_partition_change(d, "broadcast")
        if d == 0:
            raise nki_error("broadcast", "dim 0",
                            f"dim 0 cannot be broadcast ({self.buffer} {self.shape}); broadcast a "
                            "free dim, or expand_dim first")
        if self.shape[d] != 1:
            raise nki_error("broadcast", "size-1 dim",
                            f"dim {d} has size {self.shape[d]}, only size-1 dims broadcast")
        size = _as_int(size, "broadcast", "size")
        if size < 1:
            raise nki_error("broadcast", "size", f"size must be >= 1, got {size}")
        shape = list(self.shape)
        strides = list(self.strides)
        shape[d] = size
        strides[d] = 0
        return self._derive(shape, strides, self.offset)

    def expand_dim(self, dim: int) -> "NkiTensor":
        """Insert a size-1 dim at position ``dim`` (0 <= dim <= ndim; not 0 on-chip)."""
        d = _as_int(dim, "expand_dim", "dim")
        if d < 0:
            d += self.ndim + 1
        if not 0 <= d <= self.ndim:
            raise nki_error("expand_dim", "dim out of range", f"dim={dim} for a {self.ndim}-D tensor")
        self._no_partition_change(d, "expand_dim")
        shape = self.shape[:d] + (1,) + self.shape[d:]
        stride = self.strides[d] * self.shape[d] if d < self.ndim else 1
        strides = self.strides[:d] + (stride,) + self.strides[d:]
        return self._derive(shape, strides, self.offset)

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        d = self._dim(dim, "squeeze_dim")
        self._no_partition_change(d, "squeeze_dim")
        if self.shape[d] != 1:
            raise nki_error("squeeze_dim", "size-1 dim", f"dim {d} has size {self.shape[d]}")
        if self.is_on_chip and self.ndim <= 2:
            raise nki_error("squeeze_dim", "rank", "on-chip tensors stay at least 2-D")
        return self._derive(self.shape[:d] + self.shape[d + 1:],
                            self.strides[:d] + self.strides[d + 1:], self.offset)

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> "NkiTensor":
        """Split dim ``dim`` into ``shape`` (product must match)."""
        d = self._dim(dim, "reshape_dim")
        self._no_partition_change(d, "reshape_dim")
        shape = tuple(_as_int(n, "reshape_dim", "shape") for n in shape)
        if math.prod(shape) != self.shape[d] or not shape or min(shape) < 1:
            raise nki_error("reshape_dim", "element count",
                            f"{shape} does not split dim {d} of size {self.shape[d]}")
        sub = tuple(s * self.strides[d] for s in _c_strides(shape))
        return self._derive(self.shape[:d] + shape + self.shape[d + 1:],
                            self.strides[:d] + sub + self.strides[d + 1:], self.offset)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        """Merge dims start_dim..end_dim (inclusive); they must be mutually contiguous."""
        a = self._dim(start_dim, "flatten_dims")
        b = self._dim(end_dim, "flatten_dims")
        if a > b:
            raise nki_error("flatten_dims", "dim order", f"start_dim={start_dim} > end_dim={end_dim}")
        if a == b:
            return self
        self._no_partition_change(a, "flatten_dims")
        if not _is_c_contiguous(self.shape[a:b + 1], self.strides[a:b + 1], relative=True):
            raise nki_error("flatten_dims", "contiguity",
                            f"dims {a}..{b} (shape {self.shape[a:b + 1]}, strides "
                            f"{self.strides[a:b + 1]}) are not contiguous")
        n = math.prod(self.shape[a:b + 1])
        return self._derive(self.shape[:a] + (n,) + self.shape[b + 1:],
                            self.strides[:a] + (self.strides[b],) + self.strides[b + 1:],
                            self.offset)

    def reshape(self, shape: Sequence[int]) -> "NkiTensor":
        """Row-major reshape of a contiguous view (on-chip: dim 0 unchanged)."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        shape = [_as_int(n, "reshape", "shape") for n in shape]
        if shape.count(-1) > 1:
            raise nki_error("reshape", "shape", f"at most one -1 in {tuple(shape)}")
        if -1 in shape:
            rest = math.prod(n for n in shape if n != -1)
            shape[shape.index(-1)] = self.size // rest if rest else 0
        shape = tuple(shape)
        if math.prod(shape) != self.size or (shape and min(shape) < 1):
            raise nki_error("reshape", "element count",
                            f"cannot reshape {self.shape} ({self.size} elements) to {shape}")
        if self.is_on_chip:
            if not shape or shape[0] != self.shape[0]:
                raise nki_error("reshape", "partition dim",
                                f"on-chip reshape must keep dim 0: {self.shape} -> {shape}")
            if len(shape) < 2:
                raise nki_error("reshape", "rank", "on-chip tensors stay at least 2-D")
            if not _is_c_contiguous(self.shape[1:], self.strides[1:]):
                raise nki_error("reshape", "contiguity",
                                f"free dims of {self.shape} (strides {self.strides}) are not "
                                "contiguous; reshape only works on contiguous views")
            strides = (self.strides[0],) + _c_strides(shape[1:])
            return self._derive(shape, strides, self.offset)
        if not _is_c_contiguous(self.shape, self.strides):
            raise nki_error("reshape", "contiguity",
                            f"view {self.shape} with strides {self.strides} is not contiguous")
        return self._derive(shape, _c_strides(shape), self.offset)

    def view(self, dtype: Any) -> "NkiTensor":
        """Reinterpret the bits as ``dtype``; the last dim is rescaled by the size ratio.

        The last dimension must be contiguous in memory for every dtype pair, same-size ones
        included (NkiTensor.view, "Constraints", NKI 0.7 page
        https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/nki/api/generated/nki.language.NkiTensor.html);
        a strided or broadcast view is reinterpreted with ``.ap(pattern, dtype=...)`` instead."""
        new = to_nki_dtype(dtype)
        old_size, new_size = self.dtype.itemsize, new.itemsize
        if not self.shape or (self.shape[-1] != 1 and self.strides[-1] != 1):
            raise nki_error("view", "last dimension contiguous",
                            f"the last dimension must be contiguous in memory to reinterpret "
                            f"{self.dtype} as {new}, got shape {self.shape} with strides "
                            f"{self.strides}; reinterpret a strided view with "
                            f".ap(view.get_pattern(), dtype={new})")
        if old_size == new_size:
            return self._derive(self.shape, self.strides, self.offset, new)
        last_bytes = self.shape[-1] * old_size
        if last_bytes % new_size:
            raise nki_error("view", "size", f"last dim of {last_bytes} B is not a multiple of "
                                            f"{new} ({new_size} B)")
        if self.is_on_chip and self.ndim == 1:
            raise nki_error("view", "rank", "on-chip views need a free dim to reinterpret")

        def rescale(x: int, what: str) -> int:
            if (x * old_size) % new_size:
                raise nki_error("view", "alignment", f"{what} {x} x {old_size} B is not a "
                                                     f"multiple of {new_size} B")
            return x * old_size // new_size

        if self.is_on_chip and self.storage.bytes_per_partition % new_size:
            raise nki_error("view", "alignment", f"partition size {self.storage.bytes_per_partition}"
                                                 f" B is not a multiple of {new_size} B")
        strides = [rescale(s, "stride") for s in self.strides[:-1]] + [1]
        shape = list(self.shape[:-1]) + [last_bytes // new_size]
        return self._derive(shape, strides, rescale(self.offset, "offset"), new)

    reinterpret_cast = view

    def vector_select(self, dim: int, index: "NkiTensor") -> "IndirectAccess":
        """HBM only: rows of dim 0 picked by a (P,1) SBUF int32/uint32 index tile."""
        if dim != 0:
            raise nki_error("vector_select", "dim", f"only dim 0 is supported, got {dim}")
        if self.is_on_chip:
            raise nki_error("vector_select", "buffer", "vector_select needs an HBM tensor")
        pattern = [[self.strides[0], _index_rows(index, "vector_select")]]
        pattern += [[s, n] for s, n in zip(self.strides[1:], self.shape[1:])]
        return IndirectAccess(self, pattern, self.offset, index, self.dtype)

    def indirect(self, *args: Any, **kwargs: Any) -> Any:
        """Tensor indirection: trn3-only (rejected on trn2); not modelled on trn3 either."""
        ctx = current_or_none()
        if ctx is None or not ctx.target.is_trn3:
            raise nki_error("indirect", "trn3-only",
                            ".indirect() (tensor indirection) exists only on trn3 (NeuronCore-v4); "
                            "on trn2 use .ap(vector_offset=) or vector_select")
        raise nki_error("indirect", "not modelled",
                        ".indirect() is not modelled by this emulator; use .ap(vector_offset=)")

    # -- access patterns ---------------------------------------------------------------------
    def ap(self, pattern: Sequence[Sequence[int]], offset: int | None = None,
           scalar_offset: Any = None, vector_offset: Any = None, indirect_dim: int = 0,
           dtype: Any = None) -> "NkiTensor | IndirectAccess | DynamicAccess":
        """Explicit access pattern over this tensor's storage (see docs/emulator.md)."""
        return _make_ap(self, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)


def _index_rows(index: Any, what: str) -> int:
    if not isinstance(index, NkiTensor):
        raise nki_error(what, "vector_offset", f"indices must be an SBUF tensor, got "
                                               f"{type(index).__name__}")
    if index.buffer != "sbuf":
        raise nki_error(what, "vector_offset", f"indices must be in SBUF, got {index.buffer}")
    if index.dtype not in (int32, uint32):
        raise nki_error(what, "vector_offset", f"indices must be int32 or uint32, got {index.dtype}")
    if index.ndim != 2:
        raise nki_error(what, "vector_offset", f"indices must be 2-D (P, 1), got {index.shape}")
    return index.shape[0]


def _partition_stride_hazard(p_stride: int, ppe: int) -> None:
    ctx = current_or_none()
    hazard("ap", "partition stride",
           f"partition stride {p_stride} is the view's row length, not the tile's {ppe} elements "
           "per partition; accepted as one partition step as AWS's kernels assume",
           strict=ctx is not None and ctx.options.strict, stacklevel=5)


def _make_ap(t: NkiTensor, pattern: Any, offset: Any, scalar_offset: Any, vector_offset: Any,
             indirect_dim: int, dtype: Any) -> Any:
    pat = _parse_pattern(pattern)
    new_dtype = to_nki_dtype(dtype) if dtype is not None else t.dtype
    if offset is None:
        base_bytes = t.offset * t.dtype.itemsize
        if base_bytes % new_dtype.itemsize:
            raise nki_error("ap", "offset", f"inherited offset {t.offset} is not aligned to {new_dtype}")
        off = base_bytes // new_dtype.itemsize
    else:
        # R05: ``offset`` counts elements (of the access dtype) from the beginning of the
        # receiver view, so it adds to an already-offset view's start: "the offset from the
        # beginning of the tensor" (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/
        # nki/deep-dives/nki-aps.html); nki-library writes ``out[tile].ap(..., offset=0)`` to
        # address tile ``tile``, which only works with this meaning.
        rel = _as_int(offset, "ap", "offset")
        if rel < 0:
            raise nki_error("ap", "offset", f"offset must be >= 0, got {rel}")
        base_bytes = t.offset * t.dtype.itemsize
        if base_bytes % new_dtype.itemsize:
            raise nki_error("ap", "offset", f"the receiver's offset {t.offset} ({t.dtype}) is not "
                                            f"aligned to {new_dtype}")
        off = base_bytes // new_dtype.itemsize + rel
    if scalar_offset is not None and vector_offset is not None:
        raise nki_error("ap", "exclusive offsets", "scalar_offset and vector_offset are exclusive")
    if vector_offset is not None:
        if dtype is not None and new_dtype != t.dtype:
            raise nki_error("ap", "vector_offset with dtype",
                            "a reinterpret dtype together with vector_offset is not supported (0.5)")
        if indirect_dim != 0:
            raise nki_error("ap", "indirect_dim", f"vector_offset needs indirect_dim=0, got {indirect_dim}")
        if t.is_on_chip:
            raise nki_error("ap", "vector_offset receiver",
                            f"vector_offset needs an HBM receiver, got {t.buffer}")
        _index_rows(vector_offset, "ap")
        return IndirectAccess(t, pat, off, vector_offset, t.dtype)
    storage = t.storage
    if t.is_on_chip:
        ppe = storage.ppe(new_dtype.itemsize)
        if storage.bytes_per_partition % new_dtype.itemsize:
            raise nki_error("ap", "dtype", f"partition size {storage.bytes_per_partition} B is not a "
                                           f"multiple of {new_dtype}")
        p_stride, p_count = pat[0]
        row = math.prod(t.shape[1:]) if t.ndim > 1 else 1
        if p_stride != ppe and p_count > 1 and p_stride == row:
            # The docs (nki/deep-dives/nki-aps.html) describe the partition pair's stride as
            # the partition size; AWS's hardware-tested kernels pass the view's row length.
            # Partitions are separate memories, so the pair still steps one partition.
            _partition_stride_hazard(p_stride, ppe)
        elif p_stride != ppe and p_count > 1:
            raise nki_error("ap", "partition stride",
                            f"the first pair is the partition pair: stride must be {ppe} "
                            f"(elements per partition), got {p_stride}")
        if p_count > MAX_PARTITIONS:
            raise nki_error("ap", "partition count", f"{p_count} partitions > {MAX_PARTITIONS}")
        if len(pat) - 1 > MAX_ONCHIP_FREE_LEVELS:
            raise nki_error("ap", "free levels", f"{len(pat) - 1} free levels > "
                                                 f"{MAX_ONCHIP_FREE_LEVELS} on an on-chip tensor")
        pat[0][0] = ppe
        p0, f0 = divmod(off, ppe)
        free_extent = f0 + sum(s * (n - 1) for s, n in pat[1:])
        if free_extent >= ppe or p0 + p_count > storage.partitions:
            raise nki_error("ap", "out of bounds",
                            f"pattern {pat} at offset {off} leaves the tile "
                            f"({storage.partitions} partitions x {ppe} {new_dtype})")
    if scalar_offset is not None:
        d = _as_int(indirect_dim, "ap", "indirect_dim")
        if not 0 <= d < t.ndim:
            raise nki_error("ap", "indirect_dim", f"indirect_dim={d} for a {t.ndim}-D receiver")
        return DynamicAccess(t, pat, off, scalar_offset, t.strides[d], new_dtype, "ap")
    view = NkiTensor(storage, new_dtype, [n for _, n in pat], [s for s, _ in pat], off, t.name)
    if not t.is_on_chip:
        last = off + sum(s * (n - 1) for s, n in pat)
        if last >= storage.numel(new_dtype.itemsize):
            raise nki_error("ap", "out of bounds", f"pattern {pat} at offset {off} reaches element "
                                                   f"{last} of a {storage.numel(new_dtype.itemsize)}"
                                                   f"-element {new_dtype} storage")
    return view


