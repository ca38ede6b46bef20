"""The registered MSDA operators, two families written once, and the one autograd definition.

A family is a forward operator and its backward operator; the two families differ only in how
the spatial shapes and level starts travel (:class:`MsdaFamily`):

| family | forward / backward operator | spatial_shapes, level_start_index |
| --- | --- | --- |
| int list | ``ms_deformable_attention`` / ``..._bwd`` | ``SymInt[]`` flat ``[H0, W0, H1, W1, ...]``, ``SymInt[]`` |
| tensor shapes | ``ms_deformable_attention_tensor_shapes`` / ``..._bwd`` | ``Tensor`` (N_l, 2), ``Tensor?`` |

:func:`_register_family` registers each family's two operators through
:func:`._registration.register_operator` (fake kernels, ``PrivateUse1`` for TorchNeuron's
``neuron`` device, autocast pass-through) with the one forward body, backward body, fake
kernels, ``setup_context`` and autograd backward below, so they stay opaque single nodes under
``torch.compile`` / ``torch.export`` and pass ``torch.library.opcheck``. Their arguments are the
untrusted boundary: each body binds them into an :class:`~nkilib_msda.pytorch.call.MsdaCall`
(validation, memoized on the call's static facts by :mod:`.problem_cache`, and one backend
selection) and runs it. The tensor-shapes family keeps a CUDA shapes tensor on the device when
the backend reads level tables there (:mod:`.tensor_shapes_ops`).

Autograd: the operators' ``setup_context`` saves the inputs and, when the forward ran on real
tensors, the call bound again for the backward (a memo hit: no second validation); the eager
fast path's :class:`MSDAFunction` saves the call the functional API bound. Both backwards go
through :func:`input_gradients`: in plain eager mode without ``create_graph`` the saved call's
backward runs directly; otherwise (tracing, modes, double backward, per-level point counts)
the family's backward operator runs.

``backend`` names the backend that does the work; ``"auto"`` picks it as the functional API's
``backend=None`` does (:mod:`nkilib_msda.pytorch.dispatch`). ``num_points`` (optional, last):
per-level point counts (P_0, ..., P_{L-1}); the locations and weights then carry sum(P) packed
points per head and the operators pad them to max(P) inside (:mod:`.point_counts`), returning
gradients in the packed shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from nkilib_msda.pytorch._modes import can_skip_dispatcher, profiler_range, values_unreadable
from nkilib_msda.pytorch._registration import register_operator
from nkilib_msda.pytorch.call import MsdaCall, bind_msda_call, spatial_shapes_from_flat
from nkilib_msda.pytorch.dispatch import AUTO
from nkilib_msda.pytorch.point_counts import pack_point_gradients, pad_point_counts
from nkilib_msda.pytorch.tensor_shapes_ops import check_shapes_tensor

__all__ = ["MsdaFamily", "INT_LIST", "TENSOR_SHAPES", "FAMILIES", "family_of", "MSDAFunction",
           "save_msda_context", "input_gradients", "FORWARD_NAME", "BACKWARD_NAME",
           "TENSOR_SHAPES_FORWARD_NAME", "TENSOR_SHAPES_BACKWARD_NAME", "DOUBLE_BACKWARD_UNSUPPORTED",
           "output_dims"]

DOUBLE_BACKWARD_UNSUPPORTED = (
    "nkilib_msda.ms_deformable_attention: double backward (differentiating its gradients, "
    "e.g. torch.autograd.grad(..., create_graph=True) followed by a second backward, or nested "
    "torch.func.grad) is not supported; only first-order gradients are implemented")

_POINTS = "bool? deterministic=None, SymInt[]? num_points=None"
# The forward schema's arguments (value, spatial_shapes, level_start_index, sampling_locations,
# attention_weights, 6 options, num_points): those with gradients sit at these positions.
_FORWARD_ARITY = 12
_GRAD_POSITIONS = (0, 3, 4)


@dataclass(frozen=True)
class MsdaFamily:
    """One operator family: its forward operator's name and how the shapes travel."""

    name: str
    shapes_schema: str  # spatial_shapes and level_start_index in the schemas
    tensor_shapes: bool

    @property
    def forward_name(self) -> str:
        return f"nkilib_msda::{self.name}"

    @property
    def backward_name(self) -> str:
        return f"nkilib_msda::{self.name}_bwd"

    def forward_schema(self) -> str:
        return (f'(Tensor value, {self.shapes_schema}, Tensor sampling_locations, '
                f'Tensor attention_weights, str value_layout="BLNC", '
                f'str sampling_locations_layout="BQHLP2", bool align_corners=False, '
                f'str padding_mode="zeros", str backend="{AUTO}", {_POINTS}) -> Tensor')

    def backward_schema(self) -> str:
        """Three gradients, zeros where ``compute`` is False."""
        return (f'(Tensor grad_output, Tensor value, {self.shapes_schema}, '
                f'Tensor sampling_locations, Tensor attention_weights, str value_layout, '
                f'str sampling_locations_layout, bool align_corners, str padding_mode, '
                f'str backend, bool[] compute, {_POINTS}) -> (Tensor, Tensor, Tensor)')

    def backward_op(self, *args: Any) -> tuple[Tensor, Tensor, Tensor]:
        return getattr(torch.ops.nkilib_msda, f"{self.name}_bwd")(*args)

    def level_count(self, spatial_shapes: Any) -> int:
        if self.tensor_shapes:
            return int(spatial_shapes.shape[0])
        return len(spatial_shapes_from_flat(spatial_shapes))

    def check_shapes(self, spatial_shapes: Any, level_start_index: Any, value: Any) -> None:
        """What the kernels and fake kernels check before any value is read: the shapes tensor's
        rank, the integer dtypes, tensors with values (not meta, unless value is meta too)."""
        if self.tensor_shapes:
            check_shapes_tensor(spatial_shapes, level_start_index, value)

    def bind(self, value: Tensor, spatial_shapes: Any, level_start_index: Any,
             sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
             sampling_locations_layout: str, align_corners: bool, padding_mode: str,
             backend: str, deterministic: bool | None, num_points: list[int] | None = None, *,
             needs_backward: bool) -> tuple[MsdaCall, Tensor, Tensor]:
        """The operator's arguments bound into a call (int-list level starts None: derived),
        with the locations and weights it runs on: padded to max(num_points) points on every
        level, or themselves when ``num_points`` is None (:mod:`.point_counts`)."""
        if num_points is not None:
            sampling_locations, attention_weights = pad_point_counts(
                sampling_locations, attention_weights, num_points,
                self.level_count(spatial_shapes), sampling_locations_layout)
        if self.tensor_shapes:
            check_shapes_tensor(spatial_shapes, level_start_index, value)
        else:
            spatial_shapes = spatial_shapes_from_flat(spatial_shapes)
            level_start_index = None if level_start_index is None else list(level_start_index)
        call = bind_msda_call(value, spatial_shapes, level_start_index, sampling_locations,
                              attention_weights, value_layout, sampling_locations_layout,
                              align_corners, padding_mode, backend, deterministic,
                              needs_backward=needs_backward)
        return call, sampling_locations, attention_weights


INT_LIST = MsdaFamily("ms_deformable_attention",
                      "SymInt[] spatial_shapes, SymInt[]? level_start_index",  # None: derived
                      tensor_shapes=False)
TENSOR_SHAPES = MsdaFamily("ms_deformable_attention_tensor_shapes",
                           "Tensor spatial_shapes, Tensor? level_start_index", tensor_shapes=True)
FAMILIES = (INT_LIST, TENSOR_SHAPES)
FORWARD_NAME = INT_LIST.forward_name
BACKWARD_NAME = INT_LIST.backward_name
TENSOR_SHAPES_FORWARD_NAME = TENSOR_SHAPES.forward_name
TENSOR_SHAPES_BACKWARD_NAME = TENSOR_SHAPES.backward_name


def family_of(call: MsdaCall) -> MsdaFamily:
    """The family whose operators take this call's :meth:`~MsdaCall.op_args`."""
    return INT_LIST if call.tables is None else TENSOR_SHAPES


def output_dims(value: Tensor, sampling_locations: Tensor, value_layout: str,
                sampling_locations_layout: str) -> tuple:
    """(B, N_q, N_h*C_h) from the input shapes alone (works with symbolic sizes)."""
    heads = value.shape[2] if value_layout == "BLNC" else value.shape[1]
    queries = (sampling_locations.shape[1] if sampling_locations_layout == "BQHLP2"
               else sampling_locations.shape[2])
    return (value.shape[0], queries, heads * value.shape[3])


# ------------------------------------------------------------- the one autograd definition


def save_msda_context(ctx: Any, value: Tensor, sampling_locations: Tensor,
                      attention_weights: Tensor, call: MsdaCall) -> None:
    """What the eager fast path's node saves: the three inputs and the bound call (whose
    backend was checked against the backward's limits)."""
    ctx.save_for_backward(value, sampling_locations, attention_weights)
    ctx.msda_call = call


def input_gradients(call: MsdaCall | None, grad_output: Tensor, value: Tensor,
                    sampling_locations: Tensor, attention_weights: Tensor,
                    needs: tuple[bool, bool, bool], operator_args: Callable[[], tuple]
                    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_value, grad_sampling_locations, grad_attention_weights), None where not needed.

    ``needs``: the three tensors' ``needs_input_grad`` flags, the backward's ``compute`` mask.
    In plain eager mode without ``create_graph`` the saved ``call`` (None: none was bound) runs
    directly; otherwise the backward operator of the family that ``operator_args`` returns,
    with (family, spatial_shapes, level_start_index, value_layout, sampling_locations_layout,
    align_corners, padding_mode, backend, deterministic, num_points)."""
    compute = (bool(needs[0]), bool(needs[1]), bool(needs[2]))
    if call is not None and not torch.is_grad_enabled() and can_skip_dispatcher(
            grad_output, value, sampling_locations, attention_weights):
        call.check_grad_output(grad_output, value, sampling_locations, attention_weights)
        with profiler_range(BACKWARD_NAME if call.tables is None else TENSOR_SHAPES_BACKWARD_NAME):
            grads = call.backward(grad_output, value, sampling_locations, attention_weights,
                                  compute)
    else:
        family, shapes, starts, *layouts_and_backend, deterministic, num_points = operator_args()
        grads = family.backward_op(grad_output, value, shapes, starts, sampling_locations,
                                   attention_weights, *layouts_and_backend, list(compute),
                                   deterministic, num_points)
    return (grads[0] if compute[0] else None, grads[1] if compute[1] else None,
            grads[2] if compute[2] else None)


# ------------------------------------------------------------- one registration per family


def _readable(value: Tensor, spatial_shapes: Any) -> bool:
    """Whether a setup_context may bind its inputs: real (or meta) tensors, no dispatch mode
    (which would see the binding read a shapes tensor), no meta shapes tensor."""
    if values_unreadable(value) or torch._C._len_torch_dispatch_stack():
        return False
    return not (isinstance(spatial_shapes, Tensor) and spatial_shapes.is_meta)


def _register_family(family: MsdaFamily) -> None:
    """Register ``family``'s backward and forward operators, with the forward's autograd."""

    def backward_impl(grad_output: Tensor, value: Tensor, spatial_shapes: Any,
                      level_start_index: Any, sampling_locations: Tensor,
                      attention_weights: Tensor, value_layout: str,
                      sampling_locations_layout: str, align_corners: bool, padding_mode: str,
                      backend: str, compute: list[bool], deterministic: bool | None,
                      num_points: list[int] | None) -> tuple[Tensor, Tensor, Tensor]:
        """Three tensors, each in its input's shape, layout and dtype; zeros where ``compute``
        is False."""
        if len(compute) != 3:
            raise ValueError(f"compute: expected 3 flags (value, sampling_locations, "
                             f"attention_weights), got {list(compute)!r}")
        flags = (bool(compute[0]), bool(compute[1]), bool(compute[2]))
        call, locations, weights = family.bind(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
            deterministic, num_points, needs_backward=True)
        call.check_grad_output(grad_output, value, locations, weights)
        grad_value, grad_loc, grad_attn = call.backward(grad_output, value, locations, weights,
                                                        flags)
        if num_points is not None:
            grad_loc, grad_attn = pack_point_gradients(grad_loc, grad_attn, num_points,
                                                       sampling_locations_layout)
            grad_loc, grad_attn = grad_loc.contiguous(), grad_attn.contiguous()
        return grad_value, grad_loc, grad_attn

    def backward_fake(grad_output: Tensor, value: Tensor, spatial_shapes: Any,
                      level_start_index: Any, sampling_locations: Tensor,
                      attention_weights: Tensor, *options: Any) -> tuple[Tensor, Tensor, Tensor]:
        family.check_shapes(spatial_shapes, level_start_index, value)
        return (value.new_empty(value.shape),
                sampling_locations.new_empty(sampling_locations.shape),
                attention_weights.new_empty(attention_weights.shape))

    def no_double_backward(ctx: Any, *grads: Tensor) -> tuple:
        raise RuntimeError(DOUBLE_BACKWARD_UNSUPPORTED)

    register_operator(f"{family.name}_bwd", backward_impl, backward_fake,
                      schema=family.backward_schema(), backward=no_double_backward,
                      setup_context=lambda ctx, inputs, output: None)

    def forward_impl(value: Tensor, spatial_shapes: Any, level_start_index: Any,
                     sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                     sampling_locations_layout: str, align_corners: bool, padding_mode: str,
                     backend: str, deterministic: bool | None, num_points: list[int] | None
                     ) -> Tensor:
        """(B, N_q, N_h*C_h) in value's dtype, computed by ``backend``. ``deterministic`` is
        used by the backward only (bitwise-reproducible grad_value; None: the backend's
        default, e.g. ``NKILIB_MSDA_DETERMINISTIC`` for triton)."""
        call, locations, weights = family.bind(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
            deterministic, num_points, needs_backward=False)
        return call.forward(value, locations, weights)

    def forward_fake(value: Tensor, spatial_shapes: Any, level_start_index: Any,
                     sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                     sampling_locations_layout: str, *options: Any) -> Tensor:
        family.check_shapes(spatial_shapes, level_start_index, value)
        return value.new_empty(output_dims(value, sampling_locations, value_layout,
                                           sampling_locations_layout))

    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        """Save the inputs and, unless tracing or under a dispatch mode, the call bound with the
        backward's limits (raising now if an explicit backend cannot run the backward; in plain
        eager mode the backward runs it directly)."""
        (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
         *options) = inputs
        shape_tensors = (spatial_shapes, level_start_index) if family.tensor_shapes else ()
        ctx.save_for_backward(value, sampling_locations, attention_weights, *shape_tensors)
        ctx.msda_shapes = None if family.tensor_shapes else (
            list(spatial_shapes), None if level_start_index is None else list(level_start_index))
        ctx.msda_options = tuple(options)
        ctx.msda_call = None
        if options[-1] is None and _readable(value, spatial_shapes):
            ctx.msda_call, _, _ = family.bind(value, spatial_shapes, level_start_index,
                                              sampling_locations, attention_weights, *options,
                                              needs_backward=True)

    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        value, sampling_locations, attention_weights, *shape_tensors = ctx.saved_tensors
        spatial_shapes, level_start_index = (shape_tensors if family.tensor_shapes
                                             else ctx.msda_shapes)
        needs = tuple(ctx.needs_input_grad[i] for i in _GRAD_POSITIONS)
        grads = input_gradients(
            ctx.msda_call, grad_output, value, sampling_locations, attention_weights,
            needs,  # type: ignore[arg-type]
            lambda: (family, spatial_shapes, level_start_index, *ctx.msda_options))
        inputs_grads: list[Tensor | None] = [None] * _FORWARD_ARITY
        for position, grad in zip(_GRAD_POSITIONS, grads):
            inputs_grads[position] = grad
        return tuple(inputs_grads)

    register_operator(family.name, forward_impl, forward_fake, schema=family.forward_schema(),
                      backward=backward, setup_context=setup_context)


for _family in FAMILIES:
    _register_family(_family)

ms_deformable_attention = torch.ops.nkilib_msda.ms_deformable_attention
ms_deformable_attention_bwd = torch.ops.nkilib_msda.ms_deformable_attention_bwd


class MSDAFunction(torch.autograd.Function):
    """The eager fast path's autograd node: the call the functional API bound, and the same
    backward as the operators' (:func:`input_gradients`)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                call: MsdaCall) -> Tensor:
        save_msda_context(ctx, value, sampling_locations, attention_weights, call)
        with profiler_range(FORWARD_NAME if call.tables is None else TENSOR_SHAPES_FORWARD_NAME):
            return call.forward(value, sampling_locations, attention_weights)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        call: MsdaCall = ctx.msda_call
        value, sampling_locations, attention_weights = ctx.saved_tensors
        return (*input_gradients(call, grad_output, value, sampling_locations, attention_weights,
                                 ctx.needs_input_grad[:3], lambda: (
                                     family_of(call), *call.op_args(), call.op_backend,
                                     call.deterministic, None)),
                None)
