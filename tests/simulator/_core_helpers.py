"""Helpers for the core/DMA/jit emulator tests."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, nisa, nki, nl, simulate


def in_kernel(body: Callable[..., Any], *arrays: np.ndarray, **sim_kwargs: Any) -> Any:
    """Run ``body(*hbm_inputs)`` as a kernel body (returns whatever simulate returns)."""
    names = [f"a{i}" for i in range(len(arrays))]
    src = f"def kernel({', '.join(names)}):\n    return body({', '.join(names)})\n"
    scope: dict[str, Any] = {"body": body}
    exec(src, scope)  # a kernel signature without *args (which NKI rejects)
    return simulate(nki.jit(scope["kernel"]), **sim_kwargs)(*arrays)


def raises_rule(instruction: str, rule: str):
    """``pytest.raises(NkiError)`` whose message starts with ``instruction: rule``."""
    return pytest.raises(NkiError, match=rf"^{re.escape(instruction)}: {re.escape(rule)}")


def load(h: Any, dtype: Any = None, shape: Any = None) -> Any:
    """An SBUF copy of HBM tensor ``h`` (dma_copy; optional dtype cast / reshape)."""
    t = nl.ndarray(shape or h.shape, dtype or h.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=h)
    return t


def store(t: Any) -> Any:
    """A shared-HBM copy of tile ``t`` (dma_copy), for a kernel to return."""
    o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def randn(gen: np.random.Generator, *shapes: Any) -> tuple[np.ndarray, ...]:
    """Fresh standard-normal float32 arrays of ``shapes``, drawn from ``gen`` in order."""
    return tuple(gen.standard_normal(shape).astype(np.float32) for shape in shapes)


def gather_inputs(gen: np.random.Generator, table_shape: tuple[int, int],
                  index_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A float32 table and int32 row indices into it (the inputs of an indirect gather)."""
    table = gen.standard_normal(table_shape).astype(np.float32)
    return table, gen.integers(0, table_shape[0], index_shape).astype(np.int32)


def gather_rows(table: Any, index_tile: Any, rows: int) -> Any:
    """Indirect gather in a kernel: rows ``index_tile[p, 0]`` of a (N, C) HBM ``table`` into a
    (rows, C) float32 SBUF tile (row p to partition p)."""
    cols = table.shape[1]
    t = nl.ndarray((rows, cols), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=table.ap([[cols, rows], [1, cols]], vector_offset=index_tile))
    return t
