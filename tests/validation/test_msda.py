"""validate_msda_args: every invalid argument is rejected with a message naming it."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.validation.msda import MSDAProblem, dtype_name, validate_msda_args

SHAPES = ((2, 3), (1, 2))  # L = 8
B, N_Q, N_H, C_H, N_L, N_P = 2, 5, 3, 4, 2, 2


def _args(value_layout="BLNC", locations_layout="BQHLP2", dtype=np.float32):
    """Valid arguments (a dict) for the given layouts."""
    value_shape = (B, 8, N_H, C_H) if value_layout == "BLNC" else (B, N_H, 8, C_H)
    loc_shape = (B, N_Q, N_H, N_L, N_P, 2) if locations_layout == "BQHLP2" else (B, 2, N_Q, N_H, N_L, N_P)
    rng = np.random.default_rng(0)
    return dict(
        value=rng.standard_normal(value_shape).astype(dtype),
        spatial_shapes=SHAPES,
        level_start_index=(0, 6),
        sampling_locations=rng.random(loc_shape).astype(dtype),
        attention_weights=rng.random((B, N_Q, N_H, N_L, N_P)).astype(dtype),
        value_layout=value_layout,
        sampling_locations_layout=locations_layout,
        align_corners=False,
        padding_mode="zeros",
    )


def _call(**overrides):
    args = _args(overrides.pop("value_layout", "BLNC"), overrides.pop("sampling_locations_layout", "BQHLP2"))
    args.update(overrides)
    return validate_msda_args(**args)


def _assert_rejected(error, name, **overrides):
    """The call fails with ``error`` whose message starts with the argument's name and says
    what was expected and what was received."""
    with pytest.raises(error) as info:
        _call(**overrides)
    message = str(info.value)
    assert message.startswith(f"{name}:"), message
    assert "expected" in message, message
    assert re.search(r"\bgot\b|\bentry \d+ is\b", message), message  # states what was received
    return message


# ---------------------------------------------------------------- valid calls


@pytest.mark.parametrize("locations_layout", ["BQHLP2", "B2QHLP"])
@pytest.mark.parametrize("value_layout", ["BLNC", "BNLC"])
def test_valid_call_describes_the_problem(value_layout, locations_layout):
    args = _args(value_layout, locations_layout)
    problem = validate_msda_args(**dict(args, align_corners=True, padding_mode="border"))
    assert problem == MSDAProblem(
        batch=B, num_queries=N_Q, num_heads=N_H, head_dim=C_H, num_levels=N_L, num_points=N_P,
        spatial_shapes=SHAPES, level_start_index=(0, 6), value_layout=value_layout,
        sampling_locations_layout=locations_layout, align_corners=True, padding_mode="border")
    assert problem.total_pixels == 8
    assert problem.value_shape == args["value"].shape
    assert problem.sampling_locations_shape == args["sampling_locations"].shape
    assert problem.attention_weights_shape == args["attention_weights"].shape
    assert problem.output_shape == (B, N_Q, N_H * C_H)
    assert problem.num_samples == B * N_Q * N_H * N_L * N_P


def test_defaults():
    problem = _call()
    assert (problem.value_layout, problem.sampling_locations_layout) == ("BLNC", "BQHLP2")
    assert (problem.align_corners, problem.padding_mode) == (False, "zeros")


def test_level_start_index_is_derived_when_none():
    assert _call(level_start_index=None).level_start_index == (0, 6)


@pytest.mark.parametrize("flag", [np.True_, np.False_, True, False])
def test_numpy_bool_align_corners_is_accepted(flag):
    problem = _call(align_corners=flag)
    assert problem.align_corners is bool(flag)


def test_reflection_accepted_by_default():
    assert _call(padding_mode="reflection").padding_mode == "reflection"


def test_numpy_shape_arrays_and_scalars_are_accepted():
    problem = _call(spatial_shapes=np.array(SHAPES, dtype=np.int32), level_start_index=np.array([0, 6]))
    assert problem.spatial_shapes == SHAPES and problem.level_start_index == (0, 6)
    problem = _call(spatial_shapes=[[np.int64(2), np.int64(3)], [1, 2]], level_start_index=[0, np.int32(6)])
    assert problem.spatial_shapes == SHAPES and all(type(v) is int for v in problem.level_start_index)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_float_dtypes_are_accepted(dtype):
    args = _args(dtype=dtype)
    assert validate_msda_args(**args, grad_output=np.zeros((B, N_Q, N_H * C_H), dtype)).batch == B


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    args = _args("BNLC", "B2QHLP")
    problem = validate_msda_args(
        torch.tensor(args["value"], dtype=torch.bfloat16), torch.tensor(SHAPES, dtype=torch.int64),
        torch.tensor([0, 6], dtype=torch.int64), torch.tensor(args["sampling_locations"], dtype=torch.float16),
        torch.tensor(args["attention_weights"]), "BNLC", "B2QHLP", False, "zeros",
        grad_output=torch.zeros(B, N_Q, N_H * C_H, dtype=torch.bfloat16))
    assert problem.spatial_shapes == SHAPES and problem.level_start_index == (0, 6)
    assert (problem.num_heads, problem.num_queries) == (N_H, N_Q)
    with pytest.raises(TypeError, match="^spatial_shapes:.*float32"):
        _call(spatial_shapes=torch.tensor(SHAPES, dtype=torch.float32))
    with pytest.raises(TypeError, match="^level_start_index:.*float"):
        _call(level_start_index=torch.tensor([0.0, 6.0]))
    with pytest.raises(TypeError, match="^value:.*int64"):
        _call(value=torch.zeros(B, 8, N_H, C_H, dtype=torch.int64))


def test_dtype_name():
    torch = pytest.importorskip("torch")
    assert dtype_name(np.dtype(np.float32)) == "float32"
    assert dtype_name(np.float16) == "float16"
    assert dtype_name(np.dtype(ml_dtypes.bfloat16)) == "bfloat16"
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_name(torch.half) == "float16"
    assert dtype_name(torch.double) == "float64"


# -------------------------------------------------------------- choice arguments


@pytest.mark.parametrize("name", ["value_layout", "sampling_locations_layout", "padding_mode"])
@pytest.mark.parametrize("bad,error", [(None, TypeError), (3, TypeError), ("blnc", ValueError), ("", ValueError)])
def test_bad_choice_arguments(name, bad, error):
    message = _assert_rejected(error, name, **{name: bad})
    assert repr(bad) in message


def test_reflection_rejected_when_backend_lacks_it():
    with pytest.raises(ValueError) as info:
        validate_msda_args(**dict(_args(), padding_mode="reflection"), padding_modes=("zeros", "border"))
    message = str(info.value)
    assert message.startswith("padding_mode:") and "'reflection'" in message and "'border'" in message


@pytest.mark.parametrize("bad", [1, 0, "True", None, 1.0])
def test_align_corners_must_be_bool(bad):
    _assert_rejected(TypeError, "align_corners", align_corners=bad)


# ------------------------------------------------------------ spatial shapes


@pytest.mark.parametrize("bad,error", [
    (None, TypeError),
    ("2x3", TypeError),
    ([], ValueError),
    (np.zeros((0, 2), np.int64), ValueError),
    ((2, 3), ValueError),  # a single pair, not a sequence of pairs
    (((2, 3), (1, 2, 3)), ValueError),
    (((2,), (1, 2)), ValueError),
    (((2.0, 3), (1, 2)), TypeError),
    (((2, 3), (1, True)), TypeError),
    (np.array(SHAPES, dtype=np.float64), TypeError),
    (np.array(SHAPES, dtype=bool), TypeError),
    (((0, 3), (1, 2)), ValueError),
    (((2, 3), (1, -2)), ValueError),
    ({(2, 3): 0, (1, 2): 1}, TypeError),  # a dict: not a sequence of pairs
    ({(2, 3), (1, 2)}, TypeError),  # a set has no order
    ((pair for pair in SHAPES), TypeError),  # a generator would be consumed by the first pass
    (iter(SHAPES), TypeError),
])
def test_bad_spatial_shapes(bad, error):
    _assert_rejected(error, "spatial_shapes", spatial_shapes=bad)


# --------------------------------------------------------- level start index


@pytest.mark.parametrize("bad,error", [
    ((0, 5), ValueError),
    ((1, 6), ValueError),
    ((0,), ValueError),
    ((0, 6, 8), ValueError),
    ((0, 6.0), TypeError),
    (np.array([0.0, 6.0]), TypeError),
    ("0,6", TypeError),
    (6, TypeError),
])
def test_bad_level_start_index(bad, error):
    message = _assert_rejected(error, "level_start_index", level_start_index=bad)
    if error is ValueError:
        assert "(0, 6)" in message  # states the expected offsets


# --------------------------------------------------------------------- value


@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
def test_bad_value(layout):
    good = _args(layout)["value"]
    _assert_rejected(TypeError, "value", value_layout=layout, value=good.tolist())
    _assert_rejected(TypeError, "value", value_layout=layout, value=good.astype(np.int32))
    _assert_rejected(TypeError, "value", value_layout=layout, value=good.astype(np.complex64))
    _assert_rejected(ValueError, "value", value_layout=layout, value=good[0])
    _assert_rejected(ValueError, "value", value_layout=layout, value=good[..., None])
    pixel_axis = 1 if layout == "BLNC" else 2
    message = _assert_rejected(ValueError, "value", value_layout=layout, value=np.delete(good, 0, pixel_axis))
    assert "8" in message and layout in message
    for axis in range(4):
        empty = np.take(good, [], axis=axis)
        _assert_rejected(ValueError, "value", value_layout=layout, value=empty)


# --------------------------------------------------------- sampling locations


@pytest.mark.parametrize("layout", ["BQHLP2", "B2QHLP"])
def test_bad_sampling_locations(layout):
    good = _args(locations_layout=layout)["sampling_locations"]
    axes = {"B": 0, "N_h": 3, "N_l": 4, "2": 1} if layout == "B2QHLP" else {"B": 0, "N_h": 2, "N_l": 3, "2": 5}
    for dim, axis in axes.items():
        bad = np.concatenate([good, np.take(good, [0], axis=axis)], axis=axis)
        message = _assert_rejected(ValueError, "sampling_locations", sampling_locations_layout=layout,
                                   sampling_locations=bad)
        assert f"{dim} = " in message and layout in message
    _assert_rejected(ValueError, "sampling_locations", sampling_locations_layout=layout, sampling_locations=good[0])
    _assert_rejected(TypeError, "sampling_locations", sampling_locations_layout=layout,
                     sampling_locations=good.astype(np.int64))
    _assert_rejected(TypeError, "sampling_locations", sampling_locations_layout=layout,
                     sampling_locations=good.tolist())
    query_axis = 2 if layout == "B2QHLP" else 1
    _assert_rejected(ValueError, "sampling_locations", sampling_locations_layout=layout,
                     sampling_locations=np.take(good, [], axis=query_axis))


def test_locations_layout_mismatch_is_reported():
    """BQHLP2 data passed as B2QHLP: the '2' axis is wrong."""
    good = _args()["sampling_locations"]
    _assert_rejected(ValueError, "sampling_locations", sampling_locations_layout="B2QHLP", sampling_locations=good)


# ------------------------------------------------------ attention and grad_output


def test_bad_attention_weights():
    good = _args()["attention_weights"]
    message = _assert_rejected(ValueError, "attention_weights", attention_weights=good[:, :-1])
    assert str((B, N_Q, N_H, N_L, N_P)) in message
    _assert_rejected(ValueError, "attention_weights", attention_weights=good[..., None])
    _assert_rejected(ValueError, "attention_weights", attention_weights=good[..., :1])
    _assert_rejected(TypeError, "attention_weights", attention_weights=good.astype(np.int16))
    _assert_rejected(TypeError, "attention_weights", attention_weights=None)


def test_bad_grad_output():
    good = np.zeros((B, N_Q, N_H * C_H), np.float32)
    assert _call(grad_output=good).batch == B
    message = _assert_rejected(ValueError, "grad_output", grad_output=good[:, :, :-1])
    assert str((B, N_Q, N_H * C_H)) in message
    _assert_rejected(ValueError, "grad_output", grad_output=good.reshape(B, N_Q, N_H, C_H))
    _assert_rejected(TypeError, "grad_output", grad_output=good.astype(np.int32))
    _assert_rejected(TypeError, "grad_output", grad_output=good.tolist())


def test_empty_point_or_query_axis_names_that_axis_only():
    """N_p = 0 is reported as N_p (the torch layer supports N_q = 0, so the message must not
    say "N_q >= 1" for it); N_q = 0 reaching the validation (the kernels) is reported as N_q."""
    good = _args()
    no_points = good["sampling_locations"][:, :, :, :, :0]
    message = _assert_rejected(ValueError, "sampling_locations", sampling_locations=no_points,
                               attention_weights=good["attention_weights"][..., :0])
    assert "N_p >= 1" in message and "N_q" not in message.split(" in ")[0], message
    message = _assert_rejected(ValueError, "sampling_locations",
                               sampling_locations=good["sampling_locations"][:, :0],
                               attention_weights=good["attention_weights"][:, :0])
    assert "N_q >= 1" in message and "N_p >= 1" not in message, message
