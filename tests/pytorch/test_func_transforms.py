"""torch.func transforms of the functional API (grad, vjp, vmap over an extra batch dimension,
vmap of grad), in float64 against the float64 NumPy reference and plain autograd; double
backward raises a clear error on every path."""

from __future__ import annotations

import pytest
import torch

import nkilib_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from _torch_inputs import make_inputs

SHAPES = ((4, 6), (3, 2), (1, 1))  # make_inputs' default


def _msda(value, loc, attn):
    return nkilib_msda.multi_scale_deformable_attention(value, SHAPES, None, loc, attn)


def _reference(value, loc, attn):
    return torch.from_numpy(ms_deformable_attention_ref(
        value.detach().numpy(), SHAPES, None, loc.detach().numpy(), attn.detach().numpy()))


def _reference_grads(value, loc, attn, grad_output):
    return [torch.from_numpy(g) for g in ms_deformable_attention_bwd_ref(
        grad_output.numpy(), value.numpy(), SHAPES, None, loc.numpy(), attn.numpy())]


def test_func_grad_of_every_input_matches_the_reference():
    inputs = make_inputs(seed=61)
    value, loc, attn = inputs.tensors()

    def loss(v, l, a):
        return (_msda(v, l, a) * inputs.grad_output).sum()

    grads = torch.func.grad(loss, argnums=(0, 1, 2))(value, loc, attn)
    for got, want in zip(grads, _reference_grads(value, loc, attn, inputs.grad_output)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_func_vjp_of_one_input_matches_the_reference():
    inputs = make_inputs(seed=62)
    value, loc, attn = inputs.tensors()
    out, vjp = torch.func.vjp(lambda l: _msda(value, l, attn), loc)
    torch.testing.assert_close(out, _reference(value, loc, attn), rtol=1e-9, atol=1e-9)
    (grad_loc,) = vjp(inputs.grad_output)
    want = _reference_grads(value, loc, attn, inputs.grad_output)[1]
    torch.testing.assert_close(grad_loc, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("in_dims", [(0, 0, 0), (1, None, 0)], ids=["all", "shared_locations"])
def test_vmap_over_an_extra_batch_dim_matches_a_loop(in_dims):
    """(V, B, ...) inputs vmapped over V (or, for an unbatched input, shared by every V)."""
    stacked = [make_inputs(seed=70 + i) for i in range(3)]
    tensors = [torch.stack([s.tensors()[k] for s in stacked]) for k in range(3)]
    value = tensors[0].movedim(0, 1) if in_dims[0] == 1 else tensors[0]
    loc = tensors[1][0] if in_dims[1] is None else tensors[1]
    out = torch.func.vmap(_msda, in_dims=in_dims)(value, loc, tensors[2])
    for i, s in enumerate(stacked):
        want = _reference(s.value, loc if in_dims[1] is None else s.sampling_locations,
                          s.attention_weights)
        torch.testing.assert_close(out[i], want, rtol=1e-9, atol=1e-9)


def test_vmap_of_grad_gives_per_example_gradients():
    stacked = [make_inputs(seed=80 + i) for i in range(3)]
    values, locs, attns, grad_outs = (torch.stack([getattr(s, name) for s in stacked]) for name in
                                      ("value", "sampling_locations", "attention_weights",
                                       "grad_output"))

    def loss(v, l, a, g):
        return (_msda(v, l, a) * g).sum()

    per_example = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)))(
        values, locs, attns, grad_outs)
    for i, s in enumerate(stacked):
        want = _reference_grads(s.value, s.sampling_locations, s.attention_weights, s.grad_output)
        for got, w in zip(per_example, want):
            torch.testing.assert_close(got[i], w, rtol=1e-9, atol=1e-9)


def test_double_backward_raises_unsupported_eagerly():
    inputs = make_inputs(seed=90).requires_grad_()
    out = _msda(*inputs.tensors())
    (grad_value,) = torch.autograd.grad(out, inputs.value, inputs.grad_output, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        grad_value.square().sum().backward()


def test_nested_func_grad_raises_unsupported():
    inputs = make_inputs(seed=91)
    value, loc, attn = inputs.tensors()

    def grad_norm(l):
        grad_loc = torch.func.grad(lambda x: _msda(value, x, attn).square().sum())(l)
        return grad_loc.square().sum()

    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        torch.func.grad(grad_norm)(loc)
