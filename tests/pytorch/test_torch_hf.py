"""HF transformers drop-in: patch_transformers_model on tiny random models (float64).

Skipped only when transformers is not installed (CI installs the `hf` extra).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import nkilib_msda  # noqa: E402
from nkilib_msda.pytorch.hf import patch_transformers_model, unpatch_transformers_functions  # noqa: E402
from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention  # noqa: E402
from _torch_inputs import make_inputs  # noqa: E402


def _resnet(out_features):
    return transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                                     depths=[1, 1, 1, 1], out_features=out_features)


def _tiny_deformable_detr():
    config = transformers.DeformableDetrConfig(
        backbone_config=_resnet(["stage2", "stage3", "stage4"]), use_timm_backbone=False,
        use_pretrained_backbone=False, d_model=32, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, num_queries=10, num_feature_levels=4, encoder_n_points=2,
        decoder_n_points=2, num_labels=3)
    return transformers.DeformableDetrModel(config), "last_hidden_state"


def _tiny_rt_detr():
    backbone = transformers.RTDetrResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
        out_features=["stage2", "stage3", "stage4"], layer_type="basic")
    config = transformers.RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=16, d_model=32,
        encoder_in_channels=[16, 32, 64], decoder_in_channels=[16, 16, 16], encoder_ffn_dim=32,
        decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_layers=1, decoder_layers=2, num_queries=10, decoder_n_points=2, num_labels=3,
        hidden_expansion=0.5)
    return transformers.RTDetrModel(config), "last_hidden_state"


def _tiny_mask2former():
    config = transformers.Mask2FormerConfig(
        backbone_config=_resnet(["stage1", "stage2", "stage3", "stage4"]),
        use_timm_backbone=False, use_pretrained_backbone=False, feature_size=32,
        mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=32, dim_feedforward=32,
        encoder_layers=1, decoder_layers=2, num_attention_heads=2, num_queries=10, num_labels=3)
    return transformers.Mask2FormerModel(config), "pixel_decoder_last_hidden_state"


def _forward_backward(model, output_name, pixels):
    model.zero_grad()
    out = getattr(model(pixel_values=pixels), output_name)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def assert_same_results(out_after, grads_after, out_before, grads_before):
    """The swapped model's output and parameter gradients match the original's up to summation
    order (float64 models)."""
    torch.testing.assert_close(out_after, out_before, rtol=1e-10, atol=1e-12)
    assert grads_after.keys() == grads_before.keys() and len(grads_before) > 20
    for name, before in grads_before.items():
        scale = before.abs().max().item()
        torch.testing.assert_close(grads_after[name], before, rtol=1e-9,
                                   atol=1e-12 + 1e-10 * scale, msg=name)


@pytest.mark.parametrize("build,expected_sites", [(_tiny_deformable_detr, 3), (_tiny_rt_detr, 2),
                                                  (_tiny_mask2former, 1)],
                         ids=["deformable_detr", "rt_detr", "mask2former"])
def test_patch_keeps_outputs_and_parameter_gradients(build, expected_sites):
    torch.manual_seed(0)
    model, output_name = build()
    model = model.double().eval()
    pixels = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    try:
        out_before, grads_before = _forward_backward(model, output_name, pixels)
        assert patch_transformers_model(model, backend="reference") == expected_sites
        swapped = [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
        assert all(m.nkilib_msda_backend == "reference" for m in swapped)
        out_after, grads_after = _forward_backward(model, output_name, pixels)
    finally:
        unpatch_transformers_functions()
    assert_same_results(out_after, grads_after, out_before, grads_before)


def test_patched_sites_really_run_nkilib(monkeypatch):
    from nkilib_msda.backends import reference_torch

    calls = []
    real = reference_torch.msda_forward
    monkeypatch.setattr(reference_torch, "msda_forward",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(1)
    model, _ = _tiny_deformable_detr()
    model.eval()
    with torch.no_grad():
        model(pixel_values=torch.randn(2, 3, 32, 32))
    assert calls == []
    assert nkilib_msda.patch_transformers_model(model) == 3
    with torch.no_grad():
        model(pixel_values=torch.randn(2, 3, 32, 32))
    assert len(calls) == 3
    assert nkilib_msda.patch_transformers_model(model) == 3  # idempotent


def test_mask2former_function_is_patched_and_restored():
    from transformers.models.mask2former import modeling_mask2former as m2f

    original = m2f.multi_scale_deformable_attention
    inputs = make_inputs(spatial_shapes=((4, 5), (2, 3)), seed=9).requires_grad_()
    shapes_list = [tuple(s) for s in inputs.spatial_shapes]
    expect = original(inputs.value, shapes_list, inputs.sampling_locations, inputs.attention_weights)
    want = torch.autograd.grad(expect, inputs.tensors(), inputs.grad_output)
    torch.manual_seed(2)
    model, _ = _tiny_mask2former()
    try:
        assert patch_transformers_model(model) == 1
        patched = m2f.multi_scale_deformable_attention
        assert patched is not original
        for shapes in (shapes_list, torch.tensor(inputs.spatial_shapes)):
            got = patched(inputs.value, shapes, inputs.sampling_locations, inputs.attention_weights)
            torch.testing.assert_close(got, expect, rtol=1e-12, atol=1e-12)
            grads = torch.autograd.grad(got, inputs.tensors(), inputs.grad_output)
            for g, w in zip(grads, want):
                torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
    finally:
        assert unpatch_transformers_functions() == 1
    assert m2f.multi_scale_deformable_attention is original


def test_stateless_layer_matches_hf_layer_and_follows_hub_layer_rules():
    from transformers.models.deformable_detr import modeling_deformable_detr as ddetr

    inputs = make_inputs(spatial_shapes=((4, 5), (2, 3)), seed=10)
    shapes = torch.tensor(inputs.spatial_shapes)
    args = (inputs.value, shapes, [tuple(s) for s in inputs.spatial_shapes],
            torch.tensor([0, 20]), inputs.sampling_locations, inputs.attention_weights, 64)
    expect = ddetr.MultiScaleDeformableAttention()(*args)
    torch.testing.assert_close(MultiScaleDeformableAttention()(*args), expect, rtol=1e-12, atol=1e-12)
    # kernels' _validate_layer: no __init__, no extra members, same forward arity.
    assert "__init__" not in vars(MultiScaleDeformableAttention)
    members = {k for k in vars(MultiScaleDeformableAttention) if not k.startswith("__")}
    assert members <= {"forward", "has_backward", "can_torch_compile"}


def test_patch_rejects_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        patch_transformers_model("not a model")
    model, _ = _tiny_deformable_detr()
    with pytest.raises(ValueError, match="backend"):
        patch_transformers_model(model, backend="gpu")
    assert not any(isinstance(m, MultiScaleDeformableAttention) for m in model.modules())


def test_every_family_carrying_the_layer_or_function_is_recognized():
    """Scan the installed transformers for copies of the layer / Mask2Former-style function."""
    import importlib
    from pathlib import Path

    from nkilib_msda.pytorch import hf

    models_dir = Path(transformers.__file__).parent / "models"
    layer_modules, function_modules = [], []
    for path in sorted(models_dir.glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        name = f"transformers.models.{path.parent.name}.{path.stem}"
        if f"class {hf.LAYER_CLASS_NAME}(" in text:
            layer_modules.append(name)
        if f"def {hf.FUNCTION_NAME}(" in text:
            function_modules.append(name)
    assert len(layer_modules) >= 10 and len(function_modules) >= 2
    for name in layer_modules:
        layer = getattr(importlib.import_module(name), hf.LAYER_CLASS_NAME)()
        assert hf._is_hf_layer(layer), name
    for name in function_modules:
        module = importlib.import_module(name)
        blocks = [obj for obj in vars(module).values() if isinstance(obj, type)
                  and obj.__module__ == name and "DeformableAttention" in obj.__name__
                  and issubclass(obj, torch.nn.Module)]
        assert blocks, name
        probe = torch.nn.Module.__new__(blocks[0])
        torch.nn.Module.__init__(probe)
        probe.sampling_offsets = torch.nn.Linear(1, 1)
        assert hf._uses_function(probe), name
