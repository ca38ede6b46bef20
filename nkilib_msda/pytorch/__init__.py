"""PyTorch layer of nkilib_msda: registered operators, the functional API, backend dispatch,
Deformable-DETR / HF transformers drop-ins, the HF kernel hub registration, the TorchNeuron
(``neuron`` device) path and the Block Attention Residuals functions. See docs/torch.md.

Named ``pytorch`` so that it never shadows the ``torch`` package.
"""

from __future__ import annotations

from nkilib_msda._lazy import lazy_exports
from nkilib_msda.pytorch.block_attn_res_ops import block_attn_res, block_attn_res_backward
from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.modules import MSDeformAttn, MSDeformAttnFunction, MultiScaleDeformableAttention
from nkilib_msda.pytorch.msda_v2 import multi_scale_deformable_attention_v2

_LAZY = {  # these need transformers / kernels only when used
    "patch_transformers_model": "nkilib_msda.pytorch.hf",
    "register_hf_kernels": "nkilib_msda.pytorch.hf_kernels",
}

__all__ = ["multi_scale_deformable_attention", "multi_scale_deformable_attention_v2", "MSDeformAttn", "MSDeformAttnFunction",
           "MultiScaleDeformableAttention", "block_attn_res", "block_attn_res_backward", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
