"""Random MSDA inputs as in msda-design.md D (shared by simulator tests, the cost report and
``nkilib-msda check``).

value ~ N(0, 1) cast to the value dtype; sampling locations ~ U[0, 1); attention weights
~ U[0.1, 1) normalised over (N_l, N_p); locations and weights in ``param_dtype`` (float16 by
default). The reference must be run on these same (rounded) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["MSDACase", "make_inputs", "numpy_dtype", "S4", "DEFAULT_CASE"]

S4 = ((50, 45), (25, 21), (13, 9), (5, 7))


def numpy_dtype(name: str) -> Any:
    """'bfloat16' | 'float16' | 'float32' -> NumPy dtype."""
    return {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
            "float32": np.float32}[name]


@dataclass(frozen=True)
class MSDACase:
    """One MSDA problem instance (shapes, layouts, dtypes)."""

    batch: int = 1
    num_queries: int = 256
    num_heads: int = 8
    head_dim: int = 32
    num_points: int = 8
    spatial_shapes: tuple = S4
    value_layout: str = "BLNC"
    locations_layout: str = "BQHLP2"
    align_corners: bool = False
    padding_mode: str = "zeros"
    value_dtype: str = "bfloat16"
    param_dtype: str = "float16"
    name: str = field(default="", compare=False)

    @property
    def num_levels(self) -> int:
        return len(self.spatial_shapes)

    @property
    def level_start_index(self) -> tuple:
        starts, acc = [], 0
        for h, w in self.spatial_shapes:
            starts.append(acc)
            acc += h * w
        return tuple(starts)

    @property
    def total_pixels(self) -> int:
        return sum(h * w for h, w in self.spatial_shapes)

    def label(self) -> str:
        return self.name or (
            f"B{self.batch}q{self.num_queries}h{self.num_heads}c{self.head_dim}"
            f"l{self.num_levels}p{self.num_points}-{self.value_layout}-{self.locations_layout}"
            f"-{'ac' if self.align_corners else 'nac'}-{self.padding_mode}-{self.value_dtype}")


DEFAULT_CASE = MSDACase()


def make_inputs(case: MSDACase, seed: int = 0) -> dict[str, Any]:
    """Kernel/reference arguments for ``case``: value, spatial_shapes, level_start_index,
    sampling_locations, attention_weights and the layout / padding keywords."""
    rng = np.random.default_rng(seed)
    b, q, h, c = case.batch, case.num_queries, case.num_heads, case.head_dim
    lvl, pts = case.num_levels, case.num_points
    if case.value_layout == "BLNC":
        vshape = (b, case.total_pixels, h, c)
    else:
        vshape = (b, h, case.total_pixels, c)
    value = rng.standard_normal(vshape, dtype=np.float32).astype(numpy_dtype(case.value_dtype))
    loc = rng.random((b, q, h, lvl, pts, 2), dtype=np.float32)
    if case.locations_layout == "B2QHLP":
        loc = np.ascontiguousarray(np.moveaxis(loc, -1, 1))
    attn = rng.uniform(0.1, 1.0, (b, q, h, lvl, pts)).astype(np.float32)
    attn /= attn.sum(axis=(3, 4), keepdims=True)
    pdt = numpy_dtype(case.param_dtype)
    return dict(value=value, spatial_shapes=tuple(case.spatial_shapes),
                level_start_index=case.level_start_index,
                sampling_locations=loc.astype(pdt), attention_weights=attn.astype(pdt),
                value_layout=case.value_layout, sampling_locations_layout=case.locations_layout,
                align_corners=case.align_corners, padding_mode=case.padding_mode)
