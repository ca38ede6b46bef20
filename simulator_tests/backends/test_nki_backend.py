"""backend="nki" on CPU (NKI kernels in the emulator). The TorchNeuron device path is tested
in test_nki_backend_neuron.py on a stand-in device."""

from __future__ import annotations


import sys
import types

import pytest
import torch

import nkilib_msda
from nkilib_msda.backends import nki_backend
from nkilib_msda.validation.msda import validate_msda_args
from _torch_inputs import make_inputs

pytestmark = pytest.mark.emulator_only  # the nki backend runs CPU tensors in the emulator

MSDA = nkilib_msda.multi_scale_deformable_attention
SHAPES = ((4, 6), (3, 2), (1, 1))
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def _kernel_rounded(inputs, dtype):
    """The inputs as the kernels see them: value/weights/grad in ``dtype``, locations float32."""
    value = inputs.value.to(dtype)
    loc = inputs.sampling_locations.to(torch.float32)
    attn = inputs.attention_weights.to(dtype)
    grad = inputs.grad_output.to(dtype)
    return value, loc, attn, grad


def _reference(inputs, value, loc, attn, grad, align_corners, padding_mode):
    tensors = [t.detach().double().requires_grad_() for t in (value, loc, attn)]
    out = MSDA(tensors[0], inputs.spatial_shapes, None, tensors[1], tensors[2],
               value_layout=inputs.value_layout, sampling_locations_layout=inputs.sampling_locations_layout,
               align_corners=align_corners, padding_mode=padding_mode, backend="reference")
    return out.detach(), torch.autograd.grad(out, tensors, grad.double())


def _assert_close_scaled(got, want, tol, name):
    scale = want.abs().max().item()
    assert scale > 0, f"{name}: reference is all zeros, the test would be vacuous"
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale, msg=name)


def _check_against_reference(run, dtype, align_corners=False, padding_mode="zeros",
                             value_layout="BLNC", loc_layout="BQHLP2", seed=0):
    inputs = make_inputs(batch=2, queries=5, heads=2, channels=8, points=2, spatial_shapes=SHAPES,
                         value_layout=value_layout, sampling_locations_layout=loc_layout, seed=seed)
    value, loc, attn, grad = _kernel_rounded(inputs, dtype)
    tensors = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = run(inputs, *tensors, align_corners, padding_mode)
    grads = torch.autograd.grad(out, tensors, grad)
    assert out.dtype == dtype and out.shape == (2, 5, 16)
    assert [g.dtype for g in grads] == [dtype, torch.float32, dtype]
    ref_out, ref_grads = _reference(inputs, value, loc, attn, grad, align_corners, padding_mode)
    tol = TOLERANCE[dtype]
    _assert_close_scaled(out, ref_out, tol, "output")
    for name, got, want in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                               grads, ref_grads):
        _assert_close_scaled(got, want, tol, name)


def _functional(inputs, value, loc, attn, align_corners, padding_mode):
    return MSDA(value, inputs.spatial_shapes, None, loc, attn, value_layout=inputs.value_layout,
                sampling_locations_layout=inputs.sampling_locations_layout,
                align_corners=align_corners, padding_mode=padding_mode, backend="nki")


CASES = [(torch.bfloat16, False, "zeros", "BLNC", "BQHLP2"),
         (torch.bfloat16, True, "border", "BNLC", "B2QHLP"),
         (torch.bfloat16, False, "border", "BLNC", "B2QHLP"),
         (torch.float32, True, "zeros", "BNLC", "BQHLP2")]


@pytest.mark.parametrize("dtype,align_corners,padding_mode,value_layout,loc_layout", CASES)
def test_nki_backend_on_cpu_matches_reference(dtype, align_corners, padding_mode, value_layout,
                                              loc_layout):
    _check_against_reference(_functional, dtype, align_corners, padding_mode, value_layout,
                             loc_layout, seed=CASES.index((dtype, align_corners, padding_mode,
                                                           value_layout, loc_layout)))


def test_nki_backend_with_two_logical_cores(monkeypatch):
    monkeypatch.setenv(nki_backend.LNC_ENV_VAR, "2")
    _check_against_reference(_functional, torch.bfloat16, seed=21)


def test_nki_backend_passes_needs_input_grad_to_the_kernel(monkeypatch):
    seen = []
    real = nki_backend.call_backward_kernel

    def spy(call, grad_output, value, problem, loc, attn, compute):
        seen.append(tuple(compute))
        return real(call, grad_output, value, problem, loc, attn, compute)

    monkeypatch.setattr(nki_backend, "call_backward_kernel", spy)
    inputs = make_inputs(spatial_shapes=SHAPES, channels=8, seed=4)
    value, loc, attn, grad = _kernel_rounded(inputs, torch.bfloat16)
    attn.requires_grad_()
    out = MSDA(value, SHAPES, None, loc, attn, backend="nki")
    (grad_attn,) = torch.autograd.grad(out, attn, grad)
    assert seen == [(False, False, True)]
    _, ref_grads = _reference(inputs, value, loc, attn, grad, False, "zeros")
    _assert_close_scaled(grad_attn, ref_grads[2], 2e-2, "grad_attention_weights")


def test_nki_backend_rejects_reflection_and_float64():
    inputs = make_inputs(spatial_shapes=SHAPES)
    value, loc, attn, _ = _kernel_rounded(inputs, torch.bfloat16)
    with pytest.raises(ValueError, match="reflection"):
        MSDA(value, SHAPES, None, loc, attn, padding_mode="reflection", backend="nki")
    with pytest.raises(ValueError, match="float64"):
        MSDA(inputs.value, SHAPES, None, inputs.sampling_locations, inputs.attention_weights,
             backend="nki")


def test_compile_fullgraph_with_the_nki_backend_matches_eager():
    torch._dynamo.reset()
    inputs = make_inputs(spatial_shapes=SHAPES, channels=8, seed=51)
    value, loc, attn, grad = _kernel_rounded(inputs, torch.bfloat16)

    def fn(v, l, a):
        return MSDA(v, SHAPES, None, l, a, padding_mode="border", backend="nki")

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        tensors = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
        out = f(*tensors)
        results.append((out.detach(), torch.autograd.grad(out, tensors, grad)))
    (eager_out, eager_grads), (comp_out, comp_grads) = results
    assert torch.equal(comp_out, eager_out)
    for got, want in zip(comp_grads, eager_grads):
        assert torch.equal(got, want)


def test_nki_backend_accepts_exactly_what_the_kernel_planners_accept():
    """Row-unit indices: L*N_h*C_h may pass 2^24; L*N_h >= 2^24 is refused by the forward
    planner; N_h*N_l > 128 only by the backward planner (forward-only calls pass)."""
    import torch

    from nkilib_msda.backends import nki_backend

    def reason(shapes, heads):
        total = sum(h * w for h, w in shapes)
        value = torch.empty((1, total, heads, 32), dtype=torch.bfloat16)
        loc = torch.empty((1, 3, heads, len(shapes), 2, 2))
        attn = torch.empty((1, 3, heads, len(shapes), 2))
        problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
        return (nki_backend.unsupported_reason(problem, value, loc),
                nki_backend.backward_unsupported_reason(problem, value, loc))

    assert 600 * 600 * 16 * 32 >= 2 ** 24 and reason(((600, 600),), 16) == (None, None)
    assert "2^24" in reason(((4096, 4200),), 1)[0]
    forward, backward = reason(((2, 2),) * 40, 4)
    assert forward is None and "num_heads*num_levels" in backward


@pytest.mark.parametrize("lnc,cc_flags,expected", [
    ("2", "", 2), ("2", "--model-type=transformer", 2), ("1", "-O1 --lnc=1", 1),
    ("1", "--logical-nc-config 1", 1), ("2", "--lnc 1 --lnc 2", 2),
    ("", "", "expected the LNC degree the graph is compiled at, 2 .*default on Trn2.*got 1 "
             r"\(unset"),
    ("2", "-lnc=1", r"expected .* compiled at, 1 \(from NEURON_CC_FLAGS\), got 2 \(set\)"),
    ("", "--lnc=1", 1)])
def test_device_launch_checks_the_kernel_lnc_against_the_compile(monkeypatch, lnc, cc_flags,
                                                                    expected):
    """A device launch refuses a kernel LNC that differs from neuronx-cc's (NCC_EVRF066):
    unset NEURON_LOGICAL_NC_CONFIG means LNC 1 for the kernel and 2 for the compiler on Trn2."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    monkeypatch.setenv("NEURON_CC_FLAGS", cc_flags)
    monkeypatch.delenv("NKILIB_MSDA_SIM_LNC", raising=False)
    if isinstance(expected, int):
        assert nki_backend.check_device_lnc() == expected
        return
    with pytest.raises(ValueError, match=rf"^NEURON_LOGICAL_NC_CONFIG: {expected}"):
        nki_backend.check_device_lnc()
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
    with pytest.raises(ValueError, match="NCC_EVRF066"):  # the device launcher checks it
        nki_backend._torch_neuronx_launcher(lambda *args: None)
