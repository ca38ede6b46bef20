"""DMA group: dma_copy, dma_transpose, dma_compute, from their pages' stated semantics:
- nki.isa.dma_copy.html: ``dst = src``; with sw DGE a gather/scatter through SBUF indices.
- nki.isa.dma_transpose.html: 2-D permutation [1, 0], 3-D [2, 1, 0], 4-D [3, 1, 2, 0].
- nki.isa.dma_compute.html: ``dst = reduce_op(srcs[0] * scales[0], ...)`` computed in fp32,
  then cast to dst's dtype.
(pages under https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/)
"""

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nl

from _isa_helpers import gather_inputs, gather_rows, load, randn, run, store

RNG = np.random.default_rng(11)
BF16 = ml_dtypes.bfloat16


def test_dma_copy_is_an_exact_copy_and_gathers_rows():
    a, idx = gather_inputs(RNG, (16, 12), (8, 1))

    def body(h, ix):
        return store(load(h)), store(gather_rows(h, load(ix), 8))

    copy, gathered = run(body, a, idx)
    np.testing.assert_array_equal(copy, a)
    np.testing.assert_array_equal(gathered, a[idx[:, 0]])


def test_dma_copy_scatter_writes_rows_at_indices():
    data = RNG.standard_normal((4, 6)).astype(np.float32)
    idx = np.array([[5], [0], [3], [7]], np.int32)
    dst = np.full((8, 6), 3.0, np.float32)

    def body(out, d, ix):
        nisa.dma_copy(dst=out.ap([[6, 4], [1, 6]], vector_offset=load(ix)), src=load(d))
        return out

    expected = dst.copy()
    expected[idx[:, 0]] = data
    np.testing.assert_array_equal(run(body, dst, data, idx), expected)


@pytest.mark.parametrize("shape,perm", [((4, 16), (1, 0)), ((2, 4, 16), (2, 1, 0)),
                                        ((2, 1, 4, 16), (3, 1, 2, 0))])
def test_dma_transpose_permutations(shape, perm):
    a = RNG.standard_normal(shape).astype(BF16)

    def body(h):
        t = nl.ndarray(tuple(shape[p] for p in perm), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=h)
        return store(t)

    out = run(body, a)
    np.testing.assert_array_equal(out.astype(np.float32),
                                  np.transpose(a, perm).astype(np.float32))


def test_dma_compute_fp32_sum_then_cast():
    xs = RNG.standard_normal((3, 8, 4)).astype(BF16)

    def body(h):
        out = nl.ndarray((8, 4), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=[load(h[k]) for k in range(3)], reduce_op=nl.add,
                         scales=[1.0, 1.0, 1.0])
        return out

    expected = xs.astype(np.float32).sum(axis=0, dtype=np.float32).astype(BF16)
    np.testing.assert_array_equal(run(body, xs).astype(np.float32), expected.astype(np.float32))


def test_dma_compute_scatter_rmw_adds_into_hbm_rows():
    g, data = randn(RNG, (6, 5), (3, 5))
    idx = np.array([[4], [1], [2]], np.int32)

    def body(out, d, ix):
        acc = out.ap([[5, 3], [1, 5]], vector_offset=load(ix))
        nisa.dma_compute(dst=acc, srcs=[acc, load(d)], reduce_op=nl.add)
        return out

    expected = g.copy()
    expected[idx[:, 0]] += data
    np.testing.assert_allclose(run(body, g.copy(), data, idx), expected, rtol=0, atol=0)
