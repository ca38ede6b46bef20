"""Shared helpers of the instruction-group conformance tests (tests written from the NKI 0.8
pages' stated semantics; each test cites its page)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from nkilib_msda.simulator import nisa, nki, nl, simulate

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/"


def run(body: Callable[..., Any], *arrays: np.ndarray, **kw: Any) -> Any:
    """Run ``body(*hbm_inputs)`` as an NKI kernel in the emulator."""
    names = [f"a{i}" for i in range(len(arrays))]
    src = f"def kernel({', '.join(names)}):\n    return body({', '.join(names)})\n"
    scope: dict[str, Any] = {"body": body}
    exec(src, scope)
    return simulate(nki.jit(scope["kernel"]), **kw)(*arrays)


def load(h: Any, dtype: Any = None) -> Any:
    t = nl.ndarray(h.shape, dtype or h.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=h)
    return t


def store(t: Any) -> Any:
    o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o
