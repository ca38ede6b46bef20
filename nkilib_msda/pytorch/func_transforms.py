"""MSDA under ``torch.func`` transforms (grad, vjp, jacrev, vmap, and their compositions).

``torch.library.custom_op``'s autograd cannot run inside functorch transforms (its generated
``autograd.Function`` has no ``setup_context``), so inside a transform the functional API goes
through :func:`msda_under_transform`: an ``autograd.Function`` in the ``setup_context`` style
around the same two operators. Its backward is a second such Function whose own backward
raises: double backward is not supported on any path (:data:`.ops.DOUBLE_BACKWARD_UNSUPPORTED`).

Both operators also get a vmap rule (``torch.library.register_vmap``): every tensor argument has
the batch B at dim 0 in every layout, so a vmapped dimension is moved next to B and merged
into it (unbatched tensors are expanded), one operator call runs, and B is split again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nkilib_msda.pytorch.ops import BACKWARD_NAME, DOUBLE_BACKWARD_UNSUPPORTED, FORWARD_NAME

__all__ = ["msda_under_transform"]

# Positions of the tensor arguments in each operator's schema.
_FORWARD_TENSORS = (0, 3, 4)  # value, sampling_locations, attention_weights
_BACKWARD_TENSORS = (0, 1, 4, 5)  # grad_output, value, sampling_locations, attention_weights


def _merged(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` with its vmapped dim (None: not batched, expanded) merged into dim 0 (B)."""
    t = t.unsqueeze(0).expand(size, *t.shape) if dim is None else t.movedim(dim, 0)
    return t.reshape(size * t.shape[1], *t.shape[2:])


def _batched_call(op: Any, positions: tuple[int, ...], info: Any, in_dims: tuple,
                  args: tuple) -> Any:
    merged = list(args)
    for i in positions:
        merged[i] = _merged(args[i], in_dims[i], info.batch_size)
    return op(*merged)


def _split(t: Tensor, size: int) -> Tensor:
    return t.reshape(size, t.shape[0] // size, *t.shape[1:])


def _forward_vmap(info: Any, in_dims: tuple, *args: Any) -> tuple[Tensor, int]:
    out = _batched_call(torch.ops.nkilib_msda.ms_deformable_attention.default, _FORWARD_TENSORS,
                        info, in_dims, args)
    return _split(out, info.batch_size), 0


def _backward_vmap(info: Any, in_dims: tuple, *args: Any) -> tuple[tuple, tuple]:
    grads = _batched_call(torch.ops.nkilib_msda.ms_deformable_attention_bwd.default,
                          _BACKWARD_TENSORS, info, in_dims, args)
    return tuple(_split(g, info.batch_size) for g in grads), (0, 0, 0)


torch.library.register_vmap(FORWARD_NAME, _forward_vmap)
torch.library.register_vmap(BACKWARD_NAME, _backward_vmap)


class _Backward(torch.autograd.Function):
    """The backward operator as a transform-compatible node that refuses to be differentiated."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad_output: Tensor, value: Tensor, sampling_locations: Tensor,
                attention_weights: Tensor, options: tuple, compute: tuple[bool, bool, bool]
                ) -> tuple[Tensor, Tensor, Tensor]:
        shapes, starts, *rest, deterministic = options
        return torch.ops.nkilib_msda.ms_deformable_attention_bwd(
            grad_output, value, shapes, starts, sampling_locations, attention_weights, *rest,
            list(compute), deterministic)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        raise RuntimeError(DOUBLE_BACKWARD_UNSUPPORTED)


class _Forward(torch.autograd.Function):
    """The forward operator as a transform-compatible node; ``options`` are the operator's
    non-tensor arguments (flat shapes, starts, layouts, align_corners, padding_mode, backend,
    deterministic)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(value: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                options: tuple) -> Tensor:
        shapes, starts, *rest = options
        return torch.ops.nkilib_msda.ms_deformable_attention(
            value, shapes, starts, sampling_locations, attention_weights, *rest)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        value, sampling_locations, attention_weights, options = inputs
        ctx.save_for_backward(value, sampling_locations, attention_weights)
        ctx.options = options

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple:
        compute = (bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1]),
                   bool(ctx.needs_input_grad[2]))
        grads = _Backward.apply(grad_output, *ctx.saved_tensors, ctx.options, compute)
        return (*(g if flag else None for g, flag in zip(grads, compute)), None)


def msda_under_transform(value: Tensor, spatial_shapes: list[int], level_start_index: list[int],
                         sampling_locations: Tensor, attention_weights: Tensor,
                         *options: Any) -> Tensor:
    """The forward operator's result for its (checked) arguments, differentiable and
    vmappable inside ``torch.func`` transforms."""
    return _Forward.apply(value, sampling_locations, attention_weights,
                          (spatial_shapes, level_start_index, *options))
