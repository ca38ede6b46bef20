"""Tensor indexing, view methods and .ap() access patterns (docs/emulator.md)."""

import numpy as np
import pytest

from nkilib_msda.simulator import access, nisa, nl

from _core_helpers import in_kernel, raises_rule


def _sbuf_from(arr, dtype=None, name="t"):
    t = nl.ndarray(arr.shape, dtype or nl.float32, buffer=nl.sbuf, name=name)
    access.write(t, arr.reshape(-1), "test")
    return t


def test_on_chip_int_index_keeps_partition_dim_and_2d():
    def body(a):
        t = nl.ndarray((128, 4, 16), nl.float32, buffer=nl.sbuf)
        assert t[0, 0, 10].shape == (1, 1)
        assert t[:, 0, 10].shape == (128, 1)
        assert t[5].shape == (1, 4, 16)
        assert t[2:6, 1].shape == (4, 16)
        assert t[..., 3].shape == (128, 4)
        assert t[nl.ds(32, 32), :, 0:8].shape == (32, 4, 8)
        assert t[-1].offset == 127 * 64
        h = nl.ndarray((3, 4, 5), nl.float32, buffer=nl.hbm)
        assert h[1].shape == (4, 5)
        assert h[1, 2].shape == (5,)
        assert h[:, 1, 2].shape == (3,) and h[:, 1, 2].strides == (20,)
        assert h[1, 2, 3].shape == () and h[1, 2, 3].offset == 20 + 10 + 3
        assert h[0:3:2, ::2].shape == (2, 2, 5) and h[0:3:2, ::2].strides == (40, 10, 1)
    in_kernel(body, np.zeros(1, np.float32))


def test_indexed_views_read_the_right_elements():
    x = np.arange(2 * 6 * 8, dtype=np.float32).reshape(2, 6, 8)

    def body(a):
        t = nl.ndarray((6, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[1])
        out = nl.ndarray((2, 3), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[2:4, 1:7:2])
        return out

    np.testing.assert_array_equal(in_kernel(body, x), x[1, 2:4, 1:7:2])


@pytest.mark.parametrize("key, rule", [
    ((slice(0, 200),), "slice out of range"),
    ((slice(6, 5),), "slice out of range"),
    ((slice(0, 4, 0),), "slice step"),
    ((slice(0, 4, 2),), "partition step"),
    ((128,), "index out of range"),
    ((np.array([1, 2]),), "index type"),
    ((0, 0, 0), "too many indices"),
])
def test_bad_indices_raise(key, rule):
    def body(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        with raises_rule("tensor indexing", rule):
            t[key]
    in_kernel(body, np.zeros(1, np.float32))


def test_empty_slice_is_a_zero_size_view():
    # nki-library slices a core's (possibly empty) shard as t[start:start + n] with n = 0
    def body(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        assert t[5:5].shape == (0, 8) and t[:, 3:3].shape == (128, 0)
        assert a[2:2].shape[0] == 0
    in_kernel(body, np.ones((4, 4), np.float32))


def test_view_methods_shapes_strides_and_values():
    x = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)

    def body(a):
        s = a.slice(1, 1, 5, 2)
        assert s.shape == (4, 2, 8) and s.strides == (48, 16, 1) and s.offset == 8
        p = a.permute((2, 0, 1))
        assert p.shape == (8, 4, 6) and p.strides == (1, 48, 8)
        e = a.expand_dim(1)
        assert e.shape == (4, 1, 6, 8)
        b = e.broadcast(1, 3)
        assert b.shape == (4, 3, 6, 8) and b.strides[1] == 0
        sq = e.squeeze_dim(1)
        assert sq.shape == a.shape and sq.strides == a.strides
        r = a.reshape_dim(2, (2, 4))
        assert r.shape == (4, 6, 2, 4) and r.strides == (48, 8, 4, 1)
        f = a.flatten_dims(1, 2)
        assert f.shape == (4, 48) and f.strides == (48, 1)
        assert a.reshape((24, 8)).strides == (8, 1)
        assert a.reshape((-1,)).shape == (192,)
        sel = a.select(1, 2)
        assert sel.shape == (4, 8) and sel.offset == 16
        outs = []
        for view in (s, p, b, sel):
            o = nl.ndarray(view.shape, nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=view)
            outs.append(o)
        return tuple(outs)

    s, p, b, sel = in_kernel(body, x)
    np.testing.assert_array_equal(s, x[:, 1:5:2])
    np.testing.assert_array_equal(p, x.transpose(2, 0, 1))
    np.testing.assert_array_equal(b, np.broadcast_to(x[:, None], (4, 3, 6, 8)))
    np.testing.assert_array_equal(sel, x[:, 2])


def test_on_chip_view_methods_keep_partition_dim():
    def body(a):
        t = nl.ndarray((64, 4, 8), nl.float32, buffer=nl.sbuf)
        with raises_rule("permute", "partition dim"):
            t.permute((1, 0, 2))
        with raises_rule("broadcast", "partition dim"):
            nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf).broadcast(0, 4)
        with raises_rule("select", "partition dim"):
            t.select(0, 1)
        with raises_rule("reshape", "partition dim"):
            t.reshape((32, 64))
        with raises_rule("flatten_dims", "partition dim"):
            t.flatten_dims(0, 1)
        with raises_rule("broadcast", "size-1 dim"):
            t.broadcast(1, 3)
        with raises_rule("reshape_dim", "element count"):
            t.reshape_dim(1, (3, 2))
        assert t.reshape((64, 32)).strides == (32, 1)
        assert t.permute((0, 2, 1)).strides == (32, 1, 8)
        with raises_rule("reshape", "contiguity"):
            t.permute((0, 2, 1)).reshape((64, 32))
        with raises_rule("flatten_dims", "contiguity"):
            t.permute((0, 2, 1)).flatten_dims(1, 2)
    in_kernel(body, np.zeros(1, np.float32))


def test_hbm_reshape_of_non_contiguous_view_fails():
    def body(a):
        with raises_rule("reshape", "contiguity"):
            a[:, 0:4].reshape((16,))
        with raises_rule("reshape", "element count"):
            a.reshape((5, 5))
    in_kernel(body, np.zeros((4, 8), np.float32))


def test_view_dtype_reinterprets_bits():
    x = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)

    def body(a):
        v = a.view(nl.int32)
        assert v.shape == (2, 2)
        h = a.view(nl.bfloat16)
        assert h.shape == (2, 4) and h.strides == (4, 1)
        o1 = nl.ndarray((2, 2), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=v)
        t = nl.ndarray((2, 2), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        tv = t.view(nl.uint16)
        assert tv.shape == (2, 4) and tv.strides == (4, 1)
        o2 = nl.ndarray((2, 4), nl.uint16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=tv)
        return o1, o2

    o1, o2 = in_kernel(body, x)
    np.testing.assert_array_equal(o1, x.view(np.int32))
    np.testing.assert_array_equal(o2, x.view(np.uint16))


def test_ap_pattern_values_and_offset_inheritance():
    x = np.arange(64, dtype=np.float32).reshape(8, 8)

    def body(a):
        v = a.ap([[16, 4], [1, 3]], offset=2)  # rows 0,2,4,6 cols 2..4
        w = a[1:].ap([[8, 2], [2, 4]])  # offset None inherits 8 (row 1)
        assert w.offset == 8
        sliced = a[2:4, 0:2].ap([[1, 48]], offset=None)  # not composable: ignores shape
        assert sliced.shape == (48,) and sliced.offset == 16
        o1 = nl.ndarray((4, 3), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=v)
        o2 = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=w)
        return o1, o2

    o1, o2 = in_kernel(body, x)
    np.testing.assert_array_equal(o1, x.reshape(-1)[2:][np.arange(4)[:, None] * 16 + np.arange(3)])
    np.testing.assert_array_equal(o2, x[1:3, 0:8:2])


def test_ap_dtype_reinterprets_with_counts_in_new_dtype():
    x = np.arange(8, dtype=np.float32)

    def body(a):
        v = a.ap([[2, 4], [1, 2]], dtype=nl.bfloat16)
        assert v.dtype == nl.bfloat16 and v.shape == (4, 2)
        o = nl.ndarray((4, 2), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=v)
        return o

    # element (r, c) of the bf16 view is bf16 element 2r + c = the r-th float32's halves
    np.testing.assert_array_equal(in_kernel(body, x).view(np.uint16),
                                  x[:4].view(np.uint16).reshape(4, 2))


def test_ap_on_chip_partition_pair():
    def body(a):
        t = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        ok = t.ap([[16, 64], [1, 8]], offset=32 * 16 + 4)
        assert ok.shape == (64, 8) and ok.start_partition == 32
        with raises_rule("ap", "partition stride"):
            t.ap([[8, 64], [1, 8]])
        with raises_rule("ap", "partition count"):
            t.ap([[16, 129], [1, 8]])
        with raises_rule("ap", "free levels"):
            t.ap([[16, 4], [1, 1], [1, 1], [1, 1], [1, 1], [1, 1]])
        with raises_rule("ap", "out of bounds"):
            t.ap([[16, 128], [1, 17]])
        with raises_rule("ap", "out of bounds"):
            t.ap([[16, 100], [1, 16]], offset=64 * 16)
    in_kernel(body, np.zeros(1, np.float32))


def test_ap_explicit_offset_is_relative_to_the_receiver_view():
    # NKI 0.8 (nki-aps page: "the offset from the beginning of the tensor"): an explicit
    # offset on an already-offset view counts from that view's start (R05; was rejected).
    def body(a):
        v = a[1:].ap([[8, 2], [1, 8]], offset=3)
        assert v.offset == 8 + 3 and v.shape == (2, 8)
        w = a[2:].ap([[8, 2], [1, 8]], offset=0)
        assert w.offset == 16
        with raises_rule("ap", "out of bounds"):
            a.ap([[8, 9], [1, 8]])
        with raises_rule("ap", "exclusive offsets"):
            idx = nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf)
            a.ap([[8, 2], [1, 8]], scalar_offset=idx[0:1, 0:1], vector_offset=idx)
    in_kernel(body, np.zeros((8, 8), np.float32))


def test_ap_vector_offset_rules():
    def body(a):
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        fidx = nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf)
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        with raises_rule("ap", "vector_offset receiver"):
            t.ap([[8, 4], [1, 8]], vector_offset=idx)
        with raises_rule("ap", "indirect_dim"):
            a.ap([[8, 4], [1, 8]], vector_offset=idx, indirect_dim=1)
        with raises_rule("ap", "vector_offset"):
            a.ap([[8, 4], [1, 8]], vector_offset=fidx)
        with raises_rule("ap", "vector_offset with dtype"):
            a.ap([[8, 4], [1, 16]], vector_offset=idx, dtype=nl.bfloat16)
    in_kernel(body, np.zeros((8, 8), np.float32))


def test_setitem_copies_with_cast():
    x = np.array([[0.5, 1.5, -2.5, 2.6]], np.float32)

    def body(a):
        f = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=a)
        i = nl.ndarray((1, 8), nl.int32, buffer=nl.sbuf)
        i[:, 0:4] = f
        i[:, 4:8] = 7
        o = nl.ndarray((1, 8), nl.int32, buffer=nl.shared_hbm)
        o[...] = i
        return o

    out, rep = in_kernel(body, x, report=True)
    assert out.tolist() == [[0, 2, -2, 3, 7, 7, 7, 7]]
    assert rep.instruction_count("vector", "tensor_copy") == 1
    assert rep.instruction_count("dma", "dma_copy") == 2


def test_compute_ops_reject_dynamic_views():
    def body(a):
        idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        with raises_rule("test", "dynamic access"):
            access.read(a.ap([[8, 4], [1, 8]], vector_offset=idx), "test")
    in_kernel(body, np.zeros((8, 8), np.float32))


def test_on_chip_select_stays_2d():
    def body(a):
        t = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        v = t.select(1, 3)
        assert v.shape == (8, 1) and v.offset == 3 and v.strides[0] == 4
        assert nl.ndarray((8, 2, 4), nl.float32, buffer=nl.sbuf).select(2, 1).shape == (8, 2)
    in_kernel(body, np.zeros(1, np.float32))
