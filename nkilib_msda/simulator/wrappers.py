"""The ``nl`` tile functions lowered to instructions, and ``tile[...] = value``.

Layer: above the instructions and the ``nl`` namespace (language.py), below jit/simulate.
Importing this module (the emulator package does) installs:
- the ``nl.add(x, y)`` & co. tile functions behind the ALU operator objects of alu.py
  (:func:`alu.register_wrappers`); their lowering is described in alu.py's docstring;
- the handler of ``NkiTensor.__setitem__`` (:func:`assign`): on-chip to on-chip runs as a
  Vector tensor_copy, anything touching HBM as a direct dma_copy, a number as a memset.
"""

from __future__ import annotations

import builtins as _builtins
from typing import Any

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator import isa
from nkilib_msda.simulator import language as nl
from nkilib_msda.simulator import tensor as _tensor
from nkilib_msda.simulator.alu import (BITVEC, NkiOp, add, floor, maximum, minimum, multiply,
                                       negative, power, register_wrappers)
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.dtypes import to_nki_dtype
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa._operands import clear_matmul_flags
from nkilib_msda.simulator.tensor import NkiTensor

__all__ = ["assign"]


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, np.ndarray)


def _dtype(dtype: Any) -> Any:
    return to_nki_dtype(dtype)


def _promote(x: Any, y: Any):
    """Result dtype of two tiles: float beats int, then the wider type, then x's."""
    dx, dy = _dtype(x.dtype), _dtype(y.dtype)
    if dx.is_float != dy.is_float:
        return dx if dx.is_float else dy
    return dy if dy.itemsize > dx.itemsize else dx


def _new_tile(shape: tuple[int, ...], dtype: Any, buffer: str = "sbuf"):
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=getattr(nl, buffer))


def _require_tile(name: str, arg: str, x: Any) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "buffer") or _is_scalar(x):
        raise nki_error(f"nl.{name}", "operand type",
                        f"{arg} must be an on-chip tile (NkiTensor), got {type(x).__name__}")


def _binary_wrapper(op: NkiOp, x: Any, y: Any, dtype: Any = None) -> Any:
    """``nl.<op>(x, y, dtype=None)``: tile-tile (equal shapes) or tile-scalar; new SBUF tile."""
    x_scalar, y_scalar = _is_scalar(x), _is_scalar(y)
    if x_scalar and y_scalar:
        raise nki_error(f"nl.{op.name}", "operand type", "at least one operand must be a tile")
    if op is power and (x_scalar or y_scalar):
        raise nki_error("nl.power", "scalar exponent",
                        "nl.power with a scalar operand fails on hardware; "
                        "use two tiles (GpSimd tensor_tensor) or nl.multiply")
    if x_scalar or y_scalar:
        tile, scalar, reverse = (y, x, True) if x_scalar else (x, y, False)
        _require_tile(op.name, "x" if not x_scalar else "y", tile)
        default = _dtype(tile.dtype)
        out_dtype = _dtype(dtype) if dtype is not None else (
            _dtype("uint8") if op.is_compare else default)
        out = _new_tile(tile.shape, out_dtype)
        operand = scalar if op.alu_kind == BITVEC else float(scalar)
        isa.tensor_scalar(out, tile, op, operand, reverse0=reverse)
        return out
    _require_tile(op.name, "x", x)
    _require_tile(op.name, "y", y)
    if tuple(x.shape) != tuple(y.shape):
        raise nki_error(f"nl.{op.name}", "no broadcasting",
                        f"x.shape {tuple(x.shape)} != y.shape {tuple(y.shape)}; the nl.* "
                        "binary wrappers do not broadcast (use nisa.tensor_scalar or a "
                        ".broadcast() view)")
    out_dtype = _dtype(dtype) if dtype is not None else (
        _dtype("uint8") if op.is_compare else _promote(x, y))
    out = _new_tile(x.shape, out_dtype)
    isa.tensor_tensor(out, x, y, op)
    return out


def _unary_alu_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """Unary ALU wrappers (invert, logical_not, negative): one tensor_scalar instruction."""
    _require_tile(op.name, "x", x)
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    if op is negative:
        isa.tensor_scalar(out, x, multiply, -1.0)
    else:
        isa.tensor_scalar(out, x, op, None)
    return out


def _activation_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.exp(x, dtype=None)`` & co.: one ScalarE activation into a new SBUF tile."""
    _require_tile(op.name, "x", x)
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    isa.activation(out, op, x)
    return out


def _rounding_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.floor`` / ``nl.ceil``: exact on the fp32 value, then cast (see module doc)."""
    instruction = f"nl.{op.name}"
    _require_tile(op.name, "x", x)
    if x.buffer not in ("sbuf", "psum"):
        raise nki_error(instruction, "operand buffer",
                        f"x must be in SBUF or PSUM, got {x.buffer}")
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    access.check_compute_partitions(instruction, x, out)
    values = access.read_f32(x, instruction)
    rounded = np.floor(values) if op is floor else np.ceil(values)
    access.write(out, rounded.astype(np.float32), instruction)
    current().events.compute("vector", op.name, int(x.size))
    return out


def _copy_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.copy(x, dtype=None)``: ScalarE ``activation(copy)`` into a new SBUF tile."""
    return _activation_wrapper(op, x, dtype)


def _check_reduce_axis(name: str, x: Any, axis: Any) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = len(x.shape)
    norm = tuple(sorted(int(a) % nd if -nd <= int(a) < nd else int(a) for a in axes))
    if not norm or 0 in norm or norm != tuple(range(nd - len(norm), nd)):
        raise nki_error(f"nl.{name}", "reduce axis",
                        f"axis={axis!r} on a {nd}-D tile: must be the trailing contiguous free "
                        f"dims ending at {nd - 1}, never the partition dim 0")
    return norm


def _reduce_wrapper(op: NkiOp, x: Any, axis: Any, dtype: Any = None,
                    keepdims: bool = False) -> Any:
    """``nl.sum/max/min/mean(x, axis, dtype=None, keepdims=False)`` via tensor_reduce."""
    _require_tile(op.name, "x", x)
    axes = _check_reduce_axis(op.name, x, axis)
    if keepdims:
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
        shape = shape + (1,) * (2 - len(shape))  # on-chip tiles stay at least 2-D
    out_dtype = _dtype(dtype) if dtype is not None else _dtype(x.dtype)
    alu = {"sum": add, "mean": add, "max": maximum, "min": minimum}[op.name]
    if op.name != "mean":
        out = _new_tile(shape, out_dtype)
        isa.tensor_reduce(out, alu, x, axes, keepdims=keepdims)
        return out
    count = int(np.prod([x.shape[a] for a in axes]))
    total = _new_tile(shape, _dtype("float32"))
    isa.tensor_reduce(total, add, x, axes, keepdims=keepdims)
    out = _new_tile(shape, out_dtype)
    isa.tensor_scalar(out, total, multiply, 1.0 / count)
    return out


def _where_wrapper(op: NkiOp, condition: Any, x: Any, y: Any, dtype: Any = None) -> Any:
    """``nl.where(cond, x, y)``: ``x`` where ``cond != 0`` else ``y`` (tile or scalar)."""
    instruction = "nl.where"
    _require_tile("where", "condition", condition)
    _require_tile("where", "x", x)
    tiles = [condition, x] + ([] if _is_scalar(y) else [y])
    for name, t in zip(("condition", "x", "y"), tiles):
        if t.buffer not in ("sbuf", "psum"):
            raise nki_error(instruction, "operand buffer",
                            f"{name} must be in SBUF or PSUM, got {t.buffer}")
        if tuple(t.shape) != tuple(x.shape):
            raise nki_error(instruction, "no broadcasting",
                            f"{name}.shape {tuple(t.shape)} != x.shape {tuple(x.shape)}")
    if _builtins.sum(t.buffer == "psum" for t in tiles) > 1:
        raise nki_error(instruction, "two PSUM inputs",
                        "at most one Vector input may be in PSUM")
    out_dtype = _dtype(dtype) if dtype is not None else _dtype(x.dtype)
    out = _new_tile(x.shape, out_dtype)
    access.check_compute_partitions(instruction, *tiles, out)
    cond = access.read_f32(condition, instruction)
    xv = access.read_f32(x, instruction)
    yv = np.float32(y) if _is_scalar(y) else access.read_f32(y, instruction)
    access.write(out, np.where(cond != 0, xv, yv).astype(np.float32), instruction)
    current().events.compute("vector", "select", int(x.size))
    return out


def _transpose_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.transpose(x)``: ``nc_transpose`` of a 2-D tile into a new PSUM tile."""
    _require_tile("transpose", "x", x)
    if len(x.shape) != 2:
        raise nki_error("nl.transpose", "2-D tile", f"x must be 2-D, got shape {tuple(x.shape)}")
    out = _new_tile((x.shape[1], x.shape[0]), _dtype(x.dtype), "psum")
    isa.nc_transpose(out, x)
    if dtype is None or _dtype(dtype) == _dtype(x.dtype):
        return out
    cast = _new_tile(out.shape, _dtype(dtype))
    isa.tensor_copy(cast, out)
    return cast


def _matmul_wrapper(op: NkiOp, x: Any, y: Any, transpose_x: bool = False) -> Any:
    """``nl.matmul(x, y, transpose_x=True)``: ``x.T @ y`` into a new fp32 PSUM tile."""
    if not transpose_x:
        raise nki_error("nl.matmul", "transpose_x",
                        "nl.matmul(transpose_x=False) fails on hardware; pass x already "
                        "transposed ([K, M]) with transpose_x=True, or use nisa.nc_matmul")
    _require_tile("matmul", "x", x)
    _require_tile("matmul", "y", y)
    m = int(np.prod(x.shape[1:]))
    n_shape = tuple(y.shape[1:])
    out = _new_tile((m,) + n_shape, _dtype("float32"), "psum")
    isa.nc_matmul(out, x, y, accumulate=False)
    return out


def assign(dst: NkiTensor, value: Any, instruction: str) -> None:
    """``view[...] = tile``: copy with cast. On-chip to on-chip runs as a Vector
    tensor_copy (compute rules apply); anything touching HBM runs as a direct dma_copy."""
    ctx = current()
    if dst.buffer == "psum":  # a copy/memset into PSUM is not a matmul start (accumulate=True after it is UB)
        clear_matmul_flags(dst)
    if isinstance(value, NkiTensor):
        if dst.is_on_chip and value.is_on_chip:
            access.check_compute_partitions(instruction, dst, value)
            access.check_same_shape_per_partition(instruction, dst, value)
            src_vals = access.read(value, instruction)
            if src_vals.dtype != dst.dtype.np or dst.dtype != value.dtype:
                src_vals = src_vals.astype(np.float32)
            access.write(dst, src_vals.reshape(-1), instruction)
            ctx.events.compute("vector", "tensor_copy", dst.size)
            return
        isa.dma_copy(dst=dst, src=value)
        return
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        if dst.dtype.is_int and not float(value).is_integer():
            raise nki_error(instruction, "value type", f"float {value} assigned to {dst.dtype}")
        access.write(dst, np.full(dst.size, value), instruction)
        ctx.events.compute("vector" if dst.is_on_chip else "dma", "memset", dst.size)
        return
    raise nki_error(instruction, "value type",
                    f"can only assign an NKI tensor or a number, got {type(value).__name__}")


register_wrappers({
    "binary": _binary_wrapper, "unary_alu": _unary_alu_wrapper,
    "activation": _activation_wrapper, "rounding": _rounding_wrapper, "copy": _copy_wrapper,
    "reduce": _reduce_wrapper, "where": _where_wrapper, "transpose": _transpose_wrapper,
    "matmul": _matmul_wrapper,
})
_tensor.set_assign_handler(assign)
