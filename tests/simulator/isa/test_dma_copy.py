"""nisa.dma_copy: direct copies, indirect gather/scatter, OOB handling, and its rules."""

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import access, nisa, nl

from _core_helpers import gather_inputs, gather_rows, in_kernel, raises_rule, randn
from _core_helpers import load as _load, store as _store

RNG = np.random.default_rng(1234)




def test_direct_copy_casts_via_fp32_with_nki_rules():
    x = np.array([[0.5, 1.5, -2.5, 3e10, 1 + 2**-8, -0.0]], np.float32)

    def body(a):
        i = _load(a, nl.int32)
        b = _load(a, nl.bfloat16)
        return _store(i), _store(b)

    i, b = in_kernel(body, x)
    assert i.tolist() == [[0, 2, -2, 2**31 - 1, 1, 0]]
    assert b.dtype == ml_dtypes.bfloat16
    assert b.astype(np.float32).tolist() == [[0.5, 1.5, -2.5, np.float32(ml_dtypes.bfloat16(3e10)), 1.0, -0.0]]


def test_copy_pairs_elements_row_major_across_shapes():
    x = RNG.standard_normal((4, 6)).astype(np.float32)

    def body(a):
        t = nl.ndarray((2, 12), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, x), x.reshape(2, 12))


def test_indirect_gather_row_idx_p_to_partition_p():
    table, idx = gather_inputs(RNG, (50, 8), (32, 1))

    def body(v, ix):
        return _store(gather_rows(v, _load(ix), 32))

    np.testing.assert_array_equal(in_kernel(body, table, idx), table[idx[:, 0]])


def test_vector_offset_is_scaled_by_receiver_dim0_stride():
    # Receiver (N, H, C): stride0 = H*C. The pattern's first stride (here 1) is ignored.
    N, H, C = 10, 3, 4
    v = np.arange(N * H * C, dtype=np.float32).reshape(N, H, C)
    idx = np.array([[7], [0], [9], [3]], np.int32)
    h = 2

    def body(val, ix):
        i = _load(ix)
        t = nl.ndarray((4, C), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=val.ap([[1, 4], [1, C]], offset=h * C, vector_offset=i))
        flat = nl.ndarray((4, 2), nl.float32, buffer=nl.sbuf)
        # 1-D receiver: indices are raw element offsets.
        nisa.dma_copy(dst=flat, src=val.reshape((N * H * C,)).ap([[999, 4], [1, 2]],
                                                                    vector_offset=i))
        return _store(t), _store(flat)

    t, flat = in_kernel(body, v, idx)
    np.testing.assert_array_equal(t, v[idx[:, 0], h, :])
    np.testing.assert_array_equal(flat, v.reshape(-1)[idx[:, 0, None] + np.arange(2)])


def test_vector_offset_on_a_sliced_receiver_inherits_its_offset_and_stride():
    v = np.arange(12 * 6, dtype=np.float32).reshape(12, 6)
    idx = np.array([[1], [4], [2]], np.uint32)

    def body(val, ix):
        i = _load(ix)
        t = nl.ndarray((3, 2), nl.float32, buffer=nl.sbuf)
        recv = val[2:, 3:5]  # offset 2*6+3, stride0 = 6
        nisa.dma_copy(dst=t, src=recv.ap([[6, 3], [1, 2]], vector_offset=i))
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, v, idx), v[2:][idx[:, 0], 3:5])


def test_indirect_scatter():
    dst, data = randn(RNG, (20, 4), (5, 4))
    idx = np.array([[3], [19], [0], [7], [8]], np.int32)
    expected = dst.copy()
    expected[idx[:, 0]] = data

    def body(d, x, ix):
        i = _load(ix)
        t = _load(x)
        nisa.dma_copy(dst=d.ap([[4, 5], [1, 4]], vector_offset=i), src=t)
        return d

    out = in_kernel(body, dst, data, idx)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(dst, expected)  # written back in place


def test_duplicate_scatter_indices_raise_or_last_writer_wins():
    dst = np.zeros((6, 2), np.float32)
    data = np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    idx = np.array([[4], [1], [4]], np.int32)

    def body(d, x, ix):
        nisa.dma_copy(dst=d.ap([[2, 3], [1, 2]], vector_offset=_load(ix)), src=_load(x))
        return d

    with raises_rule("dma_copy", "duplicate scatter indices"):
        in_kernel(body, dst.copy(), data, idx)
    out = in_kernel(body, dst.copy(), data, idx, duplicate_scatter="last_writer_wins")
    assert out[1].tolist() == [2, 2] and out[4].tolist() in ([1, 1], [3, 3])


def test_overlapping_scatter_rows_count_as_duplicates():
    # Rows of 4 elements on a 1-D receiver: offsets 0 and 2 overlap in elements 2..3.
    def body(d, ix):
        t = nl.full((2, 4), 1.0, nl.float32)
        nisa.dma_copy(dst=d.ap([[1, 2], [1, 4]], vector_offset=_load(ix)), src=t)
        return d

    with raises_rule("dma_copy", "duplicate scatter indices"):
        in_kernel(body, np.zeros(16, np.float32), np.array([[0], [2]], np.int32))
    out = in_kernel(body, np.zeros(16, np.float32), np.array([[0], [4]], np.int32))
    assert out.tolist() == [1.0] * 8 + [0.0] * 8


@pytest.mark.parametrize("bad", [-1, 20, 2**31 - 1])
def test_oob_gather_error_and_skip(bad):
    table = RNG.standard_normal((20, 3)).astype(np.float32)
    idx = np.array([[2], [bad], [5]], np.int32)

    def body(v, ix, skip):
        i = _load(ix)
        t = nl.full((3, 3), -7.0, nl.float32)
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_copy(dst=t, src=v.ap([[3, 3], [1, 3]], vector_offset=i), oob_mode=mode)
        return _store(t)

    with raises_rule("dma_copy", "out-of-bounds index"):
        in_kernel(body, table, idx, False)
    out = in_kernel(body, table, idx, True)
    np.testing.assert_array_equal(out[[0, 2]], table[[2, 5]])
    assert out[1].tolist() == [-7.0] * 3  # skipped row: dst unchanged


def test_oob_row_partially_outside_is_oob_and_scatter_skip_leaves_hbm():
    dst = np.arange(10, dtype=np.float32)  # 1-D receiver, rows of 3 elements
    idx = np.array([[0], [8]], np.int32)  # row 2 would cover 8..10: element 10 is outside

    def body(d, ix, skip):
        t = nl.full((2, 3), -1.0, nl.float32)
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_copy(dst=d.ap([[1, 2], [1, 3]], vector_offset=_load(ix)), src=t, oob_mode=mode)
        return d

    with raises_rule("dma_copy", "out-of-bounds index"):
        in_kernel(body, dst.copy(), idx, False)
    out = in_kernel(body, dst.copy(), idx, True)
    assert out.tolist() == [-1, -1, -1, 3, 4, 5, 6, 7, 8, 9]


def test_indices_are_read_when_the_instruction_executes():
    table = np.arange(8, dtype=np.float32).reshape(8, 1)

    def body(v, ix):
        i = _load(ix)
        src = v.ap([[1, 2], [1, 1]], vector_offset=i)  # built before the indices change
        access.write(i, np.array([6, 7]), "test")
        t = nl.ndarray((2, 1), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        return _store(t)

    assert in_kernel(body, table, np.array([[0], [1]], np.int32)).tolist() == [[6.0], [7.0]]


def test_scalar_offset_and_dynamic_select():
    v = np.arange(24, dtype=np.float32).reshape(6, 4)

    def body(val, s):
        reg = _load(s)  # (1, 1) int32 = 3
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=val.ap([[4, 2], [1, 4]], scalar_offset=reg, indirect_dim=0))
        u = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=val.select(0, reg))
        with raises_rule("tensor_copy", "dynamic access"):
            access.check_compute_partitions("tensor_copy", val.select(0, reg))
        return _store(t), _store(u)

    t, u = in_kernel(body, v, np.array([[3]], np.int32))
    np.testing.assert_array_equal(t, v[3:5])
    np.testing.assert_array_equal(u, v[3:4])


def test_dma_copy_rules():
    def body(a, ix):
        s = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        p = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        i = _load(ix)
        gather = a.ap([[4, 4], [1, 4]], vector_offset=i)
        with raises_rule("dma_copy", "DMA PSUM access"):
            nisa.dma_copy(dst=p, src=s)
        with raises_rule("dma_copy", "DMA PSUM access"):
            nisa.dma_copy(dst=s, src=p)
        with raises_rule("dma_copy", "DMA element count"):
            nisa.dma_copy(dst=s[:, 0:3], src=a)
        with raises_rule("dma_copy", "hwdge dtype"):
            nisa.dma_copy(dst=nl.ndarray((4, 4), nl.bfloat16, buffer=nl.sbuf), src=a,
                          dge_mode=nisa.dge_mode.hwdge)
        nisa.dma_copy(dst=s, src=a, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)
        with raises_rule("dma_copy", "engine requires hwdge"):
            nisa.dma_copy(dst=s, src=a, engine=nisa.engine.sync)
        with raises_rule("dma_copy", "oob_mode.skip without indirection"):
            nisa.dma_copy(dst=s, src=a, oob_mode=nisa.oob_mode.skip)
        with raises_rule("dma_copy", "indirection requires swdge"):
            nisa.dma_copy(dst=s, src=gather, dge_mode=nisa.dge_mode.hwdge)
        with raises_rule("dma_copy", "enum argument"):  # NKI 0.8: raw values accepted, others not
            nisa.dma_copy(dst=s, src=a, dge_mode=7)
        with raises_rule("dma_copy", "one indirection"):
            nisa.dma_copy(dst=a.ap([[4, 4], [1, 4]], vector_offset=i), src=gather)
        with raises_rule("dma_copy", "overlapping destination"):
            nisa.dma_copy(dst=nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf).broadcast(1, 4), src=a)
        multi = nl.ndarray((4, 2), nl.int32, buffer=nl.sbuf)
        with raises_rule("dma_copy", "vector_offset shape"):
            nisa.dma_copy(dst=s, src=a.ap([[4, 4], [1, 4]], vector_offset=multi))
        with raises_rule("dma_copy", "vector_offset shape"):
            nisa.dma_copy(dst=s[0:2], src=a.ap([[4, 2], [1, 4]], vector_offset=i))
        nisa.dma_copy(dst=s, src=gather, dge_mode=nisa.dge_mode.swdge)
    in_kernel(body, np.ones((4, 4), np.float32), np.arange(4, dtype=np.int32).reshape(4, 1))


def test_dma_copy_report_counts_bytes_and_descriptors():
    table = RNG.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    idx = RNG.permutation(64)[:32].reshape(32, 1).astype(np.int32)

    def body(v, ix):
        i = _load(ix)  # 32*4 B direct hbm->sbuf
        t = nl.ndarray((32, 2, 4), nl.float32, buffer=nl.sbuf)
        # rows of 8 elements in two runs of 4 (cols 0..3 and 8..11): 2 descriptors of 8 B
        nisa.dma_copy(dst=t, src=v.ap([[16, 32], [8, 2], [1, 4]], vector_offset=i))
        return _store(t)  # 32*8*4 B sbuf->hbm

    out, rep = in_kernel(body, table, idx, report=True)
    np.testing.assert_array_equal(out.reshape(32, 8),
                                  table[idx[:, 0]][:, [0, 1, 2, 3, 8, 9, 10, 11]].astype(np.float32))
    d = rep.to_dict()["dma"]
    g = d["indirect_gather/hbm_to_sbuf"]
    assert g["instructions"] == 1 and g["elements"] == 256
    assert g["bytes"] == 256 * 4 and g["hbm_bytes"] == 256 * 2
    assert g["descriptors"] == 64 and g["descriptor_bytes_histogram"] == {8: 64}
    assert d["direct/hbm_to_sbuf"]["bytes"] == 128
    assert d["direct/sbuf_to_hbm"]["bytes"] == 1024
    assert rep.instruction_count("dma") == 3
    assert "exact counts" in str(rep) and "modelled time" in str(rep)


def test_vector_select_gathers_rows():
    v = RNG.standard_normal((9, 2, 3)).astype(np.float32)
    idx = np.array([[8], [0], [4]], np.int32)

    def body(val, ix):
        rows = val.vector_select(0, _load(ix))
        assert rows.shape == (3, 2, 3)
        t = nl.ndarray((3, 6), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=rows)
        with raises_rule("vector_select", "buffer"):
            t.vector_select(0, _load(ix))
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, v, idx), v[idx[:, 0]].reshape(3, 6))


def test_dynamic_offset_out_of_bounds():
    v = np.arange(12, dtype=np.float32).reshape(6, 2)

    def body(val, s, skip):
        t = nl.full((2, 2), -1.0, nl.float32)
        mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
        nisa.dma_copy(dst=t, src=val.ap([[2, 2], [1, 2]], scalar_offset=_load(s)), oob_mode=mode)
        return _store(t)

    with raises_rule("dma_copy", "out-of-bounds index"):
        in_kernel(body, v, np.array([[5]], np.int32), False)
    assert in_kernel(body, v, np.array([[5]], np.int32), True).tolist() == [[-1, -1], [-1, -1]]
    assert in_kernel(body, v, np.array([[4]], np.int32), False).tolist() == [[8, 9], [10, 11]]


def test_dynamic_select_value_must_index_the_dim():
    v = np.arange(12, dtype=np.float32).reshape(6, 2)

    def body(val, s):
        t = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=val[0:4].select(0, _load(s)))  # value 4 stays in storage
        return _store(t)

    with raises_rule("dma_copy", "out-of-bounds index"):
        in_kernel(body, v, np.array([[4]], np.int32))
    assert in_kernel(body, v, np.array([[3]], np.int32)).tolist() == [[6, 7]]


@pytest.mark.parametrize("shape, strides, overlap", [
    ((4, 8), (8, 1), False), ((4, 8), (16, 2), False), ((4, 8), (4, 1), True),
    ((4, 1, 8), (8, 0, 1), False), ((4, 2, 8), (8, 0, 1), True), ((8, 4), (1, 8), False),
])
def test_may_overlap(shape, strides, overlap):
    assert access.may_overlap(shape, strides) is overlap


# -- full_indirect: index tiles as AWS issues them (NKILIB_MSDA_EMULATOR_FULL_INDIRECT) ----------
def test_full_indirect_needs_128_partitions_from_partition_0(monkeypatch):
    from nkilib_msda.simulator.jit import FULL_INDIRECT_ENV

    table, idx = gather_inputs(RNG, (300, 8), (128, 2))

    def body(v, ix, rows, first):
        i = _load(ix)
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rows], src=v.ap([[8, rows], [1, 8]],
                                              vector_offset=i[first:first + rows, 0:1]))
        return _store(t[0:rows])

    # off (the default): any partitions
    got = in_kernel(lambda v, ix: body(v, ix, 64, 64), table, idx)
    np.testing.assert_array_equal(got, table[idx[64:128, 0]])
    monkeypatch.setenv(FULL_INDIRECT_ENV, "1")
    got = in_kernel(lambda v, ix: body(v, ix, 128, 0), table, idx)
    np.testing.assert_array_equal(got, table[idx[:, 0]])
    for rows, first in ((64, 0), (64, 64), (32, 96)):
        with raises_rule("dma_copy", "indirect DMA partitions"):
            in_kernel(lambda v, ix: body(v, ix, rows, first), table, idx)


def test_full_indirect_needs_aligned_multi_column_index_tiles(monkeypatch):
    from nkilib_msda.simulator.jit import FULL_INDIRECT_ENV

    monkeypatch.setenv(FULL_INDIRECT_ENV, "1")
    table = RNG.standard_normal((512, 16)).astype(ml_dtypes.bfloat16)
    idx = RNG.integers(0, 512, (128, 8)).astype(np.uint32)

    def body(v, ix, col, m):
        i = _load(ix)
        t = nl.ndarray((16, m * 128), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=v.ap([[16, m * 128], [1, 16]],
                                           vector_offset=i[:, col:col + m]))
        return _store(t)

    for col, m in ((0, 2), (4, 4), (3, 1)):    # 16-byte aligned, or a single column
        got = in_kernel(lambda v, ix: body(v, ix, col, m), table, idx)
        np.testing.assert_array_equal(got, table[idx[:, col:col + m].T.reshape(-1)].T)
    with raises_rule("dma_transpose", "index tile alignment"):
        in_kernel(lambda v, ix: body(v, ix, 1, 2), table, idx)
