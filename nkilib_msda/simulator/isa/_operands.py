"""Operand checks and value plumbing shared by the compute-engine instructions.

Values travel as NumPy arrays reshaped to ``(partitions, elements_per_partition)``: NKI pairs
operands of equal partition count and equal elements per partition in row-major order, so
free shapes may differ (docs/emulator.md).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from nkilib_msda.hardware import PARTITIONS as _PARTITIONS
from nkilib_msda.simulator import access
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.dtypes import cast_values, float32, int32, uint32
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa.enums import as_enum, engine as _engine_enum
from nkilib_msda.simulator.tensor import NkiTensor

ON_CHIP = frozenset({"sbuf", "psum"})
SBUF_ONLY = frozenset({"sbuf"})
ENGINE_NAMES = frozenset({"unknown", "tensor", "vector", "scalar", "gpsimd"})


def is_number(value: Any) -> bool:
    """A compile-time immediate: Python/NumPy int, float or bool (not an array)."""
    return isinstance(value, (int, float, bool, np.integer, np.floating, np.bool_))


def require_tensor(instruction: str, name: str, t: Any, allowed: Iterable[str] = ON_CHIP) -> NkiTensor:
    """``t`` must be a static NkiTensor (no dynamic/indirect access) in one of ``allowed``."""
    if not isinstance(t, NkiTensor):
        kind = type(t).__name__
        why = (" (indirect/dynamic access patterns are DMA-only)"
               if kind in ("IndirectAccess", "DynamicAccess") else "")
        raise nki_error(instruction, "operand type",
                        f"{name} must be an on-chip NkiTensor, got {kind}{why}")
    access.check_buffer(instruction, name, t, set(allowed))
    return t


def engine_name(instruction: str, engine: Any) -> str:
    """Normalise ``engine=`` (an ``nisa.engine`` member or None) to its name."""
    if engine is None:
        return "unknown"
    engine = as_enum(engine, _engine_enum, "engine", instruction)  # raw ints accepted (R11)
    name = getattr(engine, "name", None)
    if isinstance(engine, (str, int)) or name not in ENGINE_NAMES:
        raise nki_error(instruction, "engine",
                        f"engine must be an nisa.engine member (e.g. nisa.engine.vector), got "
                        f"{engine!r}")
    return name


def check_engine(instruction: str, engine: str, allowed: Iterable[str]) -> None:
    if engine not in allowed:
        raise nki_error(instruction, "engine",
                        f"engine={engine} is not supported; expected one of {sorted(allowed)}")


def check_no_psum_on_gpsimd(instruction: str, engine: str, *tensors: NkiTensor) -> None:
    if engine == "gpsimd":
        for t in tensors:
            if t is not None and t.buffer == "psum":
                raise nki_error(instruction, "GpSimd cannot access PSUM",
                                f"{t.name or 'operand'} is in PSUM; GpSimd reads and writes SBUF only")


def check_not_both_psum(instruction: str, a: NkiTensor, b: Any, names: str) -> None:
    if isinstance(b, NkiTensor) and a.buffer == "psum" and b.buffer == "psum":
        raise nki_error(instruction, "two PSUM inputs",
                        f"{names} are both in PSUM; at most one tensor input may be in PSUM")


def check_psum_inputs(instruction: str, **inputs: Any) -> None:
    """Vector engine: at most one tensor input may be in PSUM (docs/emulator.md).
    Applied to every tensor input, (P, 1) operand tiles included (conservative: the docs
    state it for "the two tensor inputs")."""
    in_psum = [name for name, t in inputs.items()
               if isinstance(t, NkiTensor) and t.buffer == "psum"]
    if len(in_psum) > 1:
        raise nki_error(instruction, "two PSUM inputs",
                        f"{' and '.join(in_psum)} are all in PSUM; at most one tensor input of a "
                        "Vector instruction may be in PSUM")


def partitions(t: NkiTensor) -> tuple[int, int, int]:
    """(start partition, number of partitions, elements per partition)."""
    return access.partition_info(t)


def as_pf(values: np.ndarray, num_partitions: int) -> np.ndarray:
    return np.asarray(values).reshape(num_partitions, -1)


def vector_operand(instruction: str, name: str, value: Any, num_partitions: int, *,
                   fp32_only: bool = False, bits: bool = False) -> Any:
    """A scalar immediate or a ``(P, 1)`` on-chip tile, as a float32 scalar / ``(P, 1)`` array
    (``bits``: uint64 bit patterns for bitvec ops)."""
    if is_number(value):
        if bits:
            if isinstance(value, (float, np.floating)):
                raise nki_error(instruction, "bitvec operand",
                                f"{name}={value!r}: bitvec ops need integer immediates")
            return np.uint64(int(value) % (1 << 64))
        return np.float32(value)
    t = require_tensor(instruction, name, value)
    _, p, epp = partitions(t)
    if p != num_partitions or epp != 1:
        raise nki_error(instruction, "vector operand shape",
                        f"{name} must be a scalar or a ({num_partitions}, 1) tile, got shape "
                        f"{t.shape} ({p} partitions x {epp} elements)")
    if bits:
        if not t.dtype.is_int:
            raise nki_error(instruction, "bitvec dtype",
                            f"{name} must have an integer dtype for bitvec ops, got {t.dtype}")
        return read_bits(t, instruction).reshape(num_partitions, 1)
    if fp32_only and t.dtype != float32:
        raise nki_error(instruction, "operand dtype",
                        f"tensor {name} must be float32, got {t.dtype}")
    return access.read_f32(t, instruction).reshape(num_partitions, 1)


def tensor_operands(*values: Any) -> list[NkiTensor]:
    return [v for v in values if isinstance(v, NkiTensor)]


def is_int32_family(t: NkiTensor) -> bool:
    return t.dtype in (int32, uint32)


def require_int_dtypes(instruction: str, why: str, *tensors: NkiTensor) -> None:
    for t in tensors:
        if not t.dtype.is_int:
            raise nki_error(instruction, "bitvec dtype",
                            f"{why} need integer dtypes; {t.name or 'operand'} is {t.dtype}")


def read_bits(t: NkiTensor, instruction: str) -> np.ndarray:
    """Raw bit patterns of an integer tile, zero-extended to uint64."""
    raw = np.asarray(access.read(t, instruction))
    unsigned = raw.view(np.dtype(f"u{raw.dtype.itemsize}"))
    return unsigned.astype(np.uint64)


def write_bits(dst: NkiTensor, bits: np.ndarray, instruction: str) -> None:
    """Write the low ``dst.itemsize`` bytes of each uint64 pattern, without any cast."""
    width = dst.dtype.itemsize
    truncated = (np.asarray(bits, dtype=np.uint64) & np.uint64((1 << (8 * width)) - 1))
    values = truncated.astype(np.dtype(f"u{width}")).view(dst.dtype.np)
    write_result(dst, values.reshape(dst.shape), instruction)


def write_result(dst: NkiTensor, values: np.ndarray, instruction: str) -> None:
    """Write (with the NKI cast) and forget matmul accumulation state of PSUM elements."""
    access.write(dst, np.asarray(values).reshape(dst.shape), instruction)
    if dst.buffer == "psum":
        clear_matmul_flags(dst)


def write_masked(dst: NkiTensor, values: np.ndarray, mask: np.ndarray, instruction: str) -> None:
    """Write (with the NKI cast) only where ``mask``; other elements keep their contents."""
    values = np.asarray(values).reshape(dst.shape)
    mask = np.asarray(mask, dtype=bool).reshape(dst.shape)
    if not mask.any():
        return
    access.store_masked(dst, cast_values(values[mask], dst.dtype), mask, instruction)
    if dst.buffer == "psum":  # only the written elements stop being matmul results
        flags = dst.storage.aux.get(MATMUL_FLAGS)
        if flags is not None:
            _flag_view(dst, flags)[0][mask] = 0


# -- PSUM matmul accumulation flags (per byte of the storage; set by nc_matmul) -------------
MATMUL_FLAGS = "matmul_initialised"


_FLAG_DTYPES = {1: (np.uint8, 0x01), 2: (np.uint16, 0x0101), 4: (np.uint32, 0x01010101),
                8: (np.uint64, 0x0101010101010101)}


def _flag_view(t: NkiTensor, flags: np.ndarray) -> tuple[np.ndarray, int]:
    """The per-byte flags of ``t``'s elements as a strided view (one integer per element;
    an element is flagged when every one of its bytes is)."""
    dtype, full = _FLAG_DTYPES[t.dtype.itemsize]
    return t.np_view(flags, dtype, t.dtype.itemsize), full


def matmul_flags(t: NkiTensor) -> np.ndarray:
    """Per-element bool array (shape ``t.shape``): written by an overwriting matmul since."""
    flags = t.storage.aux.get(MATMUL_FLAGS)
    if flags is None:
        return np.zeros(t.shape, dtype=bool)
    view, full = _flag_view(t, flags)
    return view == full


def set_matmul_flags(t: NkiTensor) -> None:
    flags = t.storage.aux.get(MATMUL_FLAGS)
    if flags is None:
        flags = t.storage.aux[MATMUL_FLAGS] = np.zeros(t.storage.data.size, dtype=np.uint8)
    view, full = _flag_view(t, flags)
    view[...] = full


def clear_matmul_flags(t: NkiTensor) -> None:
    flags = t.storage.aux.get(MATMUL_FLAGS)
    if flags is not None:
        _flag_view(t, flags)[0][...] = 0


def record(engine: str, opcode: str, elements: int) -> None:
    current().events.compute(engine, opcode, int(elements))


class ReduceRegisters:
    """One engine's per-partition accumulator registers (128 fp32 lanes) in one program,
    with a mask of the lanes that were reset/loaded (their contents are otherwise undefined)."""

    def __init__(self) -> None:
        self.values = np.zeros(_PARTITIONS, dtype=np.float32)
        self.valid = np.zeros(_PARTITIONS, dtype=bool)

    def reset(self, num_partitions: int, value: Any) -> None:
        self.values[:num_partitions] = value
        self.valid[:num_partitions] = True

    def require_valid(self, instruction: str, num_partitions: int, why: str) -> None:
        if not self.valid[:num_partitions].all():
            raise nki_error(instruction, "reduce registers",
                            f"{why} accumulator registers that were never reset (undefined "
                            "contents; start with reduce_cmd=nisa.reduce_cmd.reset_reduce)")

    def max_reduce(self, instruction: str, cmd: str, rows: np.ndarray) -> None:
        """Apply ``reduce_cmd`` ``cmd`` (idle/reset/reduce/reset_reduce) of a max reduction to
        the registers of ``rows``' (P, F) partitions: reset to -inf, then fold in the row maxima."""
        p = rows.shape[0]
        if cmd in ("reset", "reset_reduce"):
            self.reset(p, -np.inf)
        if cmd in ("reduce", "reset_reduce"):
            self.require_valid(instruction, p, "reduce_cmd=reduce continues")
            self.values[:p] = np.maximum(self.values[:p], rows.max(axis=1))

    def write_to(self, instruction: str, reduce_res: Any, num_partitions: int) -> None:
        """Write the first ``num_partitions`` registers to ``reduce_res``, an on-chip (P, 1)."""
        require_tensor(instruction, "reduce_res", reduce_res)
        _, rp, per_partition = partitions(reduce_res)
        if rp != num_partitions or per_partition != 1:
            raise nki_error(instruction, "reduce_res shape",
                            f"reduce_res must be ({num_partitions}, 1), got {reduce_res.shape}")
        self.require_valid(instruction, num_partitions, "reduce_res reads")
        write_result(reduce_res, self.values[:num_partitions].reshape(num_partitions, 1),
                     instruction)


def reduce_registers(engine: str) -> ReduceRegisters:
    """The accumulator registers of ``engine`` ("vector" or "scalar") in the running program."""
    ctx = current()
    regs = getattr(ctx, "_reduce_registers", None)
    if regs is None:
        regs = ctx._reduce_registers = {}
    if engine not in regs:
        regs[engine] = ReduceRegisters()
    return regs[engine]


def vector_max_reduce(instruction: str, cmd: str, rows: np.ndarray, reduce_res: Any) -> None:
    """The Vector engine's accumulate of a select with reduce: ``cmd`` applied to the max of each
    of ``rows``' (P, F) partitions, then the registers written to ``reduce_res`` unless None."""
    regs = reduce_registers("vector")
    regs.max_reduce(instruction, cmd, rows)
    if reduce_res is not None:
        regs.write_to(instruction, reduce_res, rows.shape[0])
