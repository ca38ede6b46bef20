"""Helpers for the core/DMA/jit emulator tests."""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, nki, simulate


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
