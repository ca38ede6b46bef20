"""Per-instruction cost formulas (engine cycles) of the compute engines.

The formulas are the "Estimated instruction cost" blocks of the NKI ISA reference of Neuron
2.26 (NeuronCore-v2; pages in ``constants.SOURCES``), with ``N`` the elements per partition,
scaled by the Trainium2/3 Vector/Scalar performance modes of the architecture guides. The
compute engine's ``MIN_II`` floor and GpSimd start-up are applied by :func:`compute_cycles`;
the ranged static overhead (``compute_overhead_cycles``) is added by the recorder.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence

from nkilib_msda.simulator.timing.constants import Hardware

__all__ = ["Operand", "OperandFacts", "compute_cycles", "base_cycles", "matmul_cycles", "transpose_cycles"]


class OperandFacts(Protocol):
    """What a cost formula reads of an operand (an :class:`Operand`, or the emulator's
    :class:`~nkilib_msda.simulator.access_geometry.Access`)."""

    @property
    def buffer(self) -> str: ...

    @property
    def two_byte_float(self) -> bool: ...

    @property
    def contiguous(self) -> bool: ...

    @property
    def partitions(self) -> int: ...

    @property
    def elems_per_partition(self) -> int: ...

    @property
    def fp32(self) -> bool: ...


class Operand(NamedTuple):
    """What a cost formula needs of one operand: buffer ("sbuf", "psum" or HBM), whether
    its dtype is a 2-byte float (bf16/fp16), whether its innermost free dim is contiguous,
    its partitions and elements per partition."""

    buffer: str
    two_byte_float: bool
    contiguous: bool
    partitions: int
    elems_per_partition: int
    fp32: bool = False


def base_cycles(opcode: str, n: float, reads: Sequence[OperandFacts],
                writes: Sequence[OperandFacts]) -> float:
    """NC-v2 Vector/Scalar cycles of ``opcode`` on ``n`` elements per partition (before the
    MIN_II floor and any Trainium2 performance mode)."""
    in_psum = any(r.buffer == "psum" for r in reads)
    if opcode in ("tensor_tensor", "select_reduce", "tensor_copy_predicated"):
        return n if in_psum else 2.0 * n
    if opcode in ("scalar_tensor_tensor", "tensor_tensor_scan"):
        return 2.0 * n
    if opcode == "tensor_reduce":
        all_bf16 = all(o.two_byte_float for o in [*reads, *writes])
        return n / 2.0 if all_bf16 else n
    if opcode == "reciprocal":
        return 8.0 * n
    if opcode == "bn_aggr":
        return 13.0 * n / 3.0
    if opcode == "memset":
        # "N/2 when writing bf16/fp16 zero": the value is not known here; 2-byte writes are
        # charged N/2 (the common zero fill), others N.
        return n / 2.0 if writes and all(w.two_byte_float for w in writes) else n
    return n  # tensor_scalar, tensor_copy, activation, iota, affine_select, ... : N


def _vector_speedup(hw: Hardware, opcode: str, reads: Sequence[OperandFacts],
                    writes: Sequence[OperandFacts]) -> float:
    """Trainium2 Vector performance modes (chosen by hardware)."""
    ops = [*reads, *writes]
    if not ops or not all(o.two_byte_float for o in ops):
        return 1.0
    if opcode in ("tensor_copy", "tensor_scalar") and hw.vector_perf_4x_copy:
        all_sbuf = all(o.buffer == "sbuf" for o in ops)
        contiguous = all(o.contiguous for o in ops)
        if all_sbuf and contiguous:
            return 4.0
        if contiguous or all_sbuf:
            return 2.0  # one side in PSUM, or not contiguous
        return 1.0
    if opcode == "tensor_tensor" and hw.vector_perf_2x_tensor_tensor:
        return 2.0 if all(r.buffer == "sbuf" for r in reads) else 1.0
    return 1.0


_SCALAR_2BYTE_OPS = ("tensor_copy", "tensor_scalar", "activation")


def compute_cycles(hw: Hardware, engine: str, opcode: str, n: float,
                   reads: Sequence[OperandFacts], writes: Sequence[OperandFacts]) -> float:
    """Engine cycles of one Vector/Scalar/GpSimd instruction, MIN_II / start-up included."""
    cycles = base_cycles(opcode, n, reads, writes)
    if engine == "gpsimd":
        return hw.gpsimd_start_cycles + cycles
    if engine == "vector":
        cycles /= _vector_speedup(hw, opcode, reads, writes)
    elif engine == "scalar" and opcode in _SCALAR_2BYTE_OPS and (reads or writes) and all(
            o.two_byte_float for o in [*reads, *writes]):
        cycles /= hw.scalar_2byte_speedup
    if opcode in ("activation_reduce", "tensor_scalar_reduce"):
        cycles = max(hw.min_ii_cycles, cycles) + hw.min_ii_cycles
    return max(float(hw.min_ii_cycles), cycles)


def matmul_cycles(hw: Hardware, n_stationary: int, n_moving: int, fp32: bool) -> float:
    """``max(min(64, N_stationary), N_moving)`` Tensor cycles (4x for fp32 inputs)."""
    cycles = max(min(hw.matmul_min_stationary, n_stationary), n_moving)
    return float(cycles * (hw.matmul_fp32_factor if fp32 else 1))


def transpose_cycles(hw: Hardware, partitions: int, free: int, fp32: bool) -> float:
    """PE transpose: ``max(P, min(64, F))`` Tensor cycles (2x for fp32 in transpose mode)."""
    cycles = max(partitions, min(hw.matmul_min_stationary, free))
    return float(cycles * (hw.transpose_fp32_factor if fp32 else 1))
