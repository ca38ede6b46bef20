"""MSDA problem instances and random inputs (NumPy), shared by the CLI, tests and benchmarks.

Inputs follow the upstream nkilib test convention (docs/math.md, "Test inputs"): value ~ N(0, 1)
rounded to the value dtype; locations ~ U[0, 1) and weights ~ U[0.1, 1) normalised over
(N_l, N_p), both in ``param_dtype`` (float16 by default). References must run on these same
(rounded) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["MSDACase", "make_inputs", "make_grad_output", "numpy_dtype", "S4", "DEFAULT_CASE",
           "PRESETS", "PRESET_DESCRIPTIONS", "PRESET_EMULATOR_TIME"]

S4 = ((50, 45), (25, 21), (13, 9), (5, 7))
DDETR_LEVELS = ((100, 167), (50, 84), (25, 42), (13, 21))
BEV_SCA_LEVELS = ((113, 200), (57, 100), (29, 50), (15, 25))

_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32,
           "float64": np.float64}
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def numpy_dtype(name: str) -> Any:
    """'bfloat16' | 'float16' | 'float32' | 'float64' (or bf16/fp16/fp32/fp64) -> NumPy dtype."""
    key = _ALIASES.get(name, name)
    if key not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[key]


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

    @property
    def num_samples(self) -> int:
        return self.batch * self.num_queries * self.num_heads * self.num_levels * self.num_points

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


def make_grad_output(case: MSDACase, seed: int = 0) -> np.ndarray:
    """grad_output ~ N(0, 1) of shape (B, N_q, N_h*C_h) in the value dtype."""
    rng = np.random.default_rng(seed + 1000)
    shape = (case.batch, case.num_queries, case.num_heads * case.head_dim)
    return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(case.value_dtype))


def _preset(name: str, **kw) -> MSDACase:
    return MSDACase(name=name, **kw)


PRESETS: dict[str, MSDACase] = {c.name: c for c in (
    _preset("tiny", num_queries=130, num_heads=2, head_dim=8, num_points=2,
            spatial_shapes=((4, 5), (2, 3))),
    _preset("default", num_queries=512, num_points=4,
            spatial_shapes=((32, 48), (16, 24), (8, 12), (4, 6))),
    _preset("upstream", batch=2, num_queries=256),
    _preset("bevformer-fast", batch=2, num_queries=512, locations_layout="B2QHLP"),
    _preset("ddetr-decoder", batch=2, num_queries=300, num_points=4, spatial_shapes=DDETR_LEVELS),
    _preset("ddetr-encoder", batch=2, num_queries=22223, num_points=4, spatial_shapes=DDETR_LEVELS),
    _preset("bevformer-sca", num_queries=18000, spatial_shapes=BEV_SCA_LEVELS, value_layout="BNLC",
            locations_layout="B2QHLP"),
    _preset("bevformer-tsa", num_queries=40000, num_points=4, spatial_shapes=((200, 200),),
            locations_layout="B2QHLP"),
    _preset("bevformer-decoder", num_queries=900, num_points=4, spatial_shapes=((200, 200),),
            locations_layout="B2QHLP"),
)}

PRESET_DESCRIPTIONS = {
    "tiny": "smoke test: 130 queries, 2 tiny levels (the last query tile is partly filled)",
    "default": "Deformable-DETR-like encoder on a 128x192 image, 4 levels, 512 queries",
    "upstream": "the shape of AWS nki-library's MSDA tests (4 small levels, 8 points, B=2)",
    "bevformer-fast": "AWS nki-library's quick BEVFormer test shape (B=2, 512 queries)",
    "ddetr-decoder": "Deformable-DETR decoder, 800x1333 image, 300 queries, B=2",
    "ddetr-encoder": "Deformable-DETR encoder, 800x1333 image, 22,223 queries, B=2",
    "bevformer-sca": "BEVFormer-base spatial cross-attention, 18,000 queries, BNLC value",
    "bevformer-tsa": "BEVFormer-base temporal self-attention, 40,000 queries on 200x200",
    "bevformer-decoder": "BEVFormer-base decoder, 900 queries on 200x200",
}

# Rough wall time of `nkilib-msda check --preset NAME` (forward + backward, bf16, LNC 1,
# --no-report, one CPU core; process start included). Measured 2026-12-01 except ddetr-encoder
# and bevformer-sca, scaled from bevformer-tsa by the number of samples. For --help only.
PRESET_EMULATOR_TIME = {
    "tiny": "~2 s",
    "default": "~5 s",
    "upstream": "~5 s",
    "bevformer-fast": "~10 s",
    "ddetr-decoder": "~10 s",
    "ddetr-encoder": "~3 min",
    "bevformer-sca": "~3 min",
    "bevformer-tsa": "~45 s",
    "bevformer-decoder": "~5 s",
}
