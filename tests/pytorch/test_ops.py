"""Registered operators: opcheck, fake tensors, torch.compile, autograd flags and dtypes."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import nkilib_msda
from nkilib_msda.backends.reference import backend as reference_torch
from nkilib_msda.pytorch import ops  # noqa: F401 - registers the operators
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention
FWD = torch.ops.nkilib_msda.ms_deformable_attention
BWD = torch.ops.nkilib_msda.ms_deformable_attention_bwd


def _op_args(inputs, align_corners=False, padding_mode="zeros"):
    shapes = [d for pair in inputs.spatial_shapes for d in pair]
    starts, start = [], 0
    for h, w in inputs.spatial_shapes:
        starts.append(start)
        start += h * w
    return (inputs.value, shapes, starts, inputs.sampling_locations, inputs.attention_weights,
            inputs.value_layout, inputs.sampling_locations_layout, align_corners, padding_mode,
            "reference")


@pytest.mark.parametrize("value_layout,loc_layout,padding_mode",
                         [("BLNC", "BQHLP2", "zeros"), ("BNLC", "B2QHLP", "reflection")])
def test_opcheck_forward(value_layout, loc_layout, padding_mode):
    inputs = make_inputs(batch=1, queries=3, spatial_shapes=((3, 4), (2, 2)),
                         value_layout=value_layout, sampling_locations_layout=loc_layout,
                         seed=1).requires_grad_()
    torch.library.opcheck(FWD.default, _op_args(inputs, True, padding_mode))


@pytest.mark.parametrize("compute", [[True, True, True], [False, True, False], [True, False, True]])
def test_opcheck_backward(compute):
    inputs = make_inputs(batch=1, queries=3, spatial_shapes=((3, 4), (2, 2)), seed=2)
    torch.library.opcheck(BWD.default, (inputs.grad_output, *_op_args(inputs), compute))


def test_backward_op_returns_three_tensors_in_input_dtypes_with_zeros_where_masked():
    inputs = make_inputs(dtype=torch.bfloat16, loc_dtype=torch.float16, seed=3)
    grads = BWD(inputs.grad_output, *_op_args(inputs), [False, True, False])
    assert len(grads) == 3
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float16, torch.bfloat16]
    assert [g.shape for g in grads] == [t.shape for t in inputs.tensors()]
    assert grads[0].abs().sum() == 0 and grads[2].abs().sum() == 0
    assert grads[1].abs().sum() > 0


def test_needs_input_grad_maps_to_compute_flags(monkeypatch):
    seen = []
    real = reference_torch.msda_backward

    def spy(*args, **kwargs):
        seen.append(tuple(args[5] if len(args) > 5 else kwargs["compute"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(reference_torch, "msda_backward", spy)
    inputs = make_inputs(seed=4)
    inputs.sampling_locations.requires_grad_()
    out = MSDA(inputs.value, inputs.spatial_shapes, None, inputs.sampling_locations,
               inputs.attention_weights, backend="reference")
    (grad_loc,) = torch.autograd.grad(out, inputs.sampling_locations, inputs.grad_output)
    assert seen == [(False, True, False)]
    assert grad_loc.abs().sum() > 0


def test_fake_tensor_shape_propagation():
    inputs = make_inputs(batch=3, queries=7, heads=4, channels=5, value_layout="BNLC",
                         sampling_locations_layout="B2QHLP", dtype=torch.bfloat16,
                         loc_dtype=torch.float32, seed=5)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (*inputs.tensors(), inputs.grad_output)]
        value, loc, attn, grad = fake
        out = MSDA(value, inputs.spatial_shapes, None, loc, attn, value_layout="BNLC",
                   sampling_locations_layout="B2QHLP", backend="reference")
        assert out.shape == (3, 7, 20) and out.dtype == torch.bfloat16
        args = list(_op_args(inputs))
        args[0], args[3], args[4] = value, loc, attn
        gv, gl, ga = BWD(grad, *args, [True, True, True])
        assert (gv.shape, gl.shape, ga.shape) == (value.shape, loc.shape, attn.shape)
        assert (gv.dtype, gl.dtype, ga.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)


@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
def test_compile_aot_eager_fullgraph_matches_eager(padding_mode):
    torch._dynamo.reset()
    inputs = make_inputs(seed=6, low=-0.4, high=1.4)

    def fn(value, loc, attn):
        return MSDA(value, inputs.spatial_shapes, None, loc, attn, padding_mode=padding_mode,
                    backend="reference") * 2.0

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    results = []
    for f in (fn, compiled):
        tensors = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
        out = f(*tensors)
        grads = torch.autograd.grad(out, tensors, inputs.grad_output)
        results.append((out.detach(), grads))
    (eager_out, eager_grads), (comp_out, comp_grads) = results
    torch.testing.assert_close(comp_out, eager_out, rtol=0, atol=0)
    for got, want in zip(comp_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_direct_op_call_checks_the_backend_can_run_it():
    inputs = make_inputs(dtype=torch.bfloat16, loc_dtype=torch.float32)
    args = list(_op_args(inputs, padding_mode="reflection"))
    args[-1] = "nki"
    with pytest.raises(ValueError, match="reflection"):
        FWD(*args)
    args[-1] = "gpu"
    with pytest.raises(ValueError, match="backend"):
        FWD(*args)
