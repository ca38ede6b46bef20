"""nkilib_msda.validation.arguments: THE positive-int check and the places that use it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nkilib_msda.validation.arguments import check_positive_int

BAD = [0, -3, 2.0, True, "4", None, 1.5]


@pytest.mark.parametrize("good", [1, 7, np.int64(3)])
def test_positive_ints_pass_as_python_ints(good):
    got = check_positive_int("n", good)
    assert got == int(good) and type(got) is int


@pytest.mark.parametrize("bad", BAD)
def test_everything_else_is_one_value_error_naming_the_argument(bad):
    want = f"steps: expected a positive int, got {bad!r} ({type(bad).__name__})"
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        check_positive_int("steps", bad)


def _callers():
    torch = pytest.importorskip("torch")
    import nkilib_msda
    from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
    from nkilib_msda.pytorch import buckets, mmcv
    from nkilib_msda.workloads import PRESETS
    from nkilib_msda.validation.msda import validate_msda_args

    tiny = PRESETS["tiny"]
    value = np.zeros((1, 26, 2, 8), np.float32)
    loc = np.zeros((1, 3, 2, 2, 2, 2), np.float32)
    problem = validate_msda_args(value, tiny.spatial_shapes, None, loc, np.zeros((1, 3, 2, 2, 2), np.float32),
                                 "BLNC", "BQHLP2", False, "zeros")
    return {
        "step": lambda bad: buckets.bucket_grid(64, 64, bad),
        "num_heads": lambda bad: mmcv.MultiScaleDeformableAttention(8, bad),
        "n_heads": lambda bad: nkilib_msda.MSDeformAttn(16, 2, bad),
        "im2col_step": lambda bad: nkilib_msda.MSDeformAttnFunction.apply(
            torch.zeros(1, 26, 2, 8), torch.tensor(tiny.spatial_shapes), torch.tensor([0, 20]),
            torch.zeros(1, 3, 2, 2, 2, 2), torch.zeros(1, 3, 2, 2, 2), bad),
        "max_gather_indices_per_indirect": lambda bad: plan_backward(
            problem, "bfloat16", max_gather_indices_per_indirect=bad),
    }


@pytest.mark.parametrize("name", ["step", "num_heads", "n_heads", "im2col_step",
                                  "max_gather_indices_per_indirect"])
@pytest.mark.parametrize("bad", [0, 2.0, True])
def test_every_caller_raises_the_one_error(name, bad):
    call = _callers()[name]
    with pytest.raises(ValueError, match=rf"^{name}: expected a positive int, got {bad!r} "):
        call(bad)


def test_a_zero_point_count_is_the_one_error_too():
    """An int ``n_points`` takes the positive-int check (a sequence is per-level counts)."""
    import nkilib_msda

    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"^n_points: expected a positive int, got 0 \(int\)$"):
        nkilib_msda.MSDeformAttn(16, 2, 2, 0)
