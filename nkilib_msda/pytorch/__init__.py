"""PyTorch layer of nkilib_msda: registered operators, the functional API, backend dispatch,
Deformable-DETR / HF transformers drop-ins and the torch-neuronx glue.

Named ``pytorch`` so that it never shadows the ``torch`` package.
"""

from __future__ import annotations

from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.modules import MSDeformAttn, MSDeformAttnFunction, MultiScaleDeformableAttention

__all__ = ["multi_scale_deformable_attention", "MSDeformAttn", "MSDeformAttnFunction",
           "MultiScaleDeformableAttention", "patch_transformers_model"]


def __getattr__(name: str):
    if name == "patch_transformers_model":
        from nkilib_msda.pytorch.hf import patch_transformers_model

        return patch_transformers_model
    raise AttributeError(f"module 'nkilib_msda.pytorch' has no attribute {name!r}")
