"""Shape presets and random MSDA inputs (NumPy), shared by the CLI, benchmarks and tests.

Inputs follow the upstream nkilib test convention (msda-design.md, part D): value ~ N(0, 1)
rounded to the value dtype, locations ~ U[0, 1), weights ~ U[0.1, 1) normalised over
(N_l, N_p); locations and weights in their own dtype (float16 upstream).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from nkilib_msda.validation import MSDAProblem

S4 = ((50, 45), (25, 21), (13, 9), (5, 7))
DDETR_LEVELS = ((100, 167), (50, 84), (25, 42), (13, 21))
BEV_SCA_LEVELS = ((113, 200), (57, 100), (29, 50), (15, 25))

NUMPY_DTYPES = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype for 'bf16'/'bfloat16'/'fp16'/'float16'/'fp32'/'float32'/..."""
    key = DTYPE_ALIASES.get(name, name)
    if key not in NUMPY_DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(NUMPY_DTYPES) + sorted(DTYPE_ALIASES)}, got {name!r}")
    return NUMPY_DTYPES[key]


@dataclass(frozen=True)
class ShapePreset:
    """A named MSDA problem size."""

    name: str
    batch: int
    num_queries: int
    num_heads: int
    head_dim: int
    num_points: int
    spatial_shapes: tuple[tuple[int, int], ...]
    description: str = ""
    value_layout: str = "BLNC"
    sampling_locations_layout: str = "BQHLP2"

    @property
    def num_levels(self) -> int:
        return len(self.spatial_shapes)


PRESETS: dict[str, ShapePreset] = {p.name: p for p in (
    ShapePreset("tiny", 1, 130, 2, 8, 2, ((4, 5), (2, 3)), "tiny smoke test (ragged last query tile)"),
    ShapePreset("default", 1, 512, 8, 32, 4, ((32, 48), (16, 24), (8, 12), (4, 6)),
                "Deformable-DETR-like encoder, 4 levels of a 128x192 image (laptop-sized)"),
    ShapePreset("upstream", 2, 256, 8, 32, 8, S4, "nkilib test default (S4 levels, 8 points)"),
    ShapePreset("bevformer-fast", 2, 512, 8, 32, 8, S4, "nkilib BEVFormer fast case",
                sampling_locations_layout="B2QHLP"),
    ShapePreset("ddetr-decoder", 2, 300, 8, 32, 4, DDETR_LEVELS, "Deformable-DETR decoder (800x1333)"),
    ShapePreset("ddetr-encoder", 2, 22223, 8, 32, 4, DDETR_LEVELS, "Deformable-DETR encoder (800x1333)"),
    ShapePreset("bevformer-sca", 1, 18000, 8, 32, 8, BEV_SCA_LEVELS, "BEVFormer-base spatial cross-attention",
                value_layout="BNLC", sampling_locations_layout="B2QHLP"),
    ShapePreset("bevformer-tsa", 1, 40000, 8, 32, 4, ((200, 200),), "BEVFormer-base temporal self-attention",
                sampling_locations_layout="B2QHLP"),
    ShapePreset("bevformer-decoder", 1, 900, 8, 32, 4, ((200, 200),), "BEVFormer-base decoder",
                sampling_locations_layout="B2QHLP"),
)}


@dataclass
class MSDAInputs:
    """Arrays for one MSDA call plus the static arguments, ready for ``kernel(*inputs.args())``."""

    problem: MSDAProblem
    value: np.ndarray
    sampling_locations: np.ndarray
    attention_weights: np.ndarray
    grad_output: np.ndarray | None = field(default=None)

    def args(self) -> tuple:
        """Positional arguments of the forward kernel / reference."""
        p = self.problem
        return (self.value, p.spatial_shapes, p.level_start_index, self.sampling_locations,
                self.attention_weights)

    def kwargs(self) -> dict:
        p = self.problem
        return dict(value_layout=p.value_layout, sampling_locations_layout=p.sampling_locations_layout,
                    align_corners=p.align_corners, padding_mode=p.padding_mode)


def make_problem(batch: int, num_queries: int, num_heads: int, head_dim: int, num_points: int,
                 spatial_shapes, value_layout: str = "BLNC", sampling_locations_layout: str = "BQHLP2",
                 align_corners: bool = False, padding_mode: str = "zeros") -> MSDAProblem:
    """An :class:`MSDAProblem` from plain sizes (level starts derived)."""
    shapes = tuple((int(h), int(w)) for h, w in spatial_shapes)
    starts, acc = [], 0
    for h, w in shapes:
        starts.append(acc)
        acc += h * w
    return MSDAProblem(batch, num_queries, num_heads, head_dim, len(shapes), num_points, shapes,
                       tuple(starts), value_layout, sampling_locations_layout, bool(align_corners),
                       padding_mode)


def make_inputs(problem: MSDAProblem, value_dtype="bfloat16", param_dtype="float16", seed: int = 0,
                with_grad_output: bool = False, location_range: tuple[float, float] = (0.0, 1.0)
                ) -> MSDAInputs:
    """Random inputs for ``problem`` (value in ``value_dtype``; locations/weights in ``param_dtype``)."""
    rng = np.random.default_rng(seed)
    vdt, pdt = numpy_dtype(value_dtype), numpy_dtype(param_dtype)
    value = rng.standard_normal(problem.value_shape, dtype=np.float32).astype(vdt)
    qhlp = (problem.batch, problem.num_queries, problem.num_heads, problem.num_levels, problem.num_points)
    lo, hi = location_range
    loc = rng.uniform(lo, hi, size=(*qhlp, 2)).astype(np.float32)
    if problem.sampling_locations_layout == "B2QHLP":
        loc = np.ascontiguousarray(np.moveaxis(loc, -1, 1))
    weights = rng.uniform(0.1, 1.0, size=qhlp).astype(np.float32)
    weights /= weights.sum(axis=(3, 4), keepdims=True)
    grad = None
    if with_grad_output:
        grad = rng.standard_normal(problem.output_shape, dtype=np.float32).astype(vdt)
    return MSDAInputs(problem, value, loc.astype(pdt), weights.astype(pdt), grad)
