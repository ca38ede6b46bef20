"""The torch "reference" backend against the NumPy float64 oracle, grid_sample and gradcheck."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nkilib_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.validation.msda import validate_msda_args
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention
MODES = list(itertools.product(("BLNC", "BNLC"), ("BQHLP2", "B2QHLP"), (False, True),
                               ("zeros", "border", "reflection")))


def _run(inputs, align_corners, padding_mode, backend="reference"):
    inputs.requires_grad_()
    out = MSDA(inputs.value, inputs.spatial_shapes, None, inputs.sampling_locations,
               inputs.attention_weights, value_layout=inputs.value_layout,
               sampling_locations_layout=inputs.sampling_locations_layout,
               align_corners=align_corners, padding_mode=padding_mode, backend=backend)
    grads = torch.autograd.grad(out, inputs.tensors(), inputs.grad_output)
    return out.detach(), grads


@pytest.mark.parametrize("value_layout,loc_layout,align_corners,padding_mode", MODES)
def test_matches_numpy_oracle_float64(value_layout, loc_layout, align_corners, padding_mode):
    inputs = make_inputs(value_layout=value_layout, sampling_locations_layout=loc_layout,
                         low=-0.6, high=1.6, seed=MODES.index((value_layout, loc_layout, align_corners, padding_mode)))
    out, grads = _run(inputs, align_corners, padding_mode)
    args = (inputs.value.detach().numpy(), inputs.spatial_shapes, None,
            inputs.sampling_locations.detach().numpy(), inputs.attention_weights.detach().numpy(),
            value_layout, loc_layout, align_corners, padding_mode)
    np.testing.assert_allclose(out.numpy(), ms_deformable_attention_ref(*args), rtol=1e-12, atol=1e-12)
    ref_grads = ms_deformable_attention_bwd_ref(inputs.grad_output.numpy(), *args)
    for name, got, want in zip(("value", "locations", "weights"), grads, ref_grads):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-11, atol=1e-11, err_msg=name)


def _grid_sample_msda(value, shapes, loc, attn, align_corners, padding_mode):
    """Independent formulation: one grid_sample per level (Deformable-DETR's CPU path)."""
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    per_level = value.split([h * w for h, w in shapes], dim=1)
    samples = []
    for lvl, (h, w) in enumerate(shapes):
        image = per_level[lvl].permute(0, 2, 3, 1).reshape(batch * heads, channels, h, w)
        grid = (2 * loc[:, :, :, lvl] - 1).transpose(1, 2).reshape(batch * heads, queries, points, 2)
        samples.append(F.grid_sample(image, grid, mode="bilinear", padding_mode=padding_mode,
                                     align_corners=align_corners))
    stacked = torch.stack(samples, dim=-2).flatten(-2)  # (B*H, C, Q, L*P)
    weights = attn.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    out = (stacked * weights).sum(-1).view(batch, heads * channels, queries)
    return out.transpose(1, 2)


@pytest.mark.parametrize("align_corners,padding_mode",
                         list(itertools.product((False, True), ("zeros", "border", "reflection"))))
def test_matches_grid_sample_forward_and_autograd(align_corners, padding_mode):
    inputs = make_inputs(low=-0.7, high=1.7, seed=3).requires_grad_()
    out, grads = _run(inputs, align_corners, padding_mode)
    v, loc, attn = (t.detach().clone().requires_grad_() for t in inputs.tensors())
    expect = _grid_sample_msda(v, inputs.spatial_shapes, loc, attn, align_corners, padding_mode)
    want = torch.autograd.grad(expect, (v, loc, attn), inputs.grad_output)
    torch.testing.assert_close(out, expect.detach(), rtol=1e-12, atol=1e-12)
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("padding_mode,align_corners", [("zeros", False), ("border", True),
                                                        ("reflection", False)])
def test_gradcheck_float64(padding_mode, align_corners):
    inputs = make_inputs(batch=1, queries=3, heads=2, channels=2, points=2,
                         spatial_shapes=((3, 4), (2, 3)), low=-0.3, high=1.3, seed=11)
    inputs.requires_grad_()

    def fn(value, loc, attn):
        return MSDA(value, inputs.spatial_shapes, None, loc, attn, align_corners=align_corners,
                    padding_mode=padding_mode, backend="reference")

    assert torch.autograd.gradcheck(fn, inputs.tensors(), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_dtypes_follow_value_and_match_float64(dtype):
    inputs = make_inputs(dtype=dtype, loc_dtype=torch.float32, seed=5)
    out, grads = _run(inputs, False, "zeros")
    assert out.dtype == dtype
    assert [g.dtype for g in grads] == [dtype, torch.float32, dtype]
    exact = make_inputs(seed=5)
    with torch.no_grad():  # same rounded inputs, in float64
        exact.value = inputs.value.detach().double()
        exact.sampling_locations = inputs.sampling_locations.detach().double()
        exact.attention_weights = inputs.attention_weights.detach().double()
        exact.grad_output = inputs.grad_output.double()
    ref_out, ref_grads = _run(exact, False, "zeros")
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol)
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_non_finite_and_huge_coordinates_are_safe(padding_mode):
    inputs = make_inputs(seed=7)
    loc = inputs.sampling_locations.clone()
    loc[0, 0, 0, 0, 0, 0] = float("nan")
    loc[0, 1, 0, 0, 0, 1] = float("inf")
    loc[1, 2, 1, 1, 1, 0] = -float("inf")
    loc[1, 3, 0, 2, 0, 1] = 1e30
    loc[0, 4, 1, 0, 1, 0] = -1e30
    inputs.sampling_locations = loc
    out, grads = _run(inputs, False, padding_mode)
    assert torch.isfinite(out).all()
    for g in grads:
        assert torch.isfinite(g).all()
    # The NaN sample contributes nothing and gets zero gradient.
    assert grads[1][0, 0, 0, 0, 0].abs().sum() == 0
    assert grads[2][0, 0, 0, 0, 0] == 0
    args = (inputs.value.detach().numpy(), inputs.spatial_shapes, None, loc.detach().numpy(),
            inputs.attention_weights.detach().numpy(), "BLNC", "BQHLP2", False, padding_mode)
    np.testing.assert_allclose(out.numpy(), ms_deformable_attention_ref(*args), rtol=1e-12, atol=1e-12)


def test_query_chunking_gives_the_same_results(monkeypatch):
    from nkilib_msda.backends.reference import backend as reference_torch

    inputs = make_inputs(queries=7, value_layout="BNLC", sampling_locations_layout="B2QHLP", seed=13)
    whole = _run(inputs, True, "border")
    per_query = 2 * 2 * 3 * 2 * 4 * 4  # B * N_h * N_l * N_p * 4 corners * C_h
    monkeypatch.setattr(reference_torch, "_GATHER_ELEMENTS_PER_CHUNK", 2 * per_query)
    assert len(reference_torch._query_chunks(
        validate_msda_args(inputs.value, inputs.spatial_shapes, None, inputs.sampling_locations,
                           inputs.attention_weights, "BNLC", "B2QHLP", False, "zeros"))) == 4
    chunked = _run(inputs, True, "border")
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-14)
    for got, want in zip(chunked[1], whole[1]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
