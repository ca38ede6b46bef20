"""Glue between the NKI kernels and the two torch-neuronx stacks (torch-integration.md §1).

- **PyTorch/XLA** (``device.type == "xla"``): :class:`NkiXlaMSDAFunction`, a
  ``torch.autograd.Function`` whose forward calls the ``@nki.jit`` forward kernel on the XLA
  tensors (it becomes a custom call in the HLO) and whose backward calls the backward kernel
  with ``compute_grad_*`` taken from ``ctx.needs_input_grad``.
- **TorchNeuron native** (``device.type == "neuron"``): :class:`NativeNeuronOps` registers
  forward and backward ``nki_op``s over ``wrap_nki(kernel)`` and hooks the backward in with
  ``register_autograd`` (the documented route).

Both are written against the documented torch-neuronx APIs. The kernel-calling hooks are
injectable (:class:`KernelCalls`; ``nki_op``/``wrap_nki`` for the native ops), so CPU tests run
this glue with the kernels executed by the simulator
(:func:`nkilib_msda.backends.nki_backend.run_in_simulator`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from nkilib_msda.backends.nki_backend import (
    call_backward_kernel, call_forward_kernel, run_in_simulator)
from nkilib_msda.pytorch.ops import flatten_spatial_shapes, problem_from_op_args
from nkilib_msda.validation import MSDAProblem

__all__ = ["KernelCalls", "device_kernel_calls", "simulator_kernel_calls", "set_xla_kernel_calls",
           "NkiXlaMSDAFunction", "xla_msda", "NativeNeuronOps", "native_neuron_ops",
           "msda_on_neuron_device", "LNC_ENV_VAR"]

# Neuron's logical-NeuronCore setting (Trn2 defaults to 2); the kernels are launched with
# that many programs, kernel[lnc](...).
LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"


def _raw_kernels() -> tuple[Any, Any]:
    from nkilib_msda.experimental.deformable_attention import (
        ms_deformable_attention, ms_deformable_attention_bwd)

    return ms_deformable_attention, ms_deformable_attention_bwd


def _device_lnc() -> int:
    raw = os.environ.get(LNC_ENV_VAR, "2").strip()
    if raw not in ("1", "2"):
        raise ValueError(f"{LNC_ENV_VAR}: expected 1 or 2, got {raw!r}")
    return int(raw)


def _launch(kernel: Any, lnc: int) -> Callable[..., Any]:
    """``kernel[lnc]`` (an SPMD launch over lnc logical cores), or the kernel itself for 1."""
    return kernel[lnc] if lnc > 1 else kernel


@dataclass(frozen=True)
class KernelCalls:
    """Callables with the kernels' signatures (api.md §1) that take and return torch tensors."""

    forward: Callable[..., Any]
    backward: Callable[..., Any]


def device_kernel_calls(lnc: int | None = None) -> KernelCalls:
    """The ``@nki.jit`` kernels called directly (on XLA tensors torch-neuronx compiles them)."""
    forward, backward = _raw_kernels()
    degree = lnc if lnc is not None else _device_lnc()
    return KernelCalls(_launch(forward, degree), _launch(backward, degree))


def simulator_kernel_calls(lnc: int | None = None) -> KernelCalls:
    """The kernels executed by the simulator on CPU tensors (for tests and dry runs)."""
    forward, backward = _raw_kernels()
    return KernelCalls(run_in_simulator(forward, lnc), run_in_simulator(backward, lnc))


_xla_calls: KernelCalls | None = None


def set_xla_kernel_calls(calls: KernelCalls | None) -> None:
    """Inject how the XLA path calls the kernels (None restores :func:`device_kernel_calls`)."""
    global _xla_calls
    _xla_calls = calls


def _cast_like(grad: Tensor, like: Tensor) -> Tensor:
    return grad.to(like.dtype)


# ------------------------------------------------------------------------ PyTorch/XLA


class NkiXlaMSDAFunction(torch.autograd.Function):
    """Autograd around the NKI forward and backward kernels (the PyTorch/XLA route)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                problem: MSDAProblem, calls: KernelCalls) -> Tensor:
        ctx.save_for_backward(value, sampling_locations, attention_weights)
        ctx.problem = problem
        ctx.calls = calls
        out = call_forward_kernel(calls.forward, value, problem, sampling_locations,
                                  attention_weights)
        return out.to(value.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        value, sampling_locations, attention_weights = ctx.saved_tensors
        compute = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        grads = call_backward_kernel(ctx.calls.backward, grad_output, value, ctx.problem,
                                     sampling_locations, attention_weights, compute)
        inputs = (value, sampling_locations, attention_weights)
        return (*(_cast_like(g, x) if flag else None for g, x, flag in zip(grads, inputs, compute)),
                None, None)


def xla_msda(value: Tensor, problem: MSDAProblem, sampling_locations: Tensor,
             attention_weights: Tensor, calls: KernelCalls | None = None) -> Tensor:
    """MSDA through :class:`NkiXlaMSDAFunction` (``calls`` defaults to the injected or device
    kernel calls)."""
    calls = calls or _xla_calls or device_kernel_calls()
    return NkiXlaMSDAFunction.apply(value, sampling_locations, attention_weights, problem, calls)


# ---------------------------------------------------------------- TorchNeuron native


class NativeNeuronOps:
    """Forward/backward ``nki_op``s over ``wrap_nki`` kernels, with ``register_autograd``.

    ``nki_op`` and ``wrap_nki`` default to ``torch_neuronx``'s; ``kernels`` to the package's
    ``(forward, backward)`` NKI kernels; ``lnc`` (default ``NEURON_LOGICAL_NC_CONFIG``, else 2)
    launches ``wrapped[lnc](...)`` when above 1. ``namespace`` must be unique per instance
    (operator names are global).
    """

    def __init__(self, nki_op: Callable[..., Any] | None = None,
                 wrap_nki: Callable[[Any], Callable[..., Any]] | None = None,
                 kernels: tuple[Any, Any] | None = None, namespace: str = "nkilib_msda_neuron",
                 lnc: int | None = None):
        if nki_op is None or wrap_nki is None:
            from torch_neuronx import nki_op as neuron_nki_op  # type: ignore[import-not-found]
            from torch_neuronx import wrap_nki as neuron_wrap_nki  # type: ignore[import-not-found]

            nki_op = nki_op or neuron_nki_op
            wrap_nki = wrap_nki or neuron_wrap_nki
        forward_kernel, backward_kernel = kernels or _raw_kernels()
        degree = lnc if lnc is not None else _device_lnc()
        self.forward_op = _define_forward_op(
            nki_op, _launch(wrap_nki(forward_kernel), degree), namespace)
        self.backward_op = _define_backward_op(
            nki_op, _launch(wrap_nki(backward_kernel), degree), namespace)
        self.forward_op.register_autograd(self._backward, setup_context=self._setup_context)

    def __call__(self, value: Tensor, problem: MSDAProblem, sampling_locations: Tensor,
                 attention_weights: Tensor) -> Tensor:
        return self.forward_op(
            value, flatten_spatial_shapes(problem.spatial_shapes), list(problem.level_start_index),
            sampling_locations, attention_weights, problem.value_layout,
            problem.sampling_locations_layout, problem.align_corners, problem.padding_mode)

    @staticmethod
    def _setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        value, shapes, starts, locations, weights, *static = inputs
        ctx.save_for_backward(value, locations, weights)
        ctx.static_args = (list(shapes), list(starts), *static)

    def _backward(self, ctx: Any, grad_output: Tensor) -> tuple:
        value, locations, weights = ctx.saved_tensors
        shapes, starts, *static = ctx.static_args
        compute = [ctx.needs_input_grad[0], ctx.needs_input_grad[3], ctx.needs_input_grad[4]]
        grad_value, grad_loc, grad_attn = self.backward_op(
            grad_output, value, shapes, starts, locations, weights, *static, compute)
        return (grad_value if compute[0] else None, None, None,
                grad_loc if compute[1] else None, grad_attn if compute[2] else None,
                None, None, None, None)


def _define_forward_op(nki_op: Callable[..., Any], kernel: Callable[..., Any], namespace: str):
    @nki_op(f"{namespace}::ms_deformable_attention", mutates_args={})
    def forward(value: Tensor, spatial_shapes: list[int], level_start_index: list[int],
                sampling_locations: Tensor, attention_weights: Tensor, value_layout: str,
                sampling_locations_layout: str, align_corners: bool, padding_mode: str) -> Tensor:
        problem = problem_from_op_args(value, spatial_shapes, level_start_index, sampling_locations,
                                       attention_weights, value_layout, sampling_locations_layout,
                                       align_corners, padding_mode)
        out = call_forward_kernel(kernel, value, problem, sampling_locations, attention_weights)
        return out.to(value.dtype)

    return forward


def _define_backward_op(nki_op: Callable[..., Any], kernel: Callable[..., Any], namespace: str):
    @nki_op(f"{namespace}::ms_deformable_attention_bwd", mutates_args={})
    def backward(grad_output: Tensor, value: Tensor, spatial_shapes: list[int],
                 level_start_index: list[int], sampling_locations: Tensor,
                 attention_weights: Tensor, value_layout: str, sampling_locations_layout: str,
                 align_corners: bool, padding_mode: str, compute: list[bool]
                 ) -> tuple[Tensor, Tensor, Tensor]:
        problem = problem_from_op_args(value, spatial_shapes, level_start_index, sampling_locations,
                                       attention_weights, value_layout, sampling_locations_layout,
                                       align_corners, padding_mode, grad_output=grad_output)
        grads = call_backward_kernel(kernel, grad_output, value, problem, sampling_locations,
                                     attention_weights, (compute[0], compute[1], compute[2]))
        inputs = (value, sampling_locations, attention_weights)
        return tuple(_cast_like(g, x) for g, x in zip(grads, inputs))  # type: ignore[return-value]

    return backward


_native_ops: NativeNeuronOps | None = None


def native_neuron_ops() -> NativeNeuronOps:
    """The process-wide native ops over torch_neuronx's ``nki_op``/``wrap_nki`` (built once)."""
    global _native_ops
    if _native_ops is None:
        _native_ops = NativeNeuronOps()
    return _native_ops


def msda_on_neuron_device(value: Tensor, problem: MSDAProblem, sampling_locations: Tensor,
                          attention_weights: Tensor) -> Tensor:
    """Route Neuron tensors: XLA -> autograd.Function, native "neuron" -> nki_op."""
    if value.device.type == "xla":
        return xla_msda(value, problem, sampling_locations, attention_weights)
    return native_neuron_ops()(value, problem, sampling_locations, attention_weights)
