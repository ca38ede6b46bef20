"""DMA instructions: ``dma_copy``, ``dma_transpose``, ``dma_compute`` (docs/emulator.md).

Every operand is resolved to (storage, dtype, element addresses, valid mask); the
instruction is then one NumPy gather -> (cast / sum) -> scatter.

Conservative choices where the docs are silent (also in docs/emulator.md):
- Raw ints for enum parameters are rejected (§7a.5 "raw-int enums").
- ``oob_mode.skip`` is only accepted when one operand is dynamic (vector_offset,
  scalar_offset or a dynamic select), for all three instructions.
- R08: a (P, M>1) multi-column index tile is accepted only by ``dma_transpose`` (the only
  documented use, consumed column-major); ``dma_copy``/``dma_compute`` need (P, 1) indices
  whose P equals the first pattern count: their multi-column order is undocumented and
  nki-library's two uses assume opposite orders, so any choice would silently be wrong for
  one of them.
- Only one side of a DMA may be indirect (vector_offset).
- R07: duplicate destination addresses in one scatter / scatter-RMW race on hardware (the
  docs promise nothing for them; dma_compute documents only ``unique_indices=True``). When
  the outcome cannot depend on the order (every write of a duplicated element carries the
  same bits; for a scatter-RMW, at most one non-zero contribution per element, e.g. padded
  rows aimed at row 0 with zero data, as nki-library does) the emulator computes the
  sequential result and issues an ``NkiHazardWarning``; conflicting duplicates raise
  NkiError unless ``duplicate_scatter="last_writer_wins"``. A static destination with a
  stride-0 dim (two writes to one element) is always rejected.
- R06: ``dma_compute`` scales other than 1.0 are computed (``sum(src * scale)`` in fp32)
  with an ``NkiHazardWarning``: the page says "all values in scales must be 1.0", but AWS's
  hardware-tested kernels pass -1.
- R03: ``dma_transpose`` needs a 2-byte dtype only for HWDGE and indirect transposes, as the
  page lists it; a direct transpose with ``dge_mode`` unknown takes any dtype.
Pages: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/
nki.isa.dma_copy.html, nki.isa.dma_transpose.html, nki.isa.dma_compute.html.
- dma_transpose HWDGE shape rules apply when ``dge_mode=hwdge`` is requested.
- Equal dtypes copy bits; different dtypes cast src -> fp32 -> dst with the NKI cast rules.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Sequence, cast

import numpy as np

from nkilib_msda.hardware import DMA_COMPUTE_MAX_SOURCES
from nkilib_msda.hardware import DMA_TRANSPOSE_MAX_FREE as _TRANSPOSE_MAX_FREE
from nkilib_msda.hardware import PARTITIONS as _PARTITIONS
from nkilib_msda.simulator.access import (read, read_raw, report_hazard, store,
                                          write_raw)
from nkilib_msda.simulator.alu import NkiOp
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.dtypes import cast_values, quiet_fp, uint32
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa._dma_operands import (_check_destination_unique, _check_operand,
                                                     check_index_tile,
                                                     _Operand, _resolve, _resolve_indirect,
                                                     _resolve_static, _transfer_mask)
from nkilib_msda.simulator.isa.enums import as_enum, dge_mode as _dge_mode
from nkilib_msda.simulator.isa.enums import engine as _engine
from nkilib_msda.simulator.isa.enums import oob_mode as _oob_mode
from nkilib_msda.simulator.tensor import DynamicAccess, IndirectAccess, NkiTensor

__all__ = ["dma_copy", "dma_transpose", "dma_compute"]

MAX_DMA_COMPUTE_SOURCES = DMA_COMPUTE_MAX_SOURCES
_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _enum(instruction: str, name: str, value: Any, cls: type[Enum]) -> Enum:
    return as_enum(value, cls, name, instruction)  # member or raw value (emu-api, R11)


def _convert(values: np.ndarray, src_dtype: Any, dst_dtype: Any) -> np.ndarray:
    if src_dtype == dst_dtype:
        return values
    return cast_values(values.astype(np.float32), dst_dtype)


def _direction(src_sides: Sequence[str], dst_side: str) -> str:
    sides = set(src_sides)
    src = sides.pop() if len(sides) == 1 else "mixed"
    return f"{src}_to_{dst_side}"


def _queue(dge: Enum, eng: Enum = _engine.unknown) -> str | None:
    """Where the timing model issues a DMA: hardware DGE driven by Sync ("sync") or Scalar
    ("act"), software DGE on GpSimd ("swdge"); None (dge_mode unknown or none) lets the model
    choose by the DMA's kind (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/
    deep-dives/nki-dge.html)."""
    if dge is _dge_mode.swdge:
        return "swdge"
    if dge is _dge_mode.hwdge:
        return "act" if eng in (_engine.scalar, _engine.activation) else "sync"
    return None


def _account(opcode: str, kind: str, srcs: Sequence[_Operand], dst: _Operand, elements: int,
             direction: str | None = None, queue: str | None = None) -> None:
    """Record one DMA; a read-modify-write lists its destination among ``srcs`` so the HBM
    read is counted, and passes the data-flow ``direction`` explicitly."""
    hbm = sum(elements * s.itemsize for s in srcs if s.side == "hbm")
    if dst.side == "hbm":
        hbm += elements * dst.itemsize
    indirect = [op for op in (*srcs, dst) if op.kind == "indirect"]
    descriptors = indirect[0].descriptors if indirect else None
    skipped = sum(op.skipped_descriptors for op in (*srcs, dst) if op.kind != "static")
    direction = direction or _direction([s.side for s in srcs], dst.side)
    current().events.dma(opcode, kind, direction, elements, elements * dst.itemsize, hbm,
                         descriptors, skipped, queue=queue)


# -- dma_copy ----------------------------------------------------------------------------------------
@quiet_fp
def _check_priority(ins: str, priority: Any) -> None:
    """DMA ``priority``: None or an int 0 (highest) .. 3 (lowest) (nki.lnc page, "priority")."""
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)) \
            or not 0 <= int(priority) <= 3:
        raise nki_error(ins, "priority", f"priority must be None or an int 0..3, got {priority!r}")


def dma_copy(dst: Any, src: Any, priority: int | None = None, oob_mode: Any = _oob_mode.error,
             dge_mode: Any = _dge_mode.unknown, engine: Any = _engine.unknown,
             name: str | None = None) -> None:
    """``dst = src`` (equal element counts, row-major pairing) between HBM and SBUF.

    Parameter order as the NKI 0.8 API (``priority`` third); ``priority`` (DMA quality of service,
    0 highest to 3 lowest, NeuronCore-v4) is checked and otherwise has no effect here (the
    timing model does not model DMA priorities).

    Gather: ``src=hbm.ap(..., vector_offset=idx)`` (row ``idx[p]`` -> partition p).
    Scatter: ``dst=hbm.ap(..., vector_offset=idx)``. Different dtypes cast via fp32.
    """
    ins = "dma_copy"
    _check_priority(ins, priority)
    oob = _enum(ins, "oob_mode", oob_mode, _oob_mode)
    dge = _enum(ins, "dge_mode", dge_mode, _dge_mode)
    eng = _enum(ins, "engine", engine, _engine)
    _check_operand(ins, "dst", dst)
    _check_operand(ins, "src", src)
    indirect = [x for x in (dst, src) if isinstance(x, IndirectAccess)]
    dynamic = [x for x in (dst, src) if isinstance(x, (IndirectAccess, DynamicAccess))]
    if len(indirect) == 2:
        raise nki_error(ins, "one indirection", "src and dst cannot both use vector_offset")
    if eng is not _engine.unknown:
        if dge is not _dge_mode.hwdge:
            raise nki_error(ins, "engine requires hwdge",
                            f"engine={eng} is only allowed with dge_mode=nisa.dge_mode.hwdge")
        if eng not in (_engine.sync, _engine.scalar, _engine.activation):
            raise nki_error(ins, "engine", f"HWDGE queues are driven by sync or scalar, got {eng}")
    if indirect and dge in (_dge_mode.hwdge, _dge_mode.none):
        raise nki_error(ins, "indirection requires swdge",
                        f"vector_offset needs SWDGE (dge_mode unknown or swdge), got {dge}")
    if dge is _dge_mode.hwdge and src.dtype != dst.dtype:
        raise nki_error(ins, "hwdge dtype", f"HWDGE copies cannot cast: src {src.dtype} != "
                                            f"dst {dst.dtype}")
    if oob is _oob_mode.skip and not dynamic:
        raise nki_error(ins, "oob_mode.skip without indirection",
                        "oob_mode=skip is only meaningful with a vector_offset/scalar_offset access")
    if dst.size != src.size:
        raise nki_error(ins, "DMA element count",
                        f"src has {src.size} elements {tuple(src.shape)}, dst has {dst.size} "
                        f"{tuple(dst.shape)}; DMA element counts must match")
    s = _resolve(ins, src, oob)
    d = _resolve(ins, dst, oob)
    if s.kind == "static" and d.kind == "static":
        # Static views move through NumPy strides (no address arrays); same elements.
        values = read(src, ins).reshape(-1)
        store(dst, _convert(values, s.dtype, d.dtype), ins)
        _account(ins, "direct", [s], d, int(values.size), queue=_queue(dge, eng))
        return
    mask = _transfer_mask(s, d)
    s_addr, d_addr = s.index(mask), d.index(mask)
    values = _convert(read_raw(s.storage, s_addr, s.dtype, ins, src.name), s.dtype, d.dtype)
    _check_destination_unique(ins, d, mask, values)
    write_raw(d.storage, d_addr, values, d.dtype, ins)
    kind = "indirect_scatter" if isinstance(dst, IndirectAccess) else (
        "indirect_gather" if isinstance(src, IndirectAccess) else "direct")
    _account(ins, kind, [s], d, int(values.size), queue=_queue(dge, eng))


# -- dma_transpose -------------------------------------------------------------------------------
def _transpose_indices(ins: str, acc: IndirectAccess) -> np.ndarray:
    idx = acc.index
    if idx.dtype != uint32:
        raise nki_error(ins, "index dtype", f"indirect dma_transpose needs uint32 indices, got {idx.dtype}")
    if idx.ndim != 2:
        raise nki_error(ins, "index shape", f"indices must be 2-D, got {idx.shape}")
    p, m = idx.shape
    if not (16 <= p <= _PARTITIONS and p % 16 == 0):
        raise nki_error(ins, "index shape",
                        f"indices.shape[0] must be a multiple of 16 in [16, 128], got {p}")
    if m > 1 and p != _PARTITIONS:
        raise nki_error(ins, "index shape",
                        f"indices with {m} > 1 columns need 128 partitions, got {p}")
    check_index_tile(ins, idx)
    rows = acc.shape[0]
    if idx.size < rows:
        raise nki_error(ins, "index count", f"indices.size={idx.size} < src.shape[0]={rows}")
    values = read(idx, ins)
    # Column-major consumption: row r of src comes from indices.T.flatten()[r], so
    # dst column k*128 + p comes from indices[p, k].
    return values.T.reshape(-1)[:rows]


@quiet_fp
def dma_transpose(dst: Any, src: Any, axes: Any = None, priority: int | None = None,
                  dge_mode: Any = _dge_mode.unknown, oob_mode: Any = _oob_mode.error,
                  name: str | None = None) -> None:
    """``dst = src.transpose(axes)`` into SBUF; ``src`` may be an indirect HBM access (uint32
    indices consumed column-major). ``priority`` as in :func:`dma_copy`."""
    ins = "dma_transpose"
    _check_priority(ins, priority)
    oob = _enum(ins, "oob_mode", oob_mode, _oob_mode)
    dge = _enum(ins, "dge_mode", dge_mode, _dge_mode)
    _check_operand(ins, "dst", dst)
    _check_operand(ins, "src", src)
    if not isinstance(dst, NkiTensor) or dst.buffer != "sbuf":
        raise nki_error(ins, "dst buffer", f"dst must be a static SBUF tensor, got {dst!r}")
    if src.dtype != dst.dtype:
        raise nki_error(ins, "dtype agreement", f"src {src.dtype} != dst {dst.dtype}")
    indirect = isinstance(src, IndirectAccess)
    if src.dtype.itemsize != 2 and (indirect or dge is _dge_mode.hwdge):
        # R03: the page lists "src.dtype is 2 bytes" under the HWDGE and the indirect
        # constraints only; a direct transpose (dge_mode unknown) takes any dtype.
        raise nki_error(ins, "2-byte dtype",
                        f"{'an indirect' if indirect else 'a HWDGE'} dma_transpose needs a 2-byte "
                        f"dtype (bfloat16, float16), got {src.dtype}")
    rank = len(src.shape)
    if rank not in _TRANSPOSE_AXES:
        raise nki_error(ins, "rank", f"src must be 2-D, 3-D or 4-D, got {src.shape}")
    expected_axes = _TRANSPOSE_AXES[rank]
    axes_t = expected_axes if axes is None else tuple(int(a) for a in axes)
    if axes_t != expected_axes:
        raise nki_error(ins, "axes", f"a {rank}-D transpose supports axes={expected_axes}, got {axes_t}")
    out_shape = tuple(src.shape[a] for a in axes_t)
    if tuple(dst.shape) != out_shape:
        raise nki_error(ins, "dst shape", f"dst.shape {dst.shape} != permuted src.shape {out_shape}")
    dynamic = indirect or isinstance(src, DynamicAccess)
    if oob is _oob_mode.skip and not dynamic:
        raise nki_error(ins, "oob_mode.skip without indirection",
                        "oob_mode=skip needs an indirect (vector_offset) or scalar_offset src")
    if dge is _dge_mode.hwdge:
        if indirect:
            raise nki_error(ins, "indirection requires swdge", "HWDGE cannot do indirection")
        s0 = src.shape[0]
        if rank == 2 and s0 != 16:
            raise nki_error(ins, "hwdge shape", f"2-D HWDGE transpose needs src.shape[0] == 16, got {s0}")
        if rank > 2 and (s0 not in (1, 2, 4, 8, 16) or (s0 * src.shape[-2]) % 16):
            raise nki_error(ins, "hwdge shape",
                            f"3-D/4-D HWDGE transpose needs src.shape[0] in {{1,2,4,8,16}} and "
                            f"(shape[0]*shape[-2]) % 16 == 0, got {src.shape}")
        if src.shape[-1] > _TRANSPOSE_MAX_FREE:
            raise nki_error(ins, "hwdge shape", f"src.shape[-1] must be <= {_TRANSPOSE_MAX_FREE}, "
                                                f"got {src.shape[-1]}")
    if indirect:
        if dge is _dge_mode.none:
            raise nki_error(ins, "indirection requires swdge", "dge_mode=none cannot do indirection")
        if src.shape[-1] > _TRANSPOSE_MAX_FREE:
            raise nki_error(ins, "indirect shape", f"src.shape[-1] must be <= {_TRANSPOSE_MAX_FREE}, "
                                                   f"got {src.shape[-1]}")
        if src.shape[0] % 16:
            raise nki_error(ins, "indirect shape",
                            f"src.shape[0] must be a multiple of 16, got {src.shape[0]}")
        if rank == 4 and src.shape[1] != 1 and src.shape[2] != 1:
            raise nki_error(ins, "indirect shape", f"4-D: shape[1] or shape[2] must be 1, got {src.shape}")
        s = _resolve_indirect(ins, src, _transpose_indices(ins, src), oob)
    else:
        s = _resolve(ins, src, oob)
    d = _resolve_static(dst)
    src_addr = np.transpose(s.shaped(), axes_t).reshape(-1)
    d_addr = d.index(None)
    _check_destination_unique(ins, d, None)
    if s.valid is not None:
        keep = np.transpose(s.valid, axes_t).reshape(-1)
        src_addr, d_addr = src_addr[keep], d.index(keep)
    values = read_raw(s.storage, src_addr, s.dtype, ins, src.name)
    write_raw(d.storage, d_addr, values, d.dtype, ins)
    _account(ins, "indirect_transpose" if indirect else "transpose", [s], d, int(src_addr.size),
             queue=_queue(dge))


# -- dma_compute -----------------------------------------------------------------------------------
def _is_add(op: Any) -> bool:
    return isinstance(op, NkiOp) and op.name == "add"


def _same_static(a: Any, b: Any) -> bool:
    return (isinstance(a, NkiTensor) and isinstance(b, NkiTensor) and a.storage is b.storage
            and a.shape == b.shape and a.strides == b.strides and a.offset == b.offset
            and a.dtype == b.dtype)


def _scales(ins: str, scales: Any, n: int) -> list[np.float32]:
    """One fp32 factor per source. The page: "all values in scales must be 1.0"; AWS's
    hardware-tested MSDA backward passes -1, so other values are computed with a hazard
    warning (R06) instead of being rejected."""
    if scales is None:
        return [np.float32(1.0)] * n
    if not isinstance(scales, (list, tuple)) or len(scales) != n or any(
            isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
            for v in scales):
        raise nki_error(ins, "scales", f"scales must be None or one number per source ({n}), "
                                       f"got {scales!r}")
    factors = [np.float32(v) for v in scales]
    if any(f != 1.0 for f in factors):
        report_hazard(ins, "scales must be 1.0",
                      f"scales={list(scales)!r}: the dma_compute page says all scales must be 1.0 "
                      "(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/"
                      "nki.isa.dma_compute.html); computed as sum(src * scale) in fp32")
    return factors


def _scatter_add(ins: str, d: _Operand, d_addr: Any, add: np.ndarray, old_factor: Any,
                 name: str) -> None:
    """``dst[addr] = dst[addr] * old_factor + add`` with repeated addresses accumulated
    sequentially (accepted duplicates: see _check_destination_unique)."""
    if isinstance(d_addr, slice) or np.unique(d_addr).size == d_addr.size:
        old = read_raw(d.storage, d_addr, d.dtype, ins, name).astype(np.float32)
        write_raw(d.storage, d_addr, cast_values(old * old_factor + add, d.dtype), d.dtype, ins)
        return
    if current().options.duplicate_scatter == "last_writer_wins":  # emulate the race
        old = read_raw(d.storage, d_addr, d.dtype, ins, name).astype(np.float32)
        write_raw(d.storage, d_addr, cast_values(old * old_factor + add, d.dtype), d.dtype, ins)
        return
    uniq, inverse = np.unique(d_addr, return_inverse=True)
    acc = read_raw(d.storage, uniq, d.dtype, ins, name).astype(np.float32) * old_factor
    np.add.at(acc, inverse.reshape(-1), add.reshape(-1))
    write_raw(d.storage, uniq, cast_values(acc, d.dtype), d.dtype, ins)


@quiet_fp
def dma_compute(dst: Any, srcs: Any, reduce_op: Any, scales: Any = None,
                unique_indices: bool = True, oob_mode: Any = _oob_mode.error,
                name: str | None = None) -> None:
    """``dst = sum(srcs)`` in fp32 (then cast), 1..16 sources of equal element counts.

    Scatter-RMW: ``dst=hbm.ap(vector_offset=idx)``, ``srcs=[same ap, sbuf_data]``.
    Gather-RMW: ``dst=sbuf``, ``srcs=[hbm.ap(vector_offset=idx), dst]``.
    """
    ins = "dma_compute"
    oob = _enum(ins, "oob_mode", oob_mode, _oob_mode)
    if not isinstance(srcs, (list, tuple)):
        raise nki_error(ins, "srcs", f"srcs must be a list or tuple, got {type(srcs).__name__}")
    if not 1 <= len(srcs) <= MAX_DMA_COMPUTE_SOURCES:
        raise nki_error(ins, "source count",
                        f"{len(srcs)} sources; dma_compute takes 1 to {MAX_DMA_COMPUTE_SOURCES}")
    if not _is_add(reduce_op):
        raise nki_error(ins, "reduce_op", f"reduce_op must be nl.add, got {reduce_op!r}")
    factors = _scales(ins, scales, len(srcs))
    if unique_indices is not True:
        raise nki_error(ins, "unique_indices",
                        "unique_indices must be True (non-unique indices are not supported)")
    _check_operand(ins, "dst", dst)
    for i, s in enumerate(srcs):
        _check_operand(ins, f"srcs[{i}]", s)
        if s.size != dst.size:
            raise nki_error(ins, "DMA element count",
                            f"srcs[{i}] has {s.size} elements, dst has {dst.size}")
    ops = [dst, *srcs]
    dynamic = any(isinstance(x, (IndirectAccess, DynamicAccess)) for x in ops)
    if oob is _oob_mode.skip and not dynamic:
        raise nki_error(ins, "oob_mode.skip without indirection",
                        "oob_mode=skip needs an indirect (vector_offset) or scalar_offset operand")
    indirect_srcs = [i for i, s in enumerate(srcs) if isinstance(s, IndirectAccess)]
    if isinstance(dst, IndirectAccess):
        if len(srcs) != 2 or not dst.same_access(srcs[0]) or isinstance(srcs[1], IndirectAccess):
            raise nki_error(ins, "scatter-RMW form",
                            "an indirect dst needs srcs=[the same indirect access, data] "
                            "(exactly two sources)")
        if srcs[1].buffer != "sbuf":
            raise nki_error(ins, "scatter-RMW form", f"the data source must be in SBUF, got {srcs[1].buffer}")
        d = _resolve(ins, dst, oob)
        data = _resolve(ins, srcs[1], oob)
        mask = _transfer_mask(d, data)
        d_addr, s_addr = d.index(mask), data.index(mask)
        add = read_raw(data.storage, s_addr, data.dtype, ins, srcs[1].name).astype(np.float32)
        add = add * factors[1]
        _check_destination_unique(ins, d, mask, add, rmw=True)
        _scatter_add(ins, d, d_addr, add, factors[0], dst.name)
        _account(ins, "indirect_rmw", [data, d], d, int(add.size), "sbuf_to_hbm")
        return
    if indirect_srcs:
        if len(srcs) != 2 or indirect_srcs != [0] or not _same_static(srcs[1], dst) \
                or dst.buffer != "sbuf":
            raise nki_error(ins, "gather-RMW form",
                            "an indirect source needs dst=sbuf tile and srcs=[indirect access, dst]")
        g = _resolve(ins, srcs[0], oob)
        d = _resolve_static(dst)
        mask = _transfer_mask(g)
        g_addr, d_addr = g.index(mask), d.index(mask)
        _check_destination_unique(ins, d, None)
        old = read_raw(d.storage, d_addr, d.dtype, ins, dst.name).astype(np.float32)
        add = read_raw(g.storage, g_addr, g.dtype, ins, srcs[0].name).astype(np.float32)
        summed = add * factors[0] + old * factors[1]
        write_raw(d.storage, d_addr, cast_values(summed, d.dtype), d.dtype, ins)
        _account(ins, "indirect_rmw", [g, d], d, int(old.size), "hbm_to_sbuf")
        return
    resolved = [_resolve(ins, s, oob) for s in srcs]
    d = _resolve(ins, dst, oob)
    mask = _transfer_mask(d, *resolved)
    _check_destination_unique(ins, d, mask)
    d_addr = d.index(mask)
    total = None
    for s, src, factor in zip(resolved, srcs, factors):
        values = read_raw(s.storage, s.index(mask), s.dtype, ins, src.name).astype(np.float32)
        values = values * factor if factor != 1.0 else values
        total = values if total is None else total + values
    total = cast(np.ndarray, total)  # srcs is non-empty
    write_raw(d.storage, d_addr, cast_values(total, d.dtype), d.dtype, ins)
    _account(ins, "compute", resolved, d, int(total.size))
