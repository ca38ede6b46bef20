"""Timing model: the cost formulas against the documentation's own numbers.

Formulas: the "Estimated instruction cost" blocks of the NKI ISA reference of Neuron 2.26
(N = elements per partition), the Trainium2 Vector performance modes, the DMA bandwidth
guide (23 B/ns per engine; one engine moved 32 KiB in 1,416 ns) and the DGE's ~600 ns.
"""

from __future__ import annotations

import pytest

from nkilib_msda.simulator.timing.constants import (HARDWARE, PARAM_NAMES, PARAMS, SOURCES,
                                                    nominal_params, param_vector)
from nkilib_msda.simulator.timing.costs import (Operand, compute_cycles, matmul_cycles,
                                                transpose_cycles)

TRN2 = HARDWARE["trn2"]


def sb(two_byte=False, contiguous=True, fp32=False):
    return Operand("sbuf", two_byte, contiguous, 128, 512, fp32)


def ps(two_byte=False):
    return Operand("psum", two_byte, True, 128, 512)


@pytest.mark.parametrize("opcode, reads, writes, cycles", [
    # NC-v2 formulas (fp32: no performance mode)
    ("tensor_tensor", [sb(), sb()], [sb()], 2 * 512),            # 2N
    ("tensor_tensor", [ps(), sb()], [sb()], 512),                 # N with one input in PSUM
    ("tensor_scalar", [sb()], [sb()], 512),                       # N
    ("tensor_copy", [sb()], [sb()], 512),                         # N
    ("reciprocal", [sb()], [sb()], 8 * 512),                      # 8N
    ("bn_aggr", [sb()], [sb()], 13 * 512 / 3),                    # 13N/3
    ("tensor_reduce", [sb(True)], [sb(True)], 512 / 2),           # N/2 for bf16
    ("tensor_reduce", [sb()], [sb()], 512),
    ("memset", [], [sb(True)], 512 / 2),                          # N/2 writing bf16 zero
    ("scalar_tensor_tensor", [sb(), sb()], [sb()], 2 * 512),      # 2N
    ("tensor_tensor_scan", [sb(), sb()], [sb()], 2 * 512),        # 2N
    ("tensor_scalar_reduce", [sb()], [sb()], 512 + 64),           # max(MIN_II, N) + MIN_II
    # Trainium2 performance modes
    ("tensor_copy", [sb(True)], [sb(True)], 512 / 4),             # 4x: SBUF, bf16, contiguous
    ("tensor_scalar", [sb(True, contiguous=False)], [sb(True)], 512 / 2),  # 2x: strided
    ("tensor_copy", [ps(True)], [sb(True)], 512 / 2),             # 2x: one side in PSUM
    ("tensor_tensor", [sb(True), sb(True)], [sb(True)], 2 * 512 / 2),  # 2x all-bf16 SBUF
])
def test_vector_cycles_follow_the_documented_formulas(opcode, reads, writes, cycles):
    assert compute_cycles(TRN2, "vector", opcode, 512, reads, writes) == pytest.approx(cycles)


def test_min_ii_floor_and_gpsimd_startup():
    # "MIN_II is roughly 64 engine cycles": tiny tiles cost 64 cycles, not N
    assert compute_cycles(TRN2, "vector", "tensor_scalar", 8, [sb()], [sb()]) == 64
    assert compute_cycles(TRN2, "scalar", "activation", 8, [sb()], [sb()]) == 64
    # iota / affine_select: "150 + N" GpSimd cycles
    assert compute_cycles(TRN2, "gpsimd", "iota", 512, [], [sb()]) == 150 + 512
    # Scalar: no 2-byte speed-up on trn2, 2x on trn3 (256 bf16 elements per cycle)
    assert compute_cycles(TRN2, "scalar", "activation", 512, [sb(True)], [sb(True)]) == 512
    assert compute_cycles(HARDWARE["trn3"], "scalar", "activation", 512, [sb(True)],
                          [sb(True)]) == 256


@pytest.mark.parametrize("n_stationary, n_moving, fp32, cycles", [
    (128, 512, False, 512),   # max(min(64, 128), 512)
    (128, 32, False, 64),     # the stationary floor min(64, N_stationary)
    (16, 8, False, 16),
    (128, 512, True, 4 * 512),  # fp32: 4x
])
def test_matmul_cycles(n_stationary, n_moving, fp32, cycles):
    assert matmul_cycles(TRN2, n_stationary, n_moving, fp32) == cycles


@pytest.mark.parametrize("partitions, free, fp32, cycles", [
    (128, 32, False, 128),  # max(P, min(64, F))
    (32, 128, False, 64),
    (16, 8, False, 16),
    (128, 128, True, 256),  # fp32 transpose mode: 2x
])
def test_pe_transpose_cycles(partitions, free, fp32, cycles):
    assert transpose_cycles(TRN2, partitions, free, fp32) == cycles


def test_dma_bandwidth_matches_the_measured_single_engine_example():
    # The DMA overview: one engine moved 32 KiB HBM->SBUF in 1,416 ns on Trn2.
    ns = 32 * 1024 / TRN2.dma_bytes_per_ns
    assert ns == pytest.approx(1416, rel=0.02)
    assert TRN2.dma_bytes_per_ns * TRN2.dma_engines == pytest.approx(368)  # GB/s per core
    assert HARDWARE["trn3"].dma_bytes_per_ns * 16 == pytest.approx(528)


def test_every_parameter_is_ranged_documented_and_sourced():
    for target in ("trn2", "trn3"):
        params = PARAMS[target]
        assert tuple(p.name for p in params) == PARAM_NAMES
        for p in params:
            assert p.low <= p.nominal <= p.high, p.name
            assert p.doc and p.source.startswith("https://"), p.name
        assert param_vector(target) == [nominal_params(target)[n] for n in PARAM_NAMES]
    assert nominal_params("trn2")["hwdge_issue_ns"] == 600.0  # "about 600 ns"
    assert all(url.startswith("https://") for url in SOURCES.values())
    for hw in HARDWARE.values():
        assert set(hw.sources) >= {"clock_ghz", "dma_bytes_per_ns", "hbm_bytes_per_ns_chip"}
    with pytest.raises(ValueError, match="unknown parameter"):
        param_vector("trn2", {"no_such_param": 1.0})
