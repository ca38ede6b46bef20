"""One-line patching of HF transformers models: ``patch_transformers_model(model)``.

- Families that carry their own copy of the stateless ``MultiScaleDeformableAttention`` layer
  (deformable_detr, grounding_dino, mm_grounding_dino, rt_detr, omdet_turbo, lw_detr, rf_detr,
  pp_doclayout_v2/v3/v4, and any later one with the same forward) are matched **by class
  name** and forward signature, and each instance is replaced by
  :class:`~nkilib_msda.pytorch.modules.MultiScaleDeformableAttention` (the same layer that
  :func:`nkilib_msda.register_hf_kernels` registers with the ``kernels`` hub; for models
  carrying transformers' hub hook, ``kernels.kernelize`` is the other route).
- mask2former and oneformer call a module-level function
  ``multi_scale_deformable_attention(value, spatial_shapes, loc, attn)``; the function of each
  such module present in the model is replaced (this affects every model of that family in
  the process; :func:`unpatch_transformers_functions` restores the originals).
- rt_detr_v2, d_fine and deimv2 call ``multi_scale_deformable_attention_v2(value, shapes, loc,
  attn, num_points_list, method)`` (per-level point counts); it is replaced by
  :func:`~nkilib_msda.pytorch.msda_v2.multi_scale_deformable_attention_v2`: module-wide for
  rt_detr_v2 (the block looks the function up on every call), and on each block of the model
  for d_fine / deimv2 (the block keeps the function as its ``ms_deformable_attn_core``
  attribute from ``__init__``).
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Any, Callable

import torch
from torch import Tensor, nn

from nkilib_msda.pytorch.dispatch import requested_backend
from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention
from nkilib_msda.pytorch.msda_v2 import multi_scale_deformable_attention_v2

__all__ = ["patch_transformers_model", "unpatch_transformers_functions", "LAYER_CLASS_NAME",
           "FUNCTION_NAME", "FUNCTION_V2_NAME"]

LAYER_CLASS_NAME = "MultiScaleDeformableAttention"
FUNCTION_NAME = "multi_scale_deformable_attention"
_LAYER_FORWARD_PARAMS = ("value", "value_spatial_shapes", "value_spatial_shapes_list",
                         "level_start_index", "sampling_locations", "attention_weights",
                         "im2col_step")
FUNCTION_V2_NAME = "multi_scale_deformable_attention_v2"
_FUNCTION_PARAMS = {
    FUNCTION_NAME: ("value", "value_spatial_shapes", "sampling_locations", "attention_weights"),
    FUNCTION_V2_NAME: ("value", "value_spatial_shapes", "sampling_locations", "attention_weights",
                       "num_points_list", "method"),
}
_CORE_ATTRIBUTE = "ms_deformable_attn_core"  # d_fine / deimv2 blocks keep the v2 function here
_PATCHED_MARK = "__nkilib_msda_original__"


def _forward_params(cls: type[nn.Module]) -> tuple[str, ...]:
    params = inspect.signature(cls.forward).parameters
    return tuple(p for p in params if p != "self")


def _is_hf_layer(module: nn.Module) -> bool:
    cls = type(module)
    return (cls.__name__ == LAYER_CLASS_NAME and not isinstance(module, MultiScaleDeformableAttention)
            and _forward_params(cls) == _LAYER_FORWARD_PARAMS)


class _Patched:
    """transformers' MSDA function ``name`` computed by nkilib_msda (module-level class, so a
    patched model still pickles; ``__nkilib_msda_original__`` is the replaced function)."""

    def __init__(self, name: str, backend: str | None, original: Callable[..., Any]):
        self.name = name
        self.backend = backend
        setattr(self, _PATCHED_MARK, original)

    def __call__(self, value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor,
                 attention_weights: Tensor, *v2_args: Any, **v2_kwargs: Any) -> Tensor:
        if self.name == FUNCTION_V2_NAME:  # (..., num_points_list, method="default")
            return multi_scale_deformable_attention_v2(
                value, value_spatial_shapes, sampling_locations, attention_weights, *v2_args,
                backend=self.backend, **v2_kwargs)
        if v2_args or v2_kwargs:
            raise TypeError(f"{self.name}: expected (value, value_spatial_shapes, "
                            f"sampling_locations, attention_weights), got "
                            f"{len(v2_args)} more positional and {sorted(v2_kwargs)} keyword arguments")
        return multi_scale_deformable_attention(value, value_spatial_shapes, None,
                                                sampling_locations, attention_weights,
                                                backend=self.backend)


def _function_module(module: nn.Module) -> tuple[Any, str] | None:
    """(Python module defining ``type(module)``, function name) if that module holds one of
    transformers' patchable MSDA functions."""
    py_module = sys.modules.get(type(module).__module__)
    if py_module is None or not py_module.__name__.startswith("transformers."):
        return None
    for name, want in _FUNCTION_PARAMS.items():
        func = getattr(py_module, name, None)
        if not callable(func):
            continue
        original = getattr(func, _PATCHED_MARK, func)
        try:
            params = tuple(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            continue
        if params == want:
            return py_module, name
    return None


def _uses_function(module: nn.Module) -> bool:
    """A deformable-attention block of a module with one of the functions (mask2former,
    oneformer, rt_detr_v2, d_fine, deimv2)."""
    return ("DeformableAttention" in type(module).__name__
            and hasattr(module, "sampling_offsets") and _function_module(module) is not None)


def _patch_core_attribute(module: nn.Module, name: str, backend: str | None) -> bool:
    """Point a block's ``ms_deformable_attn_core`` (d_fine, deimv2) at nkilib_msda; False when
    the block has no such attribute holding transformers' function."""
    core = getattr(module, _CORE_ATTRIBUTE, None)
    if name != FUNCTION_V2_NAME or not callable(core) or isinstance(core, nn.Module):
        return False
    original = getattr(core, _PATCHED_MARK, core)
    if getattr(original, "__name__", None) != FUNCTION_V2_NAME:
        return False
    setattr(module, _CORE_ATTRIBUTE, _Patched(name, backend, original))
    return True


def patch_transformers_model(model: nn.Module, backend: str | None = None) -> int:
    """Make every multi-scale deformable attention in an HF model run on nkilib_msda.

    Replaces each stateless ``MultiScaleDeformableAttention`` layer (matched by class name and
    forward signature) with nkilib_msda's; for mask2former/oneformer the module-level
    ``multi_scale_deformable_attention`` function; for rt_detr_v2 the module-level
    ``multi_scale_deformable_attention_v2``, and for d_fine/deimv2 each block's
    ``ms_deformable_attn_core`` (per-level point counts, "default" and "discrete" methods).
    ``backend`` as for
    :func:`nkilib_msda.multi_scale_deformable_attention` (None: automatic). Returns how many
    attention sites now use nkilib_msda (0, with a UserWarning, means the model has none).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if backend is not None:
        requested_backend(backend, torch.device("cpu"))  # validates the name before any change
    count = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if _is_hf_layer(child):
                layer = MultiScaleDeformableAttention()
                layer.nkilib_msda_backend = backend  # type: ignore[assignment]  # stub: Tensor|Module only
                setattr(parent, child_name, layer)
                count += 1
            elif isinstance(child, MultiScaleDeformableAttention):
                child.nkilib_msda_backend = backend  # type: ignore[assignment]  # stub: Tensor|Module only
                count += 1
    patched_modules = {}
    for module in model.modules():
        if _uses_function(module):
            found = _function_module(module)
            assert found is not None  # _uses_function checked it
            py_module, name = found
            if not _patch_core_attribute(module, name, backend):
                patched_modules[(py_module.__name__, name)] = py_module
            count += 1
    for (_, name), py_module in patched_modules.items():
        current = getattr(py_module, name)
        original = getattr(current, _PATCHED_MARK, current)
        setattr(py_module, name, _Patched(name, backend, original))
    if count == 0:
        warnings.warn(f"patch_transformers_model: {type(model).__name__} has no multi-scale "
                      f"deformable attention to patch (no transformers {LAYER_CLASS_NAME} layer, "
                      f"no module using transformers' {FUNCTION_NAME} or {FUNCTION_V2_NAME}); "
                      f"the model is unchanged",
                      UserWarning, stacklevel=2)
    return count


def unpatch_transformers_functions() -> int:
    """Restore every module-level function replaced by :func:`patch_transformers_model`
    (mask2former, oneformer, rt_detr_v2); d_fine / deimv2 blocks patched in a model keep
    nkilib_msda until the model is rebuilt."""
    restored = 0
    for module_name, py_module in list(sys.modules.items()):
        if not module_name.startswith("transformers.models.") or py_module is None:
            continue
        for name in _FUNCTION_PARAMS:
            current = getattr(py_module, name, None)
            original = getattr(current, _PATCHED_MARK, None)
            if original is not None:
                setattr(py_module, name, original)
                restored += 1
    return restored
