"""Deformable-DETR drop-ins: MSDeformAttnFunction and MSDeformAttn."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nkilib_msda
from nkilib_msda import MSDeformAttn, MSDeformAttnFunction
from _torch_inputs import make_inputs

SHAPES = ((5, 6), (3, 3), (2, 1))
LEVEL_STARTS = (0, 30, 39)


def _grid_sample_core(value, shapes, loc, attn):
    """Deformable-DETR's ms_deformable_attn_core_pytorch math (zeros, align_corners=False)."""
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    per_level = value.split([h * w for h, w in shapes], dim=1)
    samples = []
    for lvl, (h, w) in enumerate(shapes):
        image = per_level[lvl].flatten(2).transpose(1, 2).reshape(batch * heads, channels, h, w)
        grid = (2 * loc[:, :, :, lvl] - 1).transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))
    weights = attn.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    out = (torch.stack(samples, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(batch, heads * channels, queries).transpose(1, 2)


def _expected_msdeformattn(module, query, reference_points, input_flatten, padding_mask):
    """Deformable-DETR's MSDeformAttn.forward written out from its definition."""
    batch, queries, _ = query.shape
    heads, levels, points = module.n_heads, module.n_levels, module.n_points
    value = module.value_proj(input_flatten)
    if padding_mask is not None:
        value = value.masked_fill(padding_mask[..., None], 0.0)
    value = value.view(batch, -1, heads, module.d_model // heads)
    offsets = module.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
    attn = F.softmax(module.attention_weights(query).view(batch, queries, heads, levels * points), -1)
    attn = attn.view(batch, queries, heads, levels, points)
    shapes = torch.tensor(SHAPES)
    if reference_points.shape[-1] == 2:
        normalizer = torch.stack([shapes[:, 1], shapes[:, 0]], -1)
        loc = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
    else:
        loc = (reference_points[:, :, None, :, None, :2]
               + offsets / points * reference_points[:, :, None, :, None, 2:] * 0.5)
    return module.output_proj(_grid_sample_core(value, SHAPES, loc, attn))


def _module_inputs(ref_dim, with_mask, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 7, 32, generator=g, dtype=torch.float64)
    flat = torch.randn(2, sum(h * w for h, w in SHAPES), 32, generator=g, dtype=torch.float64)
    ref = torch.rand(2, 7, 3, ref_dim, generator=g, dtype=torch.float64)
    if ref_dim == 4:
        ref[..., 2:] = ref[..., 2:] * 0.5 + 0.1
    mask = (torch.rand(2, flat.shape[1], generator=g) < 0.3) if with_mask else None
    return query, ref, flat, mask


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("ref_dim,with_mask", [(2, False), (2, True), (4, False), (4, True)])
def test_msdeformattn_reproduces_deformable_detr(ref_dim, with_mask):
    torch.manual_seed(0)
    module = MSDeformAttn(d_model=32, n_levels=3, n_heads=4, n_points=2).double()
    _randomize(module, seed=ref_dim)  # non-trivial offsets and attention logits
    query, ref, flat, mask = _module_inputs(ref_dim, with_mask)
    out = module(query, ref, flat, torch.tensor(SHAPES), torch.tensor(LEVEL_STARTS), mask)
    grads = torch.autograd.grad(out.square().sum(), list(module.parameters()))
    expect = _expected_msdeformattn(module, query, ref, flat, mask)
    want = torch.autograd.grad(expect.square().sum(), list(module.parameters()))
    torch.testing.assert_close(out, expect, rtol=1e-10, atol=1e-10)
    for got, ref_grad in zip(grads, want):
        torch.testing.assert_close(got, ref_grad, rtol=1e-9, atol=1e-9)


def test_msdeformattn_init_matches_deformable_detr():
    module = MSDeformAttn(d_model=16, n_levels=2, n_heads=4, n_points=3)
    assert module.im2col_step == 64
    assert module.sampling_offsets.weight.abs().sum() == 0
    bias = module.sampling_offsets.bias.view(4, 2, 3, 2)
    for h in range(4):
        angle = 2 * math.pi * h / 4
        direction = torch.tensor([math.cos(angle), math.sin(angle)])
        direction = direction / direction.abs().max()
        for p in range(3):
            for lvl in range(2):
                torch.testing.assert_close(bias[h, lvl, p], direction * (p + 1))
    assert module.attention_weights.weight.abs().sum() == 0
    assert module.attention_weights.bias.abs().sum() == 0
    assert module.value_proj.bias.abs().sum() == 0 and module.output_proj.bias.abs().sum() == 0
    assert module.value_proj.weight.abs().sum() > 0


def test_msdeformattn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="d_model"):
        MSDeformAttn(d_model=30, n_heads=4)
    with pytest.warns(UserWarning, match="power of 2"):
        MSDeformAttn(d_model=24, n_heads=4, n_levels=3)
    module = MSDeformAttn(d_model=32, n_levels=3, n_heads=4, n_points=2).double()
    query, ref, flat, _ = _module_inputs(2, False)
    with pytest.raises(ValueError, match="reference_points"):
        module(query, ref[..., :1], flat, SHAPES, LEVEL_STARTS)
    with pytest.raises(ValueError, match="input_flatten"):
        module(query, ref, flat[:, :-1], SHAPES, LEVEL_STARTS)
    with pytest.raises(ValueError, match="input_spatial_shapes"):
        module(query, ref, flat, SHAPES[:2], LEVEL_STARTS[:2])
    with pytest.raises(ValueError, match="input_padding_mask"):
        module(query, ref, flat, SHAPES, LEVEL_STARTS, torch.zeros(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_msdeformattnfunction_any_batch_size(batch):
    inputs = make_inputs(batch=batch, spatial_shapes=SHAPES, seed=batch).requires_grad_()
    out = MSDeformAttnFunction.apply(inputs.value, torch.tensor(SHAPES), torch.tensor(LEVEL_STARTS),
                                     inputs.sampling_locations, inputs.attention_weights, 2)
    v, loc, attn = (t.detach().clone().requires_grad_() for t in inputs.tensors())
    expect = _grid_sample_core(v, SHAPES, loc, attn)
    torch.testing.assert_close(out, expect, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out, inputs.tensors(), inputs.grad_output)
    want = torch.autograd.grad(expect, (v, loc, attn), inputs.grad_output)
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="im2col_step"):
        MSDeformAttnFunction.apply(inputs.value, SHAPES, LEVEL_STARTS, inputs.sampling_locations,
                                   inputs.attention_weights, 0)


def test_public_names_are_exported():
    assert nkilib_msda.MSDeformAttn is MSDeformAttn
    assert callable(nkilib_msda.patch_transformers_model)
    layer = nkilib_msda.MultiScaleDeformableAttention()
    assert list(dict(layer.named_parameters())) == []
