"""Block Attention Residuals NKI kernels (docs/block_attn_res.md) on the source-major
[L, B*T, D] layout: ``block_attn_res_fwd`` and ``block_attn_res_bwd``.

The kernels are imported on first use, so the planner (``tiling``) imports without NKI or the
emulator. The torch functions ``block_attn_res`` / ``block_attn_res_backward`` live in
:mod:`nkilib_msda.pytorch` (also exported by ``nkilib_msda``); this package still answers them,
deprecated, because docs/api.md listed this import path first.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from nkilib_msda._lazy import lazy_exports

_LAZY = {
    "block_attn_res_fwd": "nkilib_msda.experimental.block_attn_res.block_attn_res_fwd",
    "block_attn_res_bwd": "nkilib_msda.experimental.block_attn_res.block_attn_res_bwd",
}
# Deprecated aliases of the torch API (the one upward import of a kernel package, lazy).
_TORCH_API = {"block_attn_res", "block_attn_res_backward"}
_TORCH_API_MODULE = "nkilib_msda.pytorch.block_attn_res_ops"

__all__ = list(_LAZY)

_kernel_getattr, __dir__ = lazy_exports(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name in _TORCH_API:
        warnings.warn(f"nkilib_msda.experimental.block_attn_res.{name} is deprecated: import it "
                      f"from nkilib_msda (or nkilib_msda.pytorch)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_TORCH_API_MODULE), name)
    return _kernel_getattr(name)
