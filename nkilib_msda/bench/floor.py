"""The autograd engine's floor of an MSDA forward + backward: a trivial ``autograd.Function``
with the operator's three differentiable inputs (value, sampling_locations,
attention_weights) that saves them and allocates its output and gradients, running no kernel.
The GPU host-time benchmarks time it beside the real call (``benchmarks/host_overhead_gpu.py``,
``decoder_step_gpu.py``; ``host_overhead.py`` keeps its own copy because it also times older
checkouts, which lack this module)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["autograd_floor"]


def autograd_floor(leaves: Sequence[Any], grad_output: Any) -> Callable[[], tuple[Any, ...]]:
    """A no-argument call: the trivial Function's forward on ``leaves`` (value,
    sampling_locations, attention_weights; tensors that require grad), returning an empty
    tensor of ``grad_output``'s shape (B, N_q, N_h*C_h), then ``torch.autograd.grad`` of it
    with ``grad_output``; returns the three gradients (empty tensors in the leaves' shapes)."""
    import torch

    class TrivialFunction(torch.autograd.Function):
        """Saves the three inputs, allocates outputs: the autograd engine's own cost."""

        @staticmethod
        def forward(ctx: Any, value: Any, locations: Any, weights: Any) -> Any:
            ctx.save_for_backward(value, locations, weights)
            return value.new_empty(grad_output.shape)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

    leaves = list(leaves)
    return lambda: torch.autograd.grad(TrivialFunction.apply(*leaves), leaves, grad_output)
