"""The autograd floor of the host-time benchmarks (nkilib_msda/bench/floor.py), on CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nkilib_msda.bench.floor import autograd_floor  # noqa: E402


def test_floor_returns_one_gradient_per_leaf_in_the_leaf_shape():
    shapes = [(2, 7, 3, 4), (2, 5, 3, 2, 1, 2), (2, 5, 3, 2, 1)]
    leaves = [torch.randn(s, requires_grad=True) for s in shapes]
    grad_output = torch.randn(2, 5, 12)
    # autograd.grad raises unless the forward's output has grad_output's shape
    call = autograd_floor(leaves, grad_output)
    for _ in range(2):  # the call can be repeated (a benchmark times it many times)
        grads = call()
        assert [tuple(g.shape) for g in grads] == shapes
        assert all(g.dtype == leaf.dtype for g, leaf in zip(grads, leaves))

