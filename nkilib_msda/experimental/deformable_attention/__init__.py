"""Multi-scale deformable attention NKI kernels (forward and backward).

The kernels are imported on first use, so the planners of this package
(``forward_config``, ``backward_config``) import without NKI or the emulator.
"""

from __future__ import annotations

from nkilib_msda._lazy import lazy_exports

_LAZY = {
    "ms_deformable_attention": "nkilib_msda.experimental.deformable_attention.ms_deformable_attention",
    "ms_deformable_attention_bwd": "nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
