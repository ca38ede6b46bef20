"""Shared MSDA emulator-test cases and checks (forward and backward kernels).

Inputs follow the upstream test matrix (docs/kernels.md, "Tests"; see ``nkilib_msda.workloads``):
value ~ N(0,1) in the value dtype, locations ~ U[0,1), weights ~ U[0.1,1) normalised over
(N_l, N_p), fp16 by default. References always run on the same rounded arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nkilib_msda.workloads import (  # noqa: F401
    PRESETS, S4, MSDACase, compare, make_inputs, numpy_dtype)
from nkilib_msda.validation.msda import MSDAProblem, normalize_level_start_index
from nkilib_msda.workloads import tolerance as _tolerance

__all__ = ["S4", "MSDACase", "make_inputs", "numpy_dtype", "BASIC_CASES", "BEVFORMER_FAST",
           "BEVFORMER_SLOW", "MATRIX_CASES", "tolerance", "assert_close", "case",
           "msda_problem"]


def case(name: str, **kw) -> MSDACase:
    return MSDACase(name=name, **kw)


# Upstream test matrix (docs/kernels.md, "Tests"); blank cells take the defaults B=1, N_q=256,
# BQHLP2, align_corners=False, zeros.
BASIC_CASES = (
    case("1-B2-BLNC-B2QHLP", batch=2, value_layout="BLNC", locations_layout="B2QHLP"),
    case("2-B2-BLNC-BQHLP2", batch=2, value_layout="BLNC", locations_layout="BQHLP2"),
    case("3-BNLC-B2QHLP", value_layout="BNLC", locations_layout="B2QHLP"),
    case("4-BNLC-BQHLP2", value_layout="BNLC", locations_layout="BQHLP2"),
    case("5-border-B2QHLP", locations_layout="B2QHLP", padding_mode="border"),
    case("6-q512-border", num_queries=512, padding_mode="border"),
    case("7-ac-zeros-B2QHLP", locations_layout="B2QHLP", align_corners=True),
    case("8-ac-zeros-BQHLP2", align_corners=True),
    case("9-ac-border-B2QHLP", locations_layout="B2QHLP", align_corners=True,
         padding_mode="border"),
    case("10-ac-border-BQHLP2", align_corners=True, padding_mode="border"),
    case("11-h4-c256-p4", num_heads=4, head_dim=256, num_points=4, locations_layout="B2QHLP"),
    case("12-h4-c144-p4-BNLC", num_heads=4, head_dim=144, num_points=4, value_layout="BNLC"),
    case("13-q263", num_queries=263),
    case("14-q501-BNLC-B2QHLP", num_queries=501, value_layout="BNLC", locations_layout="B2QHLP"),
)

BEVFORMER_FAST = PRESETS["bevformer-fast"]

BEVFORMER_SLOW = (
    PRESETS["bevformer-sca"],
    PRESETS["bevformer-tsa"],
    PRESETS["bevformer-decoder"],
    case("bev-small-sca", num_queries=13500, spatial_shapes=((113, 200),),
         locations_layout="B2QHLP"),
    case("bev-small-tsa", num_queries=22500, num_points=4, spatial_shapes=((150, 150),),
         locations_layout="B2QHLP"),
    case("bev-small-decoder", num_queries=900, num_points=4, spatial_shapes=((150, 150),),
         locations_layout="B2QHLP"),
)

# What both kernels' matrix tests run at lnc=2: the upstream cases, the fast BEVFormer case and,
# marked slow, the BEVFormer model sizes.
MATRIX_CASES = tuple(
    [pytest.param(c, id=c.name) for c in (*BASIC_CASES, BEVFORMER_FAST)]
    + [pytest.param(c, id=c.name, marks=pytest.mark.slow) for c in BEVFORMER_SLOW])


def tolerance(value_dtype: str) -> float:
    """The forward output's tolerance (nkilib_msda.workloads.TOLERANCES): 1e-2 for 2-byte
    values, 1e-5 for fp32."""
    return _tolerance("output", value_dtype)


def assert_close(out: np.ndarray, ref: np.ndarray, value_dtype: str, what: str = "output") -> None:
    """max|out - ref| <= tol * max|ref| and ||out - ref|| / ||ref|| <= tol (compared in fp64;
    the same metric `nkilib-msda check` reports)."""
    result = compare(what, out, ref, tolerance(value_dtype))
    assert result.ok, (f"{what}: max|out - ref|/max|ref| = {result.max_rel:.3g}, relative L2 = "
                       f"{result.rel_l2:.3g}, tolerance {result.tolerance:g} (non-finite counts as inf)")


def with_(c: MSDACase, **kw) -> MSDACase:
    """A copy of case ``c`` with fields replaced."""
    return dataclasses.replace(c, **kw)


def msda_problem(batch: int = 1, queries: int = 256, heads: int = 8, head_dim: int = 32,
                 points: int = 8, levels: tuple = S4, value_layout: str = "BLNC",
                 loc_layout: str = "BQHLP2", align_corners: bool = False,
                 padding_mode: str = "zeros") -> MSDAProblem:
    """A hand-built :class:`MSDAProblem` for the plain-Python planners (no arrays)."""
    return MSDAProblem(batch=batch, num_queries=queries, num_heads=heads, head_dim=head_dim,
                       num_levels=len(levels), num_points=points, spatial_shapes=tuple(levels),
                       level_start_index=normalize_level_start_index(None, tuple(levels)),
                       value_layout=value_layout, sampling_locations_layout=loc_layout,
                       align_corners=align_corners, padding_mode=padding_mode)
