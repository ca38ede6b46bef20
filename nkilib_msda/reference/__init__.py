"""NumPy float64 references (the oracle every backend is tested against)."""

from __future__ import annotations

from nkilib_msda._lazy import lazy_exports
_LAZY = {
    "ms_deformable_attention_ref": "nkilib_msda.reference.msda",
    "ms_deformable_attention_bwd_ref": "nkilib_msda.reference.msda",
    "block_attn_res_ref": "nkilib_msda.reference.block_attn_res",
    "block_attn_res_backward_ref": "nkilib_msda.reference.block_attn_res",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
