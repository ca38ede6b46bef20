"""PyTorch layer of nkilib_msda: registered operators, the functional API, backend dispatch,
Deformable-DETR / HF transformers drop-ins, the HF kernel hub registration and the TorchNeuron
(``neuron`` device) path. See docs/torch.md.

Named ``pytorch`` so that it never shadows the ``torch`` package.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.modules import MSDeformAttn, MSDeformAttnFunction, MultiScaleDeformableAttention

__all__ = ["multi_scale_deformable_attention", "MSDeformAttn", "MSDeformAttnFunction",
           "MultiScaleDeformableAttention", "patch_transformers_model", "register_hf_kernels"]


def __getattr__(name: str) -> Any:
    if name == "patch_transformers_model":
        from nkilib_msda.pytorch.hf import patch_transformers_model

        return patch_transformers_model
    if name == "register_hf_kernels":
        from nkilib_msda.pytorch.hf_kernels import register_hf_kernels

        return register_hf_kernels
    raise AttributeError(f"module 'nkilib_msda.pytorch' has no attribute {name!r}")
