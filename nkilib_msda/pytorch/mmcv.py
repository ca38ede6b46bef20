"""mmcv (OpenMMLab) drop-ins: ``mmcv.ops.multi_scale_deform_attn``'s names on nkilib_msda.

For mmdet's Deformable DETR / DINO / Mask2Former and BEVFormer-style code written against mmcv:

- :class:`MultiScaleDeformableAttnFunction` — ``.apply(value, value_spatial_shapes,
  value_level_start_index, sampling_locations, attention_weights, im2col_step)``;
- :func:`multi_scale_deformable_attn_pytorch` — ``(value, value_spatial_shapes,
  sampling_locations, attention_weights)``;
- :class:`MultiScaleDeformableAttention` — mmcv's module: same constructor arguments, forward
  arguments, parameter names and initialisation, so an mmcv checkpoint's ``state_dict`` loads;
- :func:`patch_mmcv` / :func:`unpatch_mmcv` — route an installed mmcv's function and operator
  (and so its module) through nkilib_msda.

Layouts are mmcv's, which are nkilib's BLNC / BQHLP2: value (bs, num_keys, num_heads,
head_dims), sampling_locations (bs, num_queries, num_heads, num_levels, num_points, 2) with
(x, y) in [0, 1], attention_weights (bs, num_queries, num_heads, num_levels, num_points),
output (bs, num_queries, num_heads * head_dims). mmcv itself is not a dependency; this module
needs only torch. See docs/torch.md ("mmcv / OpenMMLab").
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from nkilib_msda.pytorch.dispatch import backend_argument
from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.modules import msda_projections, reset_msda_projections, split_heads
from nkilib_msda.validation.arguments import (check_positive_int, check_positive_number,
                                              check_probability)

__all__ = ["MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn_pytorch",
           "MultiScaleDeformableAttention", "patch_mmcv", "unpatch_mmcv", "MMCV_MODULE"]

MMCV_MODULE = "mmcv.ops.multi_scale_deform_attn"
_FUNCTION_CLASS = "MultiScaleDeformableAttnFunction"
_PYTORCH_FUNCTION = "multi_scale_deformable_attn_pytorch"
_ORIGINAL = "__nkilib_msda_original__"


class MultiScaleDeformableAttnFunction:
    """mmcv's ``MultiScaleDeformableAttnFunction``: call ``MultiScaleDeformableAttnFunction.apply``.

    ``apply(value (bs, num_keys, num_heads, head_dims), value_spatial_shapes (num_levels, 2)
    (h, w), value_level_start_index (num_levels,), sampling_locations (bs, num_queries,
    num_heads, num_levels, num_points, 2), attention_weights (bs, num_queries, num_heads,
    num_levels, num_points), im2col_step)`` -> (bs, num_queries, num_heads * head_dims),
    differentiable in value, sampling_locations and attention_weights. As in mmcv the attention
    weights are cast to value's dtype; the locations keep their own dtype (mmcv rounds them to
    value's, e.g. fp16 under amp). Any batch size works; ``im2col_step`` (an int or a tensor,
    as mmcv's callers pass either) is accepted and ignored. ``backend`` (class attribute):
    None for the automatic choice, or a backend name.
    """

    backend: str | None = None

    @classmethod
    def apply(cls, value: Tensor, value_spatial_shapes: Any, value_level_start_index: Any,
              sampling_locations: Tensor, attention_weights: Tensor, im2col_step: Any) -> Tensor:
        if not isinstance(attention_weights, Tensor):
            raise TypeError(f"attention_weights: expected a tensor, got {type(attention_weights).__name__}")
        if isinstance(value, Tensor):
            attention_weights = attention_weights.type_as(value)
        return multi_scale_deformable_attention(
            value, value_spatial_shapes, value_level_start_index, sampling_locations,
            attention_weights, backend=cls.backend)


def multi_scale_deformable_attn_pytorch(value: Tensor, value_spatial_shapes: Any,
                                        sampling_locations: Tensor, attention_weights: Tensor, *,
                                        backend: str | None = None) -> Tensor:
    """mmcv's ``multi_scale_deformable_attn_pytorch`` (its CPU path), computed by nkilib_msda.

    Same arguments and layouts as :meth:`MultiScaleDeformableAttnFunction.apply` without the
    level starts (derived from ``value_spatial_shapes``) and ``im2col_step``; returns
    (bs, num_queries, num_heads * head_dims). mmcv's version is bilinear ``grid_sample`` with
    ``align_corners=False`` and zero padding, which is this package's default convention.
    """
    return multi_scale_deformable_attention(value, value_spatial_shapes, None, sampling_locations,
                                            attention_weights, backend=backend)


def _shapes_tensor(spatial_shapes: Any, device: torch.device) -> Tensor:
    """(num_levels, 2) integer tensor of (h, w) from a tensor or a sequence of pairs."""
    if isinstance(spatial_shapes, Tensor):
        return spatial_shapes
    if spatial_shapes is None:
        raise ValueError("spatial_shapes: expected a (num_levels, 2) tensor or sequence of (h, w), got None")
    return torch.tensor([tuple(pair) for pair in spatial_shapes], dtype=torch.long, device=device)


class MultiScaleDeformableAttention(nn.Module):
    """mmcv's ``MultiScaleDeformableAttention`` (Deformable DETR's attention) on nkilib_msda.

    Constructor arguments, defaults, submodules (``sampling_offsets``, ``attention_weights``,
    ``value_proj``, ``output_proj``, ``dropout``), initialisation (:meth:`init_weights`) and
    forward are mmcv's, so an mmcv checkpoint's state_dict loads with ``strict=True``.
    ``norm_cfg`` and ``init_cfg`` are stored (mmcv stores them too and builds no layer from
    ``norm_cfg``; ``init_cfg`` is read by mmengine's ``BaseModule``, which this class does not
    need). ``backend`` (keyword-only, ours) picks the compute backend; None is automatic.
    """

    def __init__(self, embed_dims: int = 256, num_heads: int = 8, num_levels: int = 4,
                 num_points: int = 4, im2col_step: int = 64, dropout: float = 0.1,
                 batch_first: bool = False, norm_cfg: dict | None = None, init_cfg: Any = None,
                 value_proj_ratio: float = 1.0, *, backend: str | None = None):
        super().__init__()
        for name, arg in (("embed_dims", embed_dims), ("num_heads", num_heads),
                          ("num_levels", num_levels), ("num_points", num_points)):
            check_positive_int(name, arg)
        check_probability("dropout", dropout)
        check_positive_number("value_proj_ratio", value_proj_ratio)
        backend_argument(backend)  # the name is checked now, not at the first forward
        split_heads(embed_dims, num_heads, ("embed_dims", "num_heads"),
                    "MultiScaleDeformableAttention", "mmcv's CUDA kernel")
        value_proj_size = int(embed_dims * value_proj_ratio)
        if value_proj_size <= 0 or value_proj_size % num_heads != 0:
            raise ValueError(f"value_proj_ratio: expected int(embed_dims * value_proj_ratio) to be a "
                             f"positive multiple of num_heads={num_heads}, got {value_proj_ratio!r} "
                             f"(value projection size {value_proj_size})")
        self.norm_cfg = norm_cfg
        self.init_cfg = init_cfg
        self.dropout = nn.Dropout(dropout)
        self.batch_first = batch_first
        self.im2col_step = im2col_step
        self.embed_dims = embed_dims
        self.num_levels = num_levels
        self.num_heads = num_heads
        self.num_points = num_points
        self.backend = backend
        (self.sampling_offsets, self.attention_weights, self.value_proj,
         self.output_proj) = msda_projections(embed_dims, value_proj_size, num_heads, num_levels,
                                              num_points)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's initialisation: zero offset weights, offset biases on a polar grid (one ring
        per point), zero attention logits, Xavier-uniform projections with zero biases."""
        reset_msda_projections(self.sampling_offsets, self.attention_weights, self.value_proj,
                               self.output_proj, self.num_heads, self.num_levels, self.num_points)
        self._is_init = True

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                identity: Tensor | None = None, query_pos: Tensor | None = None,
                key_padding_mask: Tensor | None = None, reference_points: Tensor | None = None,
                spatial_shapes: Tensor | Sequence[Sequence[int]] | None = None,
                level_start_index: Tensor | Sequence[int] | None = None, **kwargs: Any) -> Tensor:
        """mmcv's forward. query (num_query, bs, embed_dims), or (bs, num_query, embed_dims) with
        ``batch_first``; value likewise with num_key (None: the query); ``key`` is unused, as in
        mmcv; identity like query (None: the query before ``query_pos`` is added);
        key_padding_mask (bs, num_key), True where padded; reference_points (bs, num_query,
        num_levels, 2) centres or (..., 4) boxes (x, y, w, h), normalised; spatial_shapes
        (num_levels, 2) (h, w); level_start_index (num_levels,). Returns
        ``dropout(output_proj(attention)) + identity`` in query's layout. The keyword
        ``residual`` is mmcv's deprecated name for ``identity``."""
        if "residual" in kwargs:
            warnings.warn("MultiScaleDeformableAttention: `residual` is deprecated, use `identity`",
                          DeprecationWarning, stacklevel=2)
            residual = kwargs.pop("residual")
            identity = residual if identity is None else identity
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        self._check(query, value, reference_points, key_padding_mask)
        assert reference_points is not None  # _check raised otherwise
        shapes = _shapes_tensor(spatial_shapes, query.device)
        batch, num_query, _ = query.shape
        num_value = value.shape[1]
        total = int((shapes[:, 0] * shapes[:, 1]).sum())
        if shapes.shape != (self.num_levels, 2) or total != num_value:
            raise ValueError(f"spatial_shapes: expected num_levels={self.num_levels} (h, w) pairs with "
                             f"sum(h * w) = num_key = {num_value}, got {shapes.tolist()}")

        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(batch, num_value, self.num_heads,
                           self.value_proj.out_features // self.num_heads)  # (-1: B = 0 fails)
        offsets = self.sampling_offsets(query).view(
            batch, num_query, self.num_heads, self.num_levels, self.num_points, 2)
        weights = self.attention_weights(query).view(
            batch, num_query, self.num_heads, self.num_levels * self.num_points).softmax(-1)
        weights = weights.view(batch, num_query, self.num_heads, self.num_levels, self.num_points)
        if reference_points.shape[-1] == 2:
            # offsets are in pixels of each level: divide by (w, h)
            normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1).to(offsets.dtype)
            locations = (reference_points[:, :, None, :, None, :]
                         + offsets / normalizer[None, None, None, :, None, :])
        else:
            # offsets are in units of the box half-size, shared over num_points rings
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / self.num_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        output = multi_scale_deformable_attention(value, shapes, level_start_index, locations,
                                                  weights, backend=self.backend)
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity

    def _check(self, query: Tensor, value: Tensor, reference_points: Tensor | None,
               key_padding_mask: Tensor | None) -> None:
        layout = "(bs, n, embed_dims)" if self.batch_first else "(n, bs, embed_dims)"
        for name, t in (("query", query), ("value", value)):
            if t.dim() != 3 or t.shape[-1] != self.embed_dims:
                raise ValueError(f"{name}: expected {layout} with embed_dims={self.embed_dims}, got "
                                 f"shape {tuple(t.shape)}")
        if value.shape[0] != query.shape[0]:
            raise ValueError(f"value: expected batch size {query.shape[0]} (the query's), got shape "
                             f"{tuple(value.shape)} (batch_first={self.batch_first})")
        want = (query.shape[0], query.shape[1], self.num_levels)
        if reference_points is None or reference_points.dim() != 4 or (
                tuple(reference_points.shape[:3]) != want or reference_points.shape[-1] not in (2, 4)):
            got = None if reference_points is None else tuple(reference_points.shape)
            raise ValueError(f"reference_points: expected (bs, num_query, num_levels, 2 or 4) = "
                             f"{want + ('2|4',)}, got {got}")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != tuple(value.shape[:2]):
            raise ValueError(f"key_padding_mask: expected (bs, num_key) = {tuple(value.shape[:2])}, "
                             f"got {tuple(key_padding_mask.shape)}")


# ----------------------------------------------------------------------------- patching mmcv


def _replacements(backend: str | None, function_class: Any, pytorch_function: Any) -> dict[int, Any]:
    """id(original object) -> its nkilib_msda replacement (marked with the original)."""

    class PatchedFunction(MultiScaleDeformableAttnFunction):
        __doc__ = MultiScaleDeformableAttnFunction.__doc__

    PatchedFunction.backend = backend
    PatchedFunction.__name__ = PatchedFunction.__qualname__ = _FUNCTION_CLASS

    def patched_pytorch(value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor,
                        attention_weights: Tensor) -> Tensor:
        return multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations,
                                                   attention_weights, backend=backend)

    patched_pytorch.__name__ = patched_pytorch.__qualname__ = _PYTORCH_FUNCTION
    patched_pytorch.__doc__ = multi_scale_deformable_attn_pytorch.__doc__
    setattr(PatchedFunction, _ORIGINAL, function_class)
    setattr(patched_pytorch, _ORIGINAL, pytorch_function)
    return {id(function_class): PatchedFunction, id(pytorch_function): patched_pytorch}


def _loaded_modules() -> list[Any]:
    return [m for m in list(sys.modules.values()) if m is not None and hasattr(m, "__dict__")]


def _rebind(mapping: dict[int, Any]) -> int:
    """Replace every module-level binding of a key object of ``mapping`` in every loaded module
    (mmcv's own, mmcv.ops' re-export, and downstream ``from ... import`` copies)."""
    count = 0
    for module in _loaded_modules():
        namespace = vars(module)
        for name, obj in list(namespace.items()):
            replacement = mapping.get(id(obj))
            if replacement is not None and replacement is not obj:
                namespace[name] = replacement
                count += 1
    return count


def patch_mmcv(backend: str | None = None) -> int:
    """Route mmcv's multi-scale deformable attention through nkilib_msda.

    Replaces ``MultiScaleDeformableAttnFunction`` and ``multi_scale_deformable_attn_pytorch``
    of ``mmcv.ops.multi_scale_deform_attn`` — and every copy of them bound in an already
    imported module (``mmcv.ops``, mmdet, BEVFormer-style projects that did ``from ... import``)
    — with this module's versions. mmcv's ``MultiScaleDeformableAttention`` module calls one of
    the two for every forward (the function on CUDA, the pytorch path elsewhere), so its
    existing and future instances, and checkpoints, run on nkilib_msda unchanged. ``backend``
    as for :func:`nkilib_msda.multi_scale_deformable_attention`. Patching again (e.g. with
    another backend) replaces the previous patch. Import the modules that copy the names before
    calling it. Returns the number of bindings replaced.

    Raises ImportError when ``mmcv.ops.multi_scale_deform_attn`` cannot be imported (mmcv not
    installed, or installed without its compiled ops, as mmcv-lite is): a requested patch that
    cannot happen is an error, not a silent no-op. Use :class:`MultiScaleDeformableAttention`
    of this module directly in that case.
    """
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend: expected None or a backend name, got {type(backend).__name__}")
    try:
        mmcv_module = importlib.import_module(MMCV_MODULE)
    except ImportError as exc:
        raise ImportError(
            f"patch_mmcv: cannot import {MMCV_MODULE} ({exc}); install mmcv with its compiled ops "
            "(mmcv-lite has none), or use nkilib_msda.mmcv.MultiScaleDeformableAttention "
            "directly") from exc
    current = [getattr(mmcv_module, name, None) for name in (_FUNCTION_CLASS, _PYTORCH_FUNCTION)]
    missing = [name for name, obj in zip((_FUNCTION_CLASS, _PYTORCH_FUNCTION), current) if obj is None]
    if missing:
        raise ImportError(f"patch_mmcv: {MMCV_MODULE} has no {', '.join(missing)}; "
                          "this mmcv version is not supported")
    originals = [getattr(obj, _ORIGINAL, obj) for obj in current]
    mapping = _replacements(backend, *originals)
    for obj, original in zip(current, originals):
        if obj is not original:  # an earlier patch: its bindings are replaced as well
            mapping[id(obj)] = mapping[id(original)]
    return _rebind(mapping)


def unpatch_mmcv() -> int:
    """Undo :func:`patch_mmcv` in every loaded module; returns the number of bindings restored."""
    mapping: dict[int, Any] = {}
    for module in _loaded_modules():
        for obj in list(vars(module).values()):
            if not callable(obj):
                continue
            try:
                original = getattr(obj, _ORIGINAL, None)
                ours = getattr(obj, "__module__", None) == __name__
            except Exception:  # objects with exotic __getattr__ are not ours
                continue
            if original is not None and ours:
                mapping[id(obj)] = original
    return _rebind(mapping)
