"""GpSimd-engine instructions: ``iota``, ``affine_select``, ``nc_n_gather`` (SBUF only).

Affine values (``iota``, ``affine_select``) are
``offset + channel * channel_multiplier + sum_k step_k * i_k`` in 32-bit integer arithmetic
(wrapping on overflow, like the hardware's int32 ALU), where ``channel`` counts the
partitions of ``dst`` from 0 and ``pattern = [[step, num], ...]`` (outermost first, at most
4 pairs) enumerates the elements of each partition in row-major order. A non-zero
``channel_multiplier`` needs ``dst`` to start at partition 0, where "from 0" is unambiguous
(else NkiError "ambiguous partition index").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator.alu import NkiOp, equal
from nkilib_msda.simulator.dtypes import quiet_fp, uint32
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops

__all__ = ["iota", "affine_select", "nc_n_gather"]

_MAX_PATTERN_PAIRS = 4


def _int_arg(instr: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise nki_error(instr, f"{name} type", f"{name} must be an int, got {type(value).__name__} "
                                                f"{value!r}")
    return int(value)


def _check_channel_origin(instr: str, dst: Any, channel_multiplier: Any) -> None:
    """The docs do not say whether ``p`` counts from partition 0 of SBUF or from the first
    partition of ``dst``; both agree when ``dst`` starts at partition 0, so a non-zero
    ``channel_multiplier`` on a view starting elsewhere is rejected (conservative)."""
    start, _, _ = ops.partitions(dst)
    if start != 0 and channel_multiplier != 0:
        raise nki_error(instr, "ambiguous partition index",
                        f"channel_multiplier={channel_multiplier} on a dst starting at partition "
                        f"{start}: whether p counts from the tile or from SBUF partition 0 is "
                        "undocumented; start the dst at partition 0 or fold the start into offset")


def _affine_values(instr: str, pattern: Any, offset: Any, channel_multiplier: Any,
                   num_partitions: int, elements_per_partition: int) -> np.ndarray:
    """(P, F) int64 array of the wrapped-int32 affine values."""
    if not isinstance(pattern, (list, tuple)) or not pattern or len(pattern) > _MAX_PATTERN_PAIRS:
        raise nki_error(instr, "pattern",
                        f"pattern must be a list of 1..{_MAX_PATTERN_PAIRS} [step, num] pairs, "
                        f"got {pattern!r}")
    steps, nums = [], []
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise nki_error(instr, "pattern", f"each pattern entry must be [step, num], got {pair!r}")
        steps.append(_int_arg(instr, "pattern step", pair[0]))
        num = _int_arg(instr, "pattern num", pair[1])
        if num < 1:
            raise nki_error(instr, "pattern", f"pattern counts must be >= 1, got {num}")
        nums.append(num)
    if int(np.prod(nums)) != elements_per_partition:
        raise nki_error(instr, "pattern size",
                        f"pattern {pattern} covers {int(np.prod(nums))} elements but dst has "
                        f"{elements_per_partition} elements per partition")
    offset = _int_arg(instr, "offset", offset)
    channel_multiplier = _int_arg(instr, "channel_multiplier", channel_multiplier)
    free: np.ndarray = np.zeros((), dtype=np.int64)
    for k, (step, num) in enumerate(zip(steps, nums)):
        axis = np.arange(num, dtype=np.int64) * step
        free = free[..., None] + axis.reshape((1,) * k + (num,))
    free = free.reshape(1, -1)
    channel = np.arange(num_partitions, dtype=np.int64).reshape(-1, 1) * channel_multiplier
    values = offset + channel + free
    return (values + 2 ** 31) % 2 ** 32 - 2 ** 31  # int32 wrap-around


@quiet_fp
def iota(dst: Any, pattern: Any, offset: Any = 0, channel_multiplier: Any = 0,
         name: str | None = None) -> None:
    """GpSimd: ``dst[p, i...] = offset + p * channel_multiplier + sum(step * i)`` (int32,
    then cast to ``dst.dtype``); ``dst`` in SBUF."""
    instr = "iota"
    ops.require_tensor(instr, "dst", dst, ops.SBUF_ONLY)
    access.check_compute_partitions(instr, dst)
    _, p, epp = ops.partitions(dst)
    values = _affine_values(instr, pattern, offset, channel_multiplier, p, epp)
    _check_channel_origin(instr, dst, channel_multiplier)
    ops.write_result(dst, values, instr)
    ops.record("gpsimd", "iota", dst.size)


@quiet_fp
def affine_select(dst: Any, pattern: Any, channel_multiplier: Any, on_true_tile: Any,
                  on_false_value: Any, cmp_op: Any = equal, offset: Any = 0,
                  name: str | None = None) -> None:
    """GpSimd: ``dst = on_true_tile`` where ``cmp_op(affine_value, 0)``, else the fp32
    immediate ``on_false_value``. Selected elements are copied bit-exactly when the dtypes
    match, else through fp32."""
    instr = "affine_select"
    if not isinstance(cmp_op, NkiOp) or not cmp_op.is_compare or cmp_op.arity != 2:
        raise nki_error(instr, "cmp_op", f"cmp_op must be an nl comparison (nl.equal, "
                                         f"nl.greater, ...), got {cmp_op!r}")
    ops.require_tensor(instr, "dst", dst, ops.SBUF_ONLY)
    ops.require_tensor(instr, "on_true_tile", on_true_tile, ops.SBUF_ONLY)
    if not ops.is_number(on_false_value) or isinstance(on_false_value, bool):
        raise nki_error(instr, "on_false_value",
                        f"on_false_value must be an fp32 immediate, got {on_false_value!r}")
    access.check_same_shape_per_partition(instr, dst, on_true_tile)
    access.check_compute_partitions(instr, dst, on_true_tile)
    _, p, epp = ops.partitions(dst)
    affine = _affine_values(instr, pattern, offset, channel_multiplier, p, epp)
    _check_channel_origin(instr, dst, channel_multiplier)
    keep = cmp_op.apply(affine.astype(np.float64), 0.0) != 0
    if on_true_tile.dtype == dst.dtype:
        true_values = ops.as_pf(access.read(on_true_tile, instr), p)
    else:
        true_values = ops.as_pf(access.read_f32(on_true_tile, instr), p)
    false_values = np.full((p, epp), np.float32(on_false_value), dtype=np.float32)
    ops.write_masked(dst, true_values, keep, instr)
    ops.write_masked(dst, false_values, ~keep, instr)
    ops.record("gpsimd", "affine_select", dst.size)


@quiet_fp
def nc_n_gather(dst: Any, data: Any, indices: Any, name: str | None = None) -> None:
    """GpSimd per-partition gather: ``dst[p, j] = data_flat[p, indices_flat[p, j]]``
    (uint32 indices into the flattened free dims; dtype preserved bit-exactly)."""
    instr = "nc_n_gather"
    ops.require_tensor(instr, "dst", dst, ops.SBUF_ONLY)
    ops.require_tensor(instr, "data", data, ops.SBUF_ONLY)
    ops.require_tensor(instr, "indices", indices, ops.SBUF_ONLY)
    if indices.dtype != uint32:
        raise nki_error(instr, "indices dtype", f"indices must be uint32, got {indices.dtype}")
    if dst.dtype != data.dtype:
        raise nki_error(instr, "dtype", f"dst ({dst.dtype}) must have data's dtype ({data.dtype})")
    access.check_same_shape_per_partition(instr, dst, indices)
    access.check_compute_partitions(instr, dst, data, indices)
    _, p, _ = ops.partitions(dst)
    _, dp, depp = ops.partitions(data)
    if dp != p:
        raise nki_error(instr, "operand agreement",
                        f"data has {dp} partitions, dst/indices have {p}")
    idx = ops.as_pf(access.read(indices, instr), p).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= depp):
        raise nki_error(instr, "index out of range",
                        f"indices must lie in [0, {depp}) (elements per partition of data), got "
                        f"[{int(idx.min())}, {int(idx.max())}]")
    values = np.take_along_axis(ops.as_pf(access.read(data, instr), p), idx, axis=1)
    ops.write_result(dst, values, instr)
    ops.record("gpsimd", "nc_n_gather", dst.size)
