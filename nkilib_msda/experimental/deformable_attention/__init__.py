"""Multi-scale deformable attention NKI kernels (forward and backward).

The kernels are imported eagerly (they need only numpy and ml_dtypes through the emulator):
binding the names here also guarantees that ``ms_deformable_attention`` is the kernel, not its
same-named submodule, whatever was imported first.
"""

from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import ms_deformable_attention
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import (
    ms_deformable_attention_bwd)

__all__ = ["ms_deformable_attention", "ms_deformable_attention_bwd"]
