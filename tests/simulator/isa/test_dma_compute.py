"""nisa.dma_compute: fp32 sum of sources, scatter-RMW and gather-RMW, and its rules."""

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nl

from _core_helpers import in_kernel, raises_rule, randn
from _core_helpers import load as _load, store as _store

RNG = np.random.default_rng(99)
BF16 = ml_dtypes.bfloat16




@pytest.mark.parametrize("n", [1, 3, 16])
def test_sum_of_sources_in_fp32_then_cast(n):
    xs = RNG.standard_normal((n, 8, 5)).astype(BF16)
    expected = xs.astype(np.float32).sum(axis=0, dtype=np.float32).astype(BF16)

    def body(a):
        srcs = [_load(a[k]) for k in range(n)]
        out = nl.ndarray((8, 5), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=srcs, reduce_op=nl.add)
        return out

    out, rep = in_kernel(body, xs, report=True)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))
    assert rep.to_dict()["dma"]["compute/sbuf_to_hbm"]["instructions"] == 1


def test_scatter_rmw_adds_into_hbm_rows():
    g, data = randn(RNG, (30, 6), (8, 6))
    idx = RNG.permutation(30)[:8].astype(np.int32).reshape(8, 1)
    expected = g.copy()
    expected[idx[:, 0]] += data

    def body(grad, d, ix):
        i = _load(ix)
        t = _load(d)
        ap = grad.ap([[6, 8], [1, 6]], vector_offset=i)
        nisa.dma_compute(dst=ap, srcs=[ap, t], reduce_op=nl.add)
        return grad

    out, rep = in_kernel(body, g, data, idx, report=True)
    np.testing.assert_allclose(out, expected, rtol=0, atol=0)
    s = rep.to_dict()["dma"]["indirect_rmw/sbuf_to_hbm"]
    assert s["descriptors"] == 8 and s["descriptor_bytes_histogram"] == {24: 8}
    assert s["hbm_bytes"] == 2 * 8 * 6 * 4  # read + write of each HBM row


def test_scatter_rmw_duplicates_raise_or_lose_updates():
    g = np.zeros((4, 2), np.float32)
    data = np.array([[1, 1], [10, 10]], np.float32)
    idx = np.array([[2], [2]], np.int32)

    def body(grad, d, ix):
        ap = grad.ap([[2, 2], [1, 2]], vector_offset=_load(ix))
        nisa.dma_compute(dst=ap, srcs=[ap, _load(d)], reduce_op=nl.add)
        return grad

    with raises_rule("dma_compute", "duplicate scatter indices"):
        in_kernel(body, g.copy(), data, idx)
    out = in_kernel(body, g.copy(), data, idx, duplicate_scatter="last_writer_wins")
    assert out[2].tolist() in ([1, 1], [10, 10])  # one update lost, as on hardware


def test_scatter_rmw_oob_skip():
    g = np.ones((4, 2), np.float32)
    data = np.full((2, 2), 5.0, np.float32)
    idx = np.array([[1], [-1]], np.int32)

    def body(grad, d, ix, skip):
        ap = grad.ap([[2, 2], [1, 2]], vector_offset=_load(ix))
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_compute(dst=ap, srcs=[ap, _load(d)], reduce_op=nl.add, oob_mode=mode)
        return grad

    with raises_rule("dma_compute", "out-of-bounds index"):
        in_kernel(body, g.copy(), data, idx, False)
    out = in_kernel(body, g.copy(), data, idx, True)
    assert out.tolist() == [[1, 1], [6, 6], [1, 1], [1, 1]]


def test_gather_rmw_accumulates_into_sbuf():
    table, acc0 = randn(RNG, (10, 4), (3, 4))
    idx = np.array([[9], [9], [0]], np.int32)  # duplicates are fine in a gather

    def body(v, a, ix):
        acc = _load(a)
        nisa.dma_compute(dst=acc, srcs=[v.ap([[4, 3], [1, 4]], vector_offset=_load(ix)), acc],
                         reduce_op=nl.add)
        return _store(acc)

    np.testing.assert_array_equal(in_kernel(body, table, acc0, idx),
                                  acc0 + table[idx[:, 0]])


def test_dma_compute_rules():
    def body(a, ix):
        s = [_load(a) for _ in range(17)]
        out = nl.ndarray((2, 3), nl.float32, buffer=nl.shared_hbm)
        i = _load(ix)
        ap = a.ap([[3, 2], [1, 3]], vector_offset=i)
        with raises_rule("dma_compute", "source count"):
            nisa.dma_compute(dst=out, srcs=s, reduce_op=nl.add)
        with raises_rule("dma_compute", "source count"):
            nisa.dma_compute(dst=out, srcs=[], reduce_op=nl.add)
        with raises_rule("dma_compute", "reduce_op"):
            nisa.dma_compute(dst=out, srcs=s[:2], reduce_op=nl.multiply)
        with raises_rule("dma_compute", "scales"):
            nisa.dma_compute(dst=out, srcs=s[:2], reduce_op=nl.add, scales=[1.0, 2.0])
        nisa.dma_compute(dst=out, srcs=s[:2], reduce_op=nl.add, scales=(1.0, 1))
        with raises_rule("dma_compute", "unique_indices"):
            nisa.dma_compute(dst=ap, srcs=[ap, s[0]], reduce_op=nl.add, unique_indices=False)
        with raises_rule("dma_compute", "srcs"):
            nisa.dma_compute(dst=out, srcs=s[0], reduce_op=nl.add)
        with raises_rule("dma_compute", "DMA PSUM access"):
            nisa.dma_compute(dst=nl.ndarray((2, 3), nl.float32, buffer=nl.psum), srcs=s[:2],
                             reduce_op=nl.add)
        with raises_rule("dma_compute", "DMA element count"):
            nisa.dma_compute(dst=out[:, 0:2], srcs=s[:2], reduce_op=nl.add)
        with raises_rule("dma_compute", "oob_mode.skip without indirection"):
            nisa.dma_compute(dst=out, srcs=s[:2], reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)
        with raises_rule("dma_compute", "scatter-RMW form"):
            nisa.dma_compute(dst=ap, srcs=[s[0], s[1]], reduce_op=nl.add)
        with raises_rule("dma_compute", "scatter-RMW form"):
            nisa.dma_compute(dst=ap, srcs=[ap, s[0], s[1]], reduce_op=nl.add)
        with raises_rule("dma_compute", "gather-RMW form"):
            nisa.dma_compute(dst=s[0], srcs=[ap, s[1]], reduce_op=nl.add)

    in_kernel(body, np.ones((2, 3), np.float32), np.zeros((2, 1), np.int32))
