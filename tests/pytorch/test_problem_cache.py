"""One torch-layer forward + backward validates once on every eager path (functional, modules,
registered operators): the validation memo (pytorch/problem_cache.py) is the one hand-off
between the places that bind a call. The eager fast path selects the backend once; through
the dispatcher each operator body selects for itself (the forward operator, the backward
operator or the forward's setup_context, which binds the call its direct backward runs).
Block AttnRes validates and selects once; the NKI backend plans each call signature once. The counts come from instrumenting the one full
validation and the one selection function; the gradients are still checked against the
operators' (or the float64 reference's), so a path that skipped work would fail too."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

import nkilib_msda
from nkilib_msda.backends import nki_backend
from nkilib_msda.pytorch import block_attn_res_ops as bar
from nkilib_msda.pytorch import dispatch
from nkilib_msda.pytorch.call import MsdaCall, bind_msda_call
from nkilib_msda.reference import block_attn_res_backward_ref, ms_deformable_attention_bwd_ref
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention
SHAPES = ((4, 6), (3, 2), (1, 1))  # make_inputs' default, L = 31
FLAT = [4, 6, 3, 2, 1, 1]
STARTS = [0, 24, 30]


def _reference_grads(inputs, grad_output):
    v, l, a = (t.detach().double().numpy() for t in inputs)
    return [torch.from_numpy(g) for g in ms_deformable_attention_bwd_ref(
        grad_output.detach().double().numpy(), v, SHAPES, None, l, a)]


def _msda_paths():
    def functional(v, l, a):
        return MSDA(v, SHAPES, None, l, a, backend="reference")

    def functional_auto_tensor_shapes(v, l, a):
        return MSDA(v, torch.tensor(SHAPES), torch.tensor(STARTS), l, a)

    def operator(v, l, a):
        return torch.ops.nkilib_msda.ms_deformable_attention(v, FLAT, STARTS, l, a, "BLNC",
                                                             "BQHLP2", False, "zeros", "reference")

    def deformable_detr_function(v, l, a):
        return nkilib_msda.MSDeformAttnFunction.apply(v, torch.tensor(SHAPES), torch.tensor(STARTS),
                                                      l, a, 64)

    def hf_layer(v, l, a):
        layer = nkilib_msda.MultiScaleDeformableAttention()
        return layer(v, torch.tensor(SHAPES), list(SHAPES), torch.tensor(STARTS), l, a, 64)

    return [functional, functional_auto_tensor_shapes, operator, deformable_detr_function, hf_layer]


@pytest.mark.parametrize("path", _msda_paths(), ids=lambda f: f.__name__)
def test_msda_forward_backward_validates_once(path, msda_counts):
    """Eager paths bind once; the operator binds in its body (forward limits) and again, from
    the validation memo, in its setup_context (backward limits)."""
    inputs = make_inputs(seed=41)
    leaves = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
    out = path(*leaves)
    grads = torch.autograd.grad(out, leaves, inputs.grad_output)
    selections = 2 if path.__name__ == "operator" else 1
    assert msda_counts == {"validate": 1, "select": selections}
    for got, want in zip(grads, _reference_grads(leaves, inputs.grad_output)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    # A second call with the same static facts binds from the cache: no new validation.
    path(*leaves)
    assert msda_counts["validate"] == 1


class _PassThroughMode(TorchFunctionMode):
    """Any TorchFunctionMode sends the functional API through the registered operators."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", _msda_paths()[:2] + _msda_paths()[3:],
                         ids=lambda f: f.__name__)
def test_dispatcher_path_forward_backward_validates_once(path, msda_counts):
    """Through the dispatcher the functional API only checks the arguments; the operator binds
    in its body (forward limits) and its setup_context binds again from the validation memo
    (backward limits), whose call the backward runs: one validation, two selections."""
    inputs = make_inputs(seed=46)
    leaves = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
    with _PassThroughMode():
        out = path(*leaves)
        assert msda_counts == {"validate": 1, "select": 2}
        grads = torch.autograd.grad(out, leaves, inputs.grad_output)
    assert msda_counts == {"validate": 1, "select": 2}
    for got, want in zip(grads, _reference_grads(leaves, inputs.grad_output)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_msdeformattn_module_forward_backward_validates_once_and_selects_once(msda_counts):
    torch.manual_seed(42)
    module = nkilib_msda.MSDeformAttn(8, 3, 2, 2, backend="reference").double()
    query = torch.randn(2, 5, 8, dtype=torch.float64)
    ref_points = torch.rand(2, 5, 3, 2, dtype=torch.float64)
    flat = torch.randn(2, 31, 8, dtype=torch.float64, requires_grad=True)
    out = module(query, ref_points, flat, torch.tensor(SHAPES), torch.tensor(STARTS))
    (grad_flat,) = torch.autograd.grad(out.square().sum(), [flat])
    assert msda_counts == {"validate": 1, "select": 1}
    assert grad_flat.abs().sum() > 0


def test_operator_without_grad_binds_once_and_its_backward_operator_binds_its_own(msda_counts):
    """The backward operator is an untrusted boundary of its own: called directly, it binds
    (from the validation memo when grad_output has the output's shape and dtype) and selects
    once."""
    inputs = make_inputs(seed=43)
    out = torch.ops.nkilib_msda.ms_deformable_attention(*inputs.tensors()[:1], FLAT, STARTS,
                                                        *inputs.tensors()[1:])
    assert msda_counts == {"validate": 1, "select": 1} and out.shape == (2, 5, 8)
    grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
        inputs.grad_output, inputs.value, FLAT, STARTS, inputs.sampling_locations,
        inputs.attention_weights, "BLNC", "BQHLP2", False, "zeros", "auto", [True, True, True])
    assert msda_counts == {"validate": 1, "select": 2}
    for got, want in zip(grads, _reference_grads(inputs.tensors(), inputs.grad_output)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_spatial_shapes_have_one_form_after_binding():
    inputs = make_inputs(seed=44)
    for shapes in (SHAPES, [list(p) for p in SHAPES], torch.tensor(SHAPES)):
        call = bind_msda_call(inputs.value, shapes, None, inputs.sampling_locations,
                              inputs.attention_weights, "BLNC", "BQHLP2", False, "zeros", None,
                              None, needs_backward=True)
        assert isinstance(call, MsdaCall)
        assert call.problem.spatial_shapes == SHAPES
        assert all(type(d) is int for pair in call.problem.spatial_shapes for d in pair)
        assert call.op_args()[:2] == (FLAT, STARTS)


def test_operator_forward_checks_the_backward_limits_once_when_autograd_records(monkeypatch):
    """The forward operator selects with the forward's limits; its autograd node adds the
    backward's, once, keeping an explicit choice or raising (here: a backward that cannot run)."""
    inputs = make_inputs(dtype=torch.float32, seed=45)
    checks = []

    def no_backward(problem, value, loc):
        checks.append(problem)
        return "the backward cannot plan this call (test)"

    monkeypatch.setattr(nki_backend, "backward_unsupported_reason", no_backward)
    monkeypatch.setattr(nki_backend, "msda_forward",
                        lambda value, problem, loc, attn: value.new_zeros(problem.output_shape))
    with torch.no_grad():
        torch.ops.nkilib_msda.ms_deformable_attention(inputs.value, FLAT, STARTS,
                                                      *inputs.tensors()[1:], backend="nki")
    assert checks == []
    leaves = [t.clone().requires_grad_() for t in inputs.tensors()]
    with pytest.raises(ValueError, match="backward cannot plan"):
        torch.ops.nkilib_msda.ms_deformable_attention(leaves[0], FLAT, STARTS, *leaves[1:],
                                                      backend="nki")
    assert len(checks) == 1


# ------------------------------------------------------------------ NKI planning


def test_nki_backend_plans_each_signature_once(monkeypatch):
    calls = []
    real = nki_backend._first_plannable

    def counting(plan):
        calls.append(plan)
        return real(plan)

    monkeypatch.setattr(nki_backend, "_first_plannable", counting)
    nki_backend._forward_plan.cache_clear()
    nki_backend._backward_plan.cache_clear()
    inputs = make_inputs(batch=1, queries=3, dtype=torch.float32, seed=46)
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
        out = MSDA(leaves[0], SHAPES, None, leaves[1], leaves[2], backend="nki")
        grads = torch.autograd.grad(out, leaves, inputs.grad_output)
    assert len(calls) == 2  # one forward plan, one backward plan, for both training calls
    for got, want in zip(grads, _reference_grads(leaves, inputs.grad_output)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ Block AttnRes


@pytest.fixture
def bar_counts(monkeypatch):
    calls = {"validate": 0, "select": 0}

    def counted(name, key):
        real = getattr(bar, name)

        def wrapper(*args, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(bar, name, wrapper)

    for name in ("validate_block_attn_res_args", "validate_stacked_values",
                 "validate_block_attn_res_backward_args", "validate_stacked_backward_args"):
        counted(name, "validate")
    counted("select_backend", "select")
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    return calls


def _bar_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    blocks = [torch.randn(2, 3, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    partial = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    w = 0.3 * torch.randn(8, generator=g, dtype=torch.float64)
    gamma = 1 + 0.1 * torch.randn(8, generator=g, dtype=torch.float64)
    grad_h = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    return blocks, partial, w, gamma, grad_h


@pytest.mark.parametrize("path", ["functional", "operator", "functional_dispatcher"])
def test_block_attn_res_forward_backward_validates_once(path, bar_counts):
    """functional_dispatcher: under a TorchFunctionMode, through both operators. As MSDA's: the
    eager path binds once; an operator binds in its body and again, from the validation memo,
    in its setup_context (whose call the backward runs)."""
    blocks, partial, w, gamma, grad_h = _bar_inputs(47)
    leaves = [t.clone().requires_grad_() for t in (*blocks, partial, w, gamma)]
    with _PassThroughMode() if path == "functional_dispatcher" else contextlib.nullcontext():
        if path == "operator":
            values = torch.stack(leaves[:4])
            h, _, _ = torch.ops.nkilib_msda.block_attn_res(values, leaves[4], leaves[5], 0.7,
                                                           1e-6, True, "auto")
        else:
            h = bar.block_attn_res(leaves[:3], leaves[4], leaves[3], 0.7, 1e-6, leaves[5])
        grads = torch.autograd.grad(h, leaves, grad_h)
    selections = {"functional": 1, "operator": 2, "functional_dispatcher": 2}[path]
    assert bar_counts == {"validate": 1, "select": selections}
    want_blocks, want_partial, want_w, want_gamma = block_attn_res_backward_ref(
        grad_h.numpy(), [b.numpy() for b in blocks], w.numpy(), partial.numpy(), gamma.numpy(),
        0.7, 1e-6)
    for got, want in zip(grads, [*want_blocks, want_partial, want_w, want_gamma]):
        torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dispatcher", [False, True], ids=["eager", "dispatcher"])
def test_block_attn_res_backward_function_validates_once(dispatcher, bar_counts):
    blocks, partial, w, gamma, grad_h = _bar_inputs(48)
    _, rms, alpha = bar.block_attn_res(blocks, w, partial, 0.7, 1e-6, gamma, True, True, True)
    bar_counts.update(validate=0, select=0)
    with _PassThroughMode() if dispatcher else contextlib.nullcontext():
        out = bar.block_attn_res_backward(grad_h, blocks, w, alpha, partial, gamma, rms, 0.7)
    assert bar_counts == {"validate": 1, "select": 2 if dispatcher else 1}
    want = block_attn_res_backward_ref(grad_h.numpy(), [b.numpy() for b in blocks], w.numpy(),
                                       partial.numpy(), gamma.numpy(), 0.7, 1e-6)
    for got, expected in zip([*out[0], *out[1:]], [*want[0], *want[1:]]):
        torch.testing.assert_close(got, torch.from_numpy(expected), rtol=1e-9, atol=1e-9)
