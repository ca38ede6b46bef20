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


def _rt_detr_resnet():
    return transformers.RTDetrResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
        out_features=["stage2", "stage3", "stage4"], layer_type="basic")


# RT-DETRv2 / D-FINE / DEIMv2 decoders: d_model 32, 2 heads, 2 layers, 3 levels.
_REAL_TIME_DETR = dict(
    d_model=32, encoder_in_channels=[16, 32, 64], encoder_ffn_dim=32, decoder_ffn_dim=32,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_layers=1, decoder_layers=2,
    num_queries=10, num_labels=3, hidden_expansion=0.5)


def _tiny_rt_detr_v2(method="default"):
    config = transformers.RTDetrV2Config(
        backbone_config=_rt_detr_resnet(), encoder_hidden_dim=16, decoder_in_channels=[16, 16, 16],
        decoder_n_points=2, decoder_method=method, **_REAL_TIME_DETR)
    return transformers.RTDetrV2Model(config), "last_hidden_state"


def _tiny_d_fine(method="default", points=(3, 1, 2)):
    config = transformers.DFineConfig(
        backbone_config=_rt_detr_resnet(), encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_n_points=list(points), decoder_method=method, **_REAL_TIME_DETR)
    return transformers.DFineModel(config), "last_hidden_state"


def _tiny_deimv2(method="default", points=(1, 4, 2)):
    config = transformers.Deimv2Config(
        backbone_config=_rt_detr_resnet(), encoder_hidden_dim=32, decoder_in_channels=[32, 32, 32],
        decoder_n_points=list(points), decoder_method=method, **_REAL_TIME_DETR)
    return transformers.Deimv2Model(config), "last_hidden_state"


def _tiny_grounding_dino():
    text = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=64)
    config = transformers.GroundingDinoConfig(
        backbone_config=_resnet(["stage2", "stage3", "stage4"]), use_timm_backbone=False,
        use_pretrained_backbone=False, text_config=text, d_model=32, encoder_layers=1,
        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_feature_levels=4,
        encoder_n_points=2, decoder_n_points=2, max_text_len=16)
    ids = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    return transformers.GroundingDinoModel(config), "last_hidden_state", {"input_ids": ids}


def _tiny_oneformer():
    config = transformers.OneFormerConfig(
        backbone_config=_resnet(["stage1", "stage2", "stage3", "stage4"]),
        use_timm_backbone=False, use_pretrained_backbone=False, hidden_dim=32, conv_dim=32,
        mask_dim=32, encoder_feedforward_dim=32, dim_feedforward=32, encoder_layers=1,
        decoder_layers=2, num_attention_heads=2, num_queries=10, num_labels=3,
        text_encoder_width=32, text_encoder_context_length=8, text_encoder_num_layers=1,
        text_encoder_vocab_size=50, text_encoder_proj_layers=1, text_encoder_n_ctx=4,
        task_seq_len=8, max_seq_len=8, is_training=False)
    task = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(4))
    return (transformers.OneFormerModel(config), "transformer_decoder_mask_predictions",
            {"task_inputs": task})


def _forward_backward(model, output_name, pixels, extra=None):
    model.zero_grad()
    out = getattr(model(pixel_values=pixels, **(extra or {})), output_name)
    # A fixed random projection, not out.square().sum(): the outputs are layer-normed, so the
    # sum of squares is nearly constant and its gradients would be mostly cancellation noise.
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(6), dtype=out.dtype)
    (out * probe).sum().backward()
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


def assert_equal_to_1e10(out_after, grads_after, out_before, grads_before):
    """Acceptance: output and every parameter gradient within 1e-10 of the unpatched model's,
    as max|diff| / max|ref| per tensor (float64). A gradient that is zero up to rounding (its
    largest entry below 1e-5 of the model's largest gradient G, e.g. the bias of a conv feeding
    a per-channel GroupNorm, whose exact gradient is 0) is measured against that floor: its
    entries are rounding noise in both models, and the bound is then |diff| <= 1e-15 * G, a
    few float64 rounding units of G."""
    def error(got, want, floor=0.0):
        return (got - want).abs().max().item() / max(want.abs().max().item(), floor, 1e-300)

    assert error(out_after, out_before) <= 1e-10, "output"
    assert grads_after.keys() == grads_before.keys() and len(grads_before) > 20
    floor = 1e-5 * max(g.abs().max().item() for g in grads_before.values())
    errors = {name: error(grads_after[name], before, floor)
              for name, before in grads_before.items()}
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= 1e-10, f"{worst}: max|diff|/max|ref| = {errors[worst]:.3g} > 1e-10"


def _generic_sampling_offsets(model):
    """Move the initial offsets off the pixel grid. The families initialise them to integer
    pixel steps from pixel-centre references, so every sample sits exactly on a bilinear kink
    where the gradient with respect to the location is one-sided and any two roundings of
    the coordinate may pick different sides; random weights make the positions generic."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            linear = getattr(module, "sampling_offsets", None)
            if isinstance(linear, torch.nn.Linear):
                linear.weight.copy_(0.05 * torch.randn(linear.weight.shape, generator=g))
                linear.bias.add_(0.3 * torch.rand(linear.bias.shape, generator=g))


def _counting(monkeypatch):
    """Count the nkilib_msda calls: reference-backend forwards and discrete lookups."""
    from nkilib_msda.backends.reference import backend as reference_torch
    from nkilib_msda.pytorch import msda_v2

    calls = []
    for owner, name in ((reference_torch, "msda_forward"), (msda_v2, "discrete_attention")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name,
                            lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    return calls


_FAMILIES = [
    pytest.param(_tiny_deformable_detr, 3, id="deformable_detr"),
    pytest.param(_tiny_grounding_dino, 3, id="grounding_dino"),
    pytest.param(_tiny_rt_detr, 2, id="rt_detr"),
    pytest.param(_tiny_rt_detr_v2, 2, id="rt_detr_v2"),
    pytest.param(lambda: _tiny_rt_detr_v2("discrete"), 2, id="rt_detr_v2-discrete"),
    pytest.param(_tiny_d_fine, 2, id="d_fine-points312"),
    pytest.param(lambda: _tiny_d_fine("discrete"), 2, id="d_fine-points312-discrete"),
    pytest.param(_tiny_deimv2, 2, id="deimv2-points142"),
    pytest.param(lambda: _tiny_deimv2("discrete"), 2, id="deimv2-points142-discrete"),
    pytest.param(_tiny_mask2former, 1, id="mask2former"),
    pytest.param(_tiny_oneformer, 1, id="oneformer"),
]


def _patched_and_unpatched(build, expected_sites, monkeypatch, image_size):
    torch.manual_seed(0)
    model, output_name, *extra = build()
    model = model.double().eval()
    _generic_sampling_offsets(model)
    pixels = torch.randn(2, 3, image_size, image_size, dtype=torch.float64)
    calls = _counting(monkeypatch)
    try:
        out_before, grads_before = _forward_backward(model, output_name, pixels, *extra)
        assert calls == []
        assert patch_transformers_model(model, backend="reference") == expected_sites
        swapped = [m for m in model.modules() if isinstance(m, MultiScaleDeformableAttention)]
        assert all(m.nkilib_msda_backend == "reference" for m in swapped)
        out_after, grads_after = _forward_backward(model, output_name, pixels, *extra)
        assert len(calls) >= expected_sites  # the patched sites really ran nkilib_msda
    finally:
        unpatch_transformers_functions()
    return out_after, grads_after, out_before, grads_before


@pytest.mark.parametrize("build,expected_sites", [
    _FAMILIES[0], _FAMILIES[2], _FAMILIES[5], _FAMILIES[6], _FAMILIES[9]])
def test_patch_keeps_outputs_and_parameter_gradients(build, expected_sites, monkeypatch):
    """Fast subset on 32x32 images (tiny maps, so GroupNorm gradients are ill-conditioned and
    the tolerance is elementwise; the 1e-10 acceptance below uses 128x128)."""
    assert_same_results(*_patched_and_unpatched(build, expected_sites, monkeypatch, 32))


@pytest.mark.slow
@pytest.mark.parametrize("build,expected_sites", _FAMILIES)
def test_hf_families_patched_equal_unpatched_to_1e10(build, expected_sites, monkeypatch):
    """Acceptance, the HF test suites' families built tiny and offline: patched == unpatched
    to 1e-10 in float64, output and every parameter gradient. 128x128 images: on 32x32 the
    coarsest maps are 2x2 and 1x1 and the GroupNorm'd input projections amplify a 1e-15
    relative change of the input to ~1e-9 in their weight gradients, whatever computes MSDA."""
    assert_equal_to_1e10(*_patched_and_unpatched(build, expected_sites, monkeypatch, 128))


def test_patched_sites_really_run_nkilib(monkeypatch):
    from nkilib_msda.backends.reference import backend as reference_torch

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


def test_v2_families_patch_scope_and_pickling():
    """RT-DETRv2: module-wide function, restored by unpatch; D-FINE: this model's blocks only;
    a patched model still pickles (torch.save of the whole module)."""
    import io

    from transformers.models.d_fine import modeling_d_fine
    from transformers.models.rt_detr_v2 import modeling_rt_detr_v2

    original = modeling_rt_detr_v2.multi_scale_deformable_attention_v2
    torch.manual_seed(3)
    rt_v2, _ = _tiny_rt_detr_v2()
    d_fine, _ = _tiny_d_fine()
    other_d_fine, _ = _tiny_d_fine()
    try:
        assert patch_transformers_model(rt_v2) == 2
        assert modeling_rt_detr_v2.multi_scale_deformable_attention_v2 is not original
        assert patch_transformers_model(d_fine, backend="reference") == 2
        cores = [m.ms_deformable_attn_core for m in d_fine.modules() if hasattr(m, "ms_deformable_attn_core")]
        untouched = [m.ms_deformable_attn_core for m in other_d_fine.modules()
                     if hasattr(m, "ms_deformable_attn_core")]
        assert len(cores) == 2 and all(c is not modeling_d_fine.multi_scale_deformable_attention_v2
                                       for c in cores)
        assert all(c is modeling_d_fine.multi_scale_deformable_attention_v2 for c in untouched)
        buffer = io.BytesIO()
        torch.save(d_fine, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False).eval()
        d_fine.eval()
        pixels = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(loaded(pixel_values=pixels).last_hidden_state,
                                       d_fine(pixel_values=pixels).last_hidden_state)
    finally:
        assert unpatch_transformers_functions() == 1
    assert modeling_rt_detr_v2.multi_scale_deformable_attention_v2 is original


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
        if f"def {hf.FUNCTION_NAME}(" in text or f"def {hf.FUNCTION_V2_NAME}(" in text:
            function_modules.append(name)
    assert len(layer_modules) >= 10 and len(function_modules) >= 5
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
    v2_modules = [n for n in function_modules if n.rsplit(".", 1)[-1] in
                  ("modeling_rt_detr_v2", "modeling_d_fine", "modeling_deimv2")]
    assert len(v2_modules) == 3, function_modules
