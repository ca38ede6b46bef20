"""Helpers for the compute-instruction tests: run a small body inside a simulated kernel.

Inputs are moved between HBM and on-chip tiles with direct (uncounted) writes so that the
compute tests do not depend on the DMA instructions.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from _core_helpers import randn
from nkilib_msda.simulator import access, nki, nl, simulate

__all__ = ["load", "store", "run", "rng", "randn", "fp32_tiles"]


def load(h: Any, dtype: Any = None, buffer: Any = None, shape: Any = None) -> Any:
    """Copy an HBM tensor into a new on-chip tile (cast to ``dtype`` with the NKI rules)."""
    t = nl.ndarray(tuple(shape or h.shape), dtype=dtype or h.dtype, buffer=buffer or nl.sbuf)
    access.write(t, access.read(h, "test.load").reshape(-1), "test.load")
    return t


def fp32_tiles(*shapes: tuple[int, ...]) -> list[Any]:
    """One new float32 SBUF tile per shape, in order."""
    return [nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf) for shape in shapes]


def store(t: Any) -> Any:
    """Copy an on-chip tile into a new shared_hbm tensor of the same shape and dtype."""
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    access.write(out, access.read(t, "test.store"), "test.store")
    return out


def run(body: Callable[..., Any], *arrays: np.ndarray, target: str = "trn2",
        report: bool = False) -> Any:
    """Run ``body(*hbm_inputs)`` in a kernel; it returns one tile or a tuple of tiles, which
    come back as NumPy arrays (plus the cost report when ``report``)."""
    n = len(arrays)

    def kernel(a0=None, a1=None, a2=None, a3=None, a4=None):
        outs = body(*(a0, a1, a2, a3, a4)[:n])
        if isinstance(outs, tuple):
            return tuple(store(t) for t in outs)
        return store(outs)

    kernel.__name__ = getattr(body, "__name__", "kernel")
    return simulate(nki.jit(kernel), target=target, report=report)(*arrays)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)
