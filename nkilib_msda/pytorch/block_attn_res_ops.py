"""Torch API for Block Attention Residuals (docs/api.md, docs/block_attn_res.md).

- ``block_attn_res`` / ``block_attn_res_backward``: the PyPTO argument lists, flag-dependent
  returns and ValueError conditions, plus ``backend=`` ("reference", "nki"; None = auto).
- Registered ops ``torch.ops.nkilib_msda.block_attn_res`` (values [L, B, T, D] -> h [B, T, D],
  rms [B, T, L, 1] (or an empty tensor without RMSNorm), alpha [B, T, L]) and
  ``torch.ops.nkilib_msda.block_attn_res_backward`` (-> grad_values [L, B, T, D], grad_w [D],
  grad_gamma [D] or empty), with fake kernels, autograd, a PrivateUse1 (``neuron``) kernel and
  autocast kernels that run them with autocast off: ``block_attn_res`` is differentiable.
- Backends come from the registry shared with MSDA (:mod:`nkilib_msda.backends`): "reference"
  is closed-form torch (any device; fp32 inside, fp64 for fp64 inputs, which gradcheck uses);
  "nki" runs the NKI kernels (in the emulator for CPU tensors, on TorchNeuron's device
  otherwise; LNC degree from ``NEURON_LOGICAL_NC_CONFIG``). Selection follows the MSDA rules
  (:func:`nkilib_msda.pytorch.dispatch.select_block_attn_res_backend`).
- Caches are fp32 (fp64 for fp64 inputs). Gradients do not flow through the rms/alpha outputs.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from nkilib_msda.backends import BLOCK_ATTN_RES_BACKENDS, get_backend
from nkilib_msda.validation.block_attn_res import (
    KERNEL_DTYPES, validate_block_attn_res_args, validate_block_attn_res_backward_args)
from nkilib_msda.pytorch._modes import autocast_disabled
from nkilib_msda.pytorch.dispatch import AUTO, select_block_attn_res_backend
from nkilib_msda.pytorch.ops import register_autocast_passthrough

__all__ = ["block_attn_res", "block_attn_res_backward", "BACKENDS", "select_backend"]

BACKENDS = BLOCK_ATTN_RES_BACKENDS
_ALL_DTYPES = (*KERNEL_DTYPES, "float64")


def select_backend(backend: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """Explicit argument, else ``NKILIB_MSDA_BACKEND`` (if it names a Block AttnRes backend),
    else by device (TorchNeuron's device -> "nki", otherwise "reference"). An explicit "nki"
    that cannot run raises ValueError; the automatic choice falls back to "reference"."""
    return select_block_attn_res_backend(backend, device, dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _backend_module(backend: str, values: Tensor) -> Any:
    name = select_backend(None if backend == AUTO else backend, values.device, values.dtype)
    return get_backend(name)


# ---------------------------------------------------------------- registered ops


def _block_attn_res_impl(values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Optional[Tensor],
                      scale: float, rmsnorm_eps: float, enable_rmsnorm: bool,
                      backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """values [L, B, T, D] -> (h [B, T, D], rms [B, T, L, 1] or empty, alpha [B, T, L])."""
    with autocast_disabled(values.device.type):
        module = _backend_module(backend, values)
        return module.block_attn_res_forward(values, proj_weight, rmsnorm_gamma, scale,
                                             rmsnorm_eps, enable_rmsnorm)


block_attn_res_op = torch.library.custom_op("nkilib_msda::block_attn_res", _block_attn_res_impl,
                                            mutates_args=())


@block_attn_res_op.register_fake
def _block_attn_res_fake(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm,
                         backend="auto"):
    n_src, b, t, d = values.shape
    cd = _compute_dtype(values.dtype)
    rms_shape = (b, t, n_src, 1) if enable_rmsnorm else (0,)
    return (values.new_empty((b, t, d)), values.new_empty(rms_shape, dtype=cd),
            values.new_empty((b, t, n_src), dtype=cd))


def _block_attn_res_backward_impl(grad_h: Tensor, values: Tensor, proj_weight: Tensor, alpha: Tensor,
                               rmsnorm_gamma: Optional[Tensor], rms: Optional[Tensor], scale: float,
                               enable_rmsnorm: bool, backend: str = "auto"
                               ) -> tuple[Tensor, Tensor, Tensor]:
    """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] (empty without RMSNorm))."""
    with autocast_disabled(values.device.type):
        module = _backend_module(backend, values)
        return module.block_attn_res_backward(grad_h, values, proj_weight, alpha, rmsnorm_gamma,
                                              rms, scale, enable_rmsnorm)


block_attn_res_backward_op = torch.library.custom_op(
    "nkilib_msda::block_attn_res_backward", _block_attn_res_backward_impl, mutates_args=())


@block_attn_res_backward_op.register_fake
def _block_attn_res_backward_fake(grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, scale,
                                  enable_rmsnorm, backend="auto"):
    grad_gamma = (proj_weight.new_empty(rmsnorm_gamma.shape, dtype=rmsnorm_gamma.dtype)
                  if enable_rmsnorm else proj_weight.new_empty((0,)))
    return values.new_empty(values.shape), proj_weight.new_empty(proj_weight.shape), grad_gamma


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    values, proj_weight, rmsnorm_gamma, scale, _eps, enable_rmsnorm, backend = inputs
    _h, rms, alpha = output
    ctx.save_for_backward(values, proj_weight, rmsnorm_gamma, rms, alpha)
    ctx.scale, ctx.enable_rmsnorm, ctx.backend = scale, enable_rmsnorm, backend
    ctx.mark_non_differentiable(rms, alpha)


def _backward(ctx: Any, grad_h: Tensor, _grad_rms: Tensor, _grad_alpha: Tensor) -> tuple:
    values, proj_weight, rmsnorm_gamma, rms, alpha = ctx.saved_tensors
    rms_on = ctx.enable_rmsnorm
    grad_values, grad_w, grad_gamma = block_attn_res_backward_op(
        grad_h.contiguous(), values, proj_weight, alpha, rmsnorm_gamma, rms if rms_on else None,
        ctx.scale, rms_on, ctx.backend)
    if rmsnorm_gamma is None:
        grad_gamma = None
    elif not rms_on:
        grad_gamma = torch.zeros_like(rmsnorm_gamma)  # gamma is unused without RMSNorm
    return grad_values, grad_w, grad_gamma, None, None, None, None


block_attn_res_op.register_autograd(_backward, setup_context=_setup_context)

# TorchNeuron's device (PrivateUse1) and autocast: as for the MSDA operators (ops.py).
block_attn_res_op.register_kernel("privateuseone")(_block_attn_res_impl)
block_attn_res_backward_op.register_kernel("privateuseone")(_block_attn_res_backward_impl)
_LIB = torch.library.Library("nkilib_msda", "FRAGMENT")  # noqa: TOR901 - keys custom_op lacks
register_autocast_passthrough(_LIB, "block_attn_res")
register_autocast_passthrough(_LIB, "block_attn_res_backward")


# ---------------------------------------------------------------- public functions


def _stack(blocks: Sequence[Tensor], partial_block: Tensor | None) -> Tensor:
    """Source-major values [L, B, T, D] (the kernels' layout; differentiable)."""
    return torch.stack([*blocks, *([] if partial_block is None else [partial_block])], dim=0)


def block_attn_res(blocks: Sequence[Tensor], proj_weight: Tensor, partial_block: Tensor | None = None,
                   scale: float = 1.0, rmsnorm_eps: float = 1e-6,
                   rmsnorm_gamma: Tensor | None = None, enable_rmsnorm: bool = True,
                   rms_out_flag: bool = False, alpha_out_flag: bool = False, *,
                   backend: str | None = None) -> Tensor | tuple[Tensor, ...]:
    """h = sum_l softmax_l(z)_l v_l over the N blocks (+ partial block); see docs/block_attn_res.md.

    Returns ``h`` [B, T, D] in the blocks' dtype, plus ``rms`` [B, T, L, 1] and/or ``alpha``
    [B, T, L] (fp32) when ``rms_out_flag`` / ``alpha_out_flag``: ``h``, ``(h, rms)``,
    ``(h, alpha)`` or ``(h, rms, alpha)``. Differentiable in blocks, partial, weight and gamma.
    """
    validate_block_attn_res_args(blocks, proj_weight, partial_block, scale, rmsnorm_eps,
                                 rmsnorm_gamma, enable_rmsnorm, rms_out_flag,
                                 allowed_dtypes=_ALL_DTYPES)
    name = select_backend(backend, blocks[0].device, blocks[0].dtype)
    h, rms, alpha = block_attn_res_op(_stack(blocks, partial_block), proj_weight, rmsnorm_gamma,
                                      float(scale), float(rmsnorm_eps), bool(enable_rmsnorm), name)
    extras = ([rms] if rms_out_flag else []) + ([alpha] if alpha_out_flag else [])
    return (h, *extras) if extras else h


def block_attn_res_backward(grad_h: Tensor, blocks: Sequence[Tensor], proj_weight: Tensor,
                            alpha_cache: Tensor, partial_block: Tensor | None = None,
                            rmsnorm_gamma: Tensor | None = None, rms_cache: Tensor | None = None,
                            scale: float = 1.0, enable_rmsnorm: bool = True, *,
                            backend: str | None = None) -> tuple:
    """Gradients from the forward's caches: ``(grad_blocks list, grad_partial or None, grad_w)``,
    plus ``grad_gamma`` with RMSNorm; each in its input's dtype."""
    validate_block_attn_res_backward_args(grad_h, blocks, proj_weight, alpha_cache, partial_block,
                                          rmsnorm_gamma, rms_cache, scale, enable_rmsnorm,
                                          allowed_dtypes=_ALL_DTYPES)
    name = select_backend(backend, blocks[0].device, blocks[0].dtype)
    with torch.no_grad():
        grad_values, grad_w, grad_gamma = block_attn_res_backward_op(
            grad_h.contiguous(), _stack(blocks, partial_block), proj_weight, alpha_cache,
            rmsnorm_gamma if enable_rmsnorm else None, rms_cache if enable_rmsnorm else None,
            float(scale), bool(enable_rmsnorm), name)
    n_blocks = len(blocks)
    grad_blocks = list(grad_values[:n_blocks].unbind(0))
    grad_partial = grad_values[n_blocks] if partial_block is not None else None
    if enable_rmsnorm:
        return grad_blocks, grad_partial, grad_w, grad_gamma
    return grad_blocks, grad_partial, grad_w
