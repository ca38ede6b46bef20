"""``multi_scale_deformable_attention_v2``: the function RT-DETRv2, D-FINE and DEIMv2 call.

Same arguments as transformers' function of that name: value (B, S, N_h, C_h), the levels'
(H, W), sampling locations (B, N_q, N_h, sum(P), 2) and attention weights (B, N_q, N_h, sum(P))
packed level after level for per-level point counts ``num_points_list`` = (P_0, ..., P_{L-1}),
and ``method``:

- ``"default"``: bilinear sampling (``grid_sample`` with ``align_corners=False`` and zero
  padding in the models): :func:`~nkilib_msda.pytorch.functional.multi_scale_deformable_attention`
  with ``num_points``, on the selected backend;
- ``"discrete"``: the models' nearest-pixel lookup, column ``int64(x * W + 0.5)`` and row
  ``int64(y * H + 0.5)`` computed in the locations' dtype, each clamped into the level. It is
  a gather with no bilinear kernel in any backend, so it runs as torch operations on the
  inputs' device (:func:`discrete_attention`); like the models' code it gives the locations no
  gradient.

Spatial shapes in a tensor while tracing reach the operator as a tensor with ``"default"``
(read when the graph runs); ``"discrete"`` needs their values while tracing, so there they
must be Python ints.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from nkilib_msda.pytorch._modes import values_unreadable
from nkilib_msda.pytorch.functional import multi_scale_deformable_attention
from nkilib_msda.pytorch.point_counts import check_num_points, check_packed_points, level_count
from nkilib_msda.pytorch.problem_cache import spatial_shapes_tuple
from nkilib_msda.validation.layouts import level_starts

__all__ = ["multi_scale_deformable_attention_v2", "discrete_attention", "METHODS"]

METHODS = ("default", "discrete")


def _check_value(value: Any, shapes: tuple[tuple[int, int], ...], sampling_locations: Tensor
                 ) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"value: expected a torch.Tensor, got {type(value).__name__}")
    batch, heads = sampling_locations.shape[0], sampling_locations.shape[2]
    length = sum(h * w for h, w in shapes)
    if value.dim() != 4 or tuple(value.shape[:3]) != (batch, length, heads):
        raise ValueError(f"value: expected (B={batch}, sum(H*W)={length}, N_h={heads}, C_h) from "
                         f"the spatial shapes and sampling_locations, got shape {tuple(value.shape)}")


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 2-byte floats (the weighted sum is accumulated in fp32), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def discrete_attention(value: Tensor, spatial_shapes: tuple[tuple[int, int], ...],
                       sampling_locations: Tensor, attention_weights: Tensor,
                       num_points: tuple[int, ...]) -> Tensor:
    """Nearest-pixel MSDA (the models' ``method="discrete"``) -> (B, N_q, N_h*C_h).

    value (B, S, N_h, C_h); sampling_locations (B, N_q, N_h, sum(P), 2), (x, y) in [0, 1];
    attention_weights (B, N_q, N_h, sum(P)); arguments already checked. Differentiable with
    respect to value and attention_weights.
    """
    batch, length, heads, channels = value.shape
    queries, total = sampling_locations.shape[1], sampling_locations.shape[3]
    rows = []
    point = 0
    for (height, width), start, count in zip(spatial_shapes, level_starts(spatial_shapes), num_points):
        level = sampling_locations.narrow(3, point, count)
        scale = torch.tensor([width, height], device=level.device)
        # The models' exact arithmetic: scale and shift in the locations' dtype, truncate to
        # int64, clamp each coordinate into the level.
        pixel = (level * scale + 0.5).to(torch.int64)
        col = pixel[..., 0].clamp(0, width - 1)
        row = pixel[..., 1].clamp(0, height - 1)
        rows.append(start + row * width + col)
        point += count
    index = torch.cat(rows, dim=-1).permute(0, 2, 1, 3).reshape(batch, heads, queries * total)
    acc = _accumulation_dtype(value.dtype)
    per_head = value.permute(0, 2, 1, 3).to(acc)                     # (B, N_h, S, C_h)
    sampled = torch.gather(per_head, 2, index[..., None].expand(batch, heads, queries * total,
                                                                 channels))
    sampled = sampled.view(batch, heads, queries, total, channels)
    weights = attention_weights.permute(0, 2, 1, 3).to(acc)[..., None]  # (B, N_h, N_q, sum(P), 1)
    out = (sampled * weights).sum(3)                                  # (B, N_h, N_q, C_h)
    return out.permute(0, 2, 1, 3).reshape(batch, queries, heads * channels).to(value.dtype)


def multi_scale_deformable_attention_v2(
    value: Tensor,
    value_spatial_shapes: Sequence[Sequence[int]] | Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    num_points_list: Sequence[int],
    method: str = "default",
    *,
    backend: str | None = None,
) -> Tensor:
    """transformers' ``multi_scale_deformable_attention_v2``, computed by nkilib_msda.

    Returns (B, N_q, N_h*C_h) in value's dtype. ``backend`` as for
    :func:`~nkilib_msda.pytorch.functional.multi_scale_deformable_attention` (used by
    ``method="default"``; ``"discrete"`` is torch operations on any backend's device).
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {list(METHODS)}, got {method!r}")
    if (method == "default" and isinstance(value_spatial_shapes, Tensor)
            and values_unreadable(value_spatial_shapes)):
        counts = check_num_points(num_points_list, level_count(value_spatial_shapes),
                                  "num_points_list")
        return multi_scale_deformable_attention(value, value_spatial_shapes, None,
                                                sampling_locations, attention_weights,
                                                backend=backend, num_points=counts)
    shapes = spatial_shapes_tuple(value_spatial_shapes)
    counts = check_num_points(num_points_list, len(shapes), "num_points_list")
    if method == "default":
        return multi_scale_deformable_attention(value, shapes, None, sampling_locations,
                                                attention_weights, backend=backend,
                                                num_points=counts)
    check_packed_points(sampling_locations, attention_weights, counts)
    _check_value(value, shapes, sampling_locations)
    if tuple(attention_weights.shape[:3]) != tuple(sampling_locations.shape[:3]):
        raise ValueError(f"attention_weights: expected (B, N_q, N_h) = "
                         f"{tuple(sampling_locations.shape[:3])} as sampling_locations, got shape "
                         f"{tuple(attention_weights.shape)}")
    return discrete_attention(value, shapes, sampling_locations, attention_weights, counts)
