"""User errors are ValueError/TypeError naming the argument (module construction, functional
API, direct operator calls) and meta tensors get shapes from the fake kernels."""

from __future__ import annotations

import pytest
import torch

import nkilib_msda
from _torch_inputs import make_inputs


@pytest.mark.parametrize("kwargs,error,name", [
    (dict(n_heads=0), ValueError, "n_heads"),
    (dict(n_points=0), ValueError, "n_points"),
    (dict(n_levels=0), ValueError, "n_levels"),
    (dict(d_model=0), ValueError, "d_model"),
    (dict(n_levels=-1), ValueError, "n_levels"),
    (dict(d_model=30, n_heads=8), ValueError, "d_model"),
    (dict(n_heads=2.0), ValueError, "n_heads"),  # the one positive-int check: one exception type
    (dict(n_points=True), TypeError, "n_points"),
    (dict(d_model="256"), ValueError, "d_model"),
])
def test_msdeformattn_rejects_bad_sizes_naming_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        nkilib_msda.MSDeformAttn(**kwargs)


def test_msdeformattn_accepts_good_sizes():
    module = nkilib_msda.MSDeformAttn(d_model=16, n_levels=2, n_heads=2, n_points=3)
    assert module.sampling_offsets.out_features == 2 * 2 * 3 * 2


def test_meta_tensors_on_the_direct_operator_call():
    inputs = make_inputs(seed=5)
    value, loc, attn = (t.float().to("meta") for t in inputs.tensors())
    out = torch.ops.nkilib_msda.ms_deformable_attention(
        value, [4, 6, 3, 2, 1, 1], [0, 24, 30], loc, attn, "BLNC", "BQHLP2", False, "zeros",
        "reference")
    assert out.is_meta and out.shape == (2, 5, 8) and out.dtype == torch.float32
    grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
        torch.empty(2, 5, 8, device="meta"), value, [4, 6, 3, 2, 1, 1], [0, 24, 30], loc, attn,
        "BLNC", "BQHLP2", False, "zeros", "reference", [True, True, True])
    assert [g.shape for g in grads] == [value.shape, loc.shape, attn.shape]
    assert all(g.is_meta for g in grads)


def test_meta_spatial_shapes_tensor_is_a_clear_error():
    """Spatial shapes are values, not shapes: a meta tensor of them cannot be read."""
    inputs = make_inputs(seed=6)
    value, loc, attn = (t.float() for t in inputs.tensors())
    shapes = torch.tensor(inputs.spatial_shapes, device="meta")
    with pytest.raises((ValueError, TypeError), match="spatial_shapes"):
        nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn)


def test_patching_a_model_without_deformable_attention_warns():
    from nkilib_msda.pytorch.hf import patch_transformers_model

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.warns(UserWarning, match="Sequential has no multi-scale deformable attention to "
                                         "patch .*the model is unchanged"):
        assert patch_transformers_model(model) == 0


def test_nki_backend_reports_every_gather_methods_reason():
    """Forward-only bf16 C_h = 65,536: transpose and copy both fail; the message says why for
    each, without advice the torch API cannot follow (it has no gather_method=)."""
    from nkilib_msda.pytorch.functional import multi_scale_deformable_attention

    value = torch.randn(1, 4, 1, 65536, dtype=torch.bfloat16)
    locations, weights = torch.rand(1, 2, 1, 1, 1, 2), torch.ones(1, 2, 1, 1, 1)
    with pytest.raises(ValueError) as err:
        multi_scale_deformable_attention(value, ((2, 2),), (0,), locations, weights, backend="nki")
    message = str(err.value)
    assert "gather_method='transpose': C_h * dtype bytes must fit one 2 KiB PSUM bank" in message
    assert "gather_method='copy': MSDA forward does not fit SBUF" in message
    assert "the largest C_h that fits with these samples is" in message
    assert "use gather_method=" not in message and "backend='reference'" in message
