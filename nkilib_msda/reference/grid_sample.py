"""The pure-PyTorch ``grid_sample`` formulation of MSDA (Deformable-DETR / HF fallback).

Used by the GPU benchmark as the "ref" baseline (in the run dtype) and, in float64, as the
accuracy oracle for large shapes (the NumPy reference is too slow there). Differentiable by
autograd. Layouts are converted to BLNC / BQHLP2 first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nkilib_msda.validation.layouts import permutation


def to_blnc(value: torch.Tensor, layout: str) -> torch.Tensor:
    """(B, L, N_h, C_h) view/copy of value in ``layout``."""
    return value.permute(*permutation(layout, "BLNC"))


def to_bqhlp2(locations: torch.Tensor, layout: str) -> torch.Tensor:
    """(B, N_q, N_h, N_l, N_p, 2) view of locations in ``layout``."""
    return locations.permute(*permutation(layout, "BQHLP2"))


def msda_grid_sample(value: torch.Tensor, spatial_shapes, sampling_locations: torch.Tensor,
                     attention_weights: torch.Tensor, *, value_layout: str = "BLNC",
                     sampling_locations_layout: str = "BQHLP2", align_corners: bool = False,
                     padding_mode: str = "zeros") -> torch.Tensor:
    """MSDA forward by one ``grid_sample`` per level; returns (B, N_q, N_h*C_h) in value's dtype."""
    value = to_blnc(value, value_layout)
    locations = to_bqhlp2(sampling_locations, sampling_locations_layout)
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = locations.shape
    sizes = [int(h) * int(w) for h, w in spatial_shapes]
    per_level = value.split(sizes, dim=1)
    grids = 2 * locations - 1
    sampled = []
    for level, (h, w) in enumerate(spatial_shapes):
        v = per_level[level].flatten(2).transpose(1, 2).reshape(batch * heads, channels, int(h), int(w))
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)  # (B*N_h, N_q, N_p, 2)
        sampled.append(F.grid_sample(v, grid, mode="bilinear", padding_mode=padding_mode,
                                     align_corners=align_corners))  # (B*N_h, C_h, N_q, N_p)
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(batch, heads * channels, queries).transpose(1, 2).contiguous()


def msda_grid_sample_with_grads(value, spatial_shapes, sampling_locations, attention_weights,
                                grad_output, **options):
    """(out, grad_value, grad_sampling_locations, grad_attention_weights) by autograd."""
    leaves = [t.detach().requires_grad_(True) for t in (value, sampling_locations, attention_weights)]
    with torch.enable_grad():
        out = msda_grid_sample(leaves[0], spatial_shapes, leaves[1], leaves[2], **options)
        grads = torch.autograd.grad(out, leaves, grad_output)
    return (out.detach(), *grads)


def relative_l2(result: torch.Tensor, reference: torch.Tensor) -> float:
    """||result - reference|| / ||reference|| in float64 (inf if result has NaN)."""
    diff = (result.double() - reference.double()).norm().item()
    scale = reference.double().norm().item()
    return diff / scale if scale > 0 else diff
