"""nkilib_msda.validation.layouts: the layouts' dimension orders and the level starts."""

from __future__ import annotations

import numpy as np
import pytest

from nkilib_msda.validation import layouts as lay
from nkilib_msda.validation.msda import validate_msda_args


def test_the_tables_are_the_documented_orders():
    assert lay.dims_text("BLNC") == "(B, L, N_h, C_h)"
    assert lay.dims_text("BNLC") == "(B, N_h, L, C_h)"
    assert lay.dims_text("BQHLP2") == "(B, N_q, N_h, N_l, N_p, 2)"
    assert lay.dims_text("B2QHLP") == "(B, 2, N_q, N_h, N_l, N_p)"
    assert lay.VALUE_LAYOUTS == ("BLNC", "BNLC") and lay.LOCATION_LAYOUTS == ("BQHLP2", "B2QHLP")


@pytest.mark.parametrize("source,target", [("BLNC", "BNLC"), ("BNLC", "BLNC"), ("BQHLP2", "B2QHLP"),
                                           ("B2QHLP", "BQHLP2"), ("BLNC", "BLNC"), ("B2QHLP", "B2QHLP")])
def test_permutation_moves_every_dimension_to_its_place(source, target):
    """Label each axis of a tensor in ``source`` by its size, permute, read the sizes back."""
    rng = np.random.default_rng()
    names = sorted(set(lay.VALUE_DIMS.get(source, ()) + lay.LOCATION_DIMS.get(source, ())))
    sizes = dict(zip(names, rng.permutation(np.arange(2, 2 + len(names))).tolist()))
    x = rng.standard_normal(lay.arrange(source, sizes))
    y = x.transpose(lay.permutation(source, target))
    assert y.shape == lay.arrange(target, sizes)
    back = y.transpose(lay.permutation(target, source))
    assert np.array_equal(back, x)


def test_permutation_agrees_with_the_moves_written_by_hand():
    rng = np.random.default_rng()
    loc = rng.random((2, 3, 4, 5, 6, 2))
    assert np.array_equal(loc.transpose(lay.permutation("BQHLP2", "B2QHLP")), np.moveaxis(loc, -1, 1))
    value = rng.random((2, 7, 3, 4))
    assert np.array_equal(value.transpose(lay.permutation("BLNC", "BNLC")), value.transpose(0, 2, 1, 3))


def test_location_axis():
    assert [lay.location_axis("BQHLP2", d) for d in ("B", "N_q", "2")] == [0, 1, 5]
    assert [lay.location_axis("B2QHLP", d) for d in ("B", "N_q", "2")] == [0, 2, 1]


def test_unknown_layouts_are_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match=r"^sampling_locations_layout: expected one of \['BQHLP2', "
                                         r"'B2QHLP'\], got 'BLNC'$"):
        lay.location_axis("BLNC", "N_q")
    with pytest.raises(ValueError, match=r"^layout: expected one of .*got 'BHLNC'$"):
        lay.dims_text("BHLNC")
    with pytest.raises(ValueError, match=r"^target: expected a layout of the same tensor as 'BLNC', "
                                         r"got 'BQHLP2'$"):
        lay.permutation("BLNC", "BQHLP2")


def test_level_starts_are_the_cumulative_areas():
    rng = np.random.default_rng()
    shapes = [tuple(int(v) for v in rng.integers(1, 50, 2)) for _ in range(int(rng.integers(1, 6)))]
    areas = [h * w for h, w in shapes]
    assert lay.level_starts(shapes) == tuple(int(s) for s in np.cumsum([0] + areas)[:-1])
    assert lay.level_starts(((4, 5), (2, 3))) == (0, 20)
    assert lay.level_starts(()) == ()


def test_the_problem_reads_its_shapes_from_the_tables():
    rng = np.random.default_rng()
    shapes = ((4, 5), (2, 3))
    for vl in lay.VALUE_LAYOUTS:
        for ll in lay.LOCATION_LAYOUTS:
            sizes = {"B": 2, "L": 26, "N_h": 3, "C_h": 4, "N_q": 5, "N_l": 2, "N_p": 6, "2": 2}
            value = rng.standard_normal(lay.arrange(vl, sizes)).astype(np.float32)
            loc = rng.random(lay.arrange(ll, sizes)).astype(np.float32)
            attn = rng.random((2, 5, 3, 2, 6)).astype(np.float32)
            p = validate_msda_args(value, shapes, None, loc, attn, vl, ll, False, "zeros")
            assert (p.batch, p.num_queries, p.num_heads, p.head_dim, p.num_points) == (2, 5, 3, 4, 6)
            assert p.value_shape == value.shape and p.sampling_locations_shape == loc.shape
            assert p.level_start_index == lay.level_starts(shapes)
