"""``nkilib_msda.multi_scale_deformable_attention``: the differentiable functional API.

Each call takes one route, the first row of :data:`ROUTES` whose condition holds:

| route | when | what runs |
| --- | --- | --- |
| ``eager`` | plain eager mode, CPU/CUDA tensors | the call bound here (:func:`.call.bind_msda_call`), directly (:mod:`.eager`): ~100 µs of host time less than the dispatcher; a repeated call with tuple shapes takes the call remembered for it (:func:`.eager.run_remembered`) |
| ``torch.func`` | inside a ``torch.func`` transform | the int-list operators in ``setup_context`` Functions (:mod:`.func_transforms`) |
| ``op with tensor shapes`` | a shapes tensor whose values cannot be read now (tracing, fake tensors) or live on a device | ``ms_deformable_attention_tensor_shapes`` (:mod:`.tensor_shapes_ops`): the graph neither breaks nor bakes the values in, and a CUDA shapes tensor is never read on the host |
| ``op`` | anything else (modes, subclasses, meta tensors, TorchNeuron's ``neuron`` device) | ``ms_deformable_attention`` with the checked arguments (:func:`.call.msda_operator_args`) |

On the eager route a CUDA shapes tensor also stays on the device when the backend reads level
tables there (:mod:`.tensor_shapes_ops`). The operators bind their own arguments when they
run, so ``backend=None`` stays "auto" in a traced or exported graph. Every route shares one
backward (:mod:`.ops`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from nkilib_msda.backends import BACKEND_NAMES, BackendUnavailableError, get_backend
from nkilib_msda.pytorch import ops  # noqa: F401 - registers the operators
from nkilib_msda.pytorch._modes import (FAST_PATH_DEVICES, in_functorch_transform,
                                        plain_eager_now, values_unreadable)
from nkilib_msda.pytorch.call import bind_msda_call, msda_operator_args, needs_input_grad
from nkilib_msda.pytorch.eager import (can_skip_dispatcher, msda_forward_eager,
                                      remember_eager_call, run_remembered)
from nkilib_msda.pytorch.func_transforms import msda_under_transform
from nkilib_msda.pytorch.point_counts import level_count, pad_point_counts
from nkilib_msda.pytorch.tensor_shapes_ops import shapes_on_device, tensor_shapes_operator_args

__all__ = ["multi_scale_deformable_attention", "ROUTES", "route_of"]

# Import the backend modules now (they import their heavy dependencies lazily), so that a first
# call under torch.compile(fullgraph=True) does not have to import them while tracing.
for _name in BACKEND_NAMES:
    try:
        get_backend(_name)
    except BackendUnavailableError:
        pass


def multi_scale_deformable_attention(
    value: Tensor,
    spatial_shapes: Sequence[Sequence[int]] | Tensor,
    level_start_index: Sequence[int] | Tensor | None,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    *,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
    backend: str | None = None,
    deterministic: bool | None = None,
    num_points: Sequence[int] | None = None,
) -> Tensor:
    """Multi-scale deformable attention; returns (B, N_q, N_h*C_h) in value's dtype.

    Args:
        value: (B, L, N_h, C_h) for ``value_layout="BLNC"`` or (B, N_h, L, C_h) for "BNLC",
            L = sum(H_l * W_l).
        spatial_shapes: (H_l, W_l) per level: pairs or an int tensor (N_l, 2) (read when the
            call runs, also in a compiled or exported graph).
        level_start_index: cumulative H*W per level (tuple/list/tensor) or None to derive it.
        sampling_locations: normalized (x, y) in [0, 1]; (B, N_q, N_h, N_l, N_p, 2) for
            "BQHLP2" or (B, 2, N_q, N_h, N_l, N_p) for "B2QHLP".
        attention_weights: (B, N_q, N_h, N_l, N_p).
        align_corners, padding_mode: as ``grid_sample`` ("zeros", "border", "reflection").
        backend: None/"auto", "reference", "nki" or "triton" (see :mod:`.dispatch`).
        deterministic: True asks for a bitwise-reproducible backward (grad_value); None uses
            the backend's default (triton: ``NKILIB_MSDA_DETERMINISTIC``, else
            ``torch.are_deterministic_algorithms_enabled()``). The reference and nki backends
            are deterministic on CPU and Neuron whatever the flag.
        num_points: per-level point counts (P_0, ..., P_{N_l-1}) (RT-DETRv2, D-FINE, DEIMv2):
            then sampling_locations is (B, N_q, N_h, sum(P), 2) ((B, 2, N_q, N_h, sum(P)) for
            "B2QHLP") and attention_weights (B, N_q, N_h, sum(P)), level after level. Padded
            to max(P) points per level with zero weights (:mod:`.point_counts`).

    Differentiable with respect to value, sampling_locations and attention_weights. Invalid
    arguments raise ``ValueError``/``TypeError`` naming the argument before any kernel runs.
    Empty inputs (B = 0 or N_q = 0) return an empty output (and zero-size gradients) without
    calling a kernel. Meta tensors go through the operators' fake kernels (shapes only).
    """
    if num_points is not None:
        sampling_locations, attention_weights = pad_point_counts(
            sampling_locations, attention_weights, num_points, level_count(spatial_shapes),
            sampling_locations_layout)
    elif plain_eager_now():  # a call remembered on the eager route (.eager): no binding
        out = run_remembered(value, spatial_shapes, level_start_index, sampling_locations,
                             attention_weights, value_layout, sampling_locations_layout,
                             align_corners, padding_mode, backend, deterministic)
        if out is not None:
            return out
    args = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
            deterministic)
    for applies, run in _STEPS:
        if applies(value, spatial_shapes, sampling_locations, attention_weights):
            return run(args)
    raise AssertionError("the last route applies to every call")  # pragma: no cover


def _plain_eager(value: Any, spatial_shapes: Any, sampling_locations: Any,
                 attention_weights: Any) -> bool:
    """CPU/CUDA tensors in plain eager mode (or arguments that are not tensors, which the
    binding rejects). Other devices (TorchNeuron's PrivateUse1, meta) always go through the
    dispatcher."""
    if not (isinstance(value, Tensor) and isinstance(sampling_locations, Tensor)
            and isinstance(attention_weights, Tensor)):
        return True
    return value.device.type in FAST_PATH_DEVICES and can_skip_dispatcher(
        value, sampling_locations, attention_weights)


def _run_eager(args: tuple) -> Tensor:
    value, sampling_locations, attention_weights = args[0], args[3], args[4]
    call = bind_msda_call(*args, needs_backward=needs_input_grad(value, sampling_locations,
                                                                 attention_weights))
    remember_eager_call(call, args)
    return msda_forward_eager(call, value, sampling_locations, attention_weights)


def _in_transform(*tensors_and_shapes: Any) -> bool:
    return in_functorch_transform()


def _run_under_transform(args: tuple) -> Tensor:
    return msda_under_transform(*msda_operator_args(*args))


def _shapes_stay_tensors(value: Any, spatial_shapes: Any, *tensors: Any) -> bool:
    return isinstance(spatial_shapes, Tensor) and (values_unreadable(spatial_shapes)
                                                   or shapes_on_device(spatial_shapes))


def _run_tensor_shapes_op(args: tuple) -> Tensor:
    return torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes(
        *tensor_shapes_operator_args(*args))


def _always(*tensors_and_shapes: Any) -> bool:
    return True


def _run_op(args: tuple) -> Tensor:
    return torch.ops.nkilib_msda.ms_deformable_attention(*msda_operator_args(*args))


class Route(NamedTuple):
    """One way through the torch layer: its name, when it applies (given value, spatial_shapes,
    sampling_locations, attention_weights) and what runs it (given the functional API's eleven
    arguments as a tuple)."""

    name: str
    applies: Callable[..., bool]
    run: Callable[..., Tensor]


# The route table: the first row whose condition holds runs the call (module docstring).
ROUTES: tuple[Route, ...] = (
    Route("eager", _plain_eager, _run_eager),
    Route("torch.func", _in_transform, _run_under_transform),
    Route("op with tensor shapes", _shapes_stay_tensors, _run_tensor_shapes_op),
    Route("op", _always, _run_op),
)
_STEPS = tuple((route.applies, route.run) for route in ROUTES)  # the table, for the hot loop


def route_of(value: Any, spatial_shapes: Any, sampling_locations: Any,
             attention_weights: Any) -> str:
    """The name of the route a call with these arguments takes now (tests, diagnostics)."""
    return next(route.name for route in ROUTES
                if route.applies(value, spatial_shapes, sampling_locations, attention_weights))
