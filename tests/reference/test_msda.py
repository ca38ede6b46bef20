"""The float64 MSDA reference against brute force, grid_sample autograd and finite differences."""

from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest

from _msda_brute_force import brute_force_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.reference.msda import _axis_corners

PADDINGS = ("zeros", "border", "reflection")
LAYOUTS = list(itertools.product(("BLNC", "BNLC"), ("BQHLP2", "B2QHLP")))
SHAPES = ((3, 5), (1, 1), (1, 4), (2, 1), (4, 3))


# ------------------------------------------------------------------------ helpers


def _problem(rng, spatial_shapes, batch=2, queries=3, heads=2, channels=3, points=2, low=-0.5, high=1.5):
    """Canonical-layout inputs: value (B,L,N_h,C_h), locations (B,N_q,N_h,N_l,N_p,2), weights, grad_out."""
    length = sum(h * w for h, w in spatial_shapes)
    levels = len(spatial_shapes)
    value = rng.standard_normal((batch, length, heads, channels))
    locations = rng.uniform(low, high, (batch, queries, heads, levels, points, 2))
    attention = rng.uniform(0.1, 1.0, (batch, queries, heads, levels, points))
    grad_output = rng.standard_normal((batch, queries, heads * channels))
    return value, locations, attention, grad_output


def _to_layouts(value, locations, value_layout, locations_layout):
    if value_layout == "BNLC":
        value = np.ascontiguousarray(value.transpose(0, 2, 1, 3))
    if locations_layout == "B2QHLP":
        locations = np.ascontiguousarray(np.moveaxis(locations, -1, 1))
    return value, locations


def _from_layouts(grad_value, grad_locations, value_layout, locations_layout):
    if value_layout == "BNLC":
        grad_value = grad_value.transpose(0, 2, 1, 3)
    if locations_layout == "B2QHLP":
        grad_locations = np.moveaxis(grad_locations, 1, -1)
    return grad_value, grad_locations


def _run_ref(value, shapes, locations, attention, grad_output, value_layout, locations_layout, align, padding):
    """Forward and backward in the given layouts; results returned in canonical layouts."""
    v, loc = _to_layouts(value, locations, value_layout, locations_layout)
    out = ms_deformable_attention_ref(v, shapes, None, loc, attention, value_layout, locations_layout,
                                      align, padding)
    gv, gl, ga = ms_deformable_attention_bwd_ref(grad_output, v, shapes, None, loc, attention,
                                                 value_layout, locations_layout, align, padding)
    assert out.dtype == gv.dtype == gl.dtype == ga.dtype == np.float64
    assert gv.shape == v.shape and gl.shape == loc.shape and ga.shape == attention.shape
    gv, gl = _from_layouts(gv, gl, value_layout, locations_layout)
    return out, gv, gl, ga


def _assert_close(actual, expected, rtol=1e-12, atol=1e-12):
    for name, a, e in zip(("output", "grad_value", "grad_locations", "grad_attention"), actual, expected):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=name)


def _locations_off_kinks(rng, spatial_shapes, batch, queries, heads, points, align, padding):
    """Locations whose pixel coordinates have fractional parts in [0.1,0.4] or [0.6,0.9].

    That keeps them away from the cell boundaries (integers), the border clip points (0 and
    W-1) and the reflection mirrors (-0.5 + kW or multiples of W-1). Reflection spans several
    periods; the other modes stay within a pixel or two of the map.
    """
    locations = np.empty((batch, queries, heads, len(spatial_shapes), points, 2))
    for level, (height, width) in enumerate(spatial_shapes):
        for axis, size in ((0, width), (1, height)):
            shape = (batch, queries, heads, points)
            low, high = (-size - 2, 2 * size + 2) if padding == "reflection" else (-2, size + 1)
            whole = rng.integers(low, high, shape)
            frac = rng.uniform(0.1, 0.4, shape) + 0.5 * rng.integers(0, 2, shape)
            pixel = whole + frac
            if align and size == 1:
                coord = rng.uniform(-1.0, 2.0, shape)  # constant pixel coordinate 0
            elif align:
                coord = pixel / (size - 1)
            else:
                coord = (pixel + 0.5) / size
            locations[:, :, :, level, :, axis] = coord
    return locations


def _torch_msda(value, spatial_shapes, locations, attention, align, padding):
    """MSDA as per-level torch grid_sample (canonical layouts, float64 tensors)."""
    import torch.nn.functional as F

    batch, _, heads, channels = value.shape
    queries, points = locations.shape[1], locations.shape[4]
    out, start = 0, 0
    for level, (height, width) in enumerate(spatial_shapes):
        level_value = value[:, start:start + height * width].permute(0, 2, 3, 1)
        level_value = level_value.reshape(batch * heads, channels, height, width)
        start += height * width
        grid = 2 * locations[:, :, :, level].permute(0, 2, 1, 3, 4).reshape(batch * heads, queries, points, 2) - 1
        sampled = F.grid_sample(level_value, grid, mode="bilinear", padding_mode=padding, align_corners=align)
        weights = attention[:, :, :, level].permute(0, 2, 1, 3).reshape(batch * heads, 1, queries, points)
        out = out + (sampled * weights).sum(-1)
    return out.reshape(batch, heads, channels, queries).permute(0, 3, 1, 2).reshape(batch, queries, -1)


def _torch_forward_and_grads(value, spatial_shapes, locations, attention, grad_output, align, padding):
    torch = pytest.importorskip("torch")
    tensors = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (value, locations, attention)]
    out = _torch_msda(tensors[0], spatial_shapes, tensors[1], tensors[2], align, padding)
    out.backward(torch.tensor(grad_output))
    return (out.detach().numpy(), *(t.grad.numpy() for t in tensors))


# ---------------------------------------------------------------- brute force


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("value_layout,locations_layout", LAYOUTS)
def test_matches_brute_force(value_layout, locations_layout, align, padding):
    seed = 6 * LAYOUTS.index((value_layout, locations_layout)) + 2 * PADDINGS.index(padding) + align
    rng = np.random.default_rng(seed)
    value, locations, attention, grad_output = _problem(rng, SHAPES)
    expected = brute_force_msda(value, SHAPES, locations, attention, align, padding, grad_output)
    actual = _run_ref(value, SHAPES, locations, attention, grad_output, value_layout, locations_layout,
                      align, padding)
    assert np.abs(expected[0]).max() > 0.1 and np.abs(expected[2]).max() > 0.1  # non-trivial problem
    _assert_close(actual, expected)


# -------------------------------------------------------------- grid_sample


def _check_against_torch(value, shapes, locations, attention, grad_output, align, padding, tol):
    """The reference's output and gradients (BLNC, BQHLP2) equal grid_sample's within ``tol``
    (relative and absolute)."""
    expected = _torch_forward_and_grads(value, shapes, locations, attention, grad_output, align, padding)
    actual = _run_ref(value, shapes, locations, attention, grad_output, "BLNC", "BQHLP2", align, padding)
    _assert_close(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("low,high", [(-0.5, 1.5), (-3.0, 4.0)])
def test_matches_torch_grid_sample(align, padding, low, high):
    """(-3, 4) spans several reflection periods on every level."""
    rng = np.random.default_rng(7)
    shapes = ((6, 7), (3, 2), (1, 1), (1, 5))
    value, locations, attention, grad_output = _problem(rng, shapes, batch=2, queries=9, heads=3,
                                                        channels=4, points=3, low=low, high=high)
    _check_against_torch(value, shapes, locations, attention, grad_output, align, padding, 1e-11)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
def test_kink_conventions_match_torch_grid_sample(align, padding):
    """Coordinates on exact pixel centres, cell edges, borders and mirrors (multiples of 1/8,
    exact in binary): one-sided derivatives follow grid_sample (floor picks the cell; clipped
    on and beyond the border)."""
    rng = np.random.default_rng(17)
    shapes = ((4, 4), (2, 8), (1, 1), (1, 2))
    value, _, attention, grad_output = _problem(rng, shapes, batch=1, queries=16, heads=2, channels=3, points=3)
    locations = rng.integers(-12, 21, (1, 16, 2, len(shapes), 3, 2)) / 8.0
    _check_against_torch(value, shapes, locations, attention, grad_output, align, padding, 1e-12)


# ---------------------------------------------------------- finite differences


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
def test_gradients_match_central_differences(align, padding):
    rng = np.random.default_rng(11 + PADDINGS.index(padding) + 3 * align)
    shapes = ((3, 4), (2, 1), (1, 3))
    value, _, attention, grad_output = _problem(rng, shapes, batch=1, queries=2, heads=2, channels=2, points=2)
    locations = _locations_off_kinks(rng, shapes, 1, 2, 2, 2, align, padding)

    def objective(v, loc, a):
        out = ms_deformable_attention_ref(v, shapes, None, loc, a, align_corners=align, padding_mode=padding)
        return float(np.sum(out * grad_output))

    grads = ms_deformable_attention_bwd_ref(grad_output, value, shapes, None, locations, attention,
                                           align_corners=align, padding_mode=padding)
    inputs = [value, locations, attention]
    step = 1e-6
    for which, grad in enumerate(grads):
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            plus = [x.copy() for x in inputs]
            minus = [x.copy() for x in inputs]
            plus[which][index] += step
            minus[which][index] -= step
            numeric[index] = (objective(*plus) - objective(*minus)) / (2 * step)
        assert np.abs(numeric).max() > 0.05
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7, err_msg=f"gradient {which}")


def test_align_corners_location_gradient_uses_size_minus_one():
    """One sample on a 1x5 level: d out / d u = (W-1) * (V[x1] - V[x0]) exactly."""
    value = np.arange(5.0).reshape(1, 5, 1, 1) ** 2
    locations = np.array([0.3, 0.0]).reshape(1, 1, 1, 1, 1, 2)  # x = 1.2 between pixels 1 and 2
    attention = np.ones((1, 1, 1, 1, 1))
    _, grad_locations, _ = ms_deformable_attention_bwd_ref(
        np.ones((1, 1, 1)), value, ((1, 5),), None, locations, attention, align_corners=True)
    assert grad_locations[0, 0, 0, 0, 0, 0] == pytest.approx(4 * (4.0 - 1.0))
    assert grad_locations[0, 0, 0, 0, 0, 1] == 0.0  # H = 1: y is constant


# ------------------------------------------------------------------ layouts


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
def test_layouts_are_transposes(align, padding):
    rng = np.random.default_rng(5)
    shapes = ((5, 3), (2, 4))
    value, locations, attention, grad_output = _problem(rng, shapes, batch=2, queries=6, heads=3, channels=5)
    base = _run_ref(value, shapes, locations, attention, grad_output, "BLNC", "BQHLP2", align, padding)
    for value_layout, locations_layout in LAYOUTS[1:]:
        other = _run_ref(value, shapes, locations, attention, grad_output, value_layout, locations_layout,
                         align, padding)
        _assert_close(other, base, rtol=1e-14, atol=1e-14)


def test_chunking_does_not_change_results(monkeypatch):
    """Tiny chunk and flush sizes (many query chunks, several scatter flushes) give the same numbers."""
    from nkilib_msda.reference import msda

    rng = np.random.default_rng(6)
    shapes = ((5, 3), (2, 4))
    value, locations, attention, grad_output = _problem(rng, shapes, batch=2, queries=13, heads=2, channels=3)
    whole = _run_ref(value, shapes, locations, attention, grad_output, "BNLC", "B2QHLP", False, "zeros")
    monkeypatch.setattr(msda, "_GATHER_ELEMENTS_PER_CHUNK", 600)  # 192 per query: 3 queries per chunk
    monkeypatch.setattr(msda, "_SCATTER_ENTRIES_PER_FLUSH", 200)
    assert len(msda._query_chunks(msda.validate_msda_args(value, shapes, None, locations, attention, "BLNC", "BQHLP2", False, "zeros"))) == 5
    chunked = _run_ref(value, shapes, locations, attention, grad_output, "BNLC", "B2QHLP", False, "zeros")
    _assert_close(chunked, whole, rtol=1e-14, atol=1e-14)


# ---------------------------------------------------- non-finite and huge inputs


SPECIAL = (np.nan, np.inf, -np.inf, 1e38, -1e38)


def _special_problem(rng):
    shapes = ((4, 5), (3, 3))
    value, locations, attention, grad_output = _problem(rng, shapes, batch=1, queries=len(SPECIAL) * 2,
                                                        heads=2, channels=3)
    special = np.zeros(locations.shape[:-1] + (2,), bool)
    for i, bad in enumerate(SPECIAL):  # query 2i: bad x; query 2i+1: bad y; only on head 0, level 0, point 0
        locations[0, 2 * i, 0, 0, 0, 0] = bad
        locations[0, 2 * i + 1, 0, 0, 0, 1] = bad
        special[0, 2 * i, 0, 0, 0] = special[0, 2 * i + 1, 0, 0, 0] = True
    return shapes, value, locations, attention, grad_output, special[..., 0]


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
def test_special_coordinates_are_finite_and_warning_free(align, padding):
    rng = np.random.default_rng(3)
    shapes, value, locations, attention, grad_output, _ = _special_problem(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ms_deformable_attention_ref(value, shapes, None, locations, attention, align_corners=align,
                                          padding_mode=padding)
        grads = ms_deformable_attention_bwd_ref(grad_output, value, shapes, None, locations, attention,
                                                align_corners=align, padding_mode=padding)
    for result in (out, *grads):
        assert np.isfinite(result).all()


def _contribution_removed(value, shapes, locations, attention, grad_output, removed, align, padding):
    """Reference results with the samples in ``removed`` zero-weighted and moved to 0.5."""
    attention = np.where(removed, 0.0, attention)
    locations = np.where(removed[..., None], 0.5, locations)
    out = ms_deformable_attention_ref(value, shapes, None, locations, attention, align_corners=align,
                                      padding_mode=padding)
    grads = ms_deformable_attention_bwd_ref(grad_output, value, shapes, None, locations, attention,
                                            align_corners=align, padding_mode=padding)
    return out, *grads


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
def test_unusable_coordinates_contribute_nothing(align, padding):
    """NaN always; +-inf and +-1e38 too in zeros mode (outside the map); +-inf in reflection mode."""
    rng = np.random.default_rng(4)
    shapes, value, locations, attention, grad_output, special = _special_problem(rng)
    removed = {"zeros": special, "border": np.isnan(locations).any(-1),
               "reflection": ~np.isfinite(locations).all(-1)}[padding]
    out, gv, gl, ga = _run_ref(value, shapes, locations, attention, grad_output, "BLNC", "BQHLP2", align, padding)
    e_out, e_gv, e_gl, e_ga = _contribution_removed(value, shapes, locations, attention, grad_output, removed,
                                                    align, padding)
    np.testing.assert_allclose(out, e_out, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gv, e_gv, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gl[~removed], e_gl[~removed], rtol=1e-13, atol=1e-13)
    assert (gl[removed] == 0).all() and (ga[removed] == 0).all()
    np.testing.assert_allclose(ga[~removed], e_ga[~removed], rtol=1e-13, atol=1e-13)
    assert removed.sum() >= 2 and (~removed).any()


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("x,y,pixel", [
    (1e38, -1e38, (0, 4)), (-np.inf, np.inf, (2, 0)), (np.inf, 0.55, None), (-1e38, 1e38, (2, 0))])
def test_border_clamps_huge_coordinates_to_the_border_pixel(align, x, y, pixel):
    """One sample on a 3x5 map: the output is exactly the clamped border pixel (or border row)."""
    rng = np.random.default_rng(8)
    value = rng.standard_normal((1, 15, 1, 4))
    locations = np.array([x, y]).reshape(1, 1, 1, 1, 1, 2)
    attention = np.full((1, 1, 1, 1, 1), 0.75)
    out = ms_deformable_attention_ref(value, ((3, 5),), None, locations, attention, align_corners=align,
                                      padding_mode="border")
    if pixel is None:  # x clamped to column 4, y = 0.55 interpolated between rows
        py = 0.55 * 2 if align else 0.55 * 3 - 0.5
        row0, frac = int(np.floor(py)), py - np.floor(py)
        expected = (1 - frac) * value[0, row0 * 5 + 4, 0] + frac * value[0, (row0 + 1) * 5 + 4, 0]
    else:
        expected = value[0, pixel[0] * 5 + pixel[1], 0]
    np.testing.assert_allclose(out[0, 0], 0.75 * expected, rtol=1e-14, atol=1e-14)
    _, grad_locations, _ = ms_deformable_attention_bwd_ref(
        np.ones((1, 1, 4)), value, ((3, 5),), None, locations, attention, align_corners=align,
        padding_mode="border")
    assert grad_locations[0, 0, 0, 0, 0, 0] == 0.0  # x clipped: zero derivative


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("size", [1, 2, 7])
def test_corner_indices_stay_in_range(size, align, padding):
    coords = np.array([np.nan, np.inf, -np.inf, 1e38, -1e38, 1e300, -1e300, 3e8, -3e8, 0.5, -2.7, 9.1])
    corners = _axis_corners(coords, size, align, padding)
    for index in (corners.index0, corners.index1):
        assert index.dtype == np.int64 and ((index >= 0) & (index < size)).all()
    assert np.isfinite(corners.frac).all() and np.isfinite(corners.scale).all()
    assert not corners.valid0[0] and not corners.valid1[0] and corners.scale[0] == 0  # NaN


# ------------------------------------------------------------- input types


@pytest.mark.parametrize("dtype", [np.float16, np.float32, ml_dtypes.bfloat16])
def test_low_precision_inputs_are_upcast(dtype):
    rng = np.random.default_rng(9)
    shapes = ((4, 6), (2, 3))
    value, locations, attention, grad_output = _problem(rng, shapes)
    rounded = [x.astype(dtype) for x in (value, locations, attention, grad_output)]
    exact = [x.astype(np.float64) for x in rounded]
    out = ms_deformable_attention_ref(rounded[0], shapes, None, rounded[1], rounded[2], "BLNC", "BQHLP2")
    np.testing.assert_array_equal(out, ms_deformable_attention_ref(exact[0], shapes, None, exact[1], exact[2]))
    grads = ms_deformable_attention_bwd_ref(rounded[3], rounded[0], shapes, None, rounded[1], rounded[2])
    expected = ms_deformable_attention_bwd_ref(exact[3], exact[0], shapes, None, exact[1], exact[2])
    for got, want in zip(grads, expected):
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)


def test_torch_tensor_inputs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    shapes = ((4, 6), (2, 3))
    value, locations, attention, grad_output = _problem(rng, shapes)
    as_torch = [torch.tensor(x, dtype=torch.bfloat16, requires_grad=True) for x in (value, locations, attention)]
    exact = [t.detach().double().numpy() for t in as_torch]
    shape_tensor = torch.tensor(shapes, dtype=torch.int64)
    start_tensor = torch.tensor([0, 24], dtype=torch.int64)
    out = ms_deformable_attention_ref(as_torch[0], shape_tensor, start_tensor, as_torch[1], as_torch[2])
    np.testing.assert_array_equal(out, ms_deformable_attention_ref(exact[0], shapes, (0, 24), exact[1], exact[2]))
    grads = ms_deformable_attention_bwd_ref(torch.tensor(grad_output), *as_torch[:1], shape_tensor, None,
                                            *as_torch[1:])
    expected = ms_deformable_attention_bwd_ref(grad_output, exact[0], shapes, None, exact[1], exact[2])
    for got, want in zip(grads, expected):
        np.testing.assert_array_equal(got, want)


def test_invalid_arguments_are_rejected():
    rng = np.random.default_rng(12)
    value, locations, attention, grad_output = _problem(rng, ((2, 2),))
    with pytest.raises(ValueError, match="padding_mode"):
        ms_deformable_attention_ref(value, ((2, 2),), None, locations, attention, padding_mode="wrap")
    with pytest.raises(ValueError, match="grad_output"):
        ms_deformable_attention_bwd_ref(grad_output[:, :1], value, ((2, 2),), None, locations, attention)
    with pytest.raises(ValueError, match="value"):
        ms_deformable_attention_ref(value, ((2, 3),), None, locations, attention)


# ------------------------------------------------------------ large problems


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_bevformer_tsa_size_matches_grid_sample(padding):
    """BEVFormer temporal self-attention size: B=1, N_q=40000, N_h=8, C_h=32, one 200x200 level, 4 points."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    shapes = ((200, 200),)
    value, locations, attention, grad_output = _problem(rng, shapes, batch=1, queries=40000, heads=8,
                                                        channels=32, points=4, low=-0.1, high=1.1)
    out = ms_deformable_attention_ref(value, shapes, None, locations, attention, padding_mode=padding)
    with torch.no_grad():
        expected = _torch_msda(torch.tensor(value), shapes, torch.tensor(locations), torch.tensor(attention),
                               False, padding).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-11)
