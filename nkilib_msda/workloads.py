"""MSDA workloads: named shapes, input makers, the error metric and the tolerance table.

One home for the facts that tests, benchmarks, ``nkilib-msda check`` and ``nkilib-msda bench``
share:

- :data:`PRESETS`: named problem shapes (one naming scheme, ``ddetr-encoder``), with
  :data:`PRESET_DESCRIPTIONS`, :data:`PRESET_EMULATOR_TIME` and :data:`PRESET_EMULATOR_MEMORY`;
  :func:`resolve_preset` also accepts the older benchmark names (``ddetr_enc``, ``bev_tsa``, ...) listed in
  :data:`PRESET_ALIASES`.
- :func:`make_inputs` / :func:`make_grad_output` (NumPy) and :func:`make_torch_inputs` (torch,
  the same values): the upstream nkilib test convention (docs/math.md, "Test inputs"):
  value ~ N(0, 1) rounded to the value dtype; locations ~ U[0, 1) and weights ~ U[0.1, 1)
  normalised over (N_l, N_p), both in ``param_dtype`` (float16 by default). References must run
  on these same (rounded) arrays.
- :func:`compare`: THE error metric, max|out - ref| / max|ref| and ||out - ref|| / ||ref|| in
  float64 (a non-finite output counts as an infinite error); both must be within the tolerance.
- :data:`TOLERANCES`: one tolerance per (quantity, value dtype); see docs/kernels.md, "Tests";
  :data:`GPU_TOLERANCES`: the GPU checks' one tolerance per dtype.
- :data:`NKI_LIBRARY_SHAPES`: nki-library's MSDA test shapes by its names (the side-by-side
  benchmark's workloads).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from nkilib_msda.hardware import TWO_BYTE_FLOAT_DTYPES
from nkilib_msda.validation.arrays import as_float64
from nkilib_msda.validation.layouts import arrange, level_starts, permutation
from nkilib_msda.validation.msda import FLOAT_DTYPE_NAMES

__all__ = ["MSDACase", "make_inputs", "make_grad_output", "make_torch_inputs", "numpy_dtype",
           "S4", "DDETR_LEVELS", "BEV_SCA_LEVELS", "PRESETS", "PRESET_ALIASES",
           "PRESET_DESCRIPTIONS", "PRESET_EMULATOR_TIME", "PRESET_EMULATOR_MEMORY", "NKI_LIBRARY_SHAPES",
           "NKI_LIBRARY_SHAPE_DESCRIPTIONS", "GPU_TOLERANCES", "GPU_ACCUMULATED_BF16_TOLERANCE",
           "resolve_preset", "QUANTITIES", "TOLERANCES", "tolerance", "Comparison", "compare", "max_relative_error",
           "relative_l2"]

S4 = ((50, 45), (25, 21), (13, 9), (5, 7))
DDETR_LEVELS = ((100, 167), (50, 84), (25, 42), (13, 21))
BEV_SCA_LEVELS = ((113, 200), (57, 100), (29, 50), (15, 25))
M2F_LEVELS = ((128, 128), (64, 64), (32, 32))

_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def numpy_dtype(name: str) -> Any:
    """'bfloat16' | 'float16' | 'float32' | 'float64' (or bf16/fp16/fp32/fp64) -> NumPy dtype."""
    key = _DTYPE_ALIASES.get(name, name)
    if key not in FLOAT_DTYPE_NAMES:
        raise ValueError(f"dtype: expected one of {sorted(FLOAT_DTYPE_NAMES)}, got {name!r}")
    if key == "bfloat16":
        # Imported on first use: `nkilib-msda info` reads the preset table without it.
        import ml_dtypes

        return ml_dtypes.bfloat16
    return getattr(np, key)


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
        return level_starts(self.spatial_shapes)

    @property
    def total_pixels(self) -> int:
        return sum(h * w for h, w in self.spatial_shapes)

    @property
    def num_samples(self) -> int:
        return self.batch * self.num_queries * self.num_heads * self.num_levels * self.num_points

    @property
    def is_decoder(self) -> bool:
        """Few queries against many pixels (a DETR-style decoder)."""
        return self.num_queries < self.total_pixels // 4

    def label(self) -> str:
        return self.name or (
            f"B{self.batch}q{self.num_queries}h{self.num_heads}c{self.head_dim}"
            f"l{self.num_levels}p{self.num_points}-{self.value_layout}-{self.locations_layout}"
            f"-{'ac' if self.align_corners else 'nac'}-{self.padding_mode}-{self.value_dtype}")


def _float32_inputs(case: MSDACase, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, sampling_locations, attention_weights) in float32, before rounding."""
    rng = np.random.default_rng(seed)
    b, q, h = case.batch, case.num_queries, case.num_heads
    lvl, pts = case.num_levels, case.num_points
    sizes = {"B": b, "L": case.total_pixels, "N_h": h, "C_h": case.head_dim}
    value = rng.standard_normal(arrange(case.value_layout, sizes), dtype=np.float32)
    loc = rng.random((b, q, h, lvl, pts, 2), dtype=np.float32)
    if case.locations_layout != "BQHLP2":
        loc = np.ascontiguousarray(loc.transpose(permutation("BQHLP2", case.locations_layout)))
    attn = rng.uniform(0.1, 1.0, (b, q, h, lvl, pts)).astype(np.float32)
    attn /= attn.sum(axis=(3, 4), keepdims=True)
    return value, loc, attn


def _keywords(case: MSDACase) -> dict[str, Any]:
    return dict(spatial_shapes=tuple(case.spatial_shapes), level_start_index=case.level_start_index,
                value_layout=case.value_layout, sampling_locations_layout=case.locations_layout,
                align_corners=case.align_corners, padding_mode=case.padding_mode)


def make_inputs(case: MSDACase, seed: int = 0) -> dict[str, Any]:
    """Kernel/reference arguments for ``case``: value, spatial_shapes, level_start_index,
    sampling_locations, attention_weights and the layout / padding keywords (NumPy)."""
    value, loc, attn = _float32_inputs(case, seed)
    pdt = numpy_dtype(case.param_dtype)
    return dict(value=value.astype(numpy_dtype(case.value_dtype)), sampling_locations=loc.astype(pdt),
                attention_weights=attn.astype(pdt), **_keywords(case))


def make_grad_output(case: MSDACase, seed: int = 0) -> np.ndarray:
    """grad_output ~ N(0, 1) of shape (B, N_q, N_h*C_h) in the value dtype."""
    rng = np.random.default_rng(seed + 1000)
    shape = (case.batch, case.num_queries, case.num_heads * case.head_dim)
    return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(case.value_dtype))


def make_torch_inputs(case: MSDACase, seed: int = 0, device: Any = "cpu") -> dict[str, Any]:
    """:func:`make_inputs` as torch tensors on ``device`` (the same rounded values), plus
    ``grad_output`` (:func:`make_grad_output`)."""
    import torch

    def tensor(a: np.ndarray, dtype_name: str) -> Any:
        return torch.from_numpy(a).to(device=device, dtype=getattr(torch, dtype_name))

    value, loc, attn = _float32_inputs(case, seed)
    grad = make_grad_output(case, seed).astype(np.float32)
    return dict(value=tensor(value, case.value_dtype),
                sampling_locations=tensor(loc, case.param_dtype),
                attention_weights=tensor(attn, case.param_dtype),
                grad_output=tensor(grad, case.value_dtype), **_keywords(case))


def _preset(name: str, **kw: Any) -> MSDACase:
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
    _preset("mask2former-encoder", batch=2, num_queries=21504, num_points=4,
            spatial_shapes=M2F_LEVELS),
)}

# Older names (the GPU benchmark's) that the CLI and the benchmarks still accept.
PRESET_ALIASES = {
    "ddetr_enc": "ddetr-encoder", "ddetr_dec": "ddetr-decoder", "bev_sca": "bevformer-sca",
    "bev_tsa": "bevformer-tsa", "bev_dec": "bevformer-decoder", "m2f": "mask2former-encoder",
}

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
    "mask2former-encoder": "Mask2Former pixel decoder (3 levels 128², 64², 32²), 21,504 queries, B=2",
}

# Rough wall time and peak memory (peak RSS of the process) of `nkilib-msda check --preset NAME`
# (forward + backward, bf16, LNC 1, --no-report, one CPU core; process start included). Times
# measured 2026-12-01 on a laptop core, except bevformer-sca and mask2former-encoder; those and
# every peak RSS measured 2026-12-01 on a 16-core x86 server running the 10 presets at once
# (one process each; ddetr-encoder took 171 s there, bevformer-tsa 41 s, in line with the
# laptop). `--lnc 2` needs 1.3x (ddetr-decoder) to 1.5x (bevformer-tsa) the memory: see
# docs/emulator.md, "Memory at LNC 2".
# For --help only.
PRESET_EMULATOR_TIME = {
    "tiny": "~2 s",
    "default": "~5 s",
    "upstream": "~5 s",
    "bevformer-fast": "~10 s",
    "ddetr-decoder": "~10 s",
    "ddetr-encoder": "~3 min",
    "bevformer-sca": "~2 min",
    "bevformer-tsa": "~45 s",
    "bevformer-decoder": "~5 s",
    "mask2former-encoder": "~2 min",
}
PRESET_EMULATOR_MEMORY = {
    "tiny": "70 MB",
    "default": "160 MB",
    "upstream": "170 MB",
    "bevformer-fast": "180 MB",
    "ddetr-decoder": "480 MB",
    "ddetr-encoder": "1.1 GB",
    "bevformer-sca": "0.8 GB",
    "bevformer-tsa": "1.6 GB",
    "bevformer-decoder": "460 MB",
    "mask2former-encoder": "1.1 GB",
}


# nki-library's MSDA test shapes (its test_ms_deformable_attention.py and ..._bwd.py list the
# same ones): bf16 value, float16 locations / weights, as those tests draw them. The side-by-side
# benchmark (benchmarks/msda_side_by_side.py) runs them; a shape that is also a preset is that
# preset under nki-library's name.
NKI_LIBRARY_SHAPES: dict[str, MSDACase] = {name: replace(case, name=name) for name, case in (
    ("basic", replace(PRESETS["upstream"], locations_layout="B2QHLP")),
    ("sca-base", PRESETS["bevformer-sca"]),
    ("tsa-base", PRESETS["bevformer-tsa"]),
    ("decoder-base", PRESETS["bevformer-decoder"]),
    ("sca-small", MSDACase(num_queries=13500, spatial_shapes=((113, 200),), locations_layout="B2QHLP")),
    ("tsa-small", MSDACase(num_queries=22500, num_points=4, spatial_shapes=((150, 150),),
                           locations_layout="B2QHLP")),
    ("decoder-small", MSDACase(num_queries=900, num_points=4, spatial_shapes=((150, 150),),
                               locations_layout="B2QHLP")),
)}
NKI_LIBRARY_SHAPE_DESCRIPTIONS = {
    "basic": "nki-library's first basic test: B=2, 4 small levels, N_p=8",
    "sca-base": "BEVFormer-base spatial cross-attention, N_q=18,000, BNLC",
    "tsa-base": "BEVFormer-base temporal self-attention, N_q=40,000 on 200x200",
    "decoder-base": "BEVFormer-base decoder, N_q=900 on 200x200",
    "sca-small": "BEVFormer-small spatial cross-attention, N_q=13,500, 1 level 113x200, N_p=8",
    "tsa-small": "BEVFormer-small temporal self-attention, N_q=22,500 on 150x150",
    "decoder-small": "BEVFormer-small decoder, N_q=900 on 150x150",
}


def resolve_preset(name: str) -> str:
    """The canonical preset name for ``name`` (a preset or an alias); ValueError otherwise."""
    canonical = PRESET_ALIASES.get(name, name)
    if canonical not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)} (or an older name "
                         f"{sorted(PRESET_ALIASES)}), got {name!r}")
    return canonical


# ------------------------------------------------------------------ tolerances and the metric

QUANTITIES = ("output", "grad_value", "grad_sampling_locations", "grad_attention_weights")

# One tolerance per (quantity, value dtype), applied to both numbers of :func:`compare`.
# 2-byte value dtypes: 1e-2 for every quantity, 2.5x bf16's rounding unit (2^-8 = 3.9e-3), which
# any quantity stored in the value dtype incurs once. fp32: 1e-5 for the output, 1e-4 for the
# gradients (summed in another order than the float64 reference). Measured on the NKI kernels
# in the emulator (presets tiny, upstream, default, ddetr-decoder, bevformer-decoder and
# bevformer-fast, 1 to 4 seeds; max over runs of max|err|/max|ref|): bf16 output 3.0e-3,
# grad_value 3.3e-3, grad_sampling_locations 1.2e-7 (computed and stored in fp32),
# grad_attention_weights 3.3e-3; fp16 at most 4.1e-4; fp32 at most 2.0e-7. Relative L2 is
# at most 1.8e-3 (bf16) in the same runs. See docs/kernels.md, "Tolerances".
TOLERANCES: dict[tuple[str, str], float] = {
    **{(q, dt): 1e-2 for q in QUANTITIES for dt in TWO_BYTE_FLOAT_DTYPES},
    ("output", "float32"): 1e-5,
    **{(q, "float32"): 1e-4 for q in QUANTITIES[1:]},
}


def tolerance(quantity: str, value_dtype: str) -> float:
    """The tolerance of ``quantity`` (one of :data:`QUANTITIES`) for a ``value_dtype`` run."""
    key = (quantity, _DTYPE_ALIASES.get(value_dtype, value_dtype))
    if key not in TOLERANCES:
        raise ValueError(f"tolerance: no entry for quantity {quantity!r} with value dtype "
                         f"{value_dtype!r}; quantities {list(QUANTITIES)}, dtypes bfloat16, "
                         f"float16, float32")
    return TOLERANCES[key]


# The GPU (Triton) checks' tolerances, one per run dtype: relative L2 of the output and of every
# gradient against the float64 reference on the same rounded inputs (benchmarks/check_gpu.py and
# the Triton interpreter tests).
GPU_TOLERANCES: dict[str, float] = {"float32": 1e-5, **{dt: 1e-2 for dt in TWO_BYTE_FLOAT_DTYPES}}
# A bf16 result accumulated in fp32 (the forward output, grad_value) on a large shape: rel. L2.
GPU_ACCUMULATED_BF16_TOLERANCE = 2e-3


def max_relative_error(out: Any, ref: Any) -> float:
    """max|out - ref| / max|ref| in float64; inf when ``out`` has a non-finite value."""
    return compare("", out, ref, 0.0).max_rel


def relative_l2(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; inf when ``out`` has a non-finite value."""
    return compare("", out, ref, 0.0).rel_l2


@dataclass(frozen=True)
class Comparison:
    """Error of one output against the reference."""

    name: str
    max_rel: float  # max|out - ref| / max|ref|
    rel_l2: float  # ||out - ref|| / ||ref||
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(self.max_rel <= self.tolerance and self.rel_l2 <= self.tolerance)

    def row(self) -> str:
        status = "ok" if self.ok else "FAIL"
        return f"| {self.name} | {self.max_rel:.3e} | {self.rel_l2:.3e} | {self.tolerance:.1e} | {status} |"


def compare(name: str, out: Any, ref: Any, tolerance: float) -> Comparison:
    """Errors of ``out`` against ``ref`` in float64 (NaN or inf in ``out`` counts as a failure)."""
    out64, ref64 = as_float64(out), as_float64(ref)
    if out64.shape != ref64.shape:
        raise ValueError(f"{name}: output shape {out64.shape} != reference shape {ref64.shape}")
    if not np.all(np.isfinite(out64)):
        return Comparison(name, float("inf"), float("inf"), tolerance)
    diff = np.abs(out64 - ref64)
    scale = max(float(np.max(np.abs(ref64), initial=0.0)), 1e-30)
    norm = max(float(np.linalg.norm(ref64)), 1e-30)
    return Comparison(name, float(np.max(diff, initial=0.0)) / scale,
                      float(np.linalg.norm(diff)) / norm, tolerance)
