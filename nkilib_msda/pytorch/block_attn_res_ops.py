"""Torch API for Block Attention Residuals (docs/api.md, docs/block_attn_res.md).

- ``block_attn_res`` / ``block_attn_res_backward``: the PyPTO argument lists, flag-dependent
  returns and ValueError conditions, plus ``backend=`` ("reference", "nki"; None = auto).
- Registered ops ``torch.ops.nkilib_msda.block_attn_res`` (values [L, B, T, D] -> h [B, T, D],
  rms [B, T, L, 1] (or an empty tensor without RMSNorm), alpha [B, T, L]) and
  ``torch.ops.nkilib_msda.block_attn_res_backward`` (-> grad_values [L, B, T, D], grad_w [D],
  grad_gamma [D] or empty), with fake kernels, autograd, a PrivateUse1 (``neuron``) kernel and
  autocast kernels that run them with autocast off: ``block_attn_res`` is differentiable.
- One binding per call (:class:`BlockAttnResCall`: validation and backend selection, once):
  the public functions bind the user's arguments, the operators theirs (values [L, B, T, D]);
  forward and backward take the call. In plain eager mode the public functions run the call
  directly (no dispatcher round trip), through :class:`BlockAttnResFunction`, whose context
  and backward are the operator's.
- Backends come from the registry shared with MSDA (:mod:`nkilib_msda.backends`): "reference"
  is closed-form torch (any device; fp32 inside, fp64 for fp64 inputs, which gradcheck uses);
  "nki" runs the NKI kernels (in the emulator for CPU tensors, on TorchNeuron's device
  otherwise; LNC degree from ``NEURON_LOGICAL_NC_CONFIG``). Selection follows the MSDA rules
  (:func:`nkilib_msda.pytorch.dispatch.select_block_attn_res_backend`).
- Caches are fp32 (fp64 for fp64 inputs). Gradients do not flow through the rms/alpha outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from nkilib_msda.backends import block_attn_res_backends, get_backend
from nkilib_msda.pytorch._modes import (
    FAST_PATH_DEVICES, autocast_disabled, can_skip_dispatcher, profiler_range)
from nkilib_msda.pytorch._registration import register_operator
from nkilib_msda.pytorch.problem_cache import memoized, tensor_facts
from nkilib_msda.validation.block_attn_res import (
    BlockAttnResProblem, validate_block_attn_res_args,
    validate_block_attn_res_backward_args, validate_stacked_backward_args, validate_stacked_values)
from nkilib_msda.pytorch.dispatch import AUTO, backend_argument, select_block_attn_res_backend
from nkilib_msda.validation.msda import FLOAT_DTYPE_NAMES

__all__ = ["block_attn_res", "block_attn_res_backward", "BACKENDS", "select_backend",
           "BlockAttnResCall"]

BACKENDS = block_attn_res_backends()  # from the backends' declared capabilities
FORWARD_NAME = "nkilib_msda::block_attn_res"
BACKWARD_NAME = "nkilib_msda::block_attn_res_backward"

# The operators, their setup_context and the backward operator each bind from their own
# arguments; the validation behind the binding is memoized on its static facts
# (:mod:`.problem_cache`), so a forward + backward through the dispatcher validates once.

def select_backend(backend: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """Explicit argument, else ``NKILIB_MSDA_BACKEND`` (if it names a Block AttnRes backend),
    else by device (TorchNeuron's device -> "nki", otherwise "reference"). An explicit "nki"
    that cannot run raises ValueError; the automatic choice falls back to "reference"."""
    return select_block_attn_res_backend(backend, device, dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- the bound call


@dataclass(frozen=True)
class BlockAttnResCall:
    """One validated Block AttnRes call: the problem, its backend and the scalar options.
    Tensors in the kernels' layout: values [L, B, T, D] (the sources stacked)."""

    problem: BlockAttnResProblem
    backend: str
    scale: float
    rmsnorm_eps: float
    enable_rmsnorm: bool
    # The backend argument for the operators: "auto" for the automatic choice, resolved where
    # an operator runs (a traced or exported graph does not carry this machine's choice).
    op_backend: str = AUTO

    def forward(self, values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Tensor | None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """-> (h [B, T, D], rms [B, T, L, 1] or empty, alpha [B, T, L])."""
        with autocast_disabled(values.device.type):
            return get_backend(self.backend).block_attn_res_forward(
                values, proj_weight, rmsnorm_gamma, self.scale, self.rmsnorm_eps,
                self.enable_rmsnorm)

    def backward(self, grad_h: Tensor, values: Tensor, proj_weight: Tensor, alpha: Tensor,
                 rmsnorm_gamma: Tensor | None, rms: Tensor | None
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] (empty without RMSNorm))."""
        with autocast_disabled(values.device.type):
            return get_backend(self.backend).block_attn_res_backward(
                grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, self.scale,
                self.enable_rmsnorm)


def _key(operator: str, tensors: tuple, scale: Any, eps: Any, enable_rmsnorm: Any
         ) -> tuple | None:
    """The memo key of an operator's validation: the tensors' (shape, dtype, device) and the
    scalars with their types (``True`` == 1 and ``1.0`` == 1, but they validate differently)."""
    facts = tensor_facts(*tensors)
    if facts is None:
        return None
    return (operator, facts, type(scale), scale, type(eps), eps, type(enable_rmsnorm),
            enable_rmsnorm)


def _bind(problem: BlockAttnResProblem, backend: str | None, device: torch.device,
          dtype: torch.dtype, scale: float, rmsnorm_eps: float, enable_rmsnorm: bool
          ) -> BlockAttnResCall:
    argument = backend_argument(backend, BACKENDS)
    name = select_backend(None if argument == AUTO else argument, device, dtype)
    return BlockAttnResCall(problem, name, float(scale), float(rmsnorm_eps), bool(enable_rmsnorm),
                            argument)


# ---------------------------------------------------------------- registered ops


def _block_attn_res_backward_impl(grad_h: Tensor, values: Tensor, proj_weight: Tensor, alpha: Tensor,
                               rmsnorm_gamma: Optional[Tensor], rms: Optional[Tensor], scale: float,
                               enable_rmsnorm: bool, backend: str = AUTO
                               ) -> tuple[Tensor, Tensor, Tensor]:
    """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] (empty without RMSNorm))."""
    key = _key("block_attn_res_backward", (grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms),
               scale, 0.0, enable_rmsnorm)
    problem = memoized(key, lambda: validate_stacked_backward_args(
        grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, scale, enable_rmsnorm,
        allowed_dtypes=FLOAT_DTYPE_NAMES))
    call = _bind(problem, backend, values.device, values.dtype, scale, 0.0, enable_rmsnorm)
    return call.backward(grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms)


def _block_attn_res_backward_fake(grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms, scale,
                                  enable_rmsnorm, backend=AUTO):
    grad_gamma = (proj_weight.new_empty(rmsnorm_gamma.shape, dtype=rmsnorm_gamma.dtype)
                  if enable_rmsnorm else proj_weight.new_empty((0,)))
    return values.new_empty(values.shape), proj_weight.new_empty(proj_weight.shape), grad_gamma


block_attn_res_backward_op = register_operator(
    "block_attn_res_backward", _block_attn_res_backward_impl, _block_attn_res_backward_fake)


def _stacked(problem: BlockAttnResProblem) -> BlockAttnResProblem:
    """The problem of the operators' form: the L sources stacked, counted as L blocks."""
    return replace(problem, num_blocks=problem.num_sources, has_partial=False)


def _remember_backward(call: BlockAttnResCall, grad_h: Tensor, values: Tensor,
                       proj_weight: Tensor, alpha: Tensor, rmsnorm_gamma: Tensor | None,
                       rms: Tensor | None) -> None:
    """Memo entry of the backward operator's validation for the arguments of a bound call: a
    grad_h shaped like the output and the forward's own alpha / rms validate to the call's
    problem, so the backward operator binds without validating again."""
    memoized(_key("block_attn_res_backward", (grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms),
                  call.scale, 0.0, call.enable_rmsnorm), lambda: _stacked(call.problem))


def _save_context(ctx: Any, values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Tensor | None,
                  rms: Tensor, alpha: Tensor, call: BlockAttnResCall) -> None:
    ctx.save_for_backward(values, proj_weight, rmsnorm_gamma, rms, alpha)
    ctx.block_attn_res_call = call
    ctx.mark_non_differentiable(rms, alpha)


def block_attn_res_input_gradients(ctx: Any, grad_h: Tensor
                                   ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(grad_values, grad_w, grad_gamma or None) of every Block AttnRes autograd node. In plain
    eager mode without ``create_graph`` the saved call's backward runs directly; otherwise
    through the backward operator."""
    values, proj_weight, rmsnorm_gamma, rms, alpha = ctx.saved_tensors
    call: BlockAttnResCall = ctx.block_attn_res_call
    rms_on = call.enable_rmsnorm
    grad_h = grad_h.contiguous()
    tensors = [t for t in (grad_h, values, proj_weight, alpha, rmsnorm_gamma) if t is not None]
    as_expected = grad_h.shape == values.shape[1:] and grad_h.dtype == values.dtype
    if not torch.is_grad_enabled() and can_skip_dispatcher(*tensors) and as_expected:
        with profiler_range(BACKWARD_NAME):
            grad_values, grad_w, grad_gamma = call.backward(
                grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms if rms_on else None)
    else:
        if as_expected:  # the backward operator's validation is the forward's (memo entry)
            _remember_backward(call, grad_h, values, proj_weight, alpha, rmsnorm_gamma,
                               rms if rms_on else None)
        grad_values, grad_w, grad_gamma = block_attn_res_backward_op(
            grad_h, values, proj_weight, alpha, rmsnorm_gamma, rms if rms_on else None,
            call.scale, rms_on, call.op_backend)
    if rmsnorm_gamma is None:
        return grad_values, grad_w, None
    if not rms_on:
        return grad_values, grad_w, torch.zeros_like(rmsnorm_gamma)  # unused without RMSNorm
    return grad_values, grad_w, grad_gamma


def _block_attn_res_impl(values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Optional[Tensor],
                      scale: float, rmsnorm_eps: float, enable_rmsnorm: bool,
                      backend: str = AUTO) -> tuple[Tensor, Tensor, Tensor]:
    """values [L, B, T, D] -> (h [B, T, D], rms [B, T, L, 1] or empty, alpha [B, T, L])."""
    call = _bind_op(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm,
                    backend)
    return call.forward(values, proj_weight, rmsnorm_gamma)


def _bind_op(values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Optional[Tensor], scale: float,
             rmsnorm_eps: float, enable_rmsnorm: bool, backend: str) -> BlockAttnResCall:
    problem = memoized(
        _key("block_attn_res", (values, proj_weight, rmsnorm_gamma), scale, rmsnorm_eps,
             enable_rmsnorm),
        lambda: validate_stacked_values(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps,
                                        enable_rmsnorm, allowed_dtypes=FLOAT_DTYPE_NAMES))
    return _bind(problem, backend, values.device, values.dtype, scale, rmsnorm_eps,
                 enable_rmsnorm)


def _block_attn_res_fake(values, proj_weight, rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm,
                         backend=AUTO):
    n_src, b, t, d = values.shape
    cd = _compute_dtype(values.dtype)
    rms_shape = (b, t, n_src, 1) if enable_rmsnorm else (0,)
    return (values.new_empty((b, t, d)), values.new_empty(rms_shape, dtype=cd),
            values.new_empty((b, t, n_src), dtype=cd))


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    values, proj_weight, rmsnorm_gamma, scale, eps, enable_rmsnorm, backend = inputs
    _h, rms, alpha = output
    call = _bind_op(values, proj_weight, rmsnorm_gamma, scale, eps, enable_rmsnorm, backend)
    _save_context(ctx, values, proj_weight, rmsnorm_gamma, rms, alpha, call)


def _backward(ctx: Any, grad_h: Tensor, _grad_rms: Tensor, _grad_alpha: Tensor) -> tuple:
    grad_values, grad_w, grad_gamma = block_attn_res_input_gradients(ctx, grad_h)
    return grad_values, grad_w, grad_gamma, None, None, None, None


block_attn_res_op = register_operator("block_attn_res", _block_attn_res_impl,
                                      _block_attn_res_fake, backward=_backward,
                                      setup_context=_setup_context)


class BlockAttnResFunction(torch.autograd.Function):
    """The eager fast path's autograd node: the same context and backward as the operator's."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, proj_weight: Tensor, rmsnorm_gamma: Tensor | None,
                call: BlockAttnResCall) -> tuple[Tensor, Tensor, Tensor]:
        with profiler_range(FORWARD_NAME):
            h, rms, alpha = call.forward(values, proj_weight, rmsnorm_gamma)
        _save_context(ctx, values, proj_weight, rmsnorm_gamma, rms, alpha, call)
        return h, rms, alpha

    @staticmethod
    def backward(ctx: Any, grad_h: Tensor, _grad_rms: Tensor, _grad_alpha: Tensor) -> tuple:
        return (*block_attn_res_input_gradients(ctx, grad_h), None)


def _run_forward(problem: BlockAttnResProblem, backend: str | None, values: Tensor,
                 proj_weight: Tensor, rmsnorm_gamma: Tensor | None, scale: float,
                 rmsnorm_eps: float, enable_rmsnorm: bool) -> tuple[Tensor, Tensor, Tensor]:
    """In plain eager mode (CPU/CUDA) the call bound here runs directly; otherwise the
    registered operator binds it (its validation memoized, :mod:`.problem_cache`)."""
    tensors = [t for t in (values, proj_weight, rmsnorm_gamma) if t is not None]
    if values.device.type in FAST_PATH_DEVICES and can_skip_dispatcher(*tensors):
        call = _bind(problem, backend, values.device, values.dtype, scale, rmsnorm_eps,
                     enable_rmsnorm)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return BlockAttnResFunction.apply(values, proj_weight, rmsnorm_gamma, call)
        with profiler_range(FORWARD_NAME):
            return call.forward(values, proj_weight, rmsnorm_gamma)
    # The operator's validation of the stacked values is this one (memo entry, as MSDA's).
    memoized(_key("block_attn_res", (values, proj_weight, rmsnorm_gamma), scale, rmsnorm_eps,
                  enable_rmsnorm), lambda: _stacked(problem))
    return block_attn_res_op(values, proj_weight, rmsnorm_gamma, float(scale), float(rmsnorm_eps),
                             bool(enable_rmsnorm), backend_argument(backend, BACKENDS))


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
    problem = validate_block_attn_res_args(blocks, proj_weight, partial_block, scale, rmsnorm_eps,
                                           rmsnorm_gamma, enable_rmsnorm, rms_out_flag,
                                           allowed_dtypes=FLOAT_DTYPE_NAMES)
    h, rms, alpha = _run_forward(problem, backend, _stack(blocks, partial_block), proj_weight,
                                 rmsnorm_gamma, scale, rmsnorm_eps, enable_rmsnorm)
    extras = ([rms] if rms_out_flag else []) + ([alpha] if alpha_out_flag else [])
    return (h, *extras) if extras else h


def block_attn_res_backward(grad_h: Tensor, blocks: Sequence[Tensor], proj_weight: Tensor,
                            alpha_cache: Tensor, partial_block: Tensor | None = None,
                            rmsnorm_gamma: Tensor | None = None, rms_cache: Tensor | None = None,
                            scale: float = 1.0, enable_rmsnorm: bool = True, *,
                            backend: str | None = None) -> tuple:
    """Gradients from the forward's caches: ``(grad_blocks list, grad_partial or None, grad_w)``,
    plus ``grad_gamma`` with RMSNorm; each in its input's dtype."""
    problem = validate_block_attn_res_backward_args(
        grad_h, blocks, proj_weight, alpha_cache, partial_block, rmsnorm_gamma, rms_cache, scale,
        enable_rmsnorm, allowed_dtypes=FLOAT_DTYPE_NAMES)
    call = _bind(problem, backend, blocks[0].device, blocks[0].dtype, scale, 0.0, enable_rmsnorm)
    with torch.no_grad():
        args = (grad_h.contiguous(), _stack(blocks, partial_block), proj_weight, alpha_cache,
                rmsnorm_gamma if enable_rmsnorm else None, rms_cache if enable_rmsnorm else None)
        tensors = [t for t in args if t is not None]
        if args[1].device.type in FAST_PATH_DEVICES and can_skip_dispatcher(*tensors):
            with profiler_range(BACKWARD_NAME):
                grad_values, grad_w, grad_gamma = call.backward(*args)
        else:
            _remember_backward(call, *args[:4], args[4], args[5])
            grad_values, grad_w, grad_gamma = block_attn_res_backward_op(
                *args, call.scale, call.enable_rmsnorm, call.op_backend)
    n_blocks = len(blocks)
    grad_blocks = list(grad_values[:n_blocks].unbind(0))
    grad_partial = grad_values[n_blocks] if partial_block is not None else None
    if enable_rmsnorm:
        return grad_blocks, grad_partial, grad_w, grad_gamma
    return grad_blocks, grad_partial, grad_w
