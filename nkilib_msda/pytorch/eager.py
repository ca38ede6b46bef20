"""Eager fast path: run the operators' bodies without the dispatcher round trip.

Calling ``torch.ops.nkilib_msda.ms_deformable_attention`` costs about 100 µs of host time per
call (custom-op dispatch, dynamo-disable wrappers, a second validation), more than a decoder's
whole GPU time. In plain eager mode that round trip buys nothing, so
:func:`msda_forward_eager` calls the same bodies (:func:`ops.forward_with_backend`,
:func:`ops.backward_with_backend`) directly, with a small ``autograd.Function`` carrying the
same saved tensors, ``needs_input_grad`` -> ``compute`` mapping and gradient dtypes as the
operator's registered autograd.

The registered operators stay the only path whenever something could observe the difference
(:func:`can_skip_dispatcher` is False): torch.compile / export tracing, ``torch.jit.trace``,
any TorchDispatchMode (FakeTensorMode, make_fx, FlopCounterMode, ...), any TorchFunctionMode
(``with torch.device(...)``), functorch transforms (vmap, grad), and tensor subclasses.
While a profiler runs, the direct calls are wrapped in ranges named like the operators.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from nkilib_msda.backends import get_backend
from nkilib_msda.pytorch import ops
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.validation import MSDAProblem

__all__ = ["can_skip_dispatcher", "msda_forward_eager"]

_PLAIN_TENSOR_TYPES = (Tensor, nn.Parameter)
_C = torch._C


def can_skip_dispatcher(*tensors: Tensor) -> bool:
    """Whether calling the operator bodies directly is indistinguishable from the operators."""
    if torch.compiler.is_compiling() or _C._get_tracing_state() is not None:
        return False
    if _C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled():
        return False
    if _C._functorch.peek_interpreter_stack() is not None:
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TENSOR_TYPES:
            return False
    return True


def _profiler_range(name: str):
    """A profiler range called ``name`` while a profiler runs (what the operator would show)."""
    if _C._autograd._profiler_enabled():
        return torch.autograd.profiler.record_function(name)
    return contextlib.nullcontext()


def _forward(backend: str, problem: MSDAProblem, value: Tensor, sampling_locations: Tensor,
             attention_weights: Tensor) -> Tensor:
    with _profiler_range("nkilib_msda::ms_deformable_attention"):
        return ops.forward_with_backend(get_backend(backend), problem, value, sampling_locations,
                                        attention_weights)


class MSDAEager(torch.autograd.Function):
    """Autograd of the eager path; mirrors ``ops._setup_context`` / ``ops._backward``."""

    @staticmethod
    def forward(ctx, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                problem: MSDAProblem, backend: str, deterministic: bool | None) -> Tensor:
        ctx.save_for_backward(value, sampling_locations, attention_weights)
        ctx.problem = problem
        ctx.backend = backend
        ctx.deterministic = deterministic
        return _forward(backend, problem, value, sampling_locations, attention_weights)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        value, sampling_locations, attention_weights = ctx.saved_tensors
        p: MSDAProblem = ctx.problem
        compute = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        direct = can_skip_dispatcher(grad_output, value, sampling_locations, attention_weights)
        if torch.is_grad_enabled() or not direct:
            # create_graph=True or an active mode: exactly what the operator's autograd does.
            grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
                grad_output, value, ops.flatten_spatial_shapes(p.spatial_shapes),
                list(p.level_start_index), sampling_locations, attention_weights, p.value_layout,
                p.sampling_locations_layout, p.align_corners, p.padding_mode, ctx.backend,
                compute, ctx.deterministic)
        else:
            problem = validated_problem(
                value, p.spatial_shapes, p.level_start_index, sampling_locations,
                attention_weights, p.value_layout, p.sampling_locations_layout, p.align_corners,
                p.padding_mode, grad_output=grad_output)
            with _profiler_range("nkilib_msda::ms_deformable_attention_bwd"):
                grads = ops.backward_with_backend(ctx.backend, problem, grad_output, value,
                                                  sampling_locations, attention_weights, compute,
                                                  ctx.deterministic)
        grad_value, grad_loc, grad_attn = grads
        return (grad_value if compute[0] else None, grad_loc if compute[1] else None,
                grad_attn if compute[2] else None, None, None, None)


def msda_forward_eager(problem: MSDAProblem, backend: str, value: Tensor,
                       sampling_locations: Tensor, attention_weights: Tensor,
                       deterministic: bool | None = None) -> Tensor:
    """The forward operator's result (and autograd) for a validated call that ``backend`` can
    run; only valid when :func:`can_skip_dispatcher` holds for the three tensors."""
    if torch.is_grad_enabled() and (value.requires_grad or sampling_locations.requires_grad
                                    or attention_weights.requires_grad):
        return MSDAEager.apply(value, sampling_locations, attention_weights, problem, backend,
                               deterministic)
    return _forward(backend, problem, value, sampling_locations, attention_weights)
