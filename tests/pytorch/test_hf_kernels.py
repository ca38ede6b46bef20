"""HF kernel hub route: register_hf_kernels() + kernels.kernelize on tiny offline models
(Deformable DETR, Grounding DINO, RT-DETR; random init from small configs, float64): the
layers' forward becomes nkilib_msda's, outputs and parameter gradients stay the same.

transformers applies its hub hook (``use_kernel_forward_from_hub``) only with a ``kernels``
version in its supported range; with another one installed (the ``hf`` extra's 0.17) its
decorator is a no-op and ``register_hf_kernels`` adds the hook itself. The tests never add it:
the ``pristine`` fixture removes any hook nkilib_msda added earlier in the process, so the
documented route (register, then kernelize) has to do the swap on its own.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

import nkilib_msda  # noqa: E402
from nkilib_msda.backends.reference import backend as reference_torch  # noqa: E402
from nkilib_msda.pytorch import hf_kernels  # noqa: E402
from nkilib_msda.pytorch.hf_kernels import LAYER_NAME, NkilibMSDALayerRepository  # noqa: E402
from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention  # noqa: E402
from tests.pytorch.test_hf import (  # noqa: E402
    _resnet, _tiny_deformable_detr, _tiny_rt_detr, assert_same_results)


def _tiny_grounding_dino():
    text = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, vocab_size=64, max_position_embeddings=64)
    config = transformers.GroundingDinoConfig(
        backbone_config=_resnet(["stage2", "stage3", "stage4"]), use_timm_backbone=False,
        use_pretrained_backbone=False, text_config=text, d_model=32, encoder_layers=1,
        decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_feature_levels=4,
        encoder_n_points=2, decoder_n_points=2, max_text_len=16, fusion_dropout=0.0,
        fusion_droppath=0.0)
    return transformers.GroundingDinoModel(config), "last_hidden_state"


def _hf_layer_classes(model):
    return {type(m) for m in model.modules() if type(m).__name__ == LAYER_NAME
            and not isinstance(m, MultiScaleDeformableAttention)}


def _unhook_ours():
    for cls in list(hf_kernels.HOOKED_BY_US):
        for attr in ("kernel_layer_name", "kernel_condition"):
            if attr in vars(cls):
                delattr(cls, attr)
    hf_kernels.HOOKED_BY_US.clear()


@pytest.fixture
def pristine():
    """transformers' layer classes as transformers left them (hooks nkilib_msda added removed),
    before and after the test."""
    _unhook_ours()
    yield
    _unhook_ours()


def _transformers_hook_active() -> bool:
    from transformers.models.deformable_detr import modeling_deformable_detr as ddetr

    return hasattr(ddetr.MultiScaleDeformableAttention, "kernel_layer_name")


@pytest.mark.parametrize("build,sites,mode", [(_tiny_deformable_detr, 3, "training"),
                                              (_tiny_deformable_detr, 3, "inference"),
                                              (_tiny_grounding_dino, 3, "training"),
                                              (_tiny_rt_detr, 2, "training")],
                         ids=["deformable_detr", "deformable_detr-inference", "grounding_dino",
                              "rt_detr"])
def test_kernelize_swaps_in_nkilib_and_keeps_outputs_and_gradients(build, sites, mode, pristine,
                                                                   monkeypatch):
    torch.manual_seed(0)
    model, output_name = build()
    model = model.double().eval()
    g = torch.Generator().manual_seed(1)
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=g)}
    if "GroundingDino" in type(model).__name__:
        inputs["input_ids"] = torch.randint(0, 64, (2, 7), generator=g)

    def run():
        model.zero_grad()
        out = getattr(model(**inputs), output_name)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                              if p.grad is not None}

    out_before, grads_before = run()
    calls = []
    real = reference_torch.msda_forward
    monkeypatch.setattr(reference_torch, "msda_forward",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    mapping = nkilib_msda.register_hf_kernels()
    assert set(mapping[LAYER_NAME]) == {"cpu", "cuda", "neuron"}
    kernel_mode = kernels.Mode.TRAINING if mode == "training" else kernels.Mode.INFERENCE
    kernels.kernelize(model, device="cpu", mode=kernel_mode)  # other hooked layers keep theirs
    layers = [m for m in model.modules() if type(m).__name__ == LAYER_NAME]
    assert len(layers) == sites
    assert all(m.forward.__func__ is MultiScaleDeformableAttention.forward for m in layers)
    out_after, grads_after = run()
    assert len(calls) == sites  # every site ran nkilib_msda (reference backend on CPU)
    assert_same_results(out_after, grads_after, out_before, grads_before)


def test_layer_declares_modes_and_passes_the_kernels_layer_rules():
    from transformers.models.deformable_detr import modeling_deformable_detr as ddetr
    try:  # kernels < 0.19
        from kernels.layer.layer import _validate_layer
    except ModuleNotFoundError:  # kernels >= 0.19 moved its layer module
        from kernels._internals.layer.layer import _validate_layer

    assert MultiScaleDeformableAttention.has_backward is True
    assert MultiScaleDeformableAttention.can_torch_compile is True
    repo = NkilibMSDALayerRepository()
    assert repo.load() is MultiScaleDeformableAttention and repo == NkilibMSDALayerRepository()
    _validate_layer(check_cls=ddetr.MultiScaleDeformableAttention, cls=repo.load(), repo=repo)


def test_kernelize_for_compile_mode_keeps_our_layer(pristine):
    torch.manual_seed(2)
    model, _ = _tiny_deformable_detr()
    nkilib_msda.register_hf_kernels(["cpu"])
    kernels.kernelize(model, device="cpu", mode=kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE)
    layers = [m for m in model.modules() if type(m).__name__ == LAYER_NAME]
    assert layers and all(m.forward.__func__ is MultiScaleDeformableAttention.forward
                          for m in layers)


def test_register_hf_kernels_rejects_bad_devices():
    with pytest.raises(ValueError, match="devices"):
        nkilib_msda.register_hf_kernels(["tpu"])
    with pytest.raises(TypeError, match="devices"):
        nkilib_msda.register_hf_kernels("cpu")


def test_register_hooks_the_layer_classes_transformers_left_unhooked(pristine):
    from transformers.models.deformable_detr import modeling_deformable_detr as ddetr
    from transformers.models.rt_detr import modeling_rt_detr as rt_detr

    active = _transformers_hook_active()
    nkilib_msda.register_hf_kernels(["cpu"])
    for cls in (ddetr.MultiScaleDeformableAttention, rt_detr.MultiScaleDeformableAttention):
        assert cls.kernel_layer_name == LAYER_NAME
        assert (cls in hf_kernels.HOOKED_BY_US) is not active  # only where transformers did not


@pytest.mark.parametrize("env", [("USE_HUB_KERNELS", "NO"), ("DISABLE_KERNEL_MAPPING", "1")])
def test_register_warns_when_kernelize_cannot_swap(env, pristine, monkeypatch):
    monkeypatch.setenv(*env)
    with pytest.warns(UserWarning, match=f"{env[0]}.*will not swap in nkilib_msda"):
        nkilib_msda.register_hf_kernels(["cpu"])
    assert not hf_kernels.HOOKED_BY_US


def test_register_warns_when_transformers_has_no_layer_class(pristine, monkeypatch):
    monkeypatch.setattr(hf_kernels, "_hf_layer_classes", lambda: [])
    with pytest.warns(UserWarning, match="found no transformers MultiScaleDeformableAttention"):
        nkilib_msda.register_hf_kernels(["cpu"])
