"""NumPy float64 references (the oracle every backend is tested against)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ms_deformable_attention_ref": "nkilib_msda.reference.msda",
    "ms_deformable_attention_bwd_ref": "nkilib_msda.reference.msda",
    "block_attn_res_ref": "nkilib_msda.reference.block_attn_res",
    "block_attn_res_backward_ref": "nkilib_msda.reference.block_attn_res",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nkilib_msda.reference' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
