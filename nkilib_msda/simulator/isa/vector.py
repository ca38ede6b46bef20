"""Vector-engine instructions (and their GpSimd / ScalarE variants), docs/emulator.md

Engine auto-selection (``engine=nisa.engine.unknown``) is deterministic:
- ``tensor_tensor``: ``nl.power`` -> GpSimd; an arithmetic op whose inputs and output are
  all int32/uint32 and none in PSUM -> GpSimd (exact 64-bit integer math, result saturated
  to ``dst.dtype``); everything else -> Vector (fp32 math; integers exact below 2^24).
- ``tensor_scalar``: ``nl.rsqrt`` -> GpSimd (the only op GpSimd takes; Vector has no rsqrt,
  ScalarE uses ``activation``); everything else -> Vector.
- ``tensor_copy`` and ``memset``: Vector.
An explicit ``engine=`` is honoured after its rules are checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator.alu import (BITVEC, NkiOp, power,
                                       resolve_alu, rsqrt)
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.dtypes import (bool_, quiet_fp)
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops

__all__ = ["tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "tensor_copy", "memset",
           "reciprocal"]

# Ops the GpSimd integer path evaluates exactly in int64 (others fall back to fp32).
_EXACT_INT_OPS = {"add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal",
                  "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
                  "logical_xor"}


def _check_alu_target(instruction: str, op: NkiOp) -> None:
    if op.trn3_only and not current().target.is_trn3:
        raise nki_error(instruction, "trn3-only op",
                        f"op={op!r} exists only on trn3 (target is {current().target.name})")


def _require_binary(instruction: str, op: NkiOp, arg: str) -> None:
    if op.arity != 2:
        raise nki_error(instruction, "binary op required",
                        f"{arg}={op!r} is unary; this instruction needs a binary ALU op")


def _apply_step(op: NkiOp, data: np.ndarray, operand: Any, reverse: bool) -> np.ndarray:
    """``data op operand`` (``operand op data`` with ``reverse``); unary ops ignore operand."""
    if op.arity == 1:
        return op.apply(data)
    return op.apply(operand, data) if reverse else op.apply(data, operand)


def _check_unary_operand(instruction: str, op: NkiOp, operand: Any, arg: str) -> None:
    if op.arity == 1 and operand is not None and not (ops.is_number(operand) and operand == 0):
        raise nki_error(instruction, "unary operand",
                        f"{arg} must be None or 0 for the unary op {op!r}, got {operand!r}")


# ------------------------------------------------------------------------------------------
@quiet_fp
def tensor_tensor(dst: Any, data1: Any, data2: Any, op: Any, engine: Any = None,
                  name: str | None = None) -> None:
    """``dst = data1 op data2`` element-wise; equal partitions and elements per partition."""
    instr = "tensor_tensor"
    op = resolve_alu(op, instr)
    _require_binary(instr, op, "op")
    _check_alu_target(instr, op)
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data1", data1)
    ops.require_tensor(instr, "data2", data2)
    ops.check_not_both_psum(instr, data1, data2, "data1 and data2")
    access.check_same_shape_per_partition(instr, dst, data1, data2)
    access.check_compute_partitions(instr, dst, data1, data2)

    eng = ops.engine_name(instr, engine)
    ops.check_engine(instr, eng, {"unknown", "vector", "gpsimd"})
    any_psum = any(t.buffer == "psum" for t in (dst, data1, data2))
    all_int32 = all(ops.is_int32_family(t) for t in (dst, data1, data2))
    if op is power:
        if eng == "vector":
            raise nki_error(instr, "power on GpSimd",
                            "nl.power runs on the GpSimd engine only, got engine=vector")
        eng = "gpsimd"
    elif eng == "unknown":
        eng = "gpsimd" if (op.alu_kind != BITVEC and all_int32 and not any_psum) else "vector"
    if eng == "gpsimd" and op.alu_kind == BITVEC:
        raise nki_error(instr, "engine", f"bitvec op {op!r} runs on the Vector engine, not GpSimd")
    ops.check_no_psum_on_gpsimd(instr, eng, dst, data1, data2)

    _, p, _ = ops.partitions(dst)
    if op.alu_kind == BITVEC:
        ops.require_int_dtypes(instr, "bitvec ops", dst, data1, data2)
        a = ops.as_pf(ops.read_bits(data1, instr), p)
        b = ops.as_pf(ops.read_bits(data2, instr), p)
        ops.write_bits(dst, op.apply(a, b), instr)
    elif eng == "gpsimd" and all_int32 and op.name in _EXACT_INT_OPS:
        a = ops.as_pf(access.read(data1, instr), p).astype(np.int64)
        b = ops.as_pf(access.read(data2, instr), p).astype(np.int64)
        with np.errstate(all="ignore"):
            result = op._alu_fn(a, b)  # exact integer math, saturated by the write cast
        ops.write_result(dst, np.asarray(result), instr)
    else:
        a = ops.as_pf(access.read_f32(data1, instr), p)
        b = ops.as_pf(access.read_f32(data2, instr), p)
        ops.write_result(dst, op.apply(a, b), instr)
    ops.record(eng, "tensor_tensor", dst.size)


# ------------------------------------------------------------------------------------------
_SCALAR_ENGINE_TRN2_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


@quiet_fp
def tensor_scalar(dst: Any, data: Any, op0: Any, operand0: Any, reverse0: bool = False,
                  op1: Any = None, operand1: Any = None, reverse1: bool = False,
                  engine: Any = None, name: str | None = None) -> None:
    """``dst = (data op0 operand0) op1 operand1``; operands are immediates or (P,1) tiles."""
    instr = "tensor_scalar"
    op0 = resolve_alu(op0, instr)
    _check_alu_target(instr, op0)
    if op1 is None:
        if operand1 is not None or reverse1:
            raise nki_error(instr, "unused op1",
                            "operand1/reverse1 must be left at their defaults when op1 is None")
    else:
        op1 = resolve_alu(op1, instr)
        _check_alu_target(instr, op1)
        if op1.alu_kind != op0.alu_kind:
            raise nki_error(instr, "mixed op kinds",
                            f"op0={op0!r} is {op0.alu_kind} but op1={op1!r} is {op1.alu_kind}; "
                            "both must be arithmetic or both bitvec")
    _check_unary_operand(instr, op0, operand0, "operand0")
    if op1 is not None:
        _check_unary_operand(instr, op1, operand1, "operand1")
        if op1.arity == 2 and operand1 is None:
            raise nki_error(instr, "missing operand1", f"op1={op1!r} needs operand1")
    if op0.arity == 2 and operand0 is None:
        raise nki_error(instr, "missing operand0", f"op0={op0!r} needs operand0")

    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    vector_tiles = ops.tensor_operands(operand0 if op0.arity == 2 else None,
                                       operand1 if (op1 is not None and op1.arity == 2) else None)
    access.check_same_shape_per_partition(instr, dst, data)
    access.check_compute_partitions(instr, dst, data, *vector_tiles)

    bitvec = op0.alu_kind == BITVEC
    eng = ops.engine_name(instr, engine)
    ops.check_engine(instr, eng, {"unknown", "vector", "scalar", "gpsimd"})
    uses_rsqrt = op0 is rsqrt or op1 is rsqrt
    if eng == "unknown":
        eng = "gpsimd" if uses_rsqrt else "vector"
    if bitvec and eng != "vector":
        raise nki_error(instr, "engine", f"bitvec ops run on the Vector engine only, got {eng}")
    if eng == "gpsimd" and not (op0 is rsqrt and op1 is None):
        raise nki_error(instr, "engine",
                        "GpSimd tensor_scalar supports only op0=nl.rsqrt (op1=None)")
    if eng == "vector" and uses_rsqrt:
        raise nki_error(instr, "engine",
                        "nl.rsqrt is not a Vector ALU op: use engine=gpsimd (tensor_scalar) or "
                        "nisa.activation(op=nl.rsqrt) on the Scalar engine")
    if eng == "scalar" and not current().target.is_trn3:
        pair = (op0.name, None if op1 is None else op1.name)
        if pair not in _SCALAR_ENGINE_TRN2_PAIRS or reverse0 or reverse1:
            raise nki_error(instr, "ScalarE op pair",
                            f"(op0, op1)={pair} (reverse0={reverse0}, reverse1={reverse1}) on "
                            f"{current().target.name}: the Scalar engine supports only "
                            "(multiply, add), (multiply, None), (add, None) without reverse")
    ops.check_no_psum_on_gpsimd(instr, eng, dst, data, *vector_tiles)
    if eng == "vector":
        ops.check_psum_inputs(instr, data=data, operand0=operand0, operand1=operand1)

    _, p, _ = ops.partitions(data)
    if bitvec:
        ops.require_int_dtypes(instr, "bitvec ops", dst, data)
    # Bitvec ops work on the integer bits; the others on fp32 values and fp32-only operands.
    kind = {"bits": bitvec, "fp32_only": not bitvec}
    s0 = ops.vector_operand(instr, "operand0", operand0, p, **kind) if op0.arity == 2 else None
    s1 = (ops.vector_operand(instr, "operand1", operand1, p, **kind)
          if op1 is not None and op1.arity == 2 else None)
    x = ops.as_pf(ops.read_bits(data, instr) if bitvec else access.read_f32(data, instr), p)
    x = _apply_step(op0, x, s0, reverse0)
    if op1 is not None:
        x = _apply_step(op1, x, s1, reverse1)
    if bitvec:
        ops.write_bits(dst, x, instr)
    else:
        ops.write_result(dst, x, instr)
    ops.record(eng, "tensor_scalar", data.size)


# ------------------------------------------------------------------------------------------
@quiet_fp
def scalar_tensor_tensor(dst: Any, data: Any, op0: Any, operand0: Any, op1: Any, operand1: Any,
                         reverse0: bool = False, reverse1: bool = False,
                         name: str | None = None) -> None:
    """Vector ``dst = (data op0 operand0) op1 operand1``; operand0 immediate or (P,1),
    operand1 a tile like ``data``; arithmetic ops only."""
    instr = "scalar_tensor_tensor"
    op0 = resolve_alu(op0, instr)
    op1 = resolve_alu(op1, instr)
    for arg, op in (("op0", op0), ("op1", op1)):
        _check_alu_target(instr, op)
        if op.alu_kind == BITVEC:
            raise nki_error(instr, "arithmetic ops only",
                            f"{arg}={op!r} is a bitvec op; scalar_tensor_tensor takes arithmetic ops")
    _require_binary(instr, op1, "op1")
    _check_unary_operand(instr, op0, operand0, "operand0")
    if op0.arity == 2 and operand0 is None:
        raise nki_error(instr, "missing operand0", f"op0={op0!r} needs operand0")
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    ops.require_tensor(instr, "operand1", operand1)
    ops.check_not_both_psum(instr, data, operand1, "data and operand1")
    ops.check_psum_inputs(instr, data=data, operand0=operand0, operand1=operand1)
    vector_tiles = ops.tensor_operands(operand0 if op0.arity == 2 else None)
    access.check_same_shape_per_partition(instr, dst, data, operand1)
    access.check_compute_partitions(instr, dst, data, operand1, *vector_tiles)

    _, p, _ = ops.partitions(data)
    s0 = ops.vector_operand(instr, "operand0", operand0, p) if op0.arity == 2 else None
    x = ops.as_pf(access.read_f32(data, instr), p)
    t = ops.as_pf(access.read_f32(operand1, instr), p)
    x = _apply_step(op0, x, s0, reverse0)
    x = op1.apply(t, x) if reverse1 else op1.apply(x, t)
    ops.write_result(dst, x, instr)
    ops.record("vector", "scalar_tensor_tensor", data.size)


# ------------------------------------------------------------------------------------------
@quiet_fp
def tensor_copy(dst: Any, src: Any, engine: Any = None, name: str | None = None) -> None:
    """``dst = src`` on-chip. Vector/GpSimd copy bits when dtypes match, else cast via fp32
    (float -> int: round-to-nearest-even, saturating). ScalarE always goes through fp32."""
    instr = "tensor_copy"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "src", src)
    access.check_same_shape_per_partition(instr, dst, src)
    access.check_compute_partitions(instr, dst, src)
    eng = ops.engine_name(instr, engine)
    ops.check_engine(instr, eng, {"unknown", "vector", "scalar", "gpsimd"})
    if eng == "unknown":
        eng = "vector"
    if eng == "scalar" and current().target.name == "trn1":
        raise nki_error(instr, "engine", "no Scalar-engine tensor_copy on trn1 (NeuronCore-v2); "
                                         "use nisa.activation(op=nl.copy)")
    ops.check_no_psum_on_gpsimd(instr, eng, dst, src)
    _, p, _ = ops.partitions(src)
    if eng != "scalar" and dst.dtype == src.dtype:
        values = ops.as_pf(access.read(src, instr), p)
    else:
        values = ops.as_pf(access.read_f32(src, instr), p)
    ops.write_result(dst, values, instr)
    ops.record(eng, "tensor_copy", src.size)


# ------------------------------------------------------------------------------------------
@quiet_fp
def memset(dst: Any, value: Any, engine: Any = None, name: str | None = None) -> None:
    """Fill ``dst`` with the immediate ``value``; an int tile needs an int literal."""
    instr = "memset"
    ops.require_tensor(instr, "dst", dst)
    access.check_compute_partitions(instr, dst)
    eng = ops.engine_name(instr, engine)
    ops.check_engine(instr, eng, {"unknown", "vector", "gpsimd"})
    if eng == "unknown":
        eng = "vector"
    ops.check_no_psum_on_gpsimd(instr, eng, dst)
    if not ops.is_number(value):
        raise nki_error(instr, "value type",
                        f"value must be a compile-time number, got {type(value).__name__}")
    if dst.dtype.is_int:
        if isinstance(value, (float, np.floating)):
            raise nki_error(instr, "value type",
                            f"value={value!r} is a float but dst is {dst.dtype}: integer tiles "
                            "take an int literal (enforced since NKI 0.3)")
        v = int(value)
        info = np.iinfo(dst.dtype.np) if dst.dtype != bool_ else None
        lo, hi = (0, 1) if info is None else (int(info.min), int(info.max))
        if not lo <= v <= hi:
            raise nki_error(instr, "value range",
                            f"value={v} does not fit {dst.dtype} [{lo}, {hi}]")
        fill = np.full(dst.shape, v, dtype=np.int64)
    else:
        fill = np.full(dst.shape, float(value), dtype=np.float64)
    ops.write_result(dst, fill, instr)
    ops.record(eng, "memset", dst.size)


# ------------------------------------------------------------------------------------------
@quiet_fp
def reciprocal(dst: Any, data: Any, name: str | None = None) -> None:
    """Vector ``dst = 1 / data`` in fp32 (exact division, unlike activation(nl.reciprocal))."""
    instr = "reciprocal"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    access.check_same_shape_per_partition(instr, dst, data)
    access.check_compute_partitions(instr, dst, data)
    _, p, _ = ops.partitions(data)
    with np.errstate(all="ignore"):
        values = np.float32(1.0) / ops.as_pf(access.read_f32(data, instr), p)
    ops.write_result(dst, values, instr)
    ops.record("vector", "reciprocal", data.size)
