"""Torch layer of Block AttnRes: reference backend vs the NumPy reference, flag-dependent returns,
gradcheck (float64), the registered ops (opcheck, torch.compile), and the "nki" backend
(kernels in the emulator) inside a training step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nkilib_msda import block_attn_res, block_attn_res_backward
from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref
from nkilib_msda.workloads import max_relative_error


def _inputs(n_blocks, partial, b, t, d, dtype, seed=0, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    blocks = [torch.randn(b, t, d, generator=g).to(dtype) for _ in range(n_blocks)]
    partial_block = torch.randn(b, t, d, generator=g).to(dtype) if partial else None
    w = (spread * torch.randn(d, generator=g) / (4 * d) ** 0.5).to(dtype)
    gamma = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    return blocks, partial_block, w, gamma


def _max_rel(a, ref):
    return max_relative_error(a, ref)


@pytest.mark.parametrize("rms_on,partial,scale", [(True, True, 0.8), (False, False, 1.0), (True, False, 1.7)])
def test_reference_backend_matches_numpy_reference(rms_on, partial, scale):
    blocks, partial_block, w, gamma = _inputs(4, partial, 2, 5, 32, torch.bfloat16)
    outs = block_attn_res(blocks, w, partial_block, scale, 1e-6, gamma, rms_on,
                          rms_out_flag=rms_on, alpha_out_flag=True, backend="reference")
    h, rms, alpha = outs if rms_on else (outs[0], None, outs[1])
    h_ref, rms_ref, alpha_ref = block_attn_res_ref(blocks, w, partial_block, scale, 1e-6,
                                                   gamma, rms_on)
    assert h.dtype == torch.bfloat16 and alpha.dtype == torch.float32
    assert _max_rel(h, h_ref) <= 1.6e-2
    np.testing.assert_allclose(alpha.numpy(), alpha_ref, rtol=1e-5, atol=1e-7)
    if rms_on:
        assert rms.dtype == torch.float32 and rms.shape == rms_ref.shape
        np.testing.assert_allclose(rms.numpy(), rms_ref, rtol=1e-5)

    grad_h = torch.randn(h.shape).bfloat16()
    out = block_attn_res_backward(grad_h, blocks, w, alpha, partial_block, gamma, rms, scale, rms_on,
                                  backend="reference")
    ref = block_attn_res_backward_ref(grad_h, blocks, w, partial_block, gamma, scale, 1e-6, rms_on)
    assert len(out) == (4 if rms_on else 3)
    for got, want in zip(out[0], ref[0]):
        assert got.dtype == torch.bfloat16 and _max_rel(got, want) <= 1.6e-2
    assert (out[1] is None) == (not partial)
    if partial:
        assert _max_rel(out[1], ref[1]) <= 1.6e-2
    assert out[2].dtype == torch.bfloat16 and _max_rel(out[2], ref[2]) <= 1.6e-2
    if rms_on:
        assert _max_rel(out[3], ref[3]) <= 1.6e-2


def test_flag_dependent_returns():
    blocks, partial_block, w, gamma = _inputs(2, True, 1, 3, 8, torch.float32)
    h = block_attn_res(blocks, w, partial_block, rmsnorm_gamma=gamma)
    assert isinstance(h, torch.Tensor) and h.shape == (1, 3, 8)
    h2, rms = block_attn_res(blocks, w, partial_block, rmsnorm_gamma=gamma, rms_out_flag=True)
    h3, alpha = block_attn_res(blocks, w, partial_block, rmsnorm_gamma=gamma, alpha_out_flag=True)
    h4, rms4, alpha4 = block_attn_res(blocks, w, partial_block, rmsnorm_gamma=gamma,
                                      rms_out_flag=True, alpha_out_flag=True)
    assert rms.shape == (1, 3, 3, 1) and alpha.shape == (1, 3, 3)
    for x in (h2, h3, h4):
        torch.testing.assert_close(x, h)
    torch.testing.assert_close(rms4, rms)
    torch.testing.assert_close(alpha4, alpha)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, 3))


@pytest.mark.parametrize("rms_on,partial", [(True, True), (False, False)])
def test_gradcheck_float64_reference(rms_on, partial):
    blocks, partial_block, w, gamma = _inputs(2, partial, 1, 2, 4, torch.float64, spread=8.0)
    leaves = [*blocks, *([partial_block] if partial else []), w, gamma]
    leaves = [x.clone().requires_grad_() for x in leaves]
    n = len(blocks)

    def f(*xs):
        p = xs[n] if partial else None
        return block_attn_res(list(xs[:n]), xs[-2], p, 0.9, 1e-6, xs[-1], rms_on, backend="reference")

    assert torch.autograd.gradcheck(f, tuple(leaves))


def test_autograd_matches_numpy_backward_and_caches_are_not_differentiable():
    blocks, partial_block, w, gamma = _inputs(3, True, 2, 3, 16, torch.float64)
    leaves = [x.clone().requires_grad_() for x in (*blocks, partial_block, w, gamma)]
    h, rms, alpha = block_attn_res(leaves[:3], leaves[4], leaves[3], 1.3, 1e-6, leaves[5],
                                   rms_out_flag=True, alpha_out_flag=True, backend="reference")
    assert not rms.requires_grad and not alpha.requires_grad
    grad_h = torch.randn(h.shape, dtype=torch.float64)
    h.backward(grad_h)
    ref = block_attn_res_backward_ref(grad_h, blocks, w, partial_block, gamma, 1.3, 1e-6, True)
    for leaf, want in zip(leaves, [*ref[0], ref[1], ref[2], ref[3]]):
        np.testing.assert_allclose(leaf.grad.numpy(), want, rtol=1e-10, atol=1e-12)


def test_gamma_gets_zero_gradient_without_rmsnorm():
    blocks, _, w, gamma = _inputs(2, False, 1, 2, 8, torch.float64)
    gamma.requires_grad_()
    w.requires_grad_()
    block_attn_res(blocks, w, rmsnorm_gamma=gamma, enable_rmsnorm=False).sum().backward()
    assert torch.equal(gamma.grad, torch.zeros_like(gamma)) and w.grad.abs().sum() > 0


def test_registered_ops_opcheck_and_compile():
    blocks, partial_block, w, gamma = _inputs(2, True, 1, 3, 8, torch.float32)
    values = torch.stack([*blocks, partial_block]).requires_grad_()
    op = torch.ops.nkilib_msda.block_attn_res
    torch.library.opcheck(op, (values, w.requires_grad_(), gamma.requires_grad_(), 0.5, 1e-6, True,
                               "reference"))
    _, rms, alpha = op(values, w, gamma, 0.5, 1e-6, True, "reference")
    torch.library.opcheck(torch.ops.nkilib_msda.block_attn_res_backward,
                          (torch.randn(1, 3, 8), values.detach(), w.detach(), alpha, gamma.detach(), rms,
                           0.5, True, "reference"))

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(bs, p, w_, g_):
        return block_attn_res(bs, w_, p, 0.5, 1e-6, g_, backend="reference").square().sum()

    compiled = step(blocks, partial_block, w, gamma)
    eager = block_attn_res(blocks, w, partial_block, 0.5, 1e-6, gamma, backend="reference").square().sum()
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("lnc", ["1", "2"])
@pytest.mark.parametrize("rms_on", [True, False])
def test_nki_backend_training_step_matches_reference(lnc, rms_on, monkeypatch):
    """Two SGD steps through the op: bf16 blocks from a linear layer, fp32 weights. At every
    step, the "nki" backend (kernels in the emulator) is compared with the "reference" backend
    on the same parameters: h and every parameter gradient."""
    monkeypatch.setenv("NKILIB_MSDA_SIM_LNC", lnc)
    torch.manual_seed(0)
    d, n_blocks = 256, 5
    x = torch.randn(2, 70, d).bfloat16()
    layer = torch.nn.Linear(d, d, bias=False).bfloat16()
    w = torch.nn.Parameter(0.1 * torch.randn(d))
    gamma = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
    params = [layer.weight, w, gamma]
    optimizer = torch.optim.SGD(params, lr=0.5)

    def loss_and_grads(backend):
        optimizer.zero_grad()
        blocks = [layer(x * (i + 1)) for i in range(n_blocks)]
        h = block_attn_res(blocks[:-1], w, blocks[-1], 1.0, 1e-6, gamma, rms_on, backend=backend)
        (h.float() * torch.linspace(-1, 1, d)).square().mean().backward()
        return [h.detach()] + [p.grad.clone() for p in params]

    for _ in range(2):
        want = loss_and_grads("reference")
        got = loss_and_grads("nki")  # leaves the nki gradients in place for the step
        for i, (g, r) in enumerate(zip(got, want)):
            assert g.dtype == r.dtype
            if not rms_on and i == 3:  # gamma is unused without RMSNorm: zero gradient
                assert not g.any() and not r.any()
            else:
                assert _max_rel(g, r.double().numpy()) <= 1.6e-2, i
        optimizer.step()


def test_nki_backend_functions_match_reference_backend():
    blocks, partial_block, w, gamma = _inputs(6, True, 1, 130, 128, torch.float16)
    args = (blocks, w, partial_block, 1.1, 1e-6, gamma, True, True, True)
    h_n, rms_n, alpha_n = block_attn_res(*args, backend="nki")
    h_r, rms_r, alpha_r = block_attn_res(*args, backend="reference")
    assert h_n.dtype == torch.float16 and rms_n.dtype == torch.float32
    torch.testing.assert_close(rms_n, rms_r, rtol=1e-5, atol=0)
    torch.testing.assert_close(alpha_n, alpha_r, rtol=1e-5, atol=1e-7)
    assert _max_rel(h_n, h_r.double().numpy()) <= 2e-3
    grad_h = torch.randn(h_n.shape).half()
    out_n = block_attn_res_backward(grad_h, blocks, w, alpha_n, partial_block, gamma, rms_n, 1.1,
                                    backend="nki")
    out_r = block_attn_res_backward(grad_h, blocks, w, alpha_r, partial_block, gamma, rms_r, 1.1,
                                    backend="reference")
    for got, want in zip([*out_n[0], *out_n[1:]], [*out_r[0], *out_r[1:]]):
        assert got.dtype == want.dtype and _max_rel(got, want.double().numpy()) <= 2e-3


def test_opcheck_nki_backend():
    """Fake kernels and autograd registration agree with the nki (emulator) implementation."""
    blocks, partial_block, w, gamma = _inputs(2, True, 1, 40, 64, torch.bfloat16)
    values = torch.stack([*blocks, partial_block]).requires_grad_()
    w32, g32 = w.float().requires_grad_(), gamma.float().requires_grad_()
    torch.library.opcheck(torch.ops.nkilib_msda.block_attn_res,
                          (values, w32, g32, 0.5, 1e-6, True, "nki"),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    _, rms, alpha = torch.ops.nkilib_msda.block_attn_res(values, w32, g32, 0.5, 1e-6, True, "nki")
    torch.library.opcheck(torch.ops.nkilib_msda.block_attn_res_backward,
                          (torch.randn(1, 40, 64).bfloat16(), values.detach(), w32.detach(), alpha,
                           g32.detach(), rms, 0.5, True, "nki"),
                          test_utils=("test_schema", "test_faketensor"))
