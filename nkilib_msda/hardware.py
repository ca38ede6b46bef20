"""Hardware facts of the NeuronCores the kernels target, one definition of each.

Plain Python that imports nothing from the package, so every layer can read it: the planners
(without NKI) and the kernels (through :mod:`nkilib_msda.experimental.kernel_commons`).

Sources (official NKI documentation, Neuron 2.33/2.34):
- partitions, PSUM banks, SBUF sizes: the Trainium2 architecture guide
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/guides/architecture/trainium2_arch.html)
  and ``nl.tile_size`` (``pmax``, ``psum_fmax``, ``sbuf_fmax_bytes``;
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.tile_size.html).
- LNC: https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html
  and https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html.
"""

from __future__ import annotations

__all__ = [
    "PARTITIONS", "PSUM_BANK_BYTES", "PSUM_BANKS", "PSUM_BYTES", "PSUM_BANK_FP32",
    "FP32_EXACT_INT_MAX", "DTYPE_BYTES", "SBUF_USABLE_BYTES", "MAX_LNC",
]

PARTITIONS = 128                       # SBUF/PSUM partitions (nl.tile_size.pmax)
PSUM_BANK_BYTES = 2048                 # bytes per partition in one PSUM bank
PSUM_BANKS = 8
PSUM_BYTES = PSUM_BANKS * PSUM_BANK_BYTES
PSUM_BANK_FP32 = PSUM_BANK_BYTES // 4  # fp32 columns of one matmul output bank
# Index arithmetic runs in fp32 on the Vector/Scalar engines: integers are exact below 2^24.
FP32_EXACT_INT_MAX = 1 << 24
DTYPE_BYTES = {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2,
               "uint16": 2, "int16": 2, "uint8": 1, "int8": 1}
# Usable SBUF bytes per partition that planners assume when no device is queried: the
# figures nki-library budgets with (SBUF minus the runtime's dynamic-DMA scratch and a
# few bytes it keeps).
SBUF_USABLE_BYTES = {"trn1": 192 * 1024 - 17 * 1024, "trn2": 207 * 1024, "trn3": 239 * 1024}
MAX_LNC = 2                            # the Neuron SDK supports LNC degree 1 or 2
