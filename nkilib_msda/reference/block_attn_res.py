"""NumPy float64 reference for Block Attention Residuals (math: docs/block_attn_res.md).

Layouts: ``blocks`` is a sequence of N arrays [B, T, D]; with ``partial_block`` [B, T, D] the
sources are the N blocks followed by the partial sum (L = N + 1), otherwise L = N. ``proj_weight``
and ``rmsnorm_gamma`` are [D]. Inputs may be any float dtype (NumPy, ml_dtypes or torch); they are
upcast to float64 and every result is float64 (the oracle keeps full precision; callers compare
their own rounded outputs against it).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, TypeVar, cast

import numpy as np

from nkilib_msda.validation.arrays import as_float64

__all__ = ["block_attn_res_ref", "block_attn_res_backward_ref", "stack_sources"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _quiet(func: _F) -> _F:
    """Run ``func`` with NumPy floating-point warnings off (also under ``np.seterr(all="raise")``):
    underflow of tiny terms and exp(-large) is exact enough, and NaN or inf inputs propagate to
    the results, which is how the oracle reports them."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return func(*args, **kwargs)
    return cast(_F, wrapper)


def stack_sources(blocks: Sequence[Any], partial_block: Any = None) -> np.ndarray:
    """Stack the sources token-major: [B, T, L, D] float64."""
    if len(blocks) == 0:
        raise ValueError("blocks: expected at least one block, got an empty sequence")
    sources = [as_float64(b) for b in blocks]
    if partial_block is not None:
        sources.append(as_float64(partial_block))
    return np.stack(sources, axis=2)


def _scores(v: np.ndarray, w: np.ndarray, gamma: np.ndarray | None, scale: float, eps: float,
            enable_rmsnorm: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """Return (z [B,T,L], r [B,T,L] or None, x_hat [B,T,L,D] or None, u [D])."""
    if enable_rmsnorm:
        if gamma is None:
            raise ValueError("rmsnorm_gamma: required when enable_rmsnorm=True, got None")
        # Scale by m = max(max|v|, 1) before squaring so that no finite input overflows (float64
        # squares overflow only above 1.3e154, but the oracle should not have a range limit).
        m = np.maximum(np.max(np.abs(v), axis=-1), 1.0)
        vs = v / m[..., None]
        r = m * np.sqrt(np.mean(vs * vs, axis=-1) + eps / m / m)
        x_hat = v / r[..., None]
        u = scale * gamma * w
        return x_hat @ u, r, x_hat, u
    u = scale * w
    return v @ u, None, None, u


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@_quiet
def block_attn_res_ref(blocks: Sequence[Any], proj_weight: Any, partial_block: Any = None,
                       scale: float = 1.0, rmsnorm_eps: float = 1e-6, rmsnorm_gamma: Any = None,
                       enable_rmsnorm: bool = True
                       ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Forward: ``h`` [B, T, D], ``rms`` [B, T, L, 1] (None without RMSNorm), ``alpha`` [B, T, L].

    ``rms`` is the denominator r = sqrt(mean(v^2) + eps), not its reciprocal.
    """
    v = stack_sources(blocks, partial_block)
    w = as_float64(proj_weight)
    gamma = None if rmsnorm_gamma is None else as_float64(rmsnorm_gamma)
    z, r, _, _ = _scores(v, w, gamma, float(scale), float(rmsnorm_eps), enable_rmsnorm)
    alpha = _softmax(z)
    h = np.matmul(alpha[..., None, :], v)[..., 0, :]
    return h, (None if r is None else r[..., None]), alpha


@_quiet
def block_attn_res_backward_ref(grad_h: Any, blocks: Sequence[Any], proj_weight: Any,
                                partial_block: Any = None, rmsnorm_gamma: Any = None,
                                scale: float = 1.0, rmsnorm_eps: float = 1e-6,
                                enable_rmsnorm: bool = True
                                ) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray,
                                           np.ndarray | None]:
    """Backward by the closed forms, recomputed from the inputs (no caches).

    Returns (grad_blocks: N arrays [B, T, D], grad_partial_block [B, T, D] or None,
    grad_proj_weight [D], grad_rmsnorm_gamma [D] or None (None without RMSNorm)).
    """
    v = stack_sources(blocks, partial_block)
    dh = as_float64(grad_h)
    w = as_float64(proj_weight)
    gamma = None if rmsnorm_gamma is None else as_float64(rmsnorm_gamma)
    s = float(scale)
    z, r, x_hat, u = _scores(v, w, gamma, s, float(rmsnorm_eps), enable_rmsnorm)
    alpha = _softmax(z)
    d_alpha = np.matmul(v, dh[..., None])[..., 0]
    g = alpha * (d_alpha - np.sum(alpha * d_alpha, axis=-1, keepdims=True))  # dLoss/dz
    dv = alpha[..., None] * dh[:, :, None, :]
    grad_gamma = None
    if enable_rmsnorm:
        assert gamma is not None and r is not None and x_hat is not None  # checked by _scores
        dim = v.shape[-1]
        dv += (g / r)[..., None] * (u - x_hat * z[..., None] / dim)
        beta = np.tensordot(g, x_hat, axes=3)
        grad_w = s * gamma * beta
        grad_gamma = s * w * beta
    else:
        dv += g[..., None] * u
        grad_w = s * np.tensordot(g, v, axes=3)
    n_blocks = len(blocks)
    grad_blocks = [dv[:, :, i, :] for i in range(n_blocks)]
    grad_partial = dv[:, :, n_blocks, :] if partial_block is not None else None
    return grad_blocks, grad_partial, grad_w, grad_gamma
