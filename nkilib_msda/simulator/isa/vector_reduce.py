"""Vector-engine reductions, scans and predicated copies / selects (``tensor_reduce``,
``tensor_scalar_reduce``, ``tensor_tensor_scan``, ``tensor_copy_predicated``, ``select_reduce``);
the elementwise instructions and the engine-selection rules are in isa/vector.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator.alu import (BITVEC, NkiOp, add, logical_and, logical_or,
                                       logical_xor, maximum, minimum, multiply, resolve_alu, subtract)
from nkilib_msda.simulator.dtypes import (bool_, int8, int16, quiet_fp, tfloat32, uint8, uint16,
                                          uint32)
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops
from nkilib_msda.simulator.isa.enums import as_enum, reduce_cmd as _reduce_cmd_enum

from nkilib_msda.simulator.isa.vector import (_apply_step, _check_alu_target, _check_unary_operand,
                                              _require_binary)

__all__ = ["tensor_reduce", "tensor_copy_predicated", "select_reduce", "tensor_tensor_scan",
           "tensor_scalar_reduce"]


# ------------------------------------------------------------------------------------------
def _reduce_axes(instr: str, data: Any, axis: Any) -> tuple[int, ...]:
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        axes: tuple[int, ...] = (int(axis),)
    elif isinstance(axis, (tuple, list)) and axis and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axis):
        axes = tuple(int(a) for a in axis)
    else:
        raise nki_error(instr, "reduce axis", f"axis must be an int or a tuple/list of ints, got {axis!r}")
    nd = data.ndim
    norm = tuple(sorted(a + nd if a < 0 else a for a in axes))
    if norm != tuple(range(nd - len(norm), nd)) or 0 in norm or len(set(norm)) != len(norm):
        raise nki_error(instr, "reduce axis",
                        f"axis={axis!r} on a {nd}-D tile: must be the trailing contiguous free "
                        f"dims ending at dim {nd - 1}, never the partition dim 0")
    return norm


def _fold(op: NkiOp, x: np.ndarray) -> np.ndarray:
    """Reduce the last axis of a (P, R, K) fp32 array with an arithmetic op -> (P, R)."""
    with np.errstate(all="ignore"):
        if op is add:
            return x.astype(np.float64).sum(axis=-1)
        if op is subtract:  # left fold: x0 - x1 - x2 - ...
            return x[..., 0].astype(np.float64) - x[..., 1:].astype(np.float64).sum(axis=-1)
        if op is multiply:
            return x.astype(np.float64).prod(axis=-1)
        if op is maximum:
            return x.max(axis=-1)
        if op is minimum:
            return x.min(axis=-1)
        nz = x != 0
        if op is logical_and:
            return nz.all(axis=-1).astype(np.float32)
        if op is logical_or:
            return nz.any(axis=-1).astype(np.float32)
        if op is logical_xor:
            return (nz.sum(axis=-1) % 2).astype(np.float32)
    raise AssertionError(op)


@quiet_fp
def tensor_reduce(dst: Any, op: Any, data: Any, axis: Any, negate: bool = False,
                  keepdims: bool = False, name: str | None = None) -> None:
    """Vector reduction of the trailing free ``axis`` dims of ``data`` with ``op``.

    ``nl.subtract`` folds left (``x0 - x1 - ...``); sums and products run in float64 and are
    rounded once (hardware accumulates in fp32, so it can differ in the last bits).
    """
    instr = "tensor_reduce"
    op = resolve_alu(op, instr)
    if not op.reducible:
        raise nki_error(instr, "reduce op",
                        f"op={op!r} is not a legal reduction (add, subtract, multiply, maximum, "
                        "minimum, logical_and/or/xor, bitwise_and/or/xor)")
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    axes = _reduce_axes(instr, data, axis)
    if negate and op.alu_kind == BITVEC:
        raise nki_error(instr, "negate", "negate=True needs an arithmetic op")
    _, p, _ = ops.partitions(data)
    _, dp, depp = ops.partitions(dst)
    kept = int(np.prod(data.shape[1:axes[0]], dtype=np.int64))
    if dp != p or depp != kept:
        raise nki_error(instr, "dst shape",
                        f"reducing axes {axes} of {data.shape} leaves {p} partitions x {kept} "
                        f"elements, but dst {dst.shape} has {dp} x {depp}")
    access.check_compute_partitions(instr, dst, data)
    if op.alu_kind == BITVEC:
        ops.require_int_dtypes(instr, "bitvec reductions", dst, data)
        bits = ops.read_bits(data, instr).reshape(p, kept, -1)
        ufunc = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                 "bitwise_xor": np.bitwise_xor}[op.name]
        ops.write_bits(dst, ufunc.reduce(bits, axis=-1), instr)
    else:
        x = access.read_f32(data, instr).reshape(p, kept, -1)
        result = _fold(op, x)
        if negate:
            result = -result
        ops.write_result(dst, np.asarray(result, dtype=np.float64).astype(np.float32), instr)
    ops.record("vector", "tensor_reduce", data.size)


# ------------------------------------------------------------------------------------------
_PREDICATE_DTYPES_COPY = (uint8, uint16, uint32, bool_)


_PREDICATE_DTYPES_SELECT = (int8, uint8, int16, uint16, bool_)


def _predicate(instr: str, predicate: Any, allowed: Sequence[Any], p: int,
               reverse: bool) -> np.ndarray:
    if predicate.dtype not in allowed:
        raise nki_error(instr, "predicate dtype",
                        f"predicate must be one of {[str(d) for d in allowed]}, got {predicate.dtype}")
    mask = ops.as_pf(access.read(predicate, instr), p) != 0
    return ~mask if reverse else mask


@quiet_fp
def tensor_copy_predicated(dst: Any, src: Any, predicate: Any, reverse_pred: bool = False,
                           name: str | None = None) -> None:
    """Vector: ``dst = src`` where ``predicate != 0`` (``== 0`` with reverse_pred); other
    elements of ``dst`` are left unchanged. ``src`` may be an immediate."""
    instr = "tensor_copy_predicated"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "predicate", predicate)
    tiles = [dst, predicate]
    if not ops.is_number(src):
        ops.require_tensor(instr, "src", src)
        ops.check_not_both_psum(instr, src, predicate, "src and predicate")
        if src.dtype != dst.dtype:
            raise nki_error(instr, "dtype", f"src ({src.dtype}) and dst ({dst.dtype}) must match")
        tiles.append(src)
    access.check_same_shape_per_partition(instr, *tiles)
    access.check_compute_partitions(instr, *tiles)
    _, p, _ = ops.partitions(dst)
    mask = _predicate(instr, predicate, _PREDICATE_DTYPES_COPY, p, reverse_pred)
    if ops.is_number(src):
        values = np.full(mask.shape, src, dtype=np.float64)
    else:
        values = ops.as_pf(access.read(src, instr), p)
    ops.write_masked(dst, values, mask, instr)
    ops.record("vector", "tensor_copy_predicated", dst.size)


@quiet_fp
def select_reduce(dst: Any, predicate: Any, on_true: Any, on_false: Any, reduce_res: Any = None,
                  reduce_cmd: Any = None, reduce_op: Any = maximum, reverse_pred: bool = False,
                  name: str | None = None) -> None:
    """Vector ``dst = where(predicate, on_true, on_false)`` with an optional running max
    (``reduce_cmd`` reset_reduce / reduce) read out into ``reduce_res`` (P,1)."""
    instr = "select_reduce"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "predicate", predicate)
    ops.require_tensor(instr, "on_true", on_true)
    ops.check_not_both_psum(instr, on_true, predicate, "on_true and predicate")
    if on_true.dtype in (tfloat32,) or ops.is_int32_family(on_true):
        raise nki_error(instr, "on_true dtype", f"on_true cannot be {on_true.dtype}")
    if resolve_alu(reduce_op, instr) is not maximum:
        raise nki_error(instr, "reduce op", f"reduce_op must be nl.maximum, got {reduce_op!r}")
    ops.check_psum_inputs(instr, predicate=predicate, on_true=on_true, on_false=on_false)
    access.check_same_shape_per_partition(instr, dst, predicate, on_true)
    tiles = [dst, predicate, on_true] + ops.tensor_operands(on_false, reduce_res)
    access.check_compute_partitions(instr, *tiles)
    _, p, _ = ops.partitions(dst)
    if ops.is_number(on_false) and not isinstance(on_false, (float, np.floating)):
        on_false = float(on_false)
    false_values = ops.vector_operand(instr, "on_false", on_false, p,
                                      fp32_only=not ops.is_number(on_false))
    mask = _predicate(instr, predicate, _PREDICATE_DTYPES_SELECT, p, reverse_pred)
    result = np.where(mask, ops.as_pf(access.read_f32(on_true, instr), p), false_values)
    ops.write_result(dst, result.astype(np.float32), instr)
    reduce_cmd = None if reduce_cmd is None else as_enum(reduce_cmd, _reduce_cmd_enum, "reduce_cmd", instr)
    cmd = "idle" if reduce_cmd is None else getattr(reduce_cmd, "name", None)
    if isinstance(reduce_cmd, (int, str)) or cmd not in ("idle", "reset", "reduce", "reset_reduce"):
        raise nki_error(instr, "reduce_cmd",
                        f"reduce_cmd must be a nisa.reduce_cmd member (idle/reset/reduce/"
                        f"reset_reduce), got {reduce_cmd!r} (raw ints are rejected since NKI 0.3)")
    ops.vector_max_reduce(instr, cmd, result, reduce_res)
    ops.record("vector", "select_reduce", dst.size)


# ------------------------------------------------------------------------------------------
@quiet_fp
def tensor_tensor_scan(dst: Any, data0: Any, data1: Any, initial: Any, op0: Any, op1: Any,
                       reverse0: bool = False, reverse1: bool = False,
                       name: str | None = None) -> None:
    """Vector scan along the flattened free dim: ``r[i] = op1(op0(d0[i], r[i-1]), d1[i])``
    with ``r[-1] = initial`` (immediate or (P,1)); ``reverse*`` swap each op's operands."""
    instr = "tensor_tensor_scan"
    op0 = resolve_alu(op0, instr)
    op1 = resolve_alu(op1, instr)
    for arg, op in (("op0", op0), ("op1", op1)):
        _check_alu_target(instr, op)
        _require_binary(instr, op, arg)
        if op.alu_kind == BITVEC:
            raise nki_error(instr, "arithmetic ops only", f"{arg}={op!r} is a bitvec op")
    for arg, t in (("dst", dst), ("data0", data0), ("data1", data1)):
        ops.require_tensor(instr, arg, t)
    ops.check_not_both_psum(instr, data0, data1, "data0 and data1")
    ops.check_psum_inputs(instr, data0=data0, data1=data1, initial=initial)
    access.check_same_shape_per_partition(instr, dst, data0, data1)
    access.check_compute_partitions(instr, dst, data0, data1, *ops.tensor_operands(initial))
    _, p, _ = ops.partitions(data0)
    state = ops.vector_operand(instr, "initial", initial, p)
    state = np.broadcast_to(np.asarray(state, dtype=np.float32).reshape(-1), (p,)).copy()
    d0 = ops.as_pf(access.read_f32(data0, instr), p)
    d1 = ops.as_pf(access.read_f32(data1, instr), p)
    out = np.empty_like(d0)
    for i in range(d0.shape[1]):  # a scan is sequential along the free dim
        t = op0.apply(state, d0[:, i]) if reverse0 else op0.apply(d0[:, i], state)
        state = op1.apply(d1[:, i], t) if reverse1 else op1.apply(t, d1[:, i])
        out[:, i] = state
    ops.write_result(dst, out, instr)
    ops.record("vector", "tensor_tensor_scan", data0.size)


# ------------------------------------------------------------------------------------------
_REDUCE_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


@quiet_fp
def tensor_scalar_reduce(dst: Any, data: Any, op0: Any, operand0: Any, reduce_op: Any,
                         reduce_res: Any = None, reverse0: bool = False, reduce_cmd: Any = None,
                         reduce_init: Any = None, reduce_res_negate: bool = False,
                         name: str | None = None) -> None:
    """Vector ``dst = data op0 operand0`` plus a free-axis reduction of ``dst``'s fp32 values
    into the Vector accumulator registers (``reduce_cmd``: reset_reduce (default), reduce,
    load_reduce with ``reduce_init``), read out into ``reduce_res`` (P, 1).
    ``reduce_res_negate=True`` is not modelled (its semantics are not documented in detail)."""
    instr = "tensor_scalar_reduce"
    if reduce_res_negate:
        raise nki_error(instr, "not modelled",
                        "reduce_res_negate=True is not modelled by this emulator")
    op0 = resolve_alu(op0, instr)
    if op0.alu_kind == BITVEC:
        raise nki_error(instr, "arithmetic ops only", f"op0={op0!r} is a bitvec op")
    _check_alu_target(instr, op0)
    _check_unary_operand(instr, op0, operand0, "operand0")
    if reverse0:
        raise nki_error(instr, "reverse0", "reverse0=True is not supported by tensor_scalar_reduce")
    red = resolve_alu(reduce_op, instr)
    if red.name not in _REDUCE_IDENTITY:
        raise nki_error(instr, "reduce op",
                        f"reduce_op must be nl.add, nl.multiply, nl.max or nl.min, got {reduce_op!r}")
    reduce_cmd = None if reduce_cmd is None else as_enum(reduce_cmd, _reduce_cmd_enum, "reduce_cmd", instr)
    cmd = "reset_reduce" if reduce_cmd is None else getattr(reduce_cmd, "name", None)
    if isinstance(reduce_cmd, (int, str)) or cmd not in ("reset_reduce", "reduce", "load_reduce"):
        raise nki_error(instr, "reduce_cmd",
                        f"reduce_cmd must be nisa.reduce_cmd.reset_reduce/reduce/load_reduce, got {reduce_cmd!r}")
    if (reduce_init is not None) != (cmd == "load_reduce"):
        raise nki_error(instr, "reduce_init", "reduce_init is required with load_reduce and only then")
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    ops.check_psum_inputs(instr, data=data, operand0=operand0, reduce_init=reduce_init)
    access.check_same_shape_per_partition(instr, dst, data)
    tiles = ops.tensor_operands(operand0 if op0.arity == 2 else None, reduce_res, reduce_init)
    access.check_compute_partitions(instr, dst, data, *tiles)
    _, p, _ = ops.partitions(data)
    s0 = ops.vector_operand(instr, "operand0", operand0, p, fp32_only=True) if op0.arity == 2 else None
    x = _apply_step(op0, ops.as_pf(access.read_f32(data, instr), p), s0, False)
    ops.write_result(dst, x, instr)
    regs = ops.reduce_registers("vector")
    if cmd == "reset_reduce":
        regs.reset(p, _REDUCE_IDENTITY[red.name])
    elif cmd == "load_reduce":
        init = ops.vector_operand(instr, "reduce_init", reduce_init, p, fp32_only=True)
        regs.reset(p, np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)))
    regs.require_valid(instr, p, "reduce_cmd=reduce continues")
    folded = np.asarray(_fold(red, x.reshape(p, 1, -1))[:, 0], dtype=np.float32)
    regs.values[:p] = red.apply(regs.values[:p], folded)
    if reduce_res is not None:
        ops.require_tensor(instr, "reduce_res", reduce_res)
        _, rp, repp = ops.partitions(reduce_res)
        if rp != p or repp != 1:
            raise nki_error(instr, "reduce_res shape", f"reduce_res must be ({p}, 1), got {reduce_res.shape}")
        ops.write_result(reduce_res, regs.values[:p].reshape(p, 1), instr)
    ops.record("vector", "tensor_scalar_reduce", data.size)
