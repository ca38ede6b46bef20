"""Strided-view geometry: element addresses of (shape, strides, offset) views (cached), the
read-only properties every view shares, basic indexing of a view (``t[...]``, through the
view's ``_derive``) and access-pattern parsing. No tensor class is defined or imported here.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from nkilib_msda.hardware import PARTITIONS
from nkilib_msda.simulator.dtypes import NkiDtype
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.memory import ON_CHIP, Storage

MAX_PARTITIONS = PARTITIONS
MAX_ONCHIP_FREE_LEVELS = 4  # hardware access patterns: partition pair + <= 4 free pairs


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _compute_addresses(shape: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """int64 array of ``shape``: offset + sum_k strides[k] * i_k."""
    addr = np.full((), offset, dtype=np.int64)
    nd = len(shape)
    for k, (n, s) in enumerate(zip(shape, strides)):
        ax = np.arange(n, dtype=np.int64) * s
        addr = addr + ax.reshape((n,) + (1,) * (nd - k - 1))
    return np.ascontiguousarray(np.broadcast_to(addr, tuple(shape)))


class _GeometryCache:
    """Relative address arrays depend only on (shape, strides): share them between views
    (a view's addresses are ``offset + relative``). Bounded by the cached element count."""

    MAX_ELEMENTS = 16_000_000
    MAX_ENTRY = 2_000_000

    def __init__(self) -> None:
        self.entries: dict[tuple, np.ndarray] = {}
        self.elements = 0

    def relative(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
        key = (shape, strides)
        hit = self.entries.get(key)
        if hit is not None:
            return hit
        rel = _compute_addresses(shape, strides, 0)
        rel.setflags(write=False)
        if rel.size <= self.MAX_ENTRY:
            if self.elements + rel.size > self.MAX_ELEMENTS:
                self.entries.clear()
                self.elements = 0
            self.entries[key] = rel
            self.elements += rel.size
        return rel

    def get(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
        rel = self.relative(shape, strides)
        if offset == 0:
            return rel
        addr = rel + offset
        addr.setflags(write=False)
        return addr


def _is_run(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major order visits consecutive elements (size-1 dims ignored)."""
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 1:
            continue
        if s != expected:
            return False
        expected = s * n
    return True


_GEOMETRY = _GeometryCache()


def _addresses(shape: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    return _GEOMETRY.get(tuple(shape), tuple(strides), int(offset))


class _ViewBase:
    """Shared read-only properties of static and dynamic views."""

    storage: Storage
    dtype: NkiDtype
    shape: tuple[int, ...]
    name: str

    @property
    def buffer(self) -> str:
        return self.storage.buffer

    @property
    def is_on_chip(self) -> bool:
        return self.storage.buffer in ON_CHIP

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def _as_int(x: Any, what: str, arg: str) -> int:
    if type(x) is int:
        return x
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise nki_error(what, f"{arg} type", f"{arg} must be a Python int, got "
                                              f"{type(x).__name__} {x!r}")
    return int(x)


def _is_c_contiguous(shape: Sequence[int], strides: Sequence[int], relative: bool = False) -> bool:
    """Row-major contiguous (size-1 dims ignored); ``relative``: innermost stride may be any."""
    expected = None
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 1:
            continue
        if expected is None:
            if not relative and s != 1:
                return False
            expected = s
        elif s != expected:
            return False
        expected = s * n
    return True


# -- access patterns ---------------------------------------------------------------------------
def _parse_pattern(pattern: Any, what: str = "ap") -> list[list[int]]:
    if not isinstance(pattern, (list, tuple)) or not pattern:
        raise nki_error(what, "pattern", f"pattern must be a non-empty list of [stride, count] "
                                         f"pairs, got {pattern!r}")
    out = []
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise nki_error(what, "pattern", f"each pattern entry must be [stride, count], got {pair!r}")
        stride, count = pair
        if type(stride) is not int or type(count) is not int:
            stride = _as_int(stride, what, "pattern stride")
            count = _as_int(count, what, "pattern count")
        if count < 1:
            raise nki_error(what, "pattern", f"counts must be >= 1, got {count}")
        if stride < 0:
            raise nki_error(what, "pattern", f"negative stride {stride} is not supported")
        out.append([stride, count])
    return out


def _index(t: Any, key: Any, what: str = "tensor indexing") -> Any:
    if type(key) is not tuple:
        key = (key,)
    if any(k is Ellipsis for k in key):
        at = [j for j, k in enumerate(key) if k is Ellipsis]
        if len(at) > 1:
            raise nki_error(what, "index", "at most one '...' per index")
        i = at[0]
        fill = t.ndim - (len(key) - 1)
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    if len(key) > len(t.shape):
        raise nki_error(what, "too many indices", f"{len(key)} indices for shape {t.shape}")
    on_chip = t.storage.buffer in ON_CHIP
    nkey = len(key)
    shape: list[int] = []
    strides: list[int] = []
    offset = t.offset
    for d, (n, s) in enumerate(zip(t.shape, t.strides)):
        k = key[d] if d < nkey else _FULL
        if type(k) is slice:
            start, stop, step = k.start, k.stop, k.step
            if step is None or (type(step) is int and step == 1):
                step = 1
            else:
                step = _as_int(step, what, "slice step")
                if step < 1:
                    raise nki_error(what, "slice step", f"step must be >= 1, got {step} on dim {d}")
                if on_chip and d == 0 and step != 1:
                    # Partition ranges are (start, count); the docs never show a partition step.
                    raise nki_error(what, "partition step",
                                    f"on-chip dim 0 must be sliced with step 1, got {step}")
            start = 0 if start is None else _as_int(start, what, "slice start")
            stop = n if stop is None else _as_int(stop, what, "slice stop")
            if start < 0:
                start += n
            if stop < 0:
                stop += n
            if not (0 <= start <= stop <= n):
                # Python would clamp; NKI kernels bound slices explicitly (min()), so an
                # out-of-range slice is a kernel bug here. An empty slice (start == stop) is a
                # legal, zero-size view: nki-library builds them for a core whose shard is empty.
                raise nki_error(what, "slice out of range",
                                f"{start}:{stop} on dim {d} of size {n} (shape {t.shape})")
            shape.append(-(-(stop - start) // step))
            strides.append(s * step)
            offset += start * s
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise nki_error(what, "index out of range", f"index {k} on dim {d} of size {n}")
            offset += i * s
            if on_chip and d == 0:  # on-chip: an int on the partition dim keeps it
                shape.append(1)
                strides.append(s)
        else:
            raise nki_error(what, "index type",
                            f"{type(k).__name__} index on dim {d}: only int, slice, '...' and "
                            "nl.ds are allowed (no array/tensor indexing; use .ap(vector_offset=))")
    if on_chip:
        while len(shape) < 2:  # on-chip results stay >= 2-D
            shape.append(1)
            strides.append(1)
    return t._derive(shape, strides, offset)


_FULL = slice(None)
