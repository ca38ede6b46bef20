"""The one bridge between torch tensors and NumPy arrays, bfloat16 included.

NumPy has no bfloat16; ``ml_dtypes.bfloat16`` is the NumPy dtype of the same bits, so a bf16
tensor crosses as its 16-bit pattern (``view(torch.int16)`` / ``view(np.int16)``), bit for bit.
torch is imported only inside the functions that take or return a tensor, so NumPy callers
(the references, the emulator without torch) never load it.

- :func:`to_numpy`: tensor (any device, any float dtype) -> NumPy array of the same dtype, a
  fresh copy;
- :func:`to_torch`: NumPy array (ml_dtypes bfloat16 included) -> torch tensor of the same dtype
  on ``device``, a fresh copy (float8 arrays, which torch's CPU kernels barely cover, become
  float32);
- :func:`as_float64`: array or tensor -> float64 NumPy copy (the references' and the error
  metric's input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["to_numpy", "to_torch", "as_float64"]


def _is_tensor(x: Any) -> bool:
    """A torch tensor (tested without importing torch)."""
    return hasattr(x, "detach") and hasattr(x, "cpu")


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor's values as a contiguous NumPy array of the same dtype (a copy)."""
    import ml_dtypes
    import torch

    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def to_torch(a: np.ndarray, device: Any = None) -> Any:
    """A NumPy array as a torch tensor of the same dtype on ``device`` (a copy); float8 arrays
    become float32."""
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    elif a.dtype.name.startswith("float8"):
        t = torch.from_numpy(a.astype(np.float32))
    else:
        t = torch.from_numpy(a.copy())
    return t if device is None else t.to(device)


def as_float64(x: Any) -> np.ndarray:
    """Float64 NumPy copy of an array-like: NumPy (ml_dtypes included) or a torch tensor on any
    device, bfloat16 and ``requires_grad`` ones included."""
    if _is_tensor(x):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)
