"""``torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes`` (and ``..._bwd``): MSDA with
the spatial shapes (and level starts) as tensors, for tracing.

Deformable-DETR passes ``input_spatial_shapes`` as an int tensor (N_l, 2). While
``torch.compile`` / ``torch.export`` traces, its values are unknown (reading them would break
the graph or make unbacked symbols), but MSDA's output shape does not depend on them: the fake
kernels here use tensor dims only, and the real kernels read the values (one host copy each)
when they run, then validate and compute exactly like the int-list operators (:mod:`.ops`),
with the same one-line errors (e.g. sum(H*W) != value's L) raised at run time. The shapes
tensor stays an input of the traced graph, so a compiled or exported program follows whatever
shapes it is given.

The functional API routes here only for a tensor ``spatial_shapes`` while tracing (dynamo,
export, fake tensors): eager calls read the tensor once and take the int-list path. The
autograd backward always runs the backward operator, which re-reads the shapes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nkilib_msda._env import check_optional_bool
from nkilib_msda.pytorch import dispatch
from nkilib_msda.pytorch._registration import register_operator
from nkilib_msda.pytorch.ops import (backward_schema, forward_schema, msda_backward_fake,
                                     msda_op_backward, msda_op_forward, no_double_backward,
                                     output_dims)
from nkilib_msda.validation.layouts import level_starts
from nkilib_msda.validation.msda import check_shape_tensors

__all__ = ["ms_deformable_attention_tensor_shapes", "ms_deformable_attention_tensor_shapes_bwd",
           "tensor_shapes_operator_args", "TENSOR_SHAPES_FORWARD_NAME"]

TENSOR_SHAPES_FORWARD_NAME = "nkilib_msda::ms_deformable_attention_tensor_shapes"
_TENSOR_SHAPES = "Tensor spatial_shapes, Tensor? level_start_index"


def _check_shapes_tensor(spatial_shapes: Tensor) -> None:
    """Trace-time checks of what is static: an integer tensor (N_l, 2)."""
    if spatial_shapes.dim() != 2 or spatial_shapes.shape[1] != 2:
        raise ValueError(f"spatial_shapes: expected an int tensor (N_l, 2) of (H, W) per level, "
                         f"got shape {tuple(spatial_shapes.shape)}")
    if spatial_shapes.dtype.is_floating_point or spatial_shapes.dtype.is_complex \
            or spatial_shapes.dtype == torch.bool:
        raise ValueError(f"spatial_shapes: expected an integer dtype, got {spatial_shapes.dtype}")


def _flat_shapes(spatial_shapes: Tensor) -> list[int]:
    """The values as the int-list operators take them, ``[H0, W0, H1, W1, ...]``."""
    _check_shapes_tensor(spatial_shapes)
    return [int(d) for d in spatial_shapes.reshape(-1).tolist()]


def _starts(level_start_index: Tensor | None, flat_shapes: list[int]) -> list[int]:
    """The level starts' values, derived from the shapes when None."""
    if level_start_index is None:
        return list(level_starts(zip(flat_shapes[::2], flat_shapes[1::2])))
    return [int(s) for s in level_start_index.reshape(-1).tolist()]


# ---------------------------------------------------------------------------- backward


def _backward_impl(grad_output: Tensor, value: Tensor, spatial_shapes: Tensor,
                   level_start_index: Tensor | None, *tensors_and_options: Any
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """MSDA backward with tensor spatial shapes: as ``ms_deformable_attention_bwd``."""
    check_shape_tensors(spatial_shapes, level_start_index, value)
    flat = _flat_shapes(spatial_shapes)
    return msda_op_backward(grad_output, value, flat, _starts(level_start_index, flat),
                            *tensors_and_options)


def _backward_fake(grad_output: Tensor, value: Tensor, spatial_shapes: Tensor,
                   level_start_index: Tensor | None, *rest: Any) -> tuple[Tensor, Tensor, Tensor]:
    check_shape_tensors(spatial_shapes, level_start_index, value)
    return msda_backward_fake(grad_output, value, spatial_shapes, level_start_index, *rest)


ms_deformable_attention_tensor_shapes_bwd = register_operator(
    "ms_deformable_attention_tensor_shapes_bwd", _backward_impl, _backward_fake,
    schema=backward_schema(_TENSOR_SHAPES), backward=no_double_backward,
    setup_context=lambda ctx, inputs, output: None)


# ----------------------------------------------------------------------------- forward


def _forward_impl(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor | None,
                  *tensors_and_options: Any) -> Tensor:
    """MSDA forward with tensor spatial shapes (N_l, 2) and level starts (N_l,) or None:
    (B, N_q, N_h*C_h) in value's dtype, as ``ms_deformable_attention``."""
    check_shape_tensors(spatial_shapes, level_start_index, value)
    flat = _flat_shapes(spatial_shapes)
    _, output = msda_op_forward(value, flat, _starts(level_start_index, flat),
                                *tensors_and_options)
    return output


def _forward_fake(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor | None,
                  sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                  sampling_locations_layout: str, *options: Any) -> Tensor:
    _check_shapes_tensor(spatial_shapes)
    check_shape_tensors(spatial_shapes, level_start_index, value)
    return value.new_empty(output_dims(value, sampling_locations, value_layout,
                                       sampling_locations_layout))


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
     *options) = inputs
    ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations,
                          attention_weights)
    ctx.msda_options = options


def _backward(ctx: Any, grad_output: Tensor) -> tuple:
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights = \
        ctx.saved_tensors
    (value_layout, sampling_locations_layout, align_corners, padding_mode, backend, deterministic,
     num_points) = ctx.msda_options
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4])
    grads = torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes_bwd(
        grad_output, value, spatial_shapes, level_start_index, sampling_locations,
        attention_weights, value_layout, sampling_locations_layout, align_corners, padding_mode,
        backend, [bool(n) for n in needs], deterministic, num_points)
    grad_value, grad_loc, grad_attn = (g if n else None for g, n in zip(grads, needs))
    return (grad_value, None, None, grad_loc, grad_attn, None, None, None, None, None, None, None)


ms_deformable_attention_tensor_shapes = register_operator(
    "ms_deformable_attention_tensor_shapes", _forward_impl, _forward_fake,
    schema=forward_schema(_TENSOR_SHAPES), backward=_backward, setup_context=_setup_context)


def tensor_shapes_operator_args(value: Any, spatial_shapes: Tensor, level_start_index: Any,
                                sampling_locations: Any, attention_weights: Any,
                                value_layout: str, sampling_locations_layout: str,
                                align_corners: bool, padding_mode: str, backend: Any,
                                deterministic: Any) -> tuple:
    """The tensor-shapes forward operator's positional arguments for a traced user call.

    Only what is static is checked here (argument types, the shapes tensor's dims, the
    backend's name); the values are validated by the operator when it runs. Level starts given
    as ints become a constant tensor."""
    for name, x in (("value", value), ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    _check_shapes_tensor(spatial_shapes)
    if level_start_index is not None and not isinstance(level_start_index, Tensor):
        level_start_index = torch.tensor([int(s) for s in level_start_index], dtype=torch.int64,
                                         device=spatial_shapes.device)
    return (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            value_layout, sampling_locations_layout, align_corners, padding_mode,
            dispatch.backend_argument(backend), check_optional_bool("deterministic", deterministic))
