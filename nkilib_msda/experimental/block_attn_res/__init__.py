"""Block Attention Residuals (docs/block_attn_res.md): NKI kernels, validation, tiling, torch API.

``block_attn_res`` / ``block_attn_res_backward`` are the torch-level functions of docs/api.md
(imported lazily, so the kernels and plans work without torch); ``block_attn_res_fwd`` /
``block_attn_res_bwd`` are the NKI kernels on the source-major [L, B*T, D] layout.
"""

from __future__ import annotations

from nkilib_msda._lazy import lazy_exports

# Kernels, plans and validators need no torch: import them eagerly (this also binds the kernel
# names over their same-named submodules). The torch-level functions stay lazy.
from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.experimental.block_attn_res.tiling import plan_backward, plan_forward
from nkilib_msda.experimental.block_attn_res.validation import (
    validate_block_attn_res_args, validate_block_attn_res_backward_args)

_LAZY = {
    "block_attn_res": "nkilib_msda.pytorch.block_attn_res_ops",
    "block_attn_res_backward": "nkilib_msda.pytorch.block_attn_res_ops",
}

__all__ = [*_LAZY, "block_attn_res_fwd", "block_attn_res_bwd", "plan_forward", "plan_backward",
           "validate_block_attn_res_args", "validate_block_attn_res_backward_args"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
