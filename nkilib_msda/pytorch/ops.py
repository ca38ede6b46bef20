"""Registered operators ``torch.ops.nkilib_msda.ms_deformable_attention`` and ``..._bwd``, and
the one autograd definition every path shares.

Both operators are ``torch.library.custom_op``s with fake kernels (which also serve meta
tensors), so they stay opaque single nodes under ``torch.compile`` / ``torch.export`` and pass
``torch.library.opcheck``. Registered per dispatch key:

- the default implementation (every device): the operator bodies below;
- ``PrivateUse1`` (TorchNeuron's ``neuron`` device): the same bodies, whose ``"auto"`` backend
  resolves to ``"nki"`` there, so the NKI kernels run on the device (see docs/torch.md);
- ``AutocastCPU`` / ``AutocastCUDA``: run the operator with autocast off, so an autocast region
  never changes what the operators compute (they work in the dtypes they receive);
- autograd: :func:`_backward`, built from :func:`save_msda_context` and
  :func:`msda_input_gradients`, which the eager fast path's :class:`MSDAFunction` uses too.

Spatial shapes travel as a flat int list ``[H0, W0, H1, W1, ...]``. ``backend`` names the
backend module that does the work; ``"auto"`` picks it as the functional API does
(:mod:`nkilib_msda.pytorch.dispatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nkilib_msda.backends import get_backend
from nkilib_msda.pytorch._modes import autocast_disabled, can_skip_dispatcher, profiler_range
from nkilib_msda.pytorch.dispatch import AUTO, select_backend
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["ms_deformable_attention", "ms_deformable_attention_bwd", "flatten_spatial_shapes",
           "problem_from_op_args", "forward_with_backend", "backward_with_backend",
           "is_empty_problem", "MSDAStatic", "MSDAFunction", "save_msda_context",
           "msda_input_gradients"]

FORWARD_NAME = "nkilib_msda::ms_deformable_attention"
BACKWARD_NAME = "nkilib_msda::ms_deformable_attention_bwd"


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


def is_empty_problem(problem: MSDAProblem) -> bool:
    """B = 0 or N_q = 0: the output is empty and no kernel runs."""
    return problem.batch == 0 or problem.num_queries == 0


def _resolve_backend(backend: str, problem: MSDAProblem, value: Tensor, sampling_locations: Tensor,
                     *, for_backward: bool) -> Any:
    """The backend module for an operator call after checking it can run ``problem``; ``"auto"``
    is resolved like the functional API's ``backend=None`` (direct op calls skip dispatch)."""
    name = select_backend(None if backend == AUTO else backend, problem, value,
                          sampling_locations, needs_backward=for_backward)
    return get_backend(name)


# ----------------------------------------------------------------------------- forward


def _forward_op_impl(
    value: Tensor,
    spatial_shapes: list[int],
    level_start_index: list[int],
    sampling_locations: Tensor,
    attention_weights: Tensor,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
    backend: str = "auto",
    deterministic: bool | None = None,
) -> Tensor:
    """MSDA forward: (B, N_q, N_h*C_h) in value's dtype, computed by ``backend``.

    ``deterministic`` is only used by the backward (bitwise-reproducible grad_value; None: the
    backend's default, e.g. ``NKILIB_MSDA_DETERMINISTIC`` for triton)."""
    problem = problem_from_op_args(value, spatial_shapes, level_start_index, sampling_locations,
                                   attention_weights, value_layout, sampling_locations_layout,
                                   align_corners, padding_mode)
    return forward_with_backend(backend, problem, value, sampling_locations, attention_weights)


ms_deformable_attention = torch.library.custom_op(FORWARD_NAME, _forward_op_impl, mutates_args=())


def forward_with_backend(backend: str, problem: MSDAProblem, value: Tensor,
                         sampling_locations: Tensor, attention_weights: Tensor, *,
                         resolved: bool = False) -> Tensor:
    """The forward operator's body once ``problem`` is validated (empty problems call nothing).

    ``resolved``: ``backend`` is a name that :func:`select_backend` already returned for this
    call (the eager fast path), so it is not checked again."""
    if is_empty_problem(problem):
        return value.new_zeros(problem.output_shape)
    with autocast_disabled(value.device.type):
        module = (get_backend(backend) if resolved else
                  _resolve_backend(backend, problem, value, sampling_locations, for_backward=False))
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
                                  padding_mode="zeros", backend="auto", deterministic=None):
    return value.new_empty(_output_dims(value, sampling_locations, value_layout,
                                        sampling_locations_layout))


# ---------------------------------------------------------------------------- backward


def _backward_op_impl(
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


ms_deformable_attention_bwd = torch.library.custom_op(BACKWARD_NAME, _backward_op_impl,
                                                      mutates_args=())


def backward_with_backend(backend: str, problem: MSDAProblem, grad_output: Tensor, value: Tensor,
                          sampling_locations: Tensor, attention_weights: Tensor,
                          compute: list[bool], deterministic: bool | None = None, *,
                          resolved: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operator's body once ``problem`` (with ``grad_output``) is validated;
    ``resolved`` as in :func:`forward_with_backend` (the name was chosen for a backward)."""
    flags = tuple(bool(c) for c in compute)
    if any(flags) and not is_empty_problem(problem):
        with autocast_disabled(value.device.type):
            module = (get_backend(backend) if resolved else _resolve_backend(
                backend, problem, value, sampling_locations, for_backward=True))
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


# --------------------------------------------------- neuron (PrivateUse1) and autocast keys

# TorchNeuron's device is PrivateUse1 renamed to "neuron"; "privateuseone" is the name
# torch.library accepts before (and after) the rename.
ms_deformable_attention.register_kernel("privateuseone")(_forward_op_impl)
ms_deformable_attention_bwd.register_kernel("privateuseone")(_backward_op_impl)

_LIB = torch.library.Library("nkilib_msda", "FRAGMENT")  # noqa: TOR901 - keys custom_op lacks


def register_autocast_passthrough(lib: torch.library.Library, name: str) -> None:
    """Autocast kernels for ``nkilib_msda::name``: rerun the operator with autocast off (on CPU
    and CUDA), so its inputs keep their dtypes and its body computes exactly as outside."""
    for key, device_type in (("AutocastCPU", "cpu"), ("AutocastCUDA", "cuda")):
        def kernel(*args: Any, _device_type: str = device_type, **kwargs: Any) -> Any:
            with torch.autocast(device_type=_device_type, enabled=False):
                return getattr(torch.ops.nkilib_msda, name).default(*args, **kwargs)

        lib.impl(name, kernel, key)


register_autocast_passthrough(_LIB, "ms_deformable_attention")
register_autocast_passthrough(_LIB, "ms_deformable_attention_bwd")


# ------------------------------------------------------------- the one autograd definition


@dataclass(frozen=True)
class MSDAStatic:
    """The non-tensor facts the backward needs (validated problem, backend, determinism)."""

    problem: MSDAProblem
    backend: str
    deterministic: bool | None
    # True when made by the eager fast path: ``backend`` was selected for this problem with
    # its backward's limits, and ``problem`` describes the autograd node's own output.
    resolved: bool = False


def save_msda_context(ctx: Any, value: Tensor, sampling_locations: Tensor,
                      attention_weights: Tensor, static: MSDAStatic) -> None:
    """What every MSDA autograd node saves: the three inputs and the static facts."""
    ctx.save_for_backward(value, sampling_locations, attention_weights)
    ctx.msda_static = static


def msda_input_gradients(ctx: Any, grad_output: Tensor, needs: tuple[bool, bool, bool]
                         ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_value, grad_sampling_locations, grad_attention_weights), None where not needed.

    ``needs`` are the ``needs_input_grad`` flags of the three tensors; they become the backward's
    ``compute`` mask. In plain eager mode without ``create_graph`` the backward body runs
    directly; otherwise (tracing, modes, double backward) through the backward operator.
    """
    value, sampling_locations, attention_weights = ctx.saved_tensors
    static: MSDAStatic = ctx.msda_static
    p = static.problem
    compute = [bool(n) for n in needs]
    if not torch.is_grad_enabled() and can_skip_dispatcher(grad_output, value, sampling_locations,
                                                           attention_weights):
        problem = p
        # The autograd engine hands a node a gradient of its output's shape and dtype; anything
        # else (or a node of the operator path) is validated in full.
        if not (static.resolved and grad_output.shape == p.output_shape
                and grad_output.dtype == value.dtype):
            problem = validated_problem(
                value, p.spatial_shapes, p.level_start_index, sampling_locations,
                attention_weights, p.value_layout, p.sampling_locations_layout, p.align_corners,
                p.padding_mode, grad_output=grad_output)
        with profiler_range(BACKWARD_NAME):
            grads = backward_with_backend(static.backend, problem, grad_output, value,
                                          sampling_locations, attention_weights, compute,
                                          static.deterministic, resolved=static.resolved)
    else:
        grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
            grad_output, value, flatten_spatial_shapes(p.spatial_shapes),
            list(p.level_start_index), sampling_locations, attention_weights, p.value_layout,
            p.sampling_locations_layout, p.align_corners, p.padding_mode, static.backend,
            compute, static.deterministic)
    return tuple(g if flag else None for g, flag in zip(grads, compute))  # type: ignore[return-value]


def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
     value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
     deterministic) = inputs
    problem = problem_from_op_args(value, list(spatial_shapes), list(level_start_index),
                                   sampling_locations, attention_weights, value_layout,
                                   sampling_locations_layout, align_corners, padding_mode)
    save_msda_context(ctx, value, sampling_locations, attention_weights,
                      MSDAStatic(problem, backend, deterministic))


def _backward(ctx: Any, grad_output: Tensor) -> tuple:
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4])
    grad_value, grad_loc, grad_attn = msda_input_gradients(ctx, grad_output, needs)
    return (grad_value, None, None, grad_loc, grad_attn, None, None, None, None, None, None)


ms_deformable_attention.register_autograd(_backward, setup_context=_setup_context)


class MSDAFunction(torch.autograd.Function):
    """The eager fast path's autograd node: the same context and backward as the operator's."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                static: MSDAStatic) -> Tensor:
        save_msda_context(ctx, value, sampling_locations, attention_weights, static)
        with profiler_range(FORWARD_NAME):
            return forward_with_backend(static.backend, static.problem, value,
                                        sampling_locations, attention_weights,
                                        resolved=static.resolved)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return (*msda_input_gradients(ctx, grad_output, needs), None)


