"""Hardware facts and launch helpers shared by every NKI kernel and planner of the package.

The constants are plain Python (the planners import them without NKI); the functions at the
end run inside a kernel and import NKI lazily. See docs/kernels.md, "Kernel commons".

Sources (official NKI documentation, Neuron 2.33/2.34):
- partitions, PSUM banks, SBUF sizes: the Trainium2 architecture guide
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/guides/architecture/trainium2_arch.html)
  and ``nl.tile_size`` (``pmax``, ``psum_fmax``, ``sbuf_fmax_bytes``;
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.tile_size.html).
- LNC: https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html
  and https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html.
"""

from __future__ import annotations

from typing import Any

# Kernel-path code compares with ``== None``: the package's test suites still run the
# emulator's pre-0.7 source rules, which reject ``is``.

__all__ = [
    "PARTITIONS", "PSUM_BANK_BYTES", "PSUM_BANKS", "PSUM_BYTES", "PSUM_BANK_FP32",
    "FP32_EXACT_INT_MAX", "DTYPE_BYTES", "SBUF_USABLE_BYTES", "MAX_LNC",
    "core_info", "core_barrier", "usable_sbuf_bytes",
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


def core_info() -> tuple[int, int]:
    """(LNC degree, this physical core's index) inside a running kernel.

    The NKI 0.7+ idiom from the LNC page: ``nl.num_programs()`` is the LNC degree and
    ``nl.program_id(0)`` the core, whether the degree came from NEURON_LOGICAL_NC_CONFIG or
    from a (deprecated) bracket launch ``kernel[2]``. ``nl.program_ndim()`` counts grid axes
    (0 without a grid) and says nothing about the number of cores, so it is not used as a
    gate. Only an NKI front end that refuses ``num_programs`` without a grid (the pre-0.7
    model, where such a launch ran a single program) falls back to (1, 0).
    """
    from nkilib_msda._nki import nl

    try:
        lnc, core = int(nl.num_programs()), int(nl.program_id(0))
    except Exception:  # noqa: BLE001 - pre-0.7 model: no grid means one program
        if nl.program_ndim() != 0:
            raise
        return 1, 0
    if not 1 <= lnc <= MAX_LNC or not 0 <= core < lnc:
        raise ValueError(f"LNC: expected degree 1 or 2 and a core below it, got degree {lnc}, "
                         f"core {core}")
    return lnc, core


def _barrier_function() -> Any:
    """nki.lnc.core_barrier (NKI 0.8+), else the older nki.isa.core_barrier."""
    from nkilib_msda._nki import nisa, nki

    lnc_module = getattr(nki, "lnc", None)
    barrier = getattr(lnc_module, "core_barrier", None)
    return barrier if barrier != None else nisa.core_barrier  # noqa: E711


def core_barrier(data: Any, lnc: int) -> None:
    """Wait until both cores of an LNC=2 kernel reached this point for writes to ``data``.

    ``data`` is a shared-HBM tensor both cores write; call once per such tensor. At LNC 1
    there is no other core of this kernel to wait for, so nothing is issued (the 0.8 API
    allows a barrier at LNC 1, but it would only pair with an unrelated neighbour core).
    Only ``cores=(0, 1)`` is supported by the API.
    """
    if lnc > 1:
        _barrier_function()(data=data, cores=(0, 1))


def usable_sbuf_bytes() -> int:
    """Usable SBUF bytes per partition of the running target: ``nl.tile_size.sbuf_fmax_bytes``
    (``total_available_sbuf_size`` is its deprecated name)."""
    from nkilib_msda._nki import nl

    size = getattr(nl.tile_size, "sbuf_fmax_bytes", None)
    if size == None:  # noqa: E711
        size = nl.tile_size.total_available_sbuf_size
    return int(size)
