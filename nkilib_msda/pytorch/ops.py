"""Registered operators ``torch.ops.nkilib_msda.ms_deformable_attention`` and ``..._bwd``.

Both are ``torch.library.custom_op``s with fake kernels, so they stay opaque single nodes under
``torch.compile`` and pass ``torch.library.opcheck``. The forward's autograd calls the backward
op, whose ``compute`` mask comes from ``ctx.needs_input_grad``. Spatial shapes travel as a flat
int list ``[H0, W0, H1, W1, ...]``; ``backend`` names the backend module that does the work
(the caller resolves it, see :mod:`nkilib_msda.pytorch.dispatch`).

The operator bodies are :func:`forward_with_backend` and :func:`backward_with_backend`; the
eager path of the functional API (:mod:`nkilib_msda.pytorch.eager`) calls the same functions
without the dispatcher round trip.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nkilib_msda.backends import get_backend
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.validation import MSDAProblem

__all__ = ["ms_deformable_attention", "ms_deformable_attention_bwd", "flatten_spatial_shapes",
           "problem_from_op_args", "forward_with_backend", "backward_with_backend"]


def flatten_spatial_shapes(spatial_shapes: tuple[tuple[int, int], ...]) -> list[int]:
    """((H0, W0), (H1, W1), ...) -> [H0, W0, H1, W1, ...] (the operators' int[] form)."""
    return [int(d) for pair in spatial_shapes for d in pair]


def _pairs(flat: list[int]) -> tuple[tuple[int, int], ...]:
    if len(flat) % 2:
        raise ValueError(f"spatial_shapes: expected a flat list [H0, W0, H1, W1, ...], got {flat!r}")
    return tuple((int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))


def problem_from_op_args(value: Tensor, spatial_shapes: list[int], level_start_index: list[int],
                         sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                         sampling_locations_layout: str, align_corners: bool, padding_mode: str,
                         grad_output: Tensor | None = None) -> MSDAProblem:
    """Validate the operators' arguments (flat spatial shapes) into an :class:`MSDAProblem`."""
    return validated_problem(
        value, _pairs(spatial_shapes), list(level_start_index), sampling_locations,
        attention_weights, value_layout, sampling_locations_layout, align_corners, padding_mode,
        grad_output=grad_output)


def _backend_module(backend: str, problem: MSDAProblem, value: Tensor, sampling_locations: Tensor):
    """The backend module, after checking it can run ``problem`` (direct op calls skip dispatch)."""
    module = get_backend(backend)
    reason = module.unsupported_reason(problem, value, sampling_locations)
    if reason is not None:
        raise ValueError(f"backend={backend!r} cannot run this call: {reason}")
    return module


# ----------------------------------------------------------------------------- forward


@torch.library.custom_op("nkilib_msda::ms_deformable_attention", mutates_args=())
def ms_deformable_attention(
    value: Tensor,
    spatial_shapes: list[int],
    level_start_index: list[int],
    sampling_locations: Tensor,
    attention_weights: Tensor,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
    backend: str = "reference",
    deterministic: bool | None = None,
) -> Tensor:
    """MSDA forward: (B, N_q, N_h*C_h) in value's dtype, computed by ``backend``.

    ``deterministic`` is only used by the backward (bitwise-reproducible grad_value; None: the
    backend's default, e.g. ``NKILIB_MSDA_DETERMINISTIC`` for triton)."""
    problem = problem_from_op_args(value, spatial_shapes, level_start_index, sampling_locations,
                                   attention_weights, value_layout, sampling_locations_layout,
                                   align_corners, padding_mode)
    module = _backend_module(backend, problem, value, sampling_locations)
    return forward_with_backend(module, problem, value, sampling_locations, attention_weights)


def forward_with_backend(module, problem: MSDAProblem, value: Tensor, sampling_locations: Tensor,
                         attention_weights: Tensor) -> Tensor:
    """The forward operator's body once ``problem`` is validated and ``module`` can run it."""
    out = module.msda_forward(value, problem, sampling_locations, attention_weights)
    return _as_like(out, value.dtype, None)


def _as_like(x: Tensor, dtype: torch.dtype, shape: torch.Size | None) -> Tensor:
    """``x.to(dtype).reshape(shape).contiguous()``, skipping the calls that would be no-ops
    (each costs microseconds of host time)."""
    if x.dtype != dtype:
        x = x.to(dtype)
    if shape is not None and x.shape != shape:
        x = x.reshape(shape)
    return x.contiguous()


def _output_dims(value: Tensor, sampling_locations: Tensor, value_layout: str,
                 sampling_locations_layout: str) -> tuple:
    """(B, N_q, N_h*C_h) from the input shapes alone (works with symbolic sizes)."""
    heads = value.shape[2] if value_layout == "BLNC" else value.shape[1]
    queries = sampling_locations.shape[1] if sampling_locations_layout == "BQHLP2" else sampling_locations.shape[2]
    return (value.shape[0], queries, heads * value.shape[3])


@ms_deformable_attention.register_fake
def _ms_deformable_attention_fake(value, spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights, value_layout="BLNC",
                                  sampling_locations_layout="BQHLP2", align_corners=False,
                                  padding_mode="zeros", backend="reference", deterministic=None):
    return value.new_empty(_output_dims(value, sampling_locations, value_layout,
                                        sampling_locations_layout))


# ---------------------------------------------------------------------------- backward


@torch.library.custom_op("nkilib_msda::ms_deformable_attention_bwd", mutates_args=())
def ms_deformable_attention_bwd(
    grad_output: Tensor,
    value: Tensor,
    spatial_shapes: list[int],
    level_start_index: list[int],
    sampling_locations: Tensor,
    attention_weights: Tensor,
    value_layout: str,
    sampling_locations_layout: str,
    align_corners: bool,
    padding_mode: str,
    backend: str,
    compute: list[bool],
    deterministic: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """MSDA backward: always three tensors (grad_value, grad_sampling_locations,
    grad_attention_weights), each in its input's shape, layout and dtype; zeros where
    ``compute`` is False."""
    if len(compute) != 3:
        raise ValueError(f"compute: expected 3 flags (value, sampling_locations, attention_weights), "
                         f"got {list(compute)!r}")
    problem = problem_from_op_args(value, spatial_shapes, level_start_index, sampling_locations,
                                   attention_weights, value_layout, sampling_locations_layout,
                                   align_corners, padding_mode, grad_output=grad_output)
    return backward_with_backend(backend, problem, grad_output, value, sampling_locations,
                                 attention_weights, compute, deterministic)


def backward_with_backend(backend: str, problem: MSDAProblem, grad_output: Tensor, value: Tensor,
                          sampling_locations: Tensor, attention_weights: Tensor,
                          compute: list[bool], deterministic: bool | None = None
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operator's body once ``problem`` (with ``grad_output``) is validated."""
    flags = tuple(bool(c) for c in compute)
    if any(flags):
        module = _backend_module(backend, problem, value, sampling_locations)
        grads = module.msda_backward(grad_output, value, problem, sampling_locations,
                                     attention_weights, flags, deterministic=deterministic)
    else:
        grads = (torch.zeros_like(value), torch.zeros_like(sampling_locations),
                 torch.zeros_like(attention_weights))
    grad_value, grad_loc, grad_attn = grads
    return (_as_like(grad_value, value.dtype, value.shape),
            _as_like(grad_loc, sampling_locations.dtype, sampling_locations.shape),
            _as_like(grad_attn, attention_weights.dtype, attention_weights.shape))


@ms_deformable_attention_bwd.register_fake
def _ms_deformable_attention_bwd_fake(grad_output, value, spatial_shapes, level_start_index,
                                      sampling_locations, attention_weights, value_layout,
                                      sampling_locations_layout, align_corners, padding_mode,
                                      backend, compute, deterministic=None):
    return (value.new_empty(value.shape), sampling_locations.new_empty(sampling_locations.shape),
            attention_weights.new_empty(attention_weights.shape))


# ---------------------------------------------------------------------------- autograd


def _setup_context(ctx, inputs, output) -> None:
    (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
     value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
     deterministic) = inputs
    ctx.save_for_backward(value, sampling_locations, attention_weights)
    ctx.static_args = (list(spatial_shapes), list(level_start_index), value_layout,
                       sampling_locations_layout, align_corners, padding_mode, backend,
                       deterministic)


def _backward(ctx, grad_output: Tensor):
    value, sampling_locations, attention_weights = ctx.saved_tensors
    (spatial_shapes, level_start_index, value_layout, sampling_locations_layout, align_corners,
     padding_mode, backend, deterministic) = ctx.static_args
    compute = [ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]]
    grad_value, grad_loc, grad_attn = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
        grad_output, value, spatial_shapes, level_start_index, sampling_locations,
        attention_weights, value_layout, sampling_locations_layout, align_corners, padding_mode,
        backend, compute, deterministic)
    return (grad_value if compute[0] else None, None, None,
            grad_loc if compute[1] else None, grad_attn if compute[2] else None,
            None, None, None, None, None, None)


ms_deformable_attention.register_autograd(_backward, setup_context=_setup_context)
