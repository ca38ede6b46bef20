"""nkilib_msda: multi-scale deformable attention kernels for Trainium (NKI), CPU and NVIDIA.

The NumPy parts (reference, validation, simulator, NKI kernels) need only numpy and
ml_dtypes. The torch-facing names below are imported lazily, so ``import nkilib_msda``
works without torch installed.
"""

from __future__ import annotations

from nkilib_msda._lazy import lazy_exports
from nkilib_msda._version import __version__

_LAZY = {
    "multi_scale_deformable_attention": "nkilib_msda.pytorch.functional",
    "MSDeformAttnFunction": "nkilib_msda.pytorch.modules",
    "MSDeformAttn": "nkilib_msda.pytorch.modules",
    "MultiScaleDeformableAttention": "nkilib_msda.pytorch.modules",
    "patch_transformers_model": "nkilib_msda.pytorch.hf",
}

__all__ = ["__version__", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
