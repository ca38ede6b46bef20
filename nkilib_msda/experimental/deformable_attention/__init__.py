"""Multi-scale deformable attention NKI kernels (forward and backward)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ms_deformable_attention": "nkilib_msda.experimental.deformable_attention.ms_deformable_attention",
    "ms_deformable_attention_bwd": "nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
