"""nisa.dma_transpose: direct 2-D/3-D/4-D and indirect (column-major uint32 indices)."""

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nl

from _core_helpers import in_kernel, raises_rule
from _core_helpers import load as _load, store as _store

RNG = np.random.default_rng(7)
BF16 = ml_dtypes.bfloat16




@pytest.mark.parametrize("shape, axes", [((16, 40), (1, 0)), ((4, 6, 8), (2, 1, 0)),
                                          ((2, 3, 4, 5), (3, 1, 2, 0))])
def test_direct_transpose(shape, axes):
    x = RNG.standard_normal(shape).astype(BF16)

    def body(a):
        out_shape = tuple(a.shape[k] for k in axes)
        t = nl.ndarray(out_shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, x), x.transpose(axes))


def test_transpose_from_sbuf_and_hwdge():
    x = RNG.standard_normal((16, 100)).astype(np.float16)

    def body(a):
        s = _load(a)
        t = nl.ndarray((100, 16), a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=s, axes=(1, 0), dge_mode=nisa.dge_mode.hwdge)
        return _store(t)

    out, rep = in_kernel(body, x, report=True)
    np.testing.assert_array_equal(out, x.T)
    assert rep.to_dict()["dma"]["transpose/sbuf_to_sbuf"]["elements"] == 1600


def test_indirect_transpose_column_major_index_consumption():
    # src rows r = indices.T.flatten()[r]; dst column k*128 + p comes from indices[p, k].
    V = RNG.standard_normal((500, 48)).astype(BF16)
    idx = RNG.integers(0, 500, (128, 3)).astype(np.uint32)
    R = 320  # uses all of column 0 and 1 and half of column 2

    def body(v, ix):
        i = _load(ix)
        t = nl.ndarray((48, R), v.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=v.ap([[48, R], [1, 48]], vector_offset=i))
        return _store(t)

    out, rep = in_kernel(body, V, idx, report=True)
    for col in (0, 1, 127, 128, 200, 255, 256, 319):
        k, p = divmod(col, 128)
        np.testing.assert_array_equal(out[:, col], V[idx[p, k]])
    np.testing.assert_array_equal(out, V[idx.T.reshape(-1)[:R]].T)
    s = rep.to_dict()["dma"]["indirect_transpose/hbm_to_sbuf"]
    assert s["descriptors"] == R and s["descriptor_bytes_histogram"] == {96: R}


def test_indirect_transpose_oob_skip_leaves_columns_unchanged():
    V = RNG.standard_normal((40, 16)).astype(BF16)
    idx = np.arange(16, dtype=np.uint32).reshape(16, 1)
    idx[3, 0] = 40  # out of bounds

    def body(v, ix, skip):
        i = _load(ix)
        t = nl.full((16, 16), 5.0, v.dtype)
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_transpose(dst=t, src=v.ap([[16, 16], [1, 16]], vector_offset=i), oob_mode=mode)
        return _store(t)

    with raises_rule("dma_transpose", "out-of-bounds index"):
        in_kernel(body, V, idx, False)
    out = in_kernel(body, V, idx, True).astype(np.float32)
    keep = [c for c in range(16) if c != 3]
    np.testing.assert_array_equal(out[:, keep], V[idx[keep, 0]].T.astype(np.float32))
    assert (out[:, 3] == 5.0).all()


def test_dma_transpose_rules():
    def body(a, f, ix, ix32):
        s = nl.ndarray((8, 16), a.dtype, buffer=nl.sbuf)
        i = _load(ix)
        i32 = _load(ix32)
        # NKI 0.8 page: the 2-byte dtype rule belongs to the HWDGE and indirect transposes
        # only; a direct 4-byte transpose (dge_mode unknown) is legal (R03).
        with raises_rule("dma_transpose", "2-byte dtype"):
            nisa.dma_transpose(dst=nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf), src=f,
                               dge_mode=nisa.dge_mode.hwdge)
        with raises_rule("dma_transpose", "dtype agreement"):
            nisa.dma_transpose(dst=nl.ndarray((8, 16), nl.float16, buffer=nl.sbuf), src=a)
        with raises_rule("dma_transpose", "dst shape"):
            nisa.dma_transpose(dst=nl.ndarray((16, 8), a.dtype, buffer=nl.sbuf), src=a)
        with raises_rule("dma_transpose", "axes"):
            nisa.dma_transpose(dst=s, src=a, axes=(0, 1))
        with raises_rule("dma_transpose", "dst buffer"):
            nisa.dma_transpose(dst=nl.ndarray((8, 16), a.dtype, buffer=nl.hbm), src=a)
        with raises_rule("dma_transpose", "DMA PSUM access"):
            nisa.dma_transpose(dst=nl.ndarray((8, 16), a.dtype, buffer=nl.psum), src=a)
        with raises_rule("dma_transpose", "hwdge shape"):  # 2-D HWDGE needs shape[0] == 16
            nisa.dma_transpose(dst=nl.ndarray((16, 8), a.dtype, buffer=nl.sbuf),
                               src=a.reshape((8, 16)), dge_mode=nisa.dge_mode.hwdge)
        with raises_rule("dma_transpose", "oob_mode.skip without indirection"):
            nisa.dma_transpose(dst=s, src=a, oob_mode=nisa.oob_mode.skip)
        with raises_rule("dma_transpose", "index dtype"):
            nisa.dma_transpose(dst=nl.ndarray((16, 16), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[8, 16], [1, 16]], vector_offset=i32))
        with raises_rule("dma_transpose", "indirect shape"):  # src.shape[0] % 16
            nisa.dma_transpose(dst=nl.ndarray((16, 8), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[16, 8], [1, 16]], vector_offset=i))
        with raises_rule("dma_transpose", "index count"):  # 16 indices < 32 rows
            nisa.dma_transpose(dst=nl.ndarray((4, 32), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[4, 32], [1, 4]], vector_offset=i))
        bad_p = nl.ndarray((24, 1), nl.uint32, buffer=nl.sbuf)
        with raises_rule("dma_transpose", "index shape"):
            nisa.dma_transpose(dst=nl.ndarray((4, 16), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[4, 16], [1, 4]], vector_offset=bad_p))
        two_cols = nl.ndarray((64, 2), nl.uint32, buffer=nl.sbuf)
        with raises_rule("dma_transpose", "index shape"):  # >1 column needs 128 partitions
            nisa.dma_transpose(dst=nl.ndarray((4, 16), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[4, 16], [1, 4]], vector_offset=two_cols))
        with raises_rule("dma_transpose", "indirection requires swdge"):
            nisa.dma_transpose(dst=nl.ndarray((16, 16), a.dtype, buffer=nl.sbuf),
                               src=a.ap([[8, 16], [1, 16]], vector_offset=i),
                               dge_mode=nisa.dge_mode.hwdge)

    in_kernel(body, np.zeros((16, 8), BF16), np.zeros((16, 8), np.float32),
              np.zeros((16, 1), np.uint32), np.zeros((16, 1), np.int32))


def test_indirect_3d_transpose_and_4d_shape_rule():
    V = RNG.standard_normal((64, 2, 8)).astype(BF16)  # rows of (2, 8)
    idx = RNG.permutation(64)[:16].astype(np.uint32).reshape(16, 1)

    def body(v, ix):
        i = _load(ix)
        t = nl.ndarray((8, 2, 16), v.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=v.ap([[16, 16], [8, 2], [1, 8]], vector_offset=i))
        with raises_rule("dma_transpose", "indirect shape"):
            nisa.dma_transpose(dst=nl.ndarray((4, 2, 2, 16), v.dtype, buffer=nl.sbuf),
                               src=v.ap([[16, 16], [8, 2], [4, 2], [1, 4]], vector_offset=i))
        with raises_rule("dma_transpose", "rank"):
            nisa.dma_transpose(dst=nl.ndarray((16, 8), v.dtype, buffer=nl.sbuf),
                               src=v.ap([[16, 16], [1, 1], [1, 1], [1, 1], [1, 8]]))
        return _store(t)

    out = in_kernel(body, V, idx)
    np.testing.assert_array_equal(out, V[idx[:, 0]].transpose(2, 1, 0))
