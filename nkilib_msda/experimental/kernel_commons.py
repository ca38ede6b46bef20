"""Launch helpers shared by every NKI kernel of the package, and the hardware facts they use.

The facts are defined once in :mod:`nkilib_msda.hardware` (plain Python; the planners import
them from there, without NKI) and re-exported here for the kernels; the functions run inside
a kernel and import NKI lazily. See docs/kernels.md, "Kernel commons".

LNC: https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html
and https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda.hardware import (DMA_TRANSPOSE_MAX_FREE, DTYPE_BYTES, FP32_EXACT_INT_MAX, MAX_LNC,
                                  PARTITIONS, PLANNER_SBUF_BUDGET, PSUM_BANK_BYTES, PSUM_BANK_FP32,
                                  PSUM_BANKS, PSUM_BYTES, planner_sbuf_budget)

# Kernel-path code compares with ``== None``: the package's test suites still run the
# emulator's pre-0.7 source rules, which reject ``is``.

__all__ = [
    "PARTITIONS", "PSUM_BANK_BYTES", "PSUM_BANKS", "PSUM_BYTES", "PSUM_BANK_FP32",
    "FP32_EXACT_INT_MAX", "DTYPE_BYTES", "PLANNER_SBUF_BUDGET", "MAX_LNC", "DMA_TRANSPOSE_MAX_FREE",
    "core_info", "core_barrier", "usable_sbuf_bytes", "kernel_sbuf_budget",
    "explain_argument_errors",
]


def explain_argument_errors(kernel: Any, check: Any) -> None:
    """Give ``kernel`` (an ``nki.jit`` kernel) an argument check for the emulator.

    The emulator turns the caller's arrays into kernel tensors before the kernel runs and
    rejects some of them there (an empty tensor: NKI tensors hold at least one element), so
    the kernel's own validation, which would explain why (N_l = 0: ``spatial_shapes``), never
    runs. When that conversion fails, the emulator calls ``check`` with the caller's arguments
    first, and its error is the one raised (``JitKernel.set_argument_check``). Valid calls never
    run it. A real ``nki.jit`` kernel, which has no such method, is left as it is."""
    set_check = getattr(kernel, "set_argument_check", None)
    if callable(set_check):
        set_check(check)


def core_info() -> tuple[int, int]:
    """(LNC degree, this physical core's index) inside a running kernel.

    The NKI 0.7+ idiom from the LNC page: ``nl.num_programs()`` is the LNC degree and
    ``nl.program_id(0)`` the core, whether the degree came from NEURON_LOGICAL_NC_CONFIG or
    from a (deprecated) bracket launch ``kernel[2]`` ("If LNC is not being used, this API will
    return 1"). ``nl.program_ndim()`` counts grid axes (0 without a grid) and says nothing
    about the number of cores, so it is not used as a gate.
    """
    from nkilib_msda._nki import nl

    lnc, core = int(nl.num_programs()), int(nl.program_id(0))
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
    (its deprecated name ``total_available_sbuf_size`` is not used)."""
    from nkilib_msda._nki import nl

    return int(nl.tile_size.sbuf_fmax_bytes)


def kernel_sbuf_budget() -> int:
    """The planners' SBUF budget on the running target: :func:`usable_sbuf_bytes` minus the
    one planner reserve (:data:`nkilib_msda.hardware.PLANNER_SBUF_RESERVE_BYTES`)."""
    return planner_sbuf_budget(usable_sbuf_bytes())
