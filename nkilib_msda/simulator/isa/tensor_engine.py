"""Tensor-engine (PE) instructions: ``nc_matmul`` and ``nc_transpose`` (PE or Vector path).

Matmul accumulation is tracked per PSUM element ("matmul-initialised" flags kept in the PSUM
storage): an overwriting matmul (``accumulate=False``, or ``None`` on an unflagged element)
sets the flag, any non-matmul write to PSUM (tensor_copy, memset, activation, ...) clears it.
``accumulate=True`` on an element without the flag is undefined behaviour on hardware
(accumulating onto memset/copy-initialised PSUM included, NC-v2/v3) and raises NkiError.
``accumulate=None`` accumulates onto flagged elements and overwrites the others.

The product is computed in float64 from the operands' exact values and rounded to fp32 once
per instruction (the PE accumulates in fp32; fp32 operands take several passes on hardware:
the emulator does not reproduce those rounding details, docs/emulator.md). The PSUM-bank
rule assumes every PSUM tensor starts on a bank boundary (the allocator's placement).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np

from nkilib_msda.hardware import PE_ARRAY_SIZE as _PE_ARRAY_SIZE
from nkilib_msda.simulator import access
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.dtypes import (bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2,
                                          float16, float32, quiet_fp, tfloat32)
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa import _operands as ops
from nkilib_msda.simulator.isa.enums import as_enum, matmul_perf_mode

__all__ = ["nc_matmul", "nc_transpose"]

_PE_MAX_PARTITIONS = _PE_ARRAY_SIZE
_PE_MAX_STATIONARY_FREE = _PE_ARRAY_SIZE
_VECTOR_TRANSPOSE_MAX = 32
_FP32_FAMILY = (float32, tfloat32)


def _matmul_input_dtypes(instr: str, stationary: Any, moving: Any) -> None:
    target = current().target
    allowed = [float8_e4m3, float8_e5m2, bfloat16, float16, tfloat32, float32]
    if target.is_trn3:
        allowed.append(float8_e4m3fn)
    for name, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed:
            raise nki_error(instr, "input dtype",
                            f"{name} is {t.dtype}; the PE takes {[str(d) for d in allowed]} "
                            f"on {target.name}")
    if (stationary.dtype in _FP32_FAMILY) != (moving.dtype in _FP32_FAMILY):
        raise nki_error(instr, "fp32 pairing",
                        f"stationary {stationary.dtype} with moving {moving.dtype}: a float32/"
                        "tfloat32 operand must be paired with float32/tfloat32")
    if {stationary.dtype, moving.dtype} == {float8_e4m3, float8_e4m3fn}:
        raise nki_error(instr, "fp8 pairing", "float8_e4m3 and float8_e4m3fn cannot be mixed")


def _check_psum_bank(instr: str, dst: Any) -> None:
    """On trn2 one matmul output must lie inside one 2 KiB PSUM bank (per partition)."""
    target = current().target
    if target.is_trn3:
        return
    ppe = dst.storage.ppe(dst.dtype.itemsize)
    # Strides are >= 0 and on-chip free dims stay inside a partition, so the lowest and
    # highest free element of every partition follow from the offset and the free strides.
    f0 = dst.offset % ppe
    f1 = f0 + sum(s * (n - 1) for s, n in zip(dst.strides[1:], dst.shape[1:]))
    first, last = f0 * dst.dtype.itemsize, (f1 + 1) * dst.dtype.itemsize - 1
    bank = target.psum_bank_bytes
    if first // bank != last // bank:
        raise nki_error(instr, "PSUM bank",
                        f"dst spans bytes {first}..{last} of each partition, crossing a "
                        f"{bank} B PSUM bank boundary ({target.name}: one matmul output must fit "
                        "in one bank)")


def _check_tiling(instr: str, tile_position: Any, tile_size: Any, k: int, m: int) -> None:
    if not tile_position and not tile_size:
        return
    if not (isinstance(tile_position, tuple) and isinstance(tile_size, tuple)
            and len(tile_position) == 2 and len(tile_size) == 2):
        raise nki_error(instr, "tiling mode",
                        "tile_position and tile_size must both be set as 2-tuples, got "
                        f"tile_position={tile_position!r}, tile_size={tile_size!r}")
    rows, cols = (int(v) for v in tile_size)
    start_row, start_col = (int(v) for v in tile_position)
    for what, size, start in (("row", rows, start_row), ("column", cols, start_col)):
        if size not in (32, 64, _PE_ARRAY_SIZE) or start % size or not 0 <= start < _PE_ARRAY_SIZE:
            raise nki_error(instr, "tiling mode",
                            f"{what} tile size {size} / start {start}: sizes are 32, 64 or 128 "
                            "and starts multiples of the size below 128")
    if k > rows or m > cols:
        raise nki_error(instr, "tiling mode",
                        f"stationary [{k}, {m}] does not fit the [{rows}, {cols}] PE tile")


@quiet_fp
def nc_matmul(dst: Any, stationary: Any, moving: Any, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False,
              accumulate: Any = None, tile_position: Any = (), tile_size: Any = (),
              perf_mode: Any = None, name: str | None = None) -> None:
    """PE ``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` (extra free dims flatten);
    inputs in SBUF, ``dst`` in PSUM (fp32; bf16 also on trn3)."""
    instr = "nc_matmul"
    target = current().target
    ops.require_tensor(instr, "dst", dst, {"psum"})
    ops.require_tensor(instr, "stationary", stationary, ops.SBUF_ONLY)
    ops.require_tensor(instr, "moving", moving, ops.SBUF_ONLY)
    if accumulate not in (None, True, False):
        raise nki_error(instr, "accumulate", f"accumulate must be None, True or False, got {accumulate!r}")
    perf_mode = None if perf_mode is None else as_enum(perf_mode, matmul_perf_mode, "perf_mode", instr)
    if perf_mode is not None and not isinstance(perf_mode, Enum):
        raise nki_error(instr, "enum argument",
                        f"perf_mode must be a nisa.matmul_perf_mode member, got {perf_mode!r}")
    if perf_mode is not None and getattr(perf_mode, "name", None) != "none":
        raise nki_error(instr, "perf_mode", f"perf_mode={perf_mode!r} is not modelled by the emulator")
    access.check_compute_partitions(instr, dst, stationary, moving)
    _, k, m = ops.partitions(stationary)
    _, k2, n = ops.partitions(moving)
    _, dm, dn = ops.partitions(dst)
    if k != k2:
        raise nki_error(instr, "contraction dim",
                        f"stationary has {k} partitions, moving has {k2}: K must match")
    if k > _PE_MAX_PARTITIONS or m > _PE_MAX_STATIONARY_FREE:
        raise nki_error(instr, "matmul size",
                        f"stationary [K={k}, M={m}] exceeds the PE limits K <= 128, M <= 128")
    if dm != m or dn != n:
        raise nki_error(instr, "dst shape",
                        f"dst must be [M={m}, N={n}] (partitions x elements), got {dst.shape} "
                        f"({dm} x {dn})")
    _check_tiling(instr, tile_position, tile_size, k, m)

    if is_transpose:
        if dst.dtype != stationary.dtype:
            raise nki_error(instr, "transpose dtype",
                            f"is_transpose=True moves data unchanged: dst ({dst.dtype}) must have "
                            f"stationary's dtype ({stationary.dtype})")
    else:
        _matmul_input_dtypes(instr, stationary, moving)
        dst_ok = (float32, bfloat16) if target.supports_bf16_matmul_dst else (float32,)
        if dst.dtype not in dst_ok:
            raise nki_error(instr, "dst dtype",
                            f"dst is {dst.dtype}; matmul output must be "
                            f"{' or '.join(map(str, dst_ok))} on {target.name}")
    max_n = target.matmul_max_n_fp32 * (2 if dst.dtype == bfloat16 else 1)
    if n > max_n:
        raise nki_error(instr, "matmul size",
                        f"moving free size N={n} exceeds {max_n} on {target.name} (one PSUM bank "
                        "on trn2)")
    _check_psum_bank(instr, dst)

    if is_transpose:
        result = _transpose_product(instr, stationary, moving, k, m, n)
    else:
        a = ops.as_pf(access.read_f32(stationary, instr), k).astype(np.float64)
        b = ops.as_pf(access.read_f32(moving, instr), k).astype(np.float64)
        with np.errstate(all="ignore"):
            result = (a.T @ b).astype(np.float32)

    flags = ops.matmul_flags(dst).reshape(m, n)
    if accumulate is True and not flags.all():
        raise nki_error(instr, "accumulate without overwrite",
                        f"accumulate=True on {int((~flags).sum())} of {flags.size} PSUM elements "
                        "not written by an overwriting matmul (undefined behaviour: start the "
                        "accumulation group with accumulate=False)")
    add_to = flags if accumulate is not False else np.zeros_like(flags)
    if add_to.any() and not is_transpose:
        # Flagged elements were written by a matmul, so they are initialised.
        itemsize = dst.dtype.itemsize
        current_values = dst.np_view(dst.storage.data, dst.dtype.np, itemsize).reshape(m, n)
        old = current_values[add_to].astype(np.float32)
        result = result.copy()
        with np.errstate(all="ignore"):
            result[add_to] = result[add_to] + old
    access.write(dst, result.reshape(dst.shape), instr)
    ops.set_matmul_flags(dst)
    ops.record("tensor", "nc_matmul", moving.size)


def _transpose_product(instr: str, stationary: Any, moving: Any, k: int, m: int,
                       n: int) -> np.ndarray:
    """PE transpose mode: bit-exact ``stationary.T @ moving`` for a 0/1 one-hot ``moving``."""
    sel = ops.as_pf(access.read_f32(moving, instr), k)
    ones = sel != 0
    if not (np.all((sel == 0) | (sel == 1)) and np.all(ones.sum(axis=0) == 1)):
        raise nki_error(instr, "transpose mode",
                        "is_transpose=True needs a moving tile with exactly one 1 per column "
                        "(an identity or permutation matrix)")
    rows = np.argmax(ones, axis=0)  # moving column j picks stationary row rows[j]
    data = ops.as_pf(access.read(stationary, instr), k)
    return data[rows, :].T.copy()  # dst[m, j] = stationary[rows[j], m]


@quiet_fp
def nc_transpose(dst: Any, data: Any, engine: Any = None, name: str | None = None) -> None:
    """Swap the partition dim and the flattened free dims of ``data`` (same dtype, bit-exact).

    Engine auto-selection: the PE when ``data`` is in SBUF, ``dst`` in PSUM and the tile is
    at most [128, 128]; otherwise the Vector engine when it is at most [32, 32].
    """
    instr = "nc_transpose"
    ops.require_tensor(instr, "dst", dst)
    ops.require_tensor(instr, "data", data)
    if dst.dtype != data.dtype:
        raise nki_error(instr, "dtype", f"dst ({dst.dtype}) must have data's dtype ({data.dtype})")
    access.check_compute_partitions(instr, dst, data)
    _, p, f = ops.partitions(data)
    _, dp, df = ops.partitions(dst)
    if dp != f or df != p:
        raise nki_error(instr, "dst shape",
                        f"data is [{p}, {f}] (partitions x elements) so dst must be [{f}, {p}], "
                        f"got {dst.shape} ({dp} x {df})")
    eng = ops.engine_name(instr, engine)
    ops.check_engine(instr, eng, {"unknown", "tensor", "vector"})
    fits_pe = p <= _PE_MAX_PARTITIONS and f <= _PE_MAX_PARTITIONS
    fits_vector = p <= _VECTOR_TRANSPOSE_MAX and f <= _VECTOR_TRANSPOSE_MAX
    if eng == "unknown":
        if data.buffer == "sbuf" and dst.buffer == "psum" and fits_pe:
            eng = "tensor"
        elif fits_vector:
            eng = "vector"
        else:
            raise nki_error(instr, "transpose size",
                            f"[{p}, {f}] {data.buffer} -> {dst.buffer}: the PE transposes SBUF -> "
                            "PSUM tiles up to [128, 128], the Vector engine tiles up to [32, 32]")
    if eng == "tensor":
        access.check_buffer(instr, "data", data, {"sbuf"})
        access.check_buffer(instr, "dst", dst, {"psum"})
        if not fits_pe:
            raise nki_error(instr, "transpose size",
                            f"[{p}, {f}] exceeds the Tensor-engine transpose limit [128, 128]")
        _check_psum_bank(instr, dst)  # a PE transpose is a matmul: one PSUM bank on trn2
    elif not fits_vector:
        raise nki_error(instr, "transpose size",
                        f"[{p}, {f}] exceeds the Vector-engine transpose limit [32, 32]")
    values = ops.as_pf(access.read(data, instr), p).T.copy()
    if eng == "tensor":
        access.write(dst, values.reshape(dst.shape), instr)
        ops.set_matmul_flags(dst)  # a PE transpose is an overwriting matmul
    else:
        ops.write_result(dst, values, instr)
    ops.record(eng, "nc_transpose", data.size)
