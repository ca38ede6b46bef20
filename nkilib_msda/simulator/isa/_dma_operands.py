"""DMA operands: resolving static, dynamic (scalar-offset) and indirect (vector-offset) views
into element addresses with their validity masks, and the checks on them (PSUM and operand
rules, out-of-bounds indices, destination uniqueness of scatters). Used by isa/dma.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

import numpy as np

from nkilib_msda.hardware import INDEX_TILE_ALIGN_BYTES
from nkilib_msda.hardware import PARTITIONS as _PARTITIONS
from nkilib_msda.simulator.access import may_overlap, read, report_hazard
from nkilib_msda.simulator.context import current_or_none
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa.enums import oob_mode as _oob_mode
from nkilib_msda.simulator.tensor import DynamicAccess, IndirectAccess, NkiTensor, Storage

_RUNS_CACHE: dict[tuple, dict[int, int]] = {}

_ROW_RUNS_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}


# -- operand resolution -----------------------------------------------------------------------
@dataclass
class _Operand:
    """A DMA operand at execution time."""

    storage: Storage
    dtype: Any
    addr: np.ndarray | None  # int64, operand shape (rows first); None: from ``tensor``
    valid: np.ndarray | None  # bool, operand shape; None = all valid
    kind: str  # static | indirect | dynamic
    side: str  # hbm | sbuf
    descriptors: dict[int, int] | None = None
    skipped_descriptors: int = 0  # descriptors of rows dropped by oob_mode.skip
    flat: Any = None  # row-major flat index: slice (contiguous) or int64 array
    overlap_free: bool = False  # proven: no element addressed twice
    row_bases: np.ndarray | None = None  # indirect: valid rows' start addresses
    row_extent: int = 0  # indirect: elements spanned by one row
    row_runs: tuple[np.ndarray, np.ndarray] | None = None  # indirect: (run starts, lengths)
    tensor: NkiTensor | None = None  # static operands compute addresses lazily

    def shaped(self) -> np.ndarray:
        """Addresses in the operand's shape."""
        if self.addr is None:
            assert self.tensor is not None  # static operands always carry their view
            self.addr = self.tensor.addresses()
        return self.addr

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def index(self, mask: np.ndarray | None) -> Any:
        """Flat addresses of the transferred elements (a slice when possible)."""
        if mask is None:
            if self.flat is None:
                self.flat = self.tensor.flat_index() if self.tensor is not None \
                    else self.shaped().reshape(-1)
            return self.flat
        return self.shaped().reshape(-1)[mask]


def _check_operand(instruction: str, role: str, x: Any) -> None:
    if not isinstance(x, (NkiTensor, IndirectAccess, DynamicAccess)):
        raise nki_error(instruction, "operand type",
                        f"{role} must be an NKI tensor or access pattern, got {type(x).__name__}")
    if x.buffer == "psum":
        raise nki_error(instruction, "DMA PSUM access",
                        f"{role} ({x.name or 'unnamed'}) is in PSUM; DMA engines access HBM and "
                        "SBUF only (copy PSUM to SBUF with nisa.tensor_copy first)")


def _side(x: Any) -> str:
    return "sbuf" if x.buffer == "sbuf" else "hbm"


def _run_histogram(acc: IndirectAccess, rows: int) -> dict[int, int]:
    """Descriptors of ``rows`` rows: one per contiguous run of a row's elements."""
    if rows <= 0:
        return {}
    key = (acc.shape[1:], acc.free_strides, acc.dtype.itemsize)
    per_row = _RUNS_CACHE.get(key)
    if per_row is None:
        flat = acc.row_offsets().reshape(-1)
        breaks = np.flatnonzero(np.diff(flat) != 1)
        edges = np.concatenate(([0], breaks + 1, [flat.size]))
        lengths, counts = np.unique(np.diff(edges), return_counts=True)
        per_row = {int(n) * acc.dtype.itemsize: int(c) for n, c in zip(lengths, counts)}
        if len(_RUNS_CACHE) > 4096:
            _RUNS_CACHE.clear()
        _RUNS_CACHE[key] = per_row
    return {size: count * rows for size, count in per_row.items()}


_MAX_RUNS_PER_ROW = 64


def _row_runs(acc: IndirectAccess) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, lengths) of the contiguous runs of one row, relative to the row start; None
    when a row has more than ``_MAX_RUNS_PER_ROW`` runs (the generic check is then used)."""
    key = (acc.shape[1:], acc.free_strides)
    if key in _ROW_RUNS_CACHE:
        return _ROW_RUNS_CACHE[key]
    flat = np.sort(acc.row_offsets().reshape(-1))
    breaks = np.flatnonzero(np.diff(flat) != 1) + 1
    starts_at = np.concatenate(([0], breaks))
    runs = None
    if starts_at.size <= _MAX_RUNS_PER_ROW:
        lengths = np.diff(np.concatenate((starts_at, [flat.size])))
        runs = (flat[starts_at].astype(np.int64), lengths.astype(np.int64))
    if len(_ROW_RUNS_CACHE) > 4096:
        _ROW_RUNS_CACHE.clear()
    _ROW_RUNS_CACHE[key] = runs
    return runs


def _oob_rows(instruction: str, acc: IndirectAccess, rows: np.ndarray, base: np.ndarray,
              extent: int, oob: Enum) -> np.ndarray | None:
    """Bool (R,) of rows that address anything outside the receiver's storage (None: none).

    Strides are non-negative, so a row spans [base, base + extent - 1]."""
    numel = acc.storage.numel(acc.dtype.itemsize)
    if rows.size == 0 or (int(rows.min()) >= 0 and int(base.max()) + extent <= numel):
        return None
    bad = (rows < 0) | (base < 0) | (base + extent > numel)
    if oob is _oob_mode.error:
        which = np.flatnonzero(bad)
        shown = ", ".join(f"row {int(r)}: index {int(rows[r])}" for r in which[:4])
        raise nki_error(instruction, "out-of-bounds index",
                        f"{which.size} of {rows.size} indirect rows leave {acc.name or 'the tensor'}"
                        f" ({numel} {acc.dtype} elements; {shown}); use oob_mode=nisa.oob_mode.skip "
                        "to drop them")
    return bad


def _resolve_indirect(instruction: str, acc: IndirectAccess, rows: np.ndarray,
                      oob: Enum) -> _Operand:
    """Addresses of an indirect access given the per-row index values ``rows`` (R,)."""
    rows = rows.astype(np.int64)
    base = acc.offset + rows * acc.row_stride
    row_off = acc.row_offsets()
    extent = 1 + sum(s * (n - 1) for s, n in zip(acc.free_strides, acc.shape[1:]))
    bad = _oob_rows(instruction, acc, rows, base, extent, oob)
    free_nd = row_off.ndim
    lead = (rows.size,) + (1,) * free_nd
    if bad is None:
        addr = base.reshape(lead) + row_off
        valid = None
        n_bad = 0
        ok_bases = base
    else:
        addr = np.where(bad, 0, base).reshape(lead) + row_off  # never touch OOB memory
        valid = np.broadcast_to(~bad.reshape(lead), addr.shape)
        n_bad = int(np.count_nonzero(bad))
        ok_bases = base[~bad]
    hist = _run_histogram(acc, rows.size - n_bad)
    skipped = sum(_run_histogram(acc, n_bad).values())
    row_ok = not may_overlap(acc.shape[1:], acc.free_strides)
    return _Operand(acc.storage, acc.dtype, addr, valid, "indirect", "hbm", hist, skipped,
                    row_bases=ok_bases, row_extent=extent if row_ok else -1,
                    row_runs=_row_runs(acc) if row_ok else None)


def check_index_tile(instruction: str, idx: NkiTensor) -> None:
    """With ``full_indirect`` (NKILIB_MSDA_EMULATOR_FULL_INDIRECT=1, on in the kernel tests):
    an indirect DMA's index tile spans all 128 partitions from partition 0 (AWS pads every
    indirect DMA "to P_MAX to avoid a DMA abort"; rows that must not act carry an
    out-of-range index with ``oob_mode.skip``), and a multi-column index tile starts at a
    16-byte-aligned offset of its partition (hardware.INDEX_TILE_ALIGN_BYTES; AWS's single
    (P, 1) columns sit at any column offset). Neither is a documented rule, hence opt-in."""
    ctx = current_or_none()
    if ctx is None or not ctx.options.full_indirect:
        return
    first = idx.start_partition
    if first != 0 or idx.shape[0] != _PARTITIONS:
        raise nki_error(instruction, "indirect DMA partitions",
                        f"the index tile covers partitions [{first}, {first + idx.shape[0]}); "
                        f"full_indirect needs all {_PARTITIONS} from partition 0 (pad with an "
                        "out-of-range index and oob_mode=nisa.oob_mode.skip)")
    if idx.ndim == 2 and idx.shape[1] > 1:
        free_bytes = (idx.offset % idx.partition_stride) * idx.dtype.itemsize
        if free_bytes % INDEX_TILE_ALIGN_BYTES:
            raise nki_error(instruction, "index tile alignment",
                            f"a {idx.shape[1]}-column index tile starts {free_bytes} B into its "
                            f"partition; full_indirect needs a multiple of {INDEX_TILE_ALIGN_BYTES} B")


def _index_column(instruction: str, acc: IndirectAccess) -> np.ndarray:
    """(P,) index values of a dma_copy/dma_compute indirect access ((P,1) index tile)."""
    idx = acc.index
    if idx.ndim != 2 or idx.shape[1] != 1:
        raise nki_error(instruction, "vector_offset shape",
                        f"indices must be (P, 1), got {idx.shape}; a (P, M>1) multi-column index "
                        "tile is documented only for dma_transpose (column-major); for "
                        f"{instruction} the order in which its M columns map to rows is "
                        "undocumented (nki-library's two uses assume opposite orders), so it is "
                        "rejected rather than guessed: issue one (P, 1) column per instruction")
    if idx.shape[0] != acc.shape[0]:
        raise nki_error(instruction, "vector_offset shape",
                        f"the first pattern count ({acc.shape[0]}) must equal the number of "
                        f"index partitions ({idx.shape[0]})")
    check_index_tile(instruction, idx)
    return read(idx, instruction).reshape(-1)


def _resolve_dynamic(instruction: str, acc: DynamicAccess, oob: Enum) -> _Operand:
    value = int(read(acc.scalar, instruction).reshape(-1)[0])
    static = NkiTensor(acc.storage, acc.dtype, acc.shape, acc.strides, 0, acc.name).addresses()
    addr = static + (acc.offset + value * acc.scale)
    numel = acc.storage.numel(acc.dtype.itemsize)
    bad = addr.size and (addr.min() < 0 or addr.max() >= numel)
    if acc.limit is not None and not 0 <= value < acc.limit:
        bad = True
    if acc.storage.is_on_chip and not bad:
        ppe = acc.storage.ppe(acc.dtype.itemsize)
        # A dynamic offset may move the access to other partitions (indirect_dim 0 of an
        # on-chip receiver); it is out of bounds when a row leaves its (shifted) partition.
        base = acc.offset + value * acc.scale
        parts = base // ppe + np.arange(acc.shape[0]).reshape((-1,) + (1,) * (addr.ndim - 1))
        bad = bool(np.any(addr // ppe != parts))
    if bad:
        if oob is _oob_mode.error:
            raise nki_error(instruction, "out-of-bounds index",
                            f"dynamic offset value {value} moves {acc.name or 'the access'} "
                            f"outside its storage")
        return _Operand(acc.storage, acc.dtype, np.zeros_like(addr), np.zeros(addr.shape, bool),
                        "dynamic", _side(acc), None, 1)
    return _Operand(acc.storage, acc.dtype, addr, None, "dynamic", _side(acc),
                    overlap_free=not may_overlap(acc.shape, acc.strides))


def _resolve_static(t: NkiTensor) -> _Operand:
    """A static view; its addresses are only built if an instruction needs them."""
    return _Operand(t.storage, t.dtype, None, None, "static", _side(t), flat=t.run_slice(),
                    overlap_free=t.run_slice() is not None or not may_overlap(t.shape, t.strides),
                    tensor=t)


def _resolve(instruction: str, x: Any, oob: Enum) -> _Operand:
    if isinstance(x, IndirectAccess):
        return _resolve_indirect(instruction, x, _index_column(instruction, x), oob)
    if isinstance(x, DynamicAccess):
        return _resolve_dynamic(instruction, x, oob)
    return _resolve_static(x)


# -- transfer helpers ---------------------------------------------------------------------------
def _check_destination_unique(instruction: str, dst: _Operand, mask: np.ndarray | None,
                              values: np.ndarray | None = None, rmw: bool = False) -> None:
    """Reject destinations that address an element twice (R07 duplicates: see the module doc;
    ``values``: the data written per transferred element, when known)."""
    if dst.overlap_free:
        return
    if dst.kind == "indirect" and dst.row_extent > 0:
        bases = np.sort(cast(np.ndarray, dst.row_bases))  # set for every indirect operand
        if bases.size < 2 or int(np.diff(bases).min()) >= dst.row_extent:
            return  # distinct, non-overlapping rows
        if dst.row_runs is not None and _runs_disjoint(bases, *dst.row_runs):
            return  # interleaved rows whose contiguous runs never meet
    addr = dst.index(mask)
    if isinstance(addr, slice) or addr.size < 2:
        return
    if dst.kind != "indirect":
        if np.unique(addr).size != addr.size:
            raise nki_error(instruction, "overlapping destination",
                            "the destination view writes some elements more than once "
                            "(stride-0 / broadcast or overlapping pattern)")
        return
    if np.unique(addr).size != addr.size:
        if current().options.duplicate_scatter == "last_writer_wins":
            return
        if values is not None and _duplicates_order_free(addr, values, rmw):
            report_hazard(instruction, "duplicate scatter indices",
                          "several indirect rows of one scatter write the same destination "
                          "elements; the DMA writes race on hardware, but here every outcome is "
                          "the same (identical data / zero contributions, e.g. padded rows aimed "
                          "at row 0), so the sequential result is kept")
            return
        raise nki_error(instruction, "duplicate scatter indices",
                        "two indirect rows of one scatter write different data to the same "
                        "destination elements; on hardware the DMA writes race and updates are "
                        "lost (use unique indices, or simulate(..., "
                        "duplicate_scatter='last_writer_wins'))")


def _duplicates_order_free(addr: np.ndarray, values: np.ndarray, rmw: bool) -> bool:
    """Whether a scatter's result cannot depend on the order of its duplicate writes: every
    write to a repeated address carries the same bits (copy), or at most one of them is a
    non-zero contribution (read-modify-write add)."""
    order = np.argsort(addr, kind="stable")
    a = addr[order]
    v = np.asarray(values).reshape(-1)[order]
    starts = np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))
    if rmw:
        nonzero = (v != 0).astype(np.int64)
        return bool(np.all(np.add.reduceat(nonzero, starts) <= 1))
    bits = v.view(np.dtype(f"u{v.dtype.itemsize}"))
    same_as_prev = np.concatenate(([True], bits[1:] == bits[:-1]))
    first_of_group = np.zeros(a.size, dtype=bool)
    first_of_group[starts] = True
    return bool(np.all(same_as_prev | first_of_group))


def _runs_disjoint(bases: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether rows starting at ``bases`` (sorted), each made of the contiguous runs
    ``[base + starts[k], base + starts[k] + lengths[k])``, address every element at most once.
    Exact: the sorted intervals are disjoint iff each ends before the next one starts."""
    lo = (bases[:, None] + starts[None, :]).reshape(-1)
    hi = lo + np.broadcast_to(lengths, (bases.size, lengths.size)).reshape(-1)
    order = np.argsort(lo, kind="stable")
    return bool(np.all(lo[order][1:] >= hi[order][:-1]))


def _transfer_mask(*ops: _Operand) -> np.ndarray | None:
    mask = None
    for op in ops:
        if op.valid is not None:
            v = op.valid.reshape(-1)
            mask = v if mask is None else (mask & v)
    return mask
