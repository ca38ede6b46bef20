"""Torch API for Block Attention Residuals (api.md section 7, block-attn-res.md sections 2 and 5).

- ``block_attn_res`` / ``block_attn_res_backward``: the PyPTO argument lists, flag-dependent
  returns and ValueError conditions, plus ``backend=`` ("reference", "nki"; None = auto).
- Registered ops ``torch.ops.nkilib_msda.block_attn_res`` (values [L, B, T, D] -> h [B, T, D],
  rms [B, T, L, 1] (or an empty tensor without RMSNorm), alpha [B, T, L]) and
  ``torch.ops.nkilib_msda.block_attn_res_backward`` (-> grad_values [L, B, T, D], grad_w [D],
  grad_gamma [D] or empty), with fake kernels and autograd: ``block_attn_res`` is differentiable.
- Backends: "reference" is a closed-form torch implementation (any device; fp32 inside, fp64 for
  fp64 inputs, which is what gradcheck uses); "nki" runs the NKI kernels (in the simulator for
  CPU tensors, ``NKILIB_MSDA_SIM_LNC`` = 1 or 2 logical cores; natively on Neuron tensors).
- Caches are fp32 (fp64 for fp64 inputs). Gradients do not flow through the rms/alpha outputs.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, cast

import ml_dtypes
import numpy as np
import torch
from torch import Tensor

from nkilib_msda._env import env_choice
from nkilib_msda.backends import BACKEND_NAMES
from nkilib_msda.experimental.block_attn_res.validation import (
    KERNEL_DTYPES, validate_block_attn_res_args, validate_block_attn_res_backward_args)
from nkilib_msda.validation import dtype_name

__all__ = ["block_attn_res", "block_attn_res_backward", "BACKENDS", "select_backend"]

BACKENDS = ("reference", "nki")
BACKEND_ENV_VAR = "NKILIB_MSDA_BACKEND"
LNC_ENV_VAR = "NKILIB_MSDA_SIM_LNC"
_NEURON_DEVICE_TYPES = ("xla", "neuron", "privateuseone")
_ALL_DTYPES = (*KERNEL_DTYPES, "float64")


# ---------------------------------------------------------------- backend selection


def select_backend(backend: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """Explicit argument, else ``NKILIB_MSDA_BACKEND`` (if it names a Block AttnRes backend),
    else by device (Neuron/XLA -> "nki", otherwise "reference"). An explicit "nki" that cannot
    run raises ValueError; the automatic choice falls back to "reference"."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend: expected None or one of {list(BACKENDS)}, got {backend!r}")
    explicit = backend not in (None, "auto")
    if explicit and backend not in BACKENDS:
        raise ValueError(f"backend: expected None, 'auto' or one of {list(BACKENDS)} (there is no "
                         f"{backend!r} path for Block AttnRes), got {backend!r}")
    name = backend if explicit else None
    if name is None:
        env = env_choice(BACKEND_ENV_VAR, ("auto", *BACKEND_NAMES))
        # MSDA-only choices (e.g. "triton") select by device here.
        name = env if env in BACKENDS else ("nki" if device.type in _NEURON_DEVICE_TYPES else "reference")
        explicit = env in BACKENDS
    if name == "nki":
        reason = _nki_unsupported_reason(device, dtype)
        if reason is not None:
            if explicit:
                raise ValueError(f"backend='nki' cannot run this call: {reason}")
            return "reference"
    return name


def _nki_unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type not in ("cpu", *_NEURON_DEVICE_TYPES):
        return f"the NKI kernels take CPU (simulator) or Neuron tensors, got device {device}"
    if dtype_name(dtype) not in KERNEL_DTYPES:
        return f"the NKI kernels take {list(KERNEL_DTYPES)}, got dtype {dtype_name(dtype)}"
    return None


# ---------------------------------------------------------------- reference backend


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _query(w: Tensor, gamma: Tensor | None, scale: float, enable_rmsnorm: bool, cd: torch.dtype) -> Tensor:
    u = scale * w.to(cd)
    return u * cast(Tensor, gamma).to(cd) if enable_rmsnorm else u  # gamma given with RMSNorm


def _reference_forward(values: Tensor, w: Tensor, gamma: Tensor | None, scale: float, eps: float,
                       enable_rmsnorm: bool) -> tuple[Tensor, Tensor, Tensor]:
    cd = _compute_dtype(values.dtype)
    v = values.to(cd)  # [L, B, T, D]
    u = _query(w, gamma, scale, enable_rmsnorm, cd)
    if enable_rmsnorm:
        # Scale rows by m = max(max|v|, 1) before squaring: v^2 overflows fp32 for |v| > 1.8e19
        # (docs/block_attn_res.md, "Numerical range"). r = m * sqrt(mean (v/m)^2 + eps/m^2).
        m = v.abs().amax(-1, keepdim=True).clamp(min=1.0)
        vs = v / m
        r_m = torch.sqrt(vs.square().mean(-1) + eps / m.squeeze(-1).square())  # r / m, [L, B, T]
        z = (torch.einsum("lbtd,d->lbt", vs, u) / r_m).permute(1, 2, 0)
        rms = (m.squeeze(-1) * r_m).permute(1, 2, 0).unsqueeze(-1).contiguous()  # [B, T, L, 1]
    else:
        z = torch.einsum("lbtd,d->btl", v, u)
        rms = values.new_empty((0,), dtype=cd)
    alpha = torch.softmax(z, dim=-1)
    h = torch.einsum("btl,lbtd->btd", alpha, v).to(values.dtype).contiguous()
    return h, rms, alpha.contiguous()


def _reference_backward(grad_h: Tensor, values: Tensor, w: Tensor, alpha: Tensor,
                        gamma: Tensor | None, rms: Tensor | None, scale: float,
                        enable_rmsnorm: bool) -> tuple[Tensor, Tensor, Tensor]:
    cd = _compute_dtype(values.dtype)
    v, dh, a = values.to(cd), grad_h.to(cd), alpha.to(cd)
    u = _query(w, gamma, scale, enable_rmsnorm, cd)
    d_alpha = torch.einsum("btd,lbtd->btl", dh, v)
    g = a * (d_alpha - (a * d_alpha).sum(-1, keepdim=True))  # dLoss/dz
    if enable_rmsnorm:
        r = cast(Tensor, rms).to(cd)[..., 0]  # rms and gamma are given with RMSNorm
        z = torch.einsum("lbtd,d->btl", v, u) / r  # recomputed (caches fix z only up to a constant)
        coef_a = g / r
        coef_b = -coef_a * z / (values.shape[-1] * r)
    else:
        coef_a, coef_b = g, None
    dv = a.permute(2, 0, 1)[..., None] * dh + coef_a.permute(2, 0, 1)[..., None] * u
    if coef_b is not None:
        dv = dv + coef_b.permute(2, 0, 1)[..., None] * v
    beta = torch.einsum("btl,lbtd->d", coef_a, v)
    if enable_rmsnorm:
        gamma = cast(Tensor, gamma)
        grad_w = (scale * gamma.to(cd) * beta).to(w.dtype)
        grad_gamma = (scale * w.to(cd) * beta).to(gamma.dtype)
    else:
        grad_w = (scale * beta).to(w.dtype)
        grad_gamma = w.new_empty((0,))
    return dv.to(values.dtype).contiguous(), grad_w, grad_gamma


# ---------------------------------------------------------------- nki backend


def _to_numpy(t: Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a: np.ndarray, device: torch.device) -> Tensor:
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def _sim_lnc() -> int:
    raw = os.environ.get(LNC_ENV_VAR, "1").strip()
    if raw not in ("1", "2"):
        raise ValueError(f"{LNC_ENV_VAR}: expected 1 or 2, got {raw!r}")
    return int(raw)


def _run_kernel(kernel: Any, tensors: Sequence[Tensor | None], *static: Any) -> tuple[Tensor, ...]:
    """Run an NKI kernel: in the simulator for CPU tensors, natively on Neuron tensors."""
    device = cast(Tensor, tensors[0]).device  # the first tensor is always given
    if device.type == "cpu":
        from nkilib_msda.simulator import simulate

        arrays = [None if t is None else _to_numpy(t) for t in tensors]
        outs = simulate(kernel, lnc=_sim_lnc())(*arrays, *static)
        return tuple(_from_numpy(o, device) for o in outs)
    return tuple(kernel(*tensors, *static))  # pragma: no cover - needs a Neuron device


def _nki_forward(values: Tensor, w: Tensor, gamma: Tensor | None, scale: float, eps: float,
                 enable_rmsnorm: bool) -> tuple[Tensor, Tensor, Tensor]:
    from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd

    n_src, b, t, d = values.shape
    gamma32 = cast(Tensor, gamma).float() if enable_rmsnorm else None
    outs = _run_kernel(block_attn_res_fwd, [values.reshape(n_src, b * t, d), w.float(), gamma32],
                       float(scale), float(eps), bool(enable_rmsnorm))
    h = outs[0].reshape(b, t, d)
    alpha = outs[-1].reshape(b, t, n_src)
    rms = outs[1].reshape(b, t, n_src, 1) if enable_rmsnorm else values.new_empty((0,), dtype=torch.float32)
    return h, rms, alpha


def _nki_backward(grad_h: Tensor, values: Tensor, w: Tensor, alpha: Tensor, gamma: Tensor | None,
                  rms: Tensor | None, scale: float, enable_rmsnorm: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd

    n_src, b, t, d = values.shape
    tokens = b * t
    inputs = [grad_h.reshape(tokens, d), values.reshape(n_src, tokens, d), w.float(),
              alpha.float().reshape(tokens, n_src),
              cast(Tensor, gamma).float() if enable_rmsnorm else None,
              cast(Tensor, rms).float().reshape(tokens, n_src) if enable_rmsnorm else None]
    outs = _run_kernel(block_attn_res_bwd, inputs, float(scale), bool(enable_rmsnorm))
    grad_values = outs[0].reshape(n_src, b, t, d)
    grad_w = outs[1].to(w.dtype)
    grad_gamma = outs[2].to(cast(Tensor, gamma).dtype) if enable_rmsnorm else w.new_empty((0,))
    return grad_values, grad_w, grad_gamma


# ---------------------------------------------------------------- registered ops


@torch.library.custom_op("nkilib_msda::block_attn_res", mutates_args=())
def block_attn_res_op(values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Optional[Tensor],
                      scale: float, rmsnorm_eps: float, enable_rmsnorm: bool,
                      backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """values [L, B, T, D] -> (h [B, T, D], rms [B, T, L, 1] or empty, alpha [B, T, L])."""
    run = _nki_forward if backend == "nki" else _reference_forward
    return run(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm)


@block_attn_res_op.register_fake
def _block_attn_res_fake(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm,
                         backend):
    n_src, b, t, d = values.shape
    cd = _compute_dtype(values.dtype)
    rms_shape = (b, t, n_src, 1) if enable_rmsnorm else (0,)
    return (values.new_empty((b, t, d)), values.new_empty(rms_shape, dtype=cd),
            values.new_empty((b, t, n_src), dtype=cd))


@torch.library.custom_op("nkilib_msda::block_attn_res_backward", mutates_args=())
def block_attn_res_backward_op(grad_h: Tensor, values: Tensor, proj_weight: Tensor, alpha: Tensor,
                               rmsnorm_gamma: Optional[Tensor], rms: Optional[Tensor], scale: float,
                               enable_rmsnorm: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] (empty without RMSNorm))."""
    run = _nki_backward if backend == "nki" else _reference_backward
    return run(grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, scale, enable_rmsnorm)


@block_attn_res_backward_op.register_fake
def _block_attn_res_backward_fake(grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, scale,
                                  enable_rmsnorm, backend):
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


# ---------------------------------------------------------------- public functions


def _stack(blocks: Sequence[Tensor], partial_block: Tensor | None) -> Tensor:
    """Source-major values [L, B, T, D] (the kernels' layout; differentiable)."""
    return torch.stack([*blocks, *([] if partial_block is None else [partial_block])], dim=0)


def block_attn_res(blocks: Sequence[Tensor], proj_weight: Tensor, partial_block: Tensor | None = None,
                   scale: float = 1.0, rmsnorm_eps: float = 1e-6,
                   rmsnorm_gamma: Tensor | None = None, enable_rmsnorm: bool = True,
                   rms_out_flag: bool = False, alpha_out_flag: bool = False, *,
                   backend: str | None = None) -> Tensor | tuple[Tensor, ...]:
    """h = sum_l softmax_l(z)_l v_l over the N blocks (+ partial block); see block-attn-res.md.

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
