"""HF kernel hub integration: ``register_hf_kernels()``.

transformers marks its stateless MSDA layer with
``@use_kernel_forward_from_hub("MultiScaleDeformableAttention")`` (Deformable DETR, Grounding
DINO, RT-DETR and the other families carrying a copy). The ``kernels`` package then replaces
the forward of every such layer with a registered layer's forward when
``kernels.kernelize(model, device=..., mode=...)`` runs (transformers calls it for
``from_pretrained(..., use_kernels=True)``). :func:`register_hf_kernels` registers this
package's layer (:class:`~nkilib_msda.pytorch.modules.MultiScaleDeformableAttention`, which
declares ``has_backward`` and ``can_torch_compile``) for the ``cpu``, ``cuda`` and ``neuron``
devices, in every mode. Backend selection inside the layer is the usual automatic one
(docs/torch.md). Models without the hook (Mask2Former, OneFormer) use
:func:`~nkilib_msda.pytorch.hf.patch_transformers_model`, which swaps in the same layer.
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention

__all__ = ["register_hf_kernels", "LAYER_NAME", "HF_DEVICES", "NkilibMSDALayerRepository"]

LAYER_NAME = "MultiScaleDeformableAttention"
HF_DEVICES = ("cpu", "cuda", "neuron")


class NkilibMSDALayerRepository:
    """A ``kernels`` layer repository (anything with ``load() -> nn.Module class``) that serves
    this package's layer from the installed package: no Hub download, works offline."""

    layer_name = LAYER_NAME

    def load(self) -> type[nn.Module]:
        return MultiScaleDeformableAttention

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NkilibMSDALayerRepository)

    def __hash__(self) -> int:
        return hash((type(self).__name__, LAYER_NAME))

    def __str__(self) -> str:
        return f"nkilib_msda (layer `{LAYER_NAME}`)"


def register_hf_kernels(devices: Sequence[str] = HF_DEVICES) -> dict[str, Any]:
    """Register nkilib_msda's layer with the ``kernels`` package for ``devices`` (any of "cpu",
    "cuda", "neuron"); returns the mapping registered.

    Afterwards ``kernels.kernelize(model, device=..., mode=kernels.Mode.INFERENCE)`` (or
    ``Mode.TRAINING``, optionally ``| Mode.TORCH_COMPILE``) runs every
    ``MultiScaleDeformableAttention`` layer of ``model`` that carries transformers' hub hook on
    nkilib_msda. Needs the ``kernels`` package (``pip install nkilib_msda[hf]``).
    """
    if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
        raise TypeError(f"devices: expected a sequence of device names, got {devices!r}")
    unknown = [d for d in devices if d not in HF_DEVICES]
    if unknown or not devices:
        raise ValueError(f"devices: expected a non-empty subset of {list(HF_DEVICES)}, "
                         f"got {list(devices)!r}")
    try:
        import kernels
    except ImportError as exc:
        raise ImportError("register_hf_kernels needs the `kernels` package: "
                          "pip install 'nkilib_msda[hf]' (or pip install kernels)") from exc
    repo = NkilibMSDALayerRepository()
    mapping: dict[str, Any] = {LAYER_NAME: {device: repo for device in devices}}
    kernels.register_kernel_mapping(mapping)
    return mapping
