"""The backward kernel with its channels split into tiles (C_h too wide for one pass), in the
emulator against the float64 reference on the same rounded inputs (tolerances from
nkilib_msda.workloads.TOLERANCES, via ``check_gradients``)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from msda_cases import MSDACase, with_
from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
from nkilib_msda.experimental.deformable_attention.plan.forward_config import plan_forward
from nkilib_msda.reference import ms_deformable_attention_bwd_ref
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd import (
    PAIR_LEVELS, SMALL_LEVELS, backward_inputs, check_gradients, run_bwd)
from simulator_tests.experimental.deformable_attention.test_ms_deformable_attention_bwd_knobs import config_for

# the kernel's module (the package attribute of the same name is the kernel itself)
bwd_module = importlib.import_module("nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd")
DETR_OP_LEVELS = ((6, 4), (3, 2))  # Deformable-DETR's own op test: N_h = 2, N_l = 2, N_p = 2


def detr_case(head_dim: int, layout: str, value_dtype: str = "float32", num_queries: int = 5) -> MSDACase:
    param = "float32" if value_dtype == "float32" else "float16"
    return MSDACase(num_queries=num_queries, num_heads=2, head_dim=head_dim, num_points=2,
                    spatial_shapes=DETR_OP_LEVELS, value_layout=layout, value_dtype=value_dtype,
                    param_dtype=param)


def check_tiled(c: MSDACase, lnc: int, min_tiles: int = 2, **knobs) -> None:
    grad, args = backward_inputs(c, seed=3)
    cfg = config_for(grad, args, lnc=lnc, **knobs)
    assert len(cfg.channel_tiles) >= min_tiles, cfg.describe()
    outs = run_bwd(grad, args, lnc=lnc, **knobs)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c)


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.parametrize("lnc", [1, 2])
def test_detr_op_test_head_dim_3096_fp32(layout, lnc):
    """C_h = 3096 fp32 (refused before channel tiling: 235,952 B per partition)."""
    check_tiled(detr_case(3096, layout), lnc)


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.parametrize("method", ["transpose", "copy"])
def test_two_byte_values_tiled_on_both_gather_methods(method, layout):
    """bf16 C_h = 1000 with 8 points: two tiles of 512 (transpose: whole 128-channel chunks)
    and 488, or of 500 (copy)."""
    c = MSDACase(num_queries=9, num_heads=2, head_dim=1000, num_points=8, spatial_shapes=PAIR_LEVELS,
                 value_layout=layout, value_dtype="bfloat16")
    check_tiled(c, lnc=2, gather_method=method)


# Small shapes under a shrunken SBUF budget, so that every knob combination runs tiled cheaply.
TIGHT = MSDACase(num_queries=23, num_heads=4, head_dim=200, num_points=3, spatial_shapes=PAIR_LEVELS)
TIGHT_KNOBS = [
    ({}, "bfloat16"),
    ({"gather_method": "copy"}, "bfloat16"),
    ({"gather_method": "copy", "max_gather_indices_per_indirect": 40}, "float16"),
    ({"max_scatter_indices_per_indirect": 48, "num_scatter_buffers": 2}, "bfloat16"),
    ({"max_gather_indices_per_indirect": 128, "max_scatter_indices_per_indirect": 128}, "float32"),
    ({"compute_grad_value": False}, "bfloat16"),
    ({"compute_grad_sampling_locations": False, "compute_grad_attention_weights": False}, "float32"),
]


def _tight_budget(c: MSDACase, tiles: int, **knobs) -> int:
    """The largest budget (in 1 KiB steps) whose plan splits C_h into >= ``tiles`` tiles."""
    grad, args = backward_inputs(c)
    problem_cfg = config_for(grad, args, **knobs)
    budget = problem_cfg.sbuf_bytes_per_partition
    flags = {k: knobs[k] for k in knobs if k.startswith("compute_")}
    while True:
        budget -= 1024
        cfg = plan_backward(problem_cfg.problem, c.value_dtype, gather_method=knobs.get("gather_method", "transpose"),
                            max_gather_indices_per_indirect=knobs.get("max_gather_indices_per_indirect"),
                            max_scatter_indices_per_indirect=knobs.get("max_scatter_indices_per_indirect"),
                            num_scatter_buffers=knobs.get("num_scatter_buffers"), sbuf_budget=budget, **flags)
        if len(cfg.channel_tiles) >= tiles:
            return budget


def _plan_under_budget(monkeypatch, budget: int) -> list:
    """Run the kernel with ``budget`` bytes of SBUF per partition; returns the list that
    collects the backward configs the kernel plans."""
    plans = []

    def recording_plan(*args, **kwargs):
        plans.append(plan_backward(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(bwd_module, "kernel_sbuf_budget", lambda: budget)
    monkeypatch.setattr(bwd_module, "plan_backward", recording_plan)
    return plans


@pytest.mark.parametrize("knobs,value_dtype", TIGHT_KNOBS, ids=str)
def test_knobs_under_a_tight_budget(knobs, value_dtype, monkeypatch):
    """Pairs and single corners, capped gathers/scatters, buffer sets, gradient subsets,
    partial blocks and B = 2 (both layouts, alternating), each with C_h = 200 split into >= 3
    channel tiles by a smaller SBUF budget."""
    layout = "BNLC" if TIGHT_KNOBS.index((knobs, value_dtype)) % 2 else "BLNC"
    c = with_(TIGHT, value_layout=layout, value_dtype=value_dtype, batch=2,
              spatial_shapes=SMALL_LEVELS if "max_gather_indices_per_indirect" in knobs else PAIR_LEVELS,
              padding_mode="border" if layout == "BNLC" else "zeros", align_corners=layout == "BNLC")
    plans = _plan_under_budget(monkeypatch, _tight_budget(c, 3, **knobs))
    grad, args = backward_inputs(c, seed=7)
    flags = [knobs.get(f"compute_{name}", True) for name in ("grad_value", "grad_sampling_locations",
                                                             "grad_attention_weights")]
    outs = run_bwd(grad, args, lnc=2, **knobs)
    assert plans and all(len(cfg.channel_tiles) >= 3 for cfg in plans), [cfg.describe() for cfg in plans]
    assert len(outs) == sum(flags)
    check_gradients(outs, ms_deformable_attention_bwd_ref(grad, **args), c, flags=tuple(flags))


def _forward_head_dim_limit(c: MSDACase, method: str) -> int:
    """The largest C_h the forward kernel plans for ``c`` (bisection; the need grows with C_h)."""
    grad, args = backward_inputs(with_(c, head_dim=8))
    problem = config_for(grad, args).problem

    def fits(head_dim: int) -> bool:
        try:
            plan_forward(problem.__class__(**{**problem.__dict__, "head_dim": head_dim}), c.value_dtype,
                         gather_method=method)
            return True
        except ValueError:
            return False

    lo, hi = 1, 1 << 16
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# Deformable-DETR's op-test channel counts (one tile at N_p = 2) in the default run; the
# forward's largest C_h (several tiles, ~1.5 s each) marked slow.
SWEEP = [pytest.param(head_dim, dtype, method, marks=[pytest.mark.slow] if head_dim == "forward limit" else [])
         for head_dim in (1025, 2048, "forward limit")
         for dtype, method in (("float32", "copy"), ("bfloat16", "copy"), ("bfloat16", "transpose"))]


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.parametrize("head_dim,value_dtype,method", SWEEP, ids=str)
def test_head_dim_sweep_up_to_the_forward_limit(head_dim, value_dtype, method, layout):
    """Deformable-DETR's op-test channel counts and the forward's largest C_h (fp32 10,183 and
    bf16 11,314 on the copy path, 1,024 on the transpose path), both layouts."""
    c = detr_case(8, layout, value_dtype, num_queries=5)
    min_tiles = 1
    if head_dim == "forward limit":
        head_dim = _forward_head_dim_limit(c, method)
        min_tiles = 2 if method == "copy" else 1
    c = with_(c, head_dim=head_dim)
    check_tiled(c, lnc=1 + (head_dim % 2), min_tiles=min_tiles, gather_method=method)


def test_grad_output_row_scale_spans_every_channel_tile(monkeypatch):
    """grad_output near the float32 maximum only in the last channel tile of each row (the
    first tile is small): the power-of-two row scale must come from the whole row, so the
    location and weight gradients hold no NaN, overflow to the infinity of the exact value's
    sign, and stay finite and close where the exact value is inside the float32 range."""
    c = with_(TIGHT, value_dtype="float32", param_dtype="float32")
    plans = _plan_under_budget(monkeypatch, _tight_budget(c, 3, compute_grad_value=False))
    grad, args = backward_inputs(c, seed=11)
    rows = grad.reshape(grad.shape[0], grad.shape[1], c.num_heads, c.head_dim)
    rows[...] = np.clip(rows, -1.0, 1.0)
    rows[..., -c.head_dim // 4:] *= np.float32(3e38)  # only inside the last channel tile
    outs = run_bwd(grad, args, lnc=2, compute_grad_value=False)
    assert plans and all(len(cfg.channel_tiles) >= 3 for cfg in plans), [cfg.describe() for cfg in plans]
    last_tile_start = plans[0].channel_tiles[-1][0]
    assert last_tile_start <= c.head_dim - c.head_dim // 4, plans[0].describe()
    refs = ms_deformable_attention_bwd_ref(grad, **args)[1:]
    f32_max = float(np.finfo(np.float32).max)
    overflowing = 0
    for name, got, want in zip(("grad_sampling_locations", "grad_attention_weights"), outs, refs):
        got = got.astype(np.float64)
        assert not np.isnan(got).any(), f"{name}: NaN"
        beyond = np.abs(want) >= 1.001 * f32_max
        overflowing += int(beyond.sum())
        assert np.array_equal(got[beyond], np.where(want[beyond] > 0, np.inf, -np.inf)), name
        inside = np.abs(want) <= 0.999 * f32_max
        assert np.isfinite(got[inside]).all(), f"{name}: infinity where the exact value is finite"
        err = np.abs(got[inside] - want[inside]).max(initial=0.0)
        assert err <= 1e-5 * np.abs(want[inside]).max(initial=1.0), f"{name}: error {err:.3e}"
    assert overflowing, "the inputs make no gradient overflow"
