"""Hardware facts of the NeuronCores the kernels target: one definition of each.

Plain Python that imports nothing from the package, so every layer can read it: the kernels
(through :mod:`nkilib_msda.experimental.kernel_commons`; a plain constant imported at trace
time is fine for NKI 0.7+ tracing), the planners (without NKI), and the emulator's target
table (:mod:`nkilib_msda.simulator.targets`). See docs/kernels.md, "Hardware facts".

Sources (official Neuron documentation; ``latest`` = Neuron 2.34 / NKI 0.8):

- 128 partitions, PSUM of 8 banks x 2 KiB per partition, ``nl.tile_size``:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.language.tile_size.html
  and the Trainium2 architecture guide
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/trainium2_arch.html
- SBUF 28 MiB per NeuronCore-v3 (128 x 224 KiB) and 32 MiB per NeuronCore-v4 (128 x 256 KiB):
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/about/trainium3_arch.html
  ("The NeuronCore-v4 SBUF capacity is 32MiB (up from 28 MiB in NeuronCore-v3)").
- LNC degree 1 or 2:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html
- 16 DMA engines per NeuronCore, a transfer's SBUF partitions spread over them 8 per engine:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-dma-bandwidth-guide.html
  and https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/get-started/about/nki-dma-overview.html

Assumptions (not stated as numbers in the docs): the runtime keeps 16 KiB per partition for
dynamic-DMA scratch, so ``nl.tile_size.sbuf_fmax_bytes`` (usable SBUF per partition) is the
capacity minus 16 KiB; nki-library's kernels budget with the same 224 KiB - 16 KiB figure
minus a few hundred bytes of their own.
"""

from __future__ import annotations

__all__ = [
    "KIB", "PARTITIONS", "PE_ARRAY_SIZE", "DMA_TRANSPOSE_MAX_FREE", "PSUM_BANK_BYTES", "PSUM_BANKS", "PSUM_BYTES", "PSUM_BANK_FP32",
    "FP32_EXACT_INT_MAX", "DTYPE_BYTES", "MAX_LNC", "TARGETS", "NEURON_CORES",
    "MATMUL_MAX_N_FP32", "SBUF_BYTES_PER_PARTITION", "RUNTIME_SBUF_RESERVE_BYTES",
    "USABLE_SBUF_BYTES", "PLANNER_SBUF_RESERVE_BYTES", "PLANNER_SBUF_BUDGET",
    "planner_sbuf_budget", "DMA_ENGINES", "PARTITIONS_PER_DMA_ENGINE", "KERNEL_DTYPES",
    "TWO_BYTE_FLOAT_DTYPES",
]

KIB = 1024

PARTITIONS = 128                       # SBUF/PSUM partitions (nl.tile_size.pmax)
# The Tensor Engine's systolic array: contraction (partitions) and stationary free size.
PE_ARRAY_SIZE = PARTITIONS
# dma_transpose puts src.shape[-1] on the partitions: at most 128 of them.
DMA_TRANSPOSE_MAX_FREE = PARTITIONS
PSUM_BANK_BYTES = 2 * KIB              # bytes per partition in one PSUM bank
PSUM_BANKS = 8
PSUM_BYTES = PSUM_BANKS * PSUM_BANK_BYTES
PSUM_BANK_FP32 = PSUM_BANK_BYTES // 4  # fp32 columns of one matmul output bank
# Index arithmetic runs in fp32 on the Vector/Scalar engines: integers are exact below 2^24.
FP32_EXACT_INT_MAX = 1 << 24
DTYPE_BYTES = {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2,
               "uint16": 2, "int16": 2, "uint8": 1, "int8": 1}
# The float dtypes the engines compute in, by name: every device kernel's (NKI, Triton) value
# dtypes; float64 is a host dtype (the references), see nkilib_msda.validation.msda.
KERNEL_DTYPES = ("bfloat16", "float16", "float32")
TWO_BYTE_FLOAT_DTYPES = ("bfloat16", "float16")
MAX_LNC = 2                            # the Neuron SDK supports LNC degree 1 or 2
DMA_ENGINES = 16                       # DMA engines per NeuronCore
PARTITIONS_PER_DMA_ENGINE = 8          # engine e moves SBUF partitions 8e .. 8e + 7
# Multi-column indirect-DMA index tiles start 16-byte aligned: nki-library's MSDA kernels
# allocate them with align=16 ("Turbo batched indirect scatter-add DGE indices require 16 byte
# alignment", ms_deformable_attention_bwd.py); undocumented in the NKI pages.
INDEX_TILE_ALIGN_BYTES = 16
INDEX_TILE_ALIGN_WORDS = INDEX_TILE_ALIGN_BYTES // 4   # in 4-byte (uint32/int32) index words

TARGETS = ("trn2", "trn3")
NEURON_CORES = {"trn2": "NC-v3", "trn3": "NC-v4"}
# Largest fp32 matmul moving free size N the emulator accepts (one PSUM bank on NC-v3).
MATMUL_MAX_N_FP32 = {"trn2": 512, "trn3": 4096}

SBUF_BYTES_PER_PARTITION = {"trn2": 224 * KIB, "trn3": 256 * KIB}
# The runtime's dynamic-DMA scratch, kept out of every kernel's SBUF.
RUNTIME_SBUF_RESERVE_BYTES = 16 * KIB
# What ``nl.tile_size.sbuf_fmax_bytes`` reports: trn2 212,992 B, trn3 245,760 B.
USABLE_SBUF_BYTES = {t: SBUF_BYTES_PER_PARTITION[t] - RUNTIME_SBUF_RESERVE_BYTES for t in TARGETS}

# The one planner reserve: every planner fits its kernel's SBUF list into the usable SBUF minus
# 8 KiB, left for what a plan does not list (compiler temporaries, a library's own few bytes,
# the alignment padding of each allocation).
PLANNER_SBUF_RESERVE_BYTES = 8 * KIB
# trn2 204,800 B (200 KiB), trn3 237,568 B per partition.
PLANNER_SBUF_BUDGET = {t: USABLE_SBUF_BYTES[t] - PLANNER_SBUF_RESERVE_BYTES for t in TARGETS}


def planner_sbuf_budget(usable_bytes: int) -> int:
    """The planners' SBUF budget per partition for a device reporting ``usable_bytes``
    (``nl.tile_size.sbuf_fmax_bytes``): that minus the one planner reserve."""
    return int(usable_bytes) - PLANNER_SBUF_RESERVE_BYTES

# Valid input range of the Scalar engine's square root (the activation-function table,
# nki.api.shared, "Valid Input Range"): outside it "the Scalar Engine will generate invalid
# output results".
SQRT_VALID_INPUT = (2.0 ** -116, 2.0 ** 118)

# dma_compute: "max number of source tensors in srcs is 16" (nki.isa.dma_compute page).
DMA_COMPUTE_MAX_SOURCES = 16
