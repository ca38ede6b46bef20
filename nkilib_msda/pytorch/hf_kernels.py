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

transformers applies its decorator only when the installed ``kernels`` lies in the range it
supports (transformers 5.2x: >= 0.18.2, < 0.19); otherwise the decorator is a no-op and
``kernelize`` would find nothing to replace. :func:`register_hf_kernels` therefore also puts
the same hook (``kernels.replace_kernel_forward_from_hub``, what the decorator does) on every
transformers ``MultiScaleDeformableAttention`` class that lacks it, so ``kernels.kernelize``
swaps the layer with any ``kernels`` that has that function (0.17 included). It warns, instead
of leaving ``kernelize`` a silent no-op, when the hook is switched off (``USE_HUB_KERNELS``,
``DISABLE_KERNEL_MAPPING``) or when transformers is installed but no hookable class is found.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import warnings
from typing import Any, Sequence

from torch import nn

from nkilib_msda._env import read_env
from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention

__all__ = ["register_hf_kernels", "hook_transformers_layers", "LAYER_NAME", "HF_DEVICES",
           "HOOKED_FAMILIES", "NkilibMSDALayerRepository"]

LAYER_NAME = "MultiScaleDeformableAttention"
HF_DEVICES = ("cpu", "cuda", "neuron")
# transformers families whose modeling module decorates a copy of the layer with the hub hook
# (checked against transformers 5.24); any other loaded module holding the class is hooked too.
HOOKED_FAMILIES = ("deformable_detr", "grounding_dino", "mm_grounding_dino", "rt_detr",
                   "omdet_turbo", "lw_detr", "rf_detr", "pp_doclayout_v2", "pp_doclayout_v3",
                   "pp_doclayout_v4")
_LAYER_FORWARD_PARAMS = ("value", "value_spatial_shapes", "value_spatial_shapes_list",
                         "level_start_index", "sampling_locations", "attention_weights",
                         "im2col_step")
_FALSE_VALUES = {"0", "NO", "FALSE", "OFF"}
# Classes this module gave the hook (so tests can restore a pristine transformers).
HOOKED_BY_US: set[type] = set()


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


def _hub_hook_switched_off() -> str | None:
    """Why ``kernelize`` would leave hooked layers alone whatever is registered, or None."""
    use_hub = read_env("USE_HUB_KERNELS")
    if use_hub.upper() in _FALSE_VALUES:
        return f"USE_HUB_KERNELS={use_hub} switches transformers' kernel hub hook off"
    if read_env("DISABLE_KERNEL_MAPPING") not in ("", "0"):
        return "DISABLE_KERNEL_MAPPING is set, so kernels.kernelize keeps every original forward"
    return None


def _hf_layer_classes() -> list[type]:
    """transformers' stateless MSDA layer classes: those of the known families (imported here,
    so a model built later is covered) and any already imported elsewhere."""
    if importlib.util.find_spec("transformers") is None:
        return []
    for family in HOOKED_FAMILIES:
        name = f"transformers.models.{family}.modeling_{family}"
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except ImportError:  # a family this transformers version lacks or cannot import
            continue
    classes = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models.") or module is None:
            continue
        cls = vars(module).get(LAYER_NAME)
        if (isinstance(cls, type) and issubclass(cls, nn.Module) and cls is not MultiScaleDeformableAttention
                and tuple(inspect.signature(cls.forward).parameters)[1:] == _LAYER_FORWARD_PARAMS
                and cls not in classes):
            classes.append(cls)
    return classes


def hook_transformers_layers() -> list[type]:
    """Give every transformers ``MultiScaleDeformableAttention`` class the ``kernels`` hub hook
    (``kernels.replace_kernel_forward_from_hub(cls, "MultiScaleDeformableAttention")``) unless
    transformers' own decorator already did; returns the classes hooked now. Warns when the hook
    is switched off by ``USE_HUB_KERNELS`` or ``DISABLE_KERNEL_MAPPING`` (then nothing is hooked)
    or when transformers is installed but has no such class. Needs ``kernels``."""
    import kernels

    reason = _hub_hook_switched_off()
    if reason is not None:
        warnings.warn(f"register_hf_kernels: {reason}; kernels.kernelize will not swap in nkilib_msda. "
                      "Unset it, or use nkilib_msda.patch_transformers_model(model).", stacklevel=3)
        return []
    classes = _hf_layer_classes()
    if not classes and importlib.util.find_spec("transformers") is not None:
        warnings.warn("register_hf_kernels: found no transformers MultiScaleDeformableAttention class "
                      "to hook; kernels.kernelize will not swap in nkilib_msda. Use "
                      "nkilib_msda.patch_transformers_model(model).", stacklevel=3)
    hooked = []
    for cls in classes:
        if getattr(cls, "kernel_layer_name", None) is None:
            kernels.replace_kernel_forward_from_hub(cls, LAYER_NAME)
            HOOKED_BY_US.add(cls)
            hooked.append(cls)
    return hooked


def register_hf_kernels(devices: Sequence[str] = HF_DEVICES) -> dict[str, Any]:
    """Register nkilib_msda's layer with the ``kernels`` package for ``devices`` (any of "cpu",
    "cuda", "neuron"); returns the mapping registered.

    Afterwards ``kernels.kernelize(model, device=..., mode=kernels.Mode.INFERENCE)`` (or
    ``Mode.TRAINING``, optionally ``| Mode.TORCH_COMPILE``) runs every transformers
    ``MultiScaleDeformableAttention`` layer of ``model`` on nkilib_msda: the hub hook is added
    to those classes when transformers' decorator did not (:func:`hook_transformers_layers`;
    it warns when the swap cannot happen). Needs the ``kernels`` package
    (``pip install nkilib_msda[hf]``).
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
    hook_transformers_layers()
    return mapping
