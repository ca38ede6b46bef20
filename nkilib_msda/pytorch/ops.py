"""Registered operators ``torch.ops.nkilib_msda.ms_deformable_attention`` and ``..._bwd``, and
the one autograd definition every path shares.

Both operators are registered by :func:`._registration.register_operator` (fake kernels,
``PrivateUse1`` for TorchNeuron's ``neuron`` device, autocast pass-through, autograd), so they
stay opaque single nodes under ``torch.compile`` / ``torch.export`` and pass
``torch.library.opcheck``. Their arguments are the untrusted boundary: each implementation
binds them into an :class:`~nkilib_msda.pytorch.call.MsdaCall` (validation and backend
selection, once) and runs it. The forward operator's ``setup_context`` receives that very call
(:class:`._registration.CallHandoff`) and only adds the backward's limits to it.

Autograd: :func:`save_msda_context` and :func:`msda_input_gradients`, which the eager fast
path's :class:`MSDAFunction` uses too. In plain eager mode without ``create_graph`` the
backward runs the saved call directly; otherwise (tracing, modes, double backward) through the
backward operator.

Spatial shapes travel as a flat int list ``[H0, W0, H1, W1, ...]``. ``backend`` names the
backend that does the work; ``"auto"`` picks it as the functional API's ``backend=None`` does
(:mod:`nkilib_msda.pytorch.dispatch`). ``num_points`` (optional, last): per-level point counts
(P_0, ..., P_{L-1}); the locations and weights then carry sum(P) packed points per head and the
operators pad them to max(P) inside (:mod:`.point_counts`), returning gradients in the packed
shapes. With per-level counts the autograd backward always goes through the backward operator.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nkilib_msda.pytorch._modes import can_skip_dispatcher, profiler_range
from nkilib_msda.pytorch._registration import CallHandoff, register_operator
from nkilib_msda.pytorch.call import MsdaCall, bind_msda_op_call, spatial_shapes_from_flat
from nkilib_msda.pytorch.dispatch import AUTO
from nkilib_msda.pytorch.point_counts import pack_point_gradients, pad_point_counts

__all__ = ["ms_deformable_attention", "ms_deformable_attention_bwd", "MSDAFunction",
           "save_msda_context", "msda_input_gradients", "FORWARD_NAME", "BACKWARD_NAME",
           "DOUBLE_BACKWARD_UNSUPPORTED", "msda_op_forward", "msda_op_backward",
           "no_double_backward", "output_dims", "msda_backward_fake", "forward_schema",
           "backward_schema", "INT_LIST_SHAPES"]

FORWARD_NAME = "nkilib_msda::ms_deformable_attention"
BACKWARD_NAME = "nkilib_msda::ms_deformable_attention_bwd"

_HANDOFF: CallHandoff[MsdaCall] = CallHandoff()
# The autograd backward hands its saved call to the backward operator it calls (eager paths
# through the dispatcher), so one forward + backward binds once there too.
_BACKWARD_HANDOFF: CallHandoff[MsdaCall] = CallHandoff()

# The operators' schemas, written once; ``shapes`` declares spatial_shapes and level_start_index.
INT_LIST_SHAPES = "SymInt[] spatial_shapes, SymInt[]? level_start_index"  # None: derived
_POINTS = "bool? deterministic=None, SymInt[]? num_points=None"


def forward_schema(shapes: str) -> str:
    """A forward operator's schema; its bodies get every argument (see :mod:`._registration`)."""
    return (f'(Tensor value, {shapes}, Tensor sampling_locations, Tensor attention_weights, '
            f'str value_layout="BLNC", str sampling_locations_layout="BQHLP2", '
            f'bool align_corners=False, str padding_mode="zeros", str backend="{AUTO}", '
            f'{_POINTS}) -> Tensor')


def backward_schema(shapes: str) -> str:
    """A backward operator's schema: three gradients, zeros where ``compute`` is False."""
    return (f'(Tensor grad_output, Tensor value, {shapes}, Tensor sampling_locations, '
            f'Tensor attention_weights, str value_layout, str sampling_locations_layout, '
            f'bool align_corners, str padding_mode, str backend, bool[] compute, {_POINTS}) '
            f'-> (Tensor, Tensor, Tensor)')


DOUBLE_BACKWARD_UNSUPPORTED = (
    "nkilib_msda.ms_deformable_attention: double backward (differentiating its gradients, "
    "e.g. torch.autograd.grad(..., create_graph=True) followed by a second backward, or nested "
    "torch.func.grad) is not supported; only first-order gradients are implemented")


# ---------------------------------------------------------------------------- backward


def _padded_points(sampling_locations: Tensor, attention_weights: Tensor,
                   spatial_shapes: list[int], sampling_locations_layout: str,
                   num_points: list[int] | None) -> tuple[Tensor, Tensor]:
    """The locations and weights with max(num_points) points on every level (themselves when
    ``num_points`` is None)."""
    if num_points is None:
        return sampling_locations, attention_weights
    return pad_point_counts(sampling_locations, attention_weights, num_points,
                            len(spatial_shapes_from_flat(spatial_shapes)),
                            sampling_locations_layout)


def msda_op_backward(grad_output: Tensor, value: Tensor, spatial_shapes: list[int],
                     level_start_index: list[int], sampling_locations: Tensor,
                     attention_weights: Tensor, value_layout: str, sampling_locations_layout: str,
                     align_corners: bool, padding_mode: str, backend: str, compute: list[bool],
                     deterministic: bool | None, num_points: list[int] | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operators' body (flat int spatial shapes): three tensors, each in its
    input's shape, layout and dtype; zeros where ``compute`` is False."""
    if len(compute) != 3:
        raise ValueError(f"compute: expected 3 flags (value, sampling_locations, attention_weights), "
                         f"got {list(compute)!r}")
    flags = (bool(compute[0]), bool(compute[1]), bool(compute[2]))
    call = _BACKWARD_HANDOFF.take((grad_output, value, sampling_locations, attention_weights))
    locations, weights = _padded_points(sampling_locations, attention_weights, spatial_shapes,
                                        sampling_locations_layout, num_points)
    if call is None:
        call = bind_msda_op_call(value, spatial_shapes, level_start_index, locations, weights,
                                 value_layout, sampling_locations_layout, align_corners,
                                 padding_mode, backend, deterministic, needs_backward=True,
                                 grad_output=grad_output)
    grad_value, grad_loc, grad_attn = call.backward(grad_output, value, locations, weights, flags)
    if num_points is not None:
        grad_loc, grad_attn = pack_point_gradients(grad_loc, grad_attn, num_points,
                                                   sampling_locations_layout)
        grad_loc, grad_attn = grad_loc.contiguous(), grad_attn.contiguous()
    return grad_value, grad_loc, grad_attn


def msda_backward_fake(grad_output: Tensor, value: Tensor, spatial_shapes: Any,
                       level_start_index: Any, sampling_locations: Tensor,
                       attention_weights: Tensor, *options: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operators' fake kernel: three gradients in their inputs' shapes."""
    _BACKWARD_HANDOFF.clear()
    return (value.new_empty(value.shape), sampling_locations.new_empty(sampling_locations.shape),
            attention_weights.new_empty(attention_weights.shape))


def no_double_backward(ctx: Any, *grads: Tensor) -> tuple:
    """The backward operators' autograd: differentiating a gradient is not supported."""
    raise RuntimeError(DOUBLE_BACKWARD_UNSUPPORTED)


ms_deformable_attention_bwd = register_operator(
    "ms_deformable_attention_bwd", msda_op_backward, msda_backward_fake,
    schema=backward_schema(INT_LIST_SHAPES), backward=no_double_backward,
    setup_context=lambda ctx, inputs, output: None)


# ------------------------------------------------------------- the one autograd definition


def save_msda_context(ctx: Any, value: Tensor, sampling_locations: Tensor,
                      attention_weights: Tensor, call: MsdaCall) -> None:
    """What every MSDA autograd node saves: the three inputs and the bound call (whose
    backend was checked against the backward's limits)."""
    ctx.save_for_backward(value, sampling_locations, attention_weights)
    ctx.msda_call = call


def msda_input_gradients(ctx: Any, grad_output: Tensor, needs: tuple[bool, bool, bool]
                         ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_value, grad_sampling_locations, grad_attention_weights), None where not needed.

    ``needs`` are the ``needs_input_grad`` flags of the three tensors; they become the backward's
    ``compute`` mask. In plain eager mode without ``create_graph`` the saved call's backward
    runs directly; otherwise (tracing, modes, double backward) through the backward operator.
    """
    value, sampling_locations, attention_weights = ctx.saved_tensors
    call: MsdaCall = ctx.msda_call
    compute = (bool(needs[0]), bool(needs[1]), bool(needs[2]))
    if not torch.is_grad_enabled() and can_skip_dispatcher(grad_output, value, sampling_locations,
                                                           attention_weights):
        call.check_grad_output(grad_output, value, sampling_locations, attention_weights)
        with profiler_range(BACKWARD_NAME):
            grads = call.backward(grad_output, value, sampling_locations, attention_weights,
                                  compute)
    else:
        shapes, starts, value_layout, loc_layout, align_corners, padding_mode = call.op_args()
        call.check_grad_output(grad_output, value, sampling_locations, attention_weights)
        _BACKWARD_HANDOFF.put((grad_output, value, sampling_locations, attention_weights), call)
        grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
            grad_output, value, shapes, starts, sampling_locations, attention_weights,
            value_layout, loc_layout, align_corners, padding_mode, call.op_backend,
            list(compute), call.deterministic)
    return tuple(g if flag else None for g, flag in zip(grads, compute))  # type: ignore[return-value]


# ----------------------------------------------------------------------------- forward


def msda_op_forward(value: Tensor, spatial_shapes: list[int], level_start_index: list[int],
                    sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                    sampling_locations_layout: str, align_corners: bool, padding_mode: str,
                    backend: str, deterministic: bool | None, num_points: list[int] | None
                    ) -> tuple[MsdaCall, Tensor]:
    """The forward operators' body (flat int spatial shapes): the bound call (for the padded
    points when ``num_points`` is given) and the output (B, N_q, N_h*C_h)."""
    locations, weights = _padded_points(sampling_locations, attention_weights, spatial_shapes,
                                        sampling_locations_layout, num_points)
    call = bind_msda_op_call(value, spatial_shapes, level_start_index, locations, weights,
                             value_layout, sampling_locations_layout, align_corners, padding_mode,
                             backend, deterministic, needs_backward=False)
    return call, call.forward(value, locations, weights)


def _forward_op_impl(value: Tensor, spatial_shapes: list[int], level_start_index: list[int],
                     sampling_locations: Tensor, attention_weights: Tensor, *options: Any
                     ) -> Tensor:
    """MSDA forward: (B, N_q, N_h*C_h) in value's dtype, computed by ``backend``.

    ``deterministic`` is only used by the backward (bitwise-reproducible grad_value; None: the
    backend's default, e.g. ``NKILIB_MSDA_DETERMINISTIC`` for triton)."""
    call, output = msda_op_forward(value, spatial_shapes, level_start_index, sampling_locations,
                                   attention_weights, *options)
    if options[-1] is None:  # num_points: with per-level counts the backward binds again
        _HANDOFF.put((value, sampling_locations, attention_weights), call)
    return output


def output_dims(value: Tensor, sampling_locations: Tensor, value_layout: str,
                 sampling_locations_layout: str) -> tuple:
    """(B, N_q, N_h*C_h) from the input shapes alone (works with symbolic sizes)."""
    heads = value.shape[2] if value_layout == "BLNC" else value.shape[1]
    queries = sampling_locations.shape[1] if sampling_locations_layout == "BQHLP2" else sampling_locations.shape[2]
    return (value.shape[0], queries, heads * value.shape[3])


def _forward_fake(value: Tensor, spatial_shapes: Any, level_start_index: Any,
                  sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                  sampling_locations_layout: str, *options: Any) -> Tensor:
    _HANDOFF.clear()
    return value.new_empty(output_dims(value, sampling_locations, value_layout,
                                       sampling_locations_layout))


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
     value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
     deterministic, num_points) = inputs
    if num_points is not None:  # the backward operator pads and binds (per-level counts)
        ctx.save_for_backward(value, sampling_locations, attention_weights)
        ctx.msda_op_args = (list(spatial_shapes), level_start_index, value_layout,
                            sampling_locations_layout, align_corners, padding_mode, backend)
        ctx.msda_options = (deterministic, list(num_points))
        return
    call = _HANDOFF.take((value, sampling_locations, attention_weights))
    if call is None:  # the fake kernel ran (tracing): bind the traced arguments
        call = bind_msda_op_call(value, list(spatial_shapes), level_start_index,
                                 sampling_locations, attention_weights, value_layout,
                                 sampling_locations_layout, align_corners, padding_mode, backend,
                                 deterministic, needs_backward=False)
    save_msda_context(ctx, value, sampling_locations, attention_weights,
                      call.for_backward(value, sampling_locations))


def _backward(ctx: Any, grad_output: Tensor) -> tuple:
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4])
    if hasattr(ctx, "msda_op_args"):
        value, sampling_locations, attention_weights = ctx.saved_tensors
        deterministic, num_points = ctx.msda_options
        grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
            grad_output, value, ctx.msda_op_args[0], ctx.msda_op_args[1], sampling_locations,
            attention_weights, *ctx.msda_op_args[2:], [bool(n) for n in needs], deterministic,
            num_points)
        grad_value, grad_loc, grad_attn = (g if n else None for g, n in zip(grads, needs))
    else:
        grad_value, grad_loc, grad_attn = msda_input_gradients(ctx, grad_output, needs)
    return (grad_value, None, None, grad_loc, grad_attn, None, None, None, None, None, None, None)


ms_deformable_attention = register_operator(
    "ms_deformable_attention", _forward_op_impl, _forward_fake,
    schema=forward_schema(INT_LIST_SHAPES), backward=_backward, setup_context=_setup_context)


class MSDAFunction(torch.autograd.Function):
    """The eager fast path's autograd node: the same context and backward as the operator's."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                call: MsdaCall) -> Tensor:
        save_msda_context(ctx, value, sampling_locations, attention_weights, call)
        with profiler_range(FORWARD_NAME):
            return call.forward(value, sampling_locations, attention_weights)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return (*msda_input_gradients(ctx, grad_output, needs), None)
