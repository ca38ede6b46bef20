"""Block Attention Residuals (block-attn-res.md): NKI kernels, validation, tiling, torch API.

``block_attn_res`` / ``block_attn_res_backward`` are the torch-level functions of api.md section 7
(imported lazily, so the kernels and plans work without torch); ``block_attn_res_fwd`` /
``block_attn_res_bwd`` are the NKI kernels on the source-major [L, B*T, D] layout.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "block_attn_res": "nkilib_msda.pytorch.block_attn_res",
    "block_attn_res_backward": "nkilib_msda.pytorch.block_attn_res",
    "block_attn_res_fwd": "nkilib_msda.experimental.block_attn_res.block_attn_res_fwd",
    "block_attn_res_bwd": "nkilib_msda.experimental.block_attn_res.block_attn_res_bwd",
    "plan_forward": "nkilib_msda.experimental.block_attn_res.tiling",
    "plan_backward": "nkilib_msda.experimental.block_attn_res.tiling",
    "validate_block_attn_res_args": "nkilib_msda.experimental.block_attn_res.validation",
    "validate_block_attn_res_backward_args": "nkilib_msda.experimental.block_attn_res.validation",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
