"""Drop-in replacements: Deformable-DETR's ``MSDeformAttnFunction`` / ``MSDeformAttn`` and HF
transformers' stateless ``MultiScaleDeformableAttention`` layer (see docs/torch.md)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from nkilib_msda.pytorch._modes import values_unreadable
from nkilib_msda.pytorch.eager import can_skip_dispatcher
from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.point_counts import check_num_points
from nkilib_msda.pytorch.problem_cache import spatial_shapes_tuple
from nkilib_msda.pytorch.tensor_shapes_ops import shapes_on_device
from nkilib_msda.validation.arguments import check_positive_int

__all__ = ["MSDeformAttnFunction", "MSDeformAttn", "MultiScaleDeformableAttention"]


# The spatial shapes as the module uses them: (H, W) pairs of Python ints, or the (N_l, 2) int
# tensor itself while tracing (its values are read by the operator when the graph runs) or when
# it lives on a device (never read on the host: see pytorch/tensor_shapes_ops.py).
Shapes = tuple[tuple[int, int], ...] | Tensor


def _module_shapes(spatial_shapes: Any) -> Shapes:
    """(H, W) pairs as Python ints (a CPU tensor is read once, at the model edge), or the
    tensor itself while it cannot be read (tracing) or when it is on a device (CUDA)."""
    if isinstance(spatial_shapes, Tensor) and (values_unreadable(spatial_shapes)
                                               or shapes_on_device(spatial_shapes)):
        return spatial_shapes
    return spatial_shapes_tuple(spatial_shapes, "input_spatial_shapes")


_NORMALIZERS: dict[tuple, Tensor] = {}
_MAX_NORMALIZERS = 64


def _offset_normalizer(shapes: Shapes, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(N_l, 2) tensor of (W, H) per level. Cached in plain eager mode: building it from Python
    ints every forward costs a host-to-device copy (a stream sync on CUDA)."""
    if isinstance(shapes, Tensor):
        return shapes.flip(-1).to(device=device, dtype=dtype)
    if not can_skip_dispatcher():  # tracing or a mode: build it where it can be seen
        return torch.tensor([[w, h] for h, w in shapes], dtype=dtype, device=device)
    # Inference tensors cannot be saved for backward outside inference mode: keep them apart.
    key = (shapes, dtype, device, torch.is_inference_mode_enabled())
    normalizer = _NORMALIZERS.get(key)
    if normalizer is None:
        if len(_NORMALIZERS) >= _MAX_NORMALIZERS:
            _NORMALIZERS.clear()
        normalizer = torch.tensor([[w, h] for h, w in shapes], dtype=dtype, device=device)
        _NORMALIZERS[key] = normalizer
    return normalizer


class MSDeformAttnFunction:
    """Deformable-DETR's ``MSDeformAttnFunction``: use ``MSDeformAttnFunction.apply(...)``.

    ``apply(value (N, S, M, D), input_spatial_shapes (L, 2), input_level_start_index (L,),
    sampling_locations (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P), im2col_step)``
    returns (N, Lq, M*D) and is differentiable. Any batch size works; ``im2col_step`` is
    accepted and ignored (the CUDA original required ``N % im2col_step == 0``).
    """

    backend: str | None = None  # per-process override; None = automatic selection

    @classmethod
    def apply(cls, value: Tensor, value_spatial_shapes: Any, value_level_start_index: Any,
              sampling_locations: Tensor, attention_weights: Tensor, im2col_step: int) -> Tensor:
        check_positive_int("im2col_step", im2col_step)
        return multi_scale_deformable_attention(
            value, value_spatial_shapes, value_level_start_index, sampling_locations,
            attention_weights, backend=cls.backend)


def split_heads(embed_dims: int, num_heads: int, names: tuple[str, str], module: str,
                original: str) -> int:
    """The head dimension ``embed_dims // num_heads`` of an MSDA module: ValueError naming
    ``names[0]`` unless ``embed_dims`` is a multiple of ``num_heads``; a warning (as the
    original ``module`` of ``original`` gives) when it is not a power of 2. ``names``: the
    module's names of the two arguments."""
    if embed_dims % num_heads != 0:
        raise ValueError(f"{names[0]}: expected a multiple of {names[1]}={num_heads}, got {embed_dims}")
    head_dim = embed_dims // num_heads
    if head_dim & (head_dim - 1):
        warnings.warn(f"{module}: {names[0]} / {names[1]} is not a power of 2, which is less "
                      f"efficient for {original} (harmless here)", stacklevel=3)
    return head_dim


def _points_per_level(num_levels: int, num_points: int | Sequence[int]) -> tuple[int, ...]:
    """(P_0, ..., P_{L-1}): ``num_points`` itself when per level, else repeated."""
    return (num_points,) * num_levels if isinstance(num_points, int) else tuple(num_points)


def msda_projections(embed_dims: int, value_dims: int, num_heads: int, num_levels: int,
                     num_points: int | Sequence[int]
                     ) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
    """The four linear layers of an MSDA module, in the order Deformable-DETR and mmcv register
    them: sampling_offsets (embed -> heads*points*2), attention_weights (embed -> heads*points),
    value_proj (embed -> value_dims), output_proj (value_dims -> embed); points = the sum of
    the per-level counts (levels*points for an int)."""
    points = sum(_points_per_level(num_levels, num_points))
    return (nn.Linear(embed_dims, num_heads * points * 2),
            nn.Linear(embed_dims, num_heads * points),
            nn.Linear(embed_dims, value_dims),
            nn.Linear(value_dims, embed_dims))


def reset_msda_projections(sampling_offsets: nn.Linear, attention_weights: nn.Linear,
                           value_proj: nn.Linear, output_proj: nn.Linear, num_heads: int,
                           num_levels: int, num_points: int | Sequence[int]) -> None:
    """The init Deformable-DETR and mmcv share: zero offset weights, offset biases on a polar
    grid (unit-max-norm direction per head, ring i+1 for point i of each level), zero
    attention logits, Xavier-uniform projections with zero biases."""
    nn.init.constant_(sampling_offsets.weight, 0.0)
    device = sampling_offsets.weight.device
    angles = torch.arange(num_heads, dtype=torch.float32, device=device) * (
        2.0 * math.pi / num_heads)
    directions = torch.stack([angles.cos(), angles.sin()], dim=-1)
    directions = directions / directions.abs().max(dim=-1, keepdim=True).values
    rings = torch.cat([torch.arange(1, count + 1, dtype=torch.float32, device=device)
                       for count in _points_per_level(num_levels, num_points)])
    grid = directions[:, None, :] * rings[None, :, None]            # (heads, sum(P), 2)
    with torch.no_grad():
        sampling_offsets.bias.copy_(grid.reshape(-1))
    nn.init.constant_(attention_weights.weight, 0.0)
    nn.init.constant_(attention_weights.bias, 0.0)
    for linear in (value_proj, output_proj):
        nn.init.xavier_uniform_(linear.weight)
        nn.init.constant_(linear.bias, 0.0)


class MSDeformAttn(nn.Module):
    """Deformable-DETR's multi-scale deformable attention module, same parameters and init.

    ``forward(query (N, Len_q, C), reference_points (N, Len_q, n_levels, 2 or 4),
    input_flatten (N, Len_in, C), input_spatial_shapes (n_levels, 2),
    input_level_start_index (n_levels,), input_padding_mask (N, Len_in) or None)``
    returns (N, Len_q, C). 2-d reference points are normalized (x, y) centres; 4-d ones are
    (x, y, w, h) boxes whose half-size scales the offsets. ``backend`` picks the compute backend.
    ``n_points`` may be a per-level sequence (P_0, ..., P_{n_levels-1}) (RT-DETRv2 / D-FINE
    style): the offsets and weights are then n_heads * sum(P) per query, the softmax runs over
    the sum(P) points and a box's offsets are scaled by 1/P_l of their level.
    """

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8,
                 n_points: int | Sequence[int] = 4, *, backend: str | None = None):
        super().__init__()
        for name, arg in (("d_model", d_model), ("n_levels", n_levels), ("n_heads", n_heads)):
            check_positive_int(name, arg)
        self.num_points_list: tuple[int, ...] | None = None
        if isinstance(n_points, int) and not isinstance(n_points, bool):
            check_positive_int("n_points", n_points)
        else:
            n_points = self.num_points_list = check_num_points(n_points, n_levels, "n_points")
        split_heads(d_model, n_heads, ("d_model", "n_heads"), "MSDeformAttn", "the CUDA original")
        self.im2col_step = 64
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.backend = backend
        (self.sampling_offsets, self.attention_weights, self.value_proj,
         self.output_proj) = msda_projections(d_model, d_model, n_heads, n_levels, n_points)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Deformable-DETR's init: offsets start on a polar grid, one ring per point."""
        reset_msda_projections(self.sampling_offsets, self.attention_weights, self.value_proj,
                               self.output_proj, self.n_heads, self.n_levels, self.n_points)

    def forward(self, query: Tensor, reference_points: Tensor, input_flatten: Tensor,
                input_spatial_shapes: Tensor | Sequence[Sequence[int]],
                input_level_start_index: Tensor | Sequence[int] | None,
                input_padding_mask: Tensor | None = None) -> Tensor:
        shapes = _module_shapes(input_spatial_shapes)
        self._check_inputs(query, reference_points, input_flatten, shapes, input_padding_mask)
        batch, num_queries, _ = query.shape
        length_in = input_flatten.shape[1]
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(batch, length_in, self.n_heads, self.d_model // self.n_heads)
        if self.num_points_list is not None:
            return self.output_proj(self._per_level_points(
                query, reference_points, value, shapes, input_level_start_index))
        points = self.n_points
        assert isinstance(points, int)  # per-level counts returned above
        offsets = self.sampling_offsets(query).view(
            batch, num_queries, self.n_heads, self.n_levels, points, 2)
        weights = self.attention_weights(query).view(
            batch, num_queries, self.n_heads, self.n_levels * points)
        weights = F.softmax(weights, dim=-1).view(
            batch, num_queries, self.n_heads, self.n_levels, points)
        if reference_points.shape[-1] == 2:
            # offsets are in pixels of each level: divide by (W, H)
            normalizer = _offset_normalizer(shapes, offsets.dtype, offsets.device)
            locations = (reference_points[:, :, None, :, None, :]
                         + offsets / normalizer[None, None, None, :, None, :])
        else:
            # offsets are in units of the box half-size, shared over n_points rings
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / points * reference_points[:, :, None, :, None, 2:] * 0.5)
        output = multi_scale_deformable_attention(
            value, shapes, input_level_start_index, locations, weights, backend=self.backend)
        return self.output_proj(output)

    def _per_level_points(self, query: Tensor, reference_points: Tensor, value: Tensor,
                          shapes: Shapes, level_start_index: Any) -> Tensor:
        """The attention (N, Len_q, d_model) with per-level counts ``num_points_list``: every
        per-point factor repeats its level's entry P_l times (points packed level by level)."""
        counts = self.num_points_list
        assert counts is not None
        batch, num_queries, _ = query.shape
        total = sum(counts)
        offsets = self.sampling_offsets(query).view(batch, num_queries, self.n_heads, total, 2)
        weights = F.softmax(self.attention_weights(query).view(
            batch, num_queries, self.n_heads, total), dim=-1)
        # (N, Len_q, sum(P), 2 or 4): each point's reference, taken from its level
        refs = torch.cat([reference_points[:, :, level:level + 1].expand(-1, -1, count, -1)
                          for level, count in enumerate(counts)], dim=2)
        if reference_points.shape[-1] == 2:
            normalizer = _offset_normalizer(shapes, offsets.dtype, offsets.device)
            per_point = torch.cat([normalizer[level:level + 1].expand(count, 2)
                                   for level, count in enumerate(counts)])
            locations = refs[:, :, None, :, :] + offsets / per_point
        else:
            scale = offsets.new_tensor([0.5 / count for count in counts for _ in range(count)])
            locations = (refs[:, :, None, :, :2]
                         + offsets * scale[:, None] * refs[:, :, None, :, 2:])
        return multi_scale_deformable_attention(
            value, shapes, level_start_index, locations, weights, backend=self.backend,
            num_points=counts)

    def _check_inputs(self, query: Tensor, reference_points: Tensor, input_flatten: Tensor,
                      shapes: Shapes, input_padding_mask: Tensor | None) -> None:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query: expected (N, Len_q, d_model={self.d_model}), got shape "
                             f"{tuple(query.shape)}")
        batch, num_queries, _ = query.shape
        if input_flatten.dim() != 3 or input_flatten.shape[0] != batch or input_flatten.shape[-1] != self.d_model:
            raise ValueError(f"input_flatten: expected (N={batch}, Len_in, d_model={self.d_model}), "
                             f"got shape {tuple(input_flatten.shape)}")
        if isinstance(shapes, Tensor):  # traced or on a device: Len_in is not read here
            if shapes.dim() != 2 or tuple(shapes.shape) != (self.n_levels, 2):
                raise ValueError(f"input_spatial_shapes: expected an int tensor (n_levels, 2) = "
                                 f"({self.n_levels}, 2), got shape {tuple(shapes.shape)}")
        else:
            if len(shapes) != self.n_levels:
                raise ValueError(f"input_spatial_shapes: expected n_levels={self.n_levels} (H, W) "
                                 f"pairs, got {len(shapes)}")
            total = sum(h * w for h, w in shapes)
            if total != input_flatten.shape[1]:
                raise ValueError(f"input_flatten: expected Len_in = sum(H*W) = {total} from "
                                 f"input_spatial_shapes, got shape {tuple(input_flatten.shape)}")
        want = (batch, num_queries, self.n_levels)
        if (reference_points.dim() != 4 or tuple(reference_points.shape[:3]) != want
                or reference_points.shape[-1] not in (2, 4)):
            raise ValueError(f"reference_points: expected (N, Len_q, n_levels, 2 or 4) = "
                             f"{want + ('2|4',)}, got shape {tuple(reference_points.shape)}")
        if input_padding_mask is not None:
            if input_padding_mask.dtype != torch.bool:
                raise TypeError(f"input_padding_mask: expected a bool tensor, got dtype "
                                f"{input_padding_mask.dtype}")
            if tuple(input_padding_mask.shape) != tuple(input_flatten.shape[:2]):
                raise ValueError(f"input_padding_mask: expected shape (N, Len_in) = "
                                 f"{tuple(input_flatten.shape[:2])}, got {tuple(input_padding_mask.shape)}")


class MultiScaleDeformableAttention(nn.Module):
    """HF transformers' stateless MSDA layer (``...modeling_deformable_detr``), same forward.

    ``forward(value (B, L, N_h, C_h), value_spatial_shapes (N_l, 2) tensor,
    value_spatial_shapes_list [(H, W), ...] Python ints, level_start_index (N_l,),
    sampling_locations (B, N_q, N_h, N_l, N_p, 2), attention_weights (B, N_q, N_h, N_l, N_p),
    im2col_step)`` -> (B, N_q, N_h*C_h). Like HF's layer it has no ``__init__`` and no members
    besides the two the ``kernels`` hub layer rules allow: ``has_backward`` and
    ``can_torch_compile`` (both true). It is the layer :func:`nkilib_msda.register_hf_kernels`
    registers and :func:`~nkilib_msda.pytorch.hf.patch_transformers_model` swaps in; the latter
    may pin a backend per instance through the ``nkilib_msda_backend`` attribute.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, value: Tensor, value_spatial_shapes: Tensor,
                value_spatial_shapes_list: list[tuple], level_start_index: Tensor,
                sampling_locations: Tensor, attention_weights: Tensor, im2col_step: int) -> Tensor:
        shapes = value_spatial_shapes_list if value_spatial_shapes_list is not None else value_spatial_shapes
        # level_start_index is derived from the Python shapes: no host sync on the device tensor.
        return multi_scale_deformable_attention(
            value, shapes, None, sampling_locations, attention_weights,
            backend=getattr(self, "nkilib_msda_backend", None))
