"""Per-axis bilinear coordinates shared by the torch reference paths (docs/math.md conventions).

``axis`` turns one normalized coordinate into clamped corner indices, in-map flags, the
fraction and d(pixel)/d(normalized) for the three padding modes and both ``align_corners``
conventions; ``level_tables`` holds the per-level sizes and start offsets as (N_l, 1) columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["Axis", "axis", "reflect", "LevelTables", "level_tables"]


@dataclass(frozen=True)
class Axis:
    """Bilinear data along one axis; tensors shaped like the samples (B, N_q, N_h, N_l, N_p).

    ``index0/index1`` are corner indices clamped into the map; ``valid0/valid1`` whether the
    unclamped corner lies inside it (and the sample is usable); ``frac`` = p - floor(p);
    ``deriv`` = d p / d u (0 where clipped or unusable, negative where reflected).
    """

    index0: torch.Tensor
    index1: torch.Tensor
    valid0: torch.Tensor
    valid1: torch.Tensor
    frac: torch.Tensor
    deriv: torch.Tensor


def reflect(px: torch.Tensor, size: torch.Tensor, align_corners: bool
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror about 0 and size-1 (align_corners) or -0.5 and size-0.5; returns (coord, +-1)."""
    low = torch.zeros_like(size) if align_corners else torch.full_like(size, -0.5)
    span = (size - 1.0) if align_corners else size
    safe_span = torch.where(span > 0, span, torch.ones_like(span))
    offset = px - low
    sign = torch.where(offset < 0, -1.0, 1.0).to(px.dtype)
    folded = torch.fmod(offset.abs(), 2.0 * safe_span)
    mirrored = folded >= safe_span
    reflected = torch.where(mirrored, 2.0 * safe_span - folded, folded) + low
    sign = torch.where(mirrored, -sign, sign)
    degenerate = span <= 0  # a single pixel with align_corners: everything maps to 0
    return (torch.where(degenerate, torch.zeros_like(px), reflected),
            torch.where(degenerate, torch.zeros_like(sign), sign))


def axis(u: torch.Tensor, size: torch.Tensor, align_corners: bool, padding_mode: str,
         index_dtype: torch.dtype = torch.int64) -> Axis:
    """Corners, fractions and derivative of one normalized coordinate; ``size`` per level (N_l, 1).
    Indices in ``index_dtype`` (int32 is exact: they lie in [-2, size + 2])."""
    scale = (size - 1.0) if align_corners else size
    if align_corners:
        px = torch.where(scale == 0, 0.0, u * scale)  # 1-pixel axis: scale 0 (and inf * 0)
    else:
        px = u * scale - 0.5
    if padding_mode == "reflection":
        usable = torch.isfinite(u) & torch.isfinite(px)
    else:
        usable = u == u  # not NaN
    px = torch.where(usable, px, 0.0)
    deriv = torch.where(usable, scale, 0.0)
    if padding_mode == "zeros":
        # Beyond [-2, size+1] both corners are outside anyway; this only bounds the indices.
        px = torch.minimum(px.clamp_min(-2.0), size + 1.0)
    else:
        if padding_mode == "reflection":
            px, sign = reflect(px, size, align_corners)
            deriv = deriv * sign
        inside = (px > 0) & (px < size - 1.0)
        px = torch.minimum(px.clamp_min(0.0), size - 1.0)
        deriv = deriv * inside
    lower = torch.floor(px)
    index0 = lower.to(index_dtype)
    index1 = index0 + 1
    last = size.to(index_dtype) - 1
    clamped0 = torch.minimum(index0.clamp_min(0), last)
    clamped1 = torch.minimum(index1.clamp_min(0), last)
    return Axis(index0=clamped0, index1=clamped1,
                valid0=usable & (clamped0 == index0), valid1=usable & (clamped1 == index1),
                frac=px - lower, deriv=deriv)


@dataclass(frozen=True)
class LevelTables:
    """Per-level (N_l, 1) columns: heights and widths in the compute dtype, int64 starts."""

    heights: torch.Tensor
    widths: torch.Tensor
    starts: torch.Tensor


def level_tables(problem: MSDAProblem, dtype: torch.dtype, device: torch.device) -> LevelTables:
    """Built once per call from one host-to-device copy (not three per query chunk)."""
    p = problem
    table = torch.tensor([[h for h, _ in p.spatial_shapes], [w for _, w in p.spatial_shapes],
                          list(p.level_start_index)], dtype=torch.int64, device=device)
    sizes = table[:2].to(dtype)  # exact: map sizes are far below 2**24
    return LevelTables(heights=sizes[0][:, None], widths=sizes[1][:, None],
                        starts=table[2][:, None])
