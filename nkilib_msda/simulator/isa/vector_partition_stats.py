"""Vector-engine instructions for cross-partition moves, statistics and range selection.

Pages (under https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/):
- ``nki.isa.nc_stream_shuffle.html``: ``nc_stream_shuffle(dst, src, shuffle_mask, name=None)``.
  Within each quadrant of 32 partitions, output partition ``i`` copies input partition
  ``shuffle_mask[i]`` of the same quadrant; 255 leaves output partition ``i`` unchanged; the
  same 32-entry mask applies to every quadrant; equal dtypes and equal elements per partition;
  SBUF or PSUM; in place allowed.
- ``nki.isa.bn_stats.html``: ``bn_stats(dst, data, name=None)``: per partition, 6 values
  (count, mean, variance*count) of the even- and of the odd-indexed elements; at most
  ``nl.tile_size.bn_stats_fmax`` (512) input elements per partition; fp32 math.
- ``nki.isa.bn_aggr.html``: ``bn_aggr(dst, data, name=None)``: combines (count, mean,
  variance*count) triples (elements per partition a multiple of 3) into (mean, variance).
- ``nki.isa.range_select.html``: ``range_select(dst, on_true_tile, comp_op0, comp_op1, bound0,
  bound1, reduce_cmd=idle, reduce_res=None, reduce_op=maximum, range_start=0.0,
  on_false_value=0.0, name=None)``: keeps element ``j`` of a partition where
  ``comp_op0(j + range_start, bound0)`` and ``comp_op1(j + range_start, bound1)`` both hold,
  else ``on_false_value``; NeuronCore-v3 and newer; optional running max into ``reduce_res``.

Assumptions (not stated on the pages): a ``src`` with fewer partitions than ``dst`` is legal
for ``nc_stream_shuffle`` as long as every selected input partition exists (the latest page
dropped the "same number of partitions" rule of the 2.26 page; nki-library broadcasts one
partition this way); the variance is the population variance (``M2 / count``); the free index
``j`` of ``range_select`` is the row-major position within the partition; bounds are ``(P, 1)``
tiles or numbers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator.alu import maximum, resolve_alu
from nkilib_msda.simulator.dtypes import quiet_fp
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops
from nkilib_msda.simulator.isa.enums import as_enum, reduce_cmd as _reduce_cmd_enum

__all__ = ["nc_stream_shuffle", "bn_stats", "bn_aggr", "range_select"]

_QUADRANT = 32
_KEEP = 255
_BN_STATS_FMAX = 512


def nc_stream_shuffle(dst: Any, src: Any, shuffle_mask: Sequence[int],
                      name: str | None = None) -> None:
    """Per 32-partition quadrant: ``dst[q*32 + i] = src[q*32 + shuffle_mask[i]]`` (255 keeps
    ``dst[q*32 + i]``). ``src``/``dst``: on-chip ``(P, ...)`` views, equal dtype and elements
    per partition."""
    instr = "nc_stream_shuffle"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "src", src)
    access.check_compute_partitions(instr, dst, src)
    mask = list(shuffle_mask) if isinstance(shuffle_mask, (list, tuple)) else None
    if mask is None or len(mask) != _QUADRANT or not all(
            isinstance(m, (int, np.integer)) and not isinstance(m, bool) for m in mask):
        raise nki_error(instr, "shuffle_mask",
                        f"shuffle_mask must be a list of {_QUADRANT} ints, got {shuffle_mask!r}")
    if dst.dtype != src.dtype:
        raise nki_error(instr, "dtype", f"dst is {dst.dtype} but src is {src.dtype}; they must match")
    _, p_dst, per_dst = ops.partitions(dst)
    _, p_src, per_src = ops.partitions(src)
    if per_dst != per_src:
        raise nki_error(instr, "elements per partition",
                        f"dst has {per_dst} elements per partition, src has {per_src}")
    rows = np.arange(p_dst)
    selected = np.array([mask[i % _QUADRANT] for i in rows], dtype=np.int64)
    for i, m in zip(rows, selected):
        if m != _KEEP and not 0 <= m < _QUADRANT:
            raise nki_error(instr, "shuffle_mask",
                            f"shuffle_mask[{i % _QUADRANT}]={m}: entries are 0..31 or 255 (keep)")
    keep = selected == _KEEP
    source = (rows // _QUADRANT) * _QUADRANT + np.where(keep, 0, selected)
    if (source[~keep] >= p_src).any():
        bad = int(rows[~keep][source[~keep] >= p_src][0])
        raise nki_error(instr, "source partition",
                        f"dst partition {bad} copies src partition {int(source[bad])}, but src "
                        f"has {p_src} partitions")
    values = ops.as_pf(access.read(src, instr), p_src)
    out = values[np.where(keep, 0, source)] if p_src else np.zeros((p_dst, per_dst), src.dtype.np)
    if keep.any():
        write = np.broadcast_to(~keep[:, None], (p_dst, per_dst))
        ops.write_masked(dst, out, write, instr)
    else:
        ops.write_result(dst, out, instr)
    ops.record("vector", "nc_stream_shuffle", dst.size)


def _stats_operands(instr: str, dst: Any, data: Any) -> tuple[int, int, int, int]:
    """(partitions, elements per partition) of ``data``, then of ``dst``: both on-chip tensors
    on the same partitions."""
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    access.check_compute_partitions(instr, dst, data)
    _, p, per = ops.partitions(data)
    _, p_dst, per_dst = ops.partitions(dst)
    return p, per, p_dst, per_dst


@quiet_fp
def bn_stats(dst: Any, data: Any, name: str | None = None) -> None:
    """``dst`` (P, 6): count, mean, variance*count of the even- then of the odd-indexed
    elements of each partition of ``data`` (P, <= 512 elements)."""
    instr = "bn_stats"
    p, per, p_dst, per_dst = _stats_operands(instr, dst, data)
    if per > _BN_STATS_FMAX:
        raise nki_error(instr, "free size", f"data has {per} elements per partition; at most "
                        f"{_BN_STATS_FMAX} (nl.tile_size.bn_stats_fmax)")
    if p_dst != p or per_dst != 6:
        raise nki_error(instr, "dst shape", f"dst must have {p} partitions x 6 elements, got "
                        f"{p_dst} x {per_dst}")
    x = ops.as_pf(access.read_f32(data, instr), p).astype(np.float64)
    stats = np.zeros((p, 6), dtype=np.float64)
    for k, half in enumerate((x[:, 0::2], x[:, 1::2])):
        n = half.shape[1]
        mean = half.mean(axis=1) if n else np.zeros(p)
        stats[:, 3 * k] = n
        stats[:, 3 * k + 1] = mean
        stats[:, 3 * k + 2] = ((half - mean[:, None]) ** 2).sum(axis=1) if n else 0.0
    ops.write_result(dst, stats.astype(np.float32), instr)
    ops.record("vector", "bn_stats", data.size)


@quiet_fp
def bn_aggr(dst: Any, data: Any, name: str | None = None) -> None:
    """``dst`` (P, 2) = (mean, variance) over the (count, mean, variance*count) triples of
    ``data`` (P, 3k)."""
    instr = "bn_aggr"
    p, per, p_dst, per_dst = _stats_operands(instr, dst, data)
    if per % 3 or per == 0:
        raise nki_error(instr, "data shape", f"data must have a multiple of 3 elements per "
                        f"partition (count, mean, variance*count triples), got {per}")
    if p_dst != p or per_dst != 2:
        raise nki_error(instr, "dst shape", f"dst must have {p} partitions x 2 elements, got "
                        f"{p_dst} x {per_dst}")
    triples = ops.as_pf(access.read_f32(data, instr), p).astype(np.float64).reshape(p, -1, 3)
    count, mean, m2 = triples[..., 0], triples[..., 1], triples[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    grand = (count * mean).sum(axis=1) / safe
    var = (m2 + count * (mean - grand[:, None]) ** 2).sum(axis=1) / safe
    ops.write_result(dst, np.stack([grand, var], axis=1).astype(np.float32), instr)
    ops.record("vector", "bn_aggr", data.size)


def _bound(instr: str, name: str, value: Any, p: int) -> Any:
    if ops.is_number(value):
        return np.float32(value)
    return ops.vector_operand(instr, name, value, p)


@quiet_fp
def range_select(dst: Any, on_true_tile: Any, comp_op0: Any, comp_op1: Any, bound0: Any,
                 bound1: Any, reduce_cmd: Any = None, reduce_res: Any = None,
                 reduce_op: Any = maximum, range_start: float = 0.0,
                 on_false_value: float = 0.0, name: str | None = None) -> None:
    """``dst[p, j] = on_true_tile[p, j]`` where ``comp_op0(j + range_start, bound0[p])`` and
    ``comp_op1(j + range_start, bound1[p])``, else ``on_false_value``; optional running max."""
    from nkilib_msda.simulator.context import current

    instr = "range_select"
    if current().target.name == "trn1":
        raise nki_error(instr, "target", "range_select needs NeuronCore-v3 or newer")
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "on_true_tile", on_true_tile)
    access.check_same_shape_per_partition(instr, dst, on_true_tile)
    access.check_compute_partitions(instr, dst, on_true_tile,
                                    *ops.tensor_operands(bound0, bound1, reduce_res))
    ops.check_psum_inputs(instr, on_true_tile=on_true_tile, bound0=bound0, bound1=bound1)
    op0, op1 = resolve_alu(comp_op0, instr), resolve_alu(comp_op1, instr)
    for arg, op in (("comp_op0", op0), ("comp_op1", op1)):
        if not op.is_compare:
            raise nki_error(instr, "comparison op", f"{arg} must be a comparison op, got {op!r}")
    if resolve_alu(reduce_op, instr) is not maximum:
        raise nki_error(instr, "reduce op", f"reduce_op must be nl.maximum, got {reduce_op!r}")
    _, p, per = ops.partitions(on_true_tile)
    index = (np.arange(per, dtype=np.float32) + np.float32(range_start))[None, :]
    keep = (op0.apply(index, _bound(instr, "bound0", bound0, p)) != 0) & \
           (op1.apply(index, _bound(instr, "bound1", bound1, p)) != 0)
    values = ops.as_pf(access.read_f32(on_true_tile, instr), p)
    result = np.where(keep, values, np.float32(on_false_value)).astype(np.float32)
    ops.write_result(dst, result, instr)
    cmd_enum = as_enum(reduce_cmd if reduce_cmd is not None else _reduce_cmd_enum.idle,
                       _reduce_cmd_enum, "reduce_cmd", instr)
    cmd = cmd_enum.name
    if cmd not in ("idle", "reset", "reduce", "reset_reduce"):
        raise nki_error(instr, "reduce_cmd", f"reduce_cmd must be idle/reset/reduce/"
                        f"reset_reduce, got {cmd_enum!r}")
    ops.vector_max_reduce(instr, cmd, result, reduce_res)
    ops.record("vector", "range_select", dst.size)
