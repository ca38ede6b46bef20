"""Scalar-engine (ACT) instructions: ``activation`` and ``activation_reduce``.

``activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
reduce_cmd=idle)`` computes ``op(data * scale + bias)`` in fp32 (the activation function in
float64, rounded to fp32). Outside an activation function's documented valid input range the
hardware returns garbage; the emulator returns the exact value and warns once per function
(:class:`NkiWarning`).

The free-axis ``nl.add`` reduction accumulates into per-partition registers kept per
program (``reduce_cmd``: reset / reduce / reset_reduce / idle, as in the ISA pseudo-code).
Reading never-reset registers into ``reduce_res`` raises NkiError (undefined contents).
ScalarE ``tensor_scalar`` lives in vector.py with the other tensor_scalar engines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator import access
from nkilib_msda.simulator.alu import NkiOp, add, warn_out_of_range
from nkilib_msda.simulator.dtypes import quiet_fp, tfloat32
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops
from nkilib_msda.simulator.isa.enums import as_enum, reduce_cmd as _reduce_cmd

__all__ = ["activation", "activation_reduce", "activate2", "exponential"]


def _activation_op(instr: str, op: Any) -> NkiOp:
    if not isinstance(op, NkiOp) or op.activation_fn is None:
        raise nki_error(instr, "activation function",
                        f"op={op!r} is not a Scalar Engine activation function (e.g. nl.copy, "
                        "nl.exp, nl.relu, nl.rsqrt)")
    return op


@quiet_fp
def activation(dst: Any, op: Any, data: Any, bias: Any = None, scale: Any = 1.0,
               reduce_op: Any = None, reduce_res: Any = None, reduce_cmd: Any = None,
               name: str | None = None) -> None:
    """ScalarE ``dst = op(data * scale + bias)``; ``scale`` an fp32 immediate or (P,1) fp32
    tile, ``bias`` a (P,1) tile or an immediate (v3+); optional ``nl.add`` free-axis reduction."""
    instr = "activation"
    op = _activation_op(instr, op)
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    access.check_same_shape_per_partition(instr, dst, data)
    tiles = ops.tensor_operands(bias, scale, reduce_res)
    access.check_compute_partitions(instr, dst, data, *tiles)
    _, p, _ = ops.partitions(data)
    if scale is None:
        raise nki_error(instr, "scale", "scale must be an fp32 immediate or a (P, 1) fp32 tile")
    s = ops.vector_operand(instr, "scale", scale, p, fp32_only=True)
    if bias is None:
        b = np.float32(0.0)
    else:
        if getattr(bias, "dtype", None) == tfloat32:
            raise nki_error(instr, "bias dtype", "bias cannot be tfloat32")
        b = ops.vector_operand(instr, "bias", bias, p)
    cmd = _reduce_cmd_name(instr, reduce_cmd)
    if reduce_op is not None and reduce_op is not add:
        raise nki_error(instr, "reduce op", f"reduce_op must be nl.add, got {reduce_op!r}")
    if cmd in ("reduce", "reset_reduce") and reduce_op is None:
        raise nki_error(instr, "reduce op", f"reduce_cmd={cmd} needs reduce_op=nl.add")

    x = ops.as_pf(access.read_f32(data, instr), p)
    with np.errstate(all="ignore"):
        pre = (x * s + b).astype(np.float32)
    warn_out_of_range(op, pre)
    out = op.activate(pre)
    ops.write_result(dst, out, instr)

    regs = ops.reduce_registers("scalar")
    if cmd in ("reset", "reset_reduce"):
        regs.reset(p, 0.0)
    if cmd in ("reduce", "reset_reduce"):
        regs.require_valid(instr, p, "reduce_cmd=reduce continues")
        with np.errstate(all="ignore"):
            regs.values[:p] = (regs.values[:p].astype(np.float64)
                               + out.astype(np.float64).sum(axis=1)).astype(np.float32)
    if reduce_res is not None:
        regs.write_to(instr, reduce_res, p)
    ops.record("scalar", "activation", data.size)


def _reduce_cmd_name(instr: str, reduce_cmd: Any) -> str:
    if reduce_cmd is None:
        return "idle"
    reduce_cmd = as_enum(reduce_cmd, _reduce_cmd, "reduce_cmd", instr)  # raw ints (R11)
    name = getattr(reduce_cmd, "name", None)
    if isinstance(reduce_cmd, (int, str)) or name not in (
            "idle", "reset", "reduce", "reset_reduce"):
        raise nki_error(instr, "reduce_cmd",
                        f"reduce_cmd must be nisa.reduce_cmd.idle/reset/reduce/reset_reduce, "
                        f"got {reduce_cmd!r}")
    return name


@quiet_fp
def activation_reduce(dst: Any, op: Any, data: Any, reduce_op: Any, reduce_res: Any,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None) -> None:
    """``activation`` with ``reduce_cmd=reset_reduce``: ``reduce_res = sum(op(...), free)``."""
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
               reduce_res=reduce_res, reduce_cmd=_reduce_cmd.reset_reduce, name=name)



def _trn3_only(instr: str) -> None:
    """Instructions that exist only on NeuronCore-v4 (trn3) and are not modelled here."""
    target = current().target
    if not target.is_trn3:
        raise nki_error(instr, "trn3-only instruction",
                        f"nisa.{instr} exists only on trn3 (NeuronCore-v4); the target is "
                        f"{target.name}: use nisa.activation")
    raise nki_error(instr, "not modelled",
                    f"nisa.{instr} (trn3) is not modelled by this emulator; use nisa.activation")


def activate2(*args: Any, **kwargs: Any) -> None:
    """trn3-only two-op activation: rejected on trn2 ("trn3-only instruction"), not modelled."""
    _trn3_only("activate2")


def exponential(*args: Any, **kwargs: Any) -> None:
    """trn3-only ``exp`` with max subtraction: rejected on trn2, not modelled on trn3."""
    _trn3_only("exponential")
