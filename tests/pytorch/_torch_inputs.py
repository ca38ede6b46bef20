"""Random MSDA inputs for the torch-layer tests (fresh, never all zeros)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MSDAInputs:
    value: torch.Tensor
    spatial_shapes: tuple[tuple[int, int], ...]
    sampling_locations: torch.Tensor
    attention_weights: torch.Tensor
    grad_output: torch.Tensor
    value_layout: str = "BLNC"
    sampling_locations_layout: str = "BQHLP2"

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.value, self.sampling_locations, self.attention_weights

    def requires_grad_(self) -> "MSDAInputs":
        for t in self.tensors():
            t.requires_grad_(True)
        return self


def make_inputs(batch: int = 2, queries: int = 5, heads: int = 2, channels: int = 4, points: int = 2,
                spatial_shapes: tuple[tuple[int, int], ...] = ((4, 6), (3, 2), (1, 1)),
                value_layout: str = "BLNC", sampling_locations_layout: str = "BQHLP2",
                dtype: torch.dtype = torch.float64, loc_dtype: torch.dtype | None = None,
                low: float = -0.15, high: float = 1.15, seed: int = 0) -> MSDAInputs:
    """Locations uniform in [low, high] (some outside the map), softmax-free positive weights."""
    g = torch.Generator().manual_seed(seed)
    levels = len(spatial_shapes)
    length = sum(h * w for h, w in spatial_shapes)
    value = torch.randn(batch, length, heads, channels, generator=g, dtype=torch.float64)
    if value_layout == "BNLC":
        value = value.permute(0, 2, 1, 3)
    loc = low + (high - low) * torch.rand(batch, queries, heads, levels, points, 2, generator=g,
                                          dtype=torch.float64)
    if sampling_locations_layout == "B2QHLP":
        loc = loc.permute(0, 5, 1, 2, 3, 4)
    attn = torch.rand(batch, queries, heads, levels, points, generator=g, dtype=torch.float64) + 0.1
    grad = torch.randn(batch, queries, heads * channels, generator=g, dtype=torch.float64)
    return MSDAInputs(
        value=value.contiguous().to(dtype), spatial_shapes=spatial_shapes,
        sampling_locations=loc.contiguous().to(loc_dtype or dtype),
        attention_weights=attn.to(dtype), grad_output=grad.to(dtype),
        value_layout=value_layout, sampling_locations_layout=sampling_locations_layout)
