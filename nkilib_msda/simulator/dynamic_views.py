"""Dynamic views: accesses whose addresses depend on values in SBUF when a DMA instruction
executes (``.ap(vector_offset=...)``: :class:`IndirectAccess`; ``.ap(scalar_offset=...)`` and
``select(dim, sbuf_scalar)``: :class:`DynamicAccess`). Only DMA instructions accept them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator.dtypes import NkiDtype
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.geometry import _addresses, _ViewBase

# Receivers and index/offset tiles are NkiTensors (defined above this module, in tensor.py).


def _is_static_view(x: Any) -> bool:
    """Whether ``x`` is an NkiTensor: the one view class that is not dynamic."""
    return isinstance(x, _ViewBase) and not isinstance(x, _DynamicViewBase)

_VIEW_METHODS = ("slice", "select", "permute", "broadcast", "expand_dim", "squeeze_dim",
                 "reshape_dim", "flatten_dims", "reshape", "view", "reinterpret_cast",
                 "vector_select", "ap", "indirect")


class _DynamicViewBase(_ViewBase):
    """Dynamic (indirect / scalar-offset / dynamic-select) views are terminal: the indirect dim
    cannot be sliced afterwards and a tensor takes one indirection (docs/emulator.md)."""

    def __getitem__(self, key: Any) -> Any:
        raise nki_error("tensor indexing", "dynamic view",
                        f"{self!r} is a dynamic access: it cannot be indexed or sliced further "
                        "(the indirect dim cannot be sliced afterwards); index the receiver "
                        "before calling .ap()/.select()")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__getitem__(key)

    def __getattr__(self, name: str) -> Any:
        if name in _VIEW_METHODS:
            raise nki_error(name, "dynamic view",
                            f"{name}() on a dynamic access ({type(self).__name__}): one indirection "
                            "per tensor, and dynamic views cannot be re-viewed; build the view on "
                            "the receiver first")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


class DynamicAccess(_DynamicViewBase):
    """A view whose offset adds ``value(scalar) * scale`` read from a (1,1) SBUF int tile
    when the (DMA) instruction executes. Out of bounds: any element outside the storage (and,
    for a dynamic ``select``, a value outside the selected dim)."""

    def __init__(self, receiver: Any, pattern: list[list[int]], offset: int,
                 scalar: Any, scale: int, dtype: NkiDtype, what: str,
                 limit: int | None = None) -> None:
        if not _is_static_view(scalar) or scalar.buffer != "sbuf" or scalar.size != 1 \
                or not scalar.dtype.is_int:
            raise nki_error(what, "scalar_offset",
                            "the dynamic offset must be a (1,1) SBUF integer tensor, got "
                            f"{getattr(scalar, 'shape', type(scalar).__name__)}")
        self.receiver = receiver
        self.storage = receiver.storage
        self.dtype = dtype
        self.pattern = pattern
        self.shape = tuple(n for _, n in pattern)
        self.strides = tuple(s for s, _ in pattern)
        self.offset = offset
        self.scalar = scalar
        self.scale = scale
        self.limit = limit  # select: the value must index the selected dim (0 <= v < limit)
        self.name = receiver.name

    def __repr__(self) -> str:
        return f"DynamicAccess({self.name!r}, shape={self.shape}, {self.buffer})"


class IndirectAccess(_DynamicViewBase):
    """``receiver.ap(pattern, vector_offset=idx)``: row p starts at
    ``offset + idx[p] * receiver.strides[0]``; the first pair's stride is ignored."""

    def __init__(self, receiver: Any, pattern: list[list[int]], offset: int,
                 index: Any, dtype: NkiDtype) -> None:
        self.receiver = receiver
        self.storage = receiver.storage
        self.dtype = dtype
        self.pattern = pattern
        self.shape = tuple(n for _, n in pattern)
        self.free_strides = tuple(s for s, _ in pattern[1:])
        self.row_stride = receiver.strides[0] if receiver.strides else 1
        self.offset = offset
        self.index = index
        self.name = receiver.name

    def __repr__(self) -> str:
        return (f"IndirectAccess({self.name!r}, shape={self.shape}, {self.buffer}, "
                f"index={self.index.shape})")

    def same_access(self, other: Any) -> bool:
        return (isinstance(other, IndirectAccess) and other.storage is self.storage
                and other.pattern == self.pattern and other.offset == self.offset
                and other.row_stride == self.row_stride and other.dtype == self.dtype
                and other.index.storage is self.index.storage
                and other.index.offset == self.index.offset
                and other.index.shape == self.index.shape
                and other.index.strides == self.index.strides)

    def row_offsets(self) -> np.ndarray:
        """Offsets (elements) of one row's elements relative to its start, shape pattern[1:]."""
        return _addresses(self.shape[1:], self.free_strides, 0)


def is_dynamic(x: Any) -> bool:
    return isinstance(x, (IndirectAccess, DynamicAccess))
