"""No 0*inf leak in the reference backend: a corner outside the map contributes nothing (to
the output and to all three gradients) even when the pixel its index is clamped to holds
inf/NaN; an in-map corner that reads inf/NaN still propagates it. Compared with the float64
NumPy reference (on a copy of value with the non-finite pixels made finite) wherever the
result does not depend on those pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nkilib_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from _torch_inputs import make_inputs

SHAPES = ((4, 6), (3, 2), (1, 1))
# (level-0 pixel index, value): map corners, where out-of-map corners get clamped to.
POISON = ((0, np.inf), (5, -np.inf), (18, np.nan), (23, np.inf))


def _case(padding_mode, seed):
    inputs = make_inputs(batch=2, queries=40, spatial_shapes=SHAPES, low=-0.2, high=1.2, seed=seed)
    value = inputs.value.clone()
    finite = value.clone()
    indicator = torch.zeros_like(value)
    for pixel, poison in POISON:
        value[:, pixel] = poison
        indicator[:, pixel] = 1.0
    return inputs, value, finite, indicator


def _depends(inputs, indicator, padding_mode):
    """Masks of results that depend on the poisoned pixels (through an in-map corner)."""
    args = (SHAPES, None, inputs.sampling_locations.numpy(), inputs.attention_weights.numpy())
    kw = dict(padding_mode=padding_mode)
    out = ms_deformable_attention_ref(indicator.numpy(), *args, **kw)
    ones = np.ones_like(out)
    _, g_loc, g_attn = ms_deformable_attention_bwd_ref(ones, indicator.numpy(), *args, **kw)
    # A sample depends on a poisoned pixel if it reads one with non-zero weight or slope.
    heads, channels = inputs.value.shape[2], inputs.value.shape[3]
    out_dep = np.abs(out).reshape(*out.shape[:2], heads, channels).sum(-1) > 0  # (B, Q, H)
    loc_dep = np.abs(g_loc).sum(-1) > 0
    return out_dep, loc_dep | (np.abs(g_attn) > 0), np.abs(g_attn) > 0


@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
def test_out_of_map_corners_do_not_leak_non_finite_values(padding_mode):
    inputs, value, finite, indicator = _case(padding_mode, seed=3)
    tensors = [value.requires_grad_(), inputs.sampling_locations.clone().requires_grad_(),
               inputs.attention_weights.clone().requires_grad_()]
    out = nkilib_msda.multi_scale_deformable_attention(
        tensors[0], SHAPES, None, tensors[1], tensors[2], padding_mode=padding_mode,
        backend="reference")
    grad_value, grad_loc, grad_attn = torch.autograd.grad(out, tensors, inputs.grad_output)
    args = (SHAPES, None, inputs.sampling_locations.numpy(), inputs.attention_weights.numpy())
    kw = dict(padding_mode=padding_mode)
    want_out = ms_deformable_attention_ref(finite.numpy(), *args, **kw)
    want_grads = ms_deformable_attention_bwd_ref(inputs.grad_output.numpy(), finite.numpy(),
                                                 *args, **kw)
    out_dep, loc_dep, attn_dep = _depends(inputs, indicator, padding_mode)
    heads, channels = value.shape[2], value.shape[3]

    got = out.detach().reshape(*out.shape[:2], heads, channels).numpy()
    want = want_out.reshape(got.shape)
    free = ~out_dep
    assert free.sum() > 20 and out_dep.sum() > 0  # both kinds of queries occur
    np.testing.assert_allclose(got[free], want[free], rtol=1e-10, atol=1e-12)
    assert not np.isfinite(got[out_dep]).all(axis=-1).any()  # every dependent head is hit
    # grad_value does not depend on value at all: finite and exact everywhere.
    np.testing.assert_allclose(grad_value.numpy(), want_grads[0], rtol=1e-10, atol=1e-12)
    loc_free = ~loc_dep
    np.testing.assert_allclose(grad_loc.numpy()[loc_free], want_grads[1][loc_free],
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grad_attn.numpy()[~attn_dep], want_grads[2][~attn_dep],
                               rtol=1e-9, atol=1e-12)
    assert not np.isfinite(grad_attn.numpy()[attn_dep]).any()


def test_out_of_map_samples_are_exercised():
    """The case really has out-of-map corners clamped onto the poisoned pixels."""
    inputs, *_ = _case("zeros", seed=3)
    u = inputs.sampling_locations[..., 0, :, 0]  # level 0, x
    v = inputs.sampling_locations[..., 0, :, 1]
    assert ((u < 0) & (v < 0.25)).any() and ((u > 1) & (v > 0.75)).any()
