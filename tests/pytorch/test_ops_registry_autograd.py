"""One backend registry for MSDA and Block AttnRes; one autograd definition used by the
registered operator, the eager fast path and (through the operator) the neuron path."""

from __future__ import annotations

import pytest
import torch

import nkilib_msda
from nkilib_msda import backends
from nkilib_msda.pytorch import block_attn_res_ops as bar
from nkilib_msda.pytorch import dispatch, ops
from _torch_inputs import make_inputs


def test_block_attn_res_backends_come_from_the_shared_registry():
    assert bar.BACKENDS == backends.BLOCK_ATTN_RES_BACKENDS
    assert set(backends.BLOCK_ATTN_RES_BACKENDS) <= set(backends.BACKEND_NAMES)
    for name in backends.BLOCK_ATTN_RES_BACKENDS:
        module = backends.get_backend(name)
        for attr in ("msda_forward", "msda_backward", "block_attn_res_forward",
                     "block_attn_res_backward", "block_attn_res_unsupported_reason"):
            assert callable(getattr(module, attr)), (name, attr)


def test_block_attn_res_selection_follows_the_msda_rules(monkeypatch):
    cpu = torch.device("cpu")
    assert bar.select_backend(None, cpu, torch.float32) == "reference"
    assert bar.select_backend("nki", cpu, torch.float32) == "nki"
    assert bar.select_backend(None, torch.device("privateuseone"), torch.float32) == "nki"
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    assert bar.select_backend(None, cpu, torch.bfloat16) == "nki"
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")  # an MSDA-only backend: select by device
    assert bar.select_backend(None, cpu, torch.float32) == "reference"
    with pytest.raises(ValueError, match="triton"):
        bar.select_backend("triton", cpu, torch.float32)
    with pytest.raises(ValueError, match="cannot run this call"):
        bar.select_backend("nki", cpu, torch.float64)


def test_env_chosen_backend_that_cannot_run_raises():
    """Explicit choices (argument or env) must work; only the device default falls back."""
    import os

    os.environ[dispatch.ENV_VAR] = "nki"
    try:
        with pytest.raises(ValueError, match=dispatch.ENV_VAR):
            bar.select_backend(None, torch.device("cpu"), torch.float64)
    finally:
        del os.environ[dispatch.ENV_VAR]


@pytest.mark.parametrize("path", ["eager", "operator", "compiled"])
def test_every_path_uses_the_one_autograd_definition(path, monkeypatch):
    calls = []
    real = ops.input_gradients

    def spy(*args):
        calls.append(tuple(bool(n) for n in args[5]))  # needs
        return real(*args)

    monkeypatch.setattr(ops, "input_gradients", spy)
    inputs = make_inputs(seed=17)
    value, loc, attn = (t.clone() for t in inputs.tensors())
    loc.requires_grad_()

    def fn(v, l, a):
        return nkilib_msda.multi_scale_deformable_attention(v, inputs.spatial_shapes, None, l, a)

    if path == "operator":
        out = torch.ops.nkilib_msda.ms_deformable_attention(
            value, [4, 6, 3, 2, 1, 1], [0, 24, 30], loc, attn)
    elif path == "compiled":
        torch._dynamo.reset()
        out = torch.compile(fn, backend="aot_eager", fullgraph=True)(value, loc, attn)
    else:
        out = fn(value, loc, attn)
    (grad_loc,) = torch.autograd.grad(out, loc, inputs.grad_output)
    if path != "compiled":  # compiled: the spy runs while AOTAutograd traces the backward
        assert calls == [(False, True, False)]
    else:
        assert calls and all(c == (False, True, False) for c in calls)
    monkeypatch.undo()
    loc2 = loc.detach().clone().requires_grad_()
    want = nkilib_msda.multi_scale_deformable_attention(value, inputs.spatial_shapes, None,
                                                        loc2, attn, backend="reference")
    (want_grad,) = torch.autograd.grad(want, loc2, inputs.grad_output)
    torch.testing.assert_close(grad_loc, want_grad, rtol=1e-12, atol=1e-12)
