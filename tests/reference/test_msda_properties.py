"""Property tests: the float64 reference equals the brute-force loops on random small problems."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from _msda_brute_force import brute_force_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref

level_shapes = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3)


@st.composite
def problems(draw):
    shapes = tuple(draw(level_shapes))
    batch, queries = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    heads, channels, points = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    length = sum(h * w for h, w in shapes)
    value = rng.standard_normal((batch, length, heads, channels))
    locations = rng.uniform(-0.5, 1.5, (batch, queries, heads, len(shapes), points, 2))
    attention = rng.uniform(-1.0, 1.0, (batch, queries, heads, len(shapes), points))
    grad_output = rng.standard_normal((batch, queries, heads * channels))
    options = dict(
        value_layout=draw(st.sampled_from(["BLNC", "BNLC"])),
        sampling_locations_layout=draw(st.sampled_from(["BQHLP2", "B2QHLP"])),
        align_corners=draw(st.booleans()),
        padding_mode=draw(st.sampled_from(["zeros", "border", "reflection"])))
    return shapes, value, locations, attention, grad_output, options


@given(problems())
def test_reference_equals_brute_force(problem):
    shapes, value, locations, attention, grad_output, options = problem
    expected = brute_force_msda(value, shapes, locations, attention, options["align_corners"],
                                options["padding_mode"], grad_output)
    v = value.transpose(0, 2, 1, 3).copy() if options["value_layout"] == "BNLC" else value
    loc = np.moveaxis(locations, -1, 1).copy() if options["sampling_locations_layout"] == "B2QHLP" else locations
    out = ms_deformable_attention_ref(v, shapes, None, loc, attention, **options)
    grad_value, grad_locations, grad_attention = ms_deformable_attention_bwd_ref(
        grad_output, v, shapes, None, loc, attention, **options)
    if options["value_layout"] == "BNLC":
        grad_value = grad_value.transpose(0, 2, 1, 3)
    if options["sampling_locations_layout"] == "B2QHLP":
        grad_locations = np.moveaxis(grad_locations, 1, -1)
    for name, got, want in zip(("output", "grad_value", "grad_locations", "grad_attention"),
                               (out, grad_value, grad_locations, grad_attention), expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
