"""Empty inputs and autocast on the triton backend under TRITON_INTERPRET=1 (run in a
subprocess by test_functional_contract.py)."""

from __future__ import annotations

import os

import torch

import nkilib_msda
from nkilib_msda.backends import get_backend
from _torch_inputs import make_inputs

assert os.environ.get("TRITON_INTERPRET") == "1"
MSDA = nkilib_msda.multi_scale_deformable_attention
triton_backend = get_backend("triton")


def check_empty() -> None:
    real = (triton_backend.msda_forward, triton_backend.msda_backward)

    def no_kernel(*args, **kwargs):
        raise AssertionError("triton was called for an empty input")

    triton_backend.msda_forward = triton_backend.msda_backward = no_kernel
    try:
        inputs = make_inputs(batch=2, queries=3, seed=21)
        for batch, queries in ((0, 3), (2, 0)):
            tensors = [inputs.value[:batch].float(),
                       inputs.sampling_locations[:batch, :queries].float(),
                       inputs.attention_weights[:batch, :queries].float()]
            tensors = [t.clone().requires_grad_() for t in tensors]
            out = MSDA(tensors[0], inputs.spatial_shapes, None, tensors[1], tensors[2],
                       backend="triton")
            assert out.shape == (batch, queries, 8)
            grads = torch.autograd.grad(out.sum(), tensors)
            assert all(g.shape == t.shape and not g.any() for g, t in zip(grads, tensors))
    finally:
        triton_backend.msda_forward, triton_backend.msda_backward = real


def check_autocast() -> None:
    inputs = make_inputs(batch=1, queries=3, channels=8, spatial_shapes=((3, 4), (2, 2)), seed=22)
    value, loc, attn = (t.float() for t in inputs.tensors())

    def run():
        tensors = [t.clone().requires_grad_() for t in (value, loc, attn)]
        out = MSDA(tensors[0], inputs.spatial_shapes, None, tensors[1], tensors[2],
                   backend="triton")
        return (out, *torch.autograd.grad(out, tensors, inputs.grad_output.float()))

    outside = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = run()
    for got, want in zip(inside, outside):
        assert got.dtype == want.dtype and torch.equal(got, want)


if __name__ == "__main__":
    check_empty()
    check_autocast()
    print("PASSED")
