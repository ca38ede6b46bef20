"""Property test: HBM basic indexing and view methods agree with NumPy on random keys."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from nkilib_msda.simulator import nisa, nl

from _core_helpers import in_kernel


@st.composite
def shape_and_key(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    key = []
    for n in shape[: draw(st.integers(0, len(shape)))]:
        if draw(st.booleans()):
            key.append(draw(st.integers(-n, n - 1)))
        else:
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            key.append(slice(start, stop, draw(st.integers(1, 3))))
    return shape, tuple(key)


@given(shape_and_key(), st.integers(0, 2**31 - 1))
def test_hbm_indexing_matches_numpy(sk, seed):
    shape, key = sk
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    expected = x[key]

    def body(a):
        view = a[key]
        assert view.shape == expected.shape
        out = nl.ndarray(view.shape if view.shape else (1,), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view)
        return out

    np.testing.assert_array_equal(in_kernel(body, x).reshape(expected.shape), expected)


@given(st.permutations(range(4)), st.integers(0, 2**31 - 1))
def test_hbm_permute_matches_numpy(perm, seed):
    x = np.random.default_rng(seed).standard_normal((2, 3, 4, 5)).astype(np.float32)

    def body(a):
        view = a.permute(tuple(perm))
        out = nl.ndarray(view.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view)
        return out

    np.testing.assert_array_equal(in_kernel(body, x), x.transpose(perm))
