"""nkilib_msda: multi-scale deformable attention kernels for Trainium (NKI), CPU and NVIDIA.

The NumPy parts (reference, validation, emulator, NKI kernels) need only numpy and
ml_dtypes, so ``import nkilib_msda`` works without torch and does not import it. When torch is
installed, the operators ``torch.ops.nkilib_msda.*`` (MSDA and Block AttnRes) are registered as
soon as both are imported, in either order, so a program saved with ``torch.export`` loads in a
process that only imports nkilib_msda and torch. The torch-facing names below are imported
lazily.
"""

from __future__ import annotations

from nkilib_msda._lazy import alias_modules, lazy_exports
from nkilib_msda._torch_ops import register_torch_ops_when_available
from nkilib_msda._version import __version__

_LAZY = {
    "multi_scale_deformable_attention": "nkilib_msda.pytorch.functional",
    "multi_scale_deformable_attention_v2": "nkilib_msda.pytorch.msda_v2",
    "MSDeformAttnFunction": "nkilib_msda.pytorch.modules",
    "MSDeformAttn": "nkilib_msda.pytorch.modules",
    "MultiScaleDeformableAttention": "nkilib_msda.pytorch.modules",
    "patch_transformers_model": "nkilib_msda.pytorch.hf",
    "register_hf_kernels": "nkilib_msda.pytorch.hf_kernels",
    "block_attn_res": "nkilib_msda.pytorch.block_attn_res_ops",
    "block_attn_res_backward": "nkilib_msda.pytorch.block_attn_res_ops",
}

__all__ = ["__version__", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

# Modules that moved under ``pytorch/``: their old names import the same module objects.
alias_modules({
    "nkilib_msda.mmcv": "nkilib_msda.pytorch.mmcv",
    "nkilib_msda.buckets": "nkilib_msda.pytorch.buckets",
})

register_torch_ops_when_available()
