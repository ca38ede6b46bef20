"""Uninitialised memory, hazards (R03, R05-R09), strict mode, error structure and quiet
floating point (docs/emulator.md, "Memory, hazards and strict mode").

The package's conftest runs emulator tests strict; tests of the default behaviour pass
``strict=False`` explicitly.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, nisa, nki, nl
from nkilib_msda.simulator.errors import NkiHazardWarning, nki_error
from nkilib_msda.simulator.jit import STRICT_ENV

from _core_helpers import in_kernel, raises_rule, randn
from _core_helpers import load as _load, store as _store

RNG = np.random.default_rng(2026)




def _hazards(caught, rule):
    return [w for w in caught if issubclass(w.category, NkiHazardWarning)
            and w.message.rule == rule]


# -- uninitialised memory -------------------------------------------------------------------
def _read_unwritten(a):
    f = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
    i = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf)
    out_f = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
    out_i = nl.ndarray((4, 8), nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_f, src=f)
    nisa.dma_copy(dst=out_i, src=i)
    return out_f, out_i


def test_default_uninitialised_reads_return_the_fill_pattern():
    out_f, out_i = in_kernel(_read_unwritten, np.zeros((1, 1), np.float32), strict=False)
    assert np.isnan(out_f).all()
    assert (out_i == 4).all()


def test_strict_mode_rejects_uninitialised_reads_by_argument_env_and_jit(monkeypatch):
    x = np.zeros((1, 1), np.float32)
    with raises_rule("dma_copy", "uninitialized read"):
        in_kernel(_read_unwritten, x, strict=True)
    monkeypatch.setenv(STRICT_ENV, "1")
    with raises_rule("dma_copy", "uninitialized read"):
        in_kernel(_read_unwritten, x)
    monkeypatch.delenv(STRICT_ENV)
    in_kernel(_read_unwritten, x)  # default: no error

    @nki.jit(strict=True)
    def k(a):
        return _read_unwritten(a)

    with raises_rule("dma_copy", "uninitialized read"):
        k(x)


def test_unwritten_outputs_are_nan_by_default_and_errors_when_strict():
    def body(a):
        return nl.ndarray((2, 3), nl.float32, buffer=nl.shared_hbm)

    assert np.isnan(in_kernel(body, np.zeros((1, 1), np.float32), strict=False)).all()
    with raises_rule("kernel return", "output not written"):
        in_kernel(body, np.zeros((1, 1), np.float32), strict=True)


# -- NkiError structure ---------------------------------------------------------------------
def test_nki_error_carries_structured_fields():
    e = nki_error("dma_copy", "DMA element count", "src has 3, dst 4")
    assert (e.instruction, e.rule, e.detail) == ("dma_copy", "DMA element count",
                                                 "src has 3, dst 4")
    assert str(e) == "dma_copy: DMA element count: src has 3, dst 4"
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.rule, str(back)) == (NkiError, e.rule, str(e))
    with pytest.raises(NkiError) as info:
        in_kernel(lambda a: nisa.dma_copy(dst=nl.ndarray((2, 2), nl.float32, buffer=nl.sbuf),
                                          src=a), np.zeros((3, 3), np.float32))
    assert (info.value.instruction, info.value.rule) == ("dma_copy", "DMA element count")


# -- quiet floating point ---------------------------------------------------------------------
def test_fp_warnings_never_escape_even_under_seterr_raise():
    x = np.array([[0.0, -1.0, 1e30, np.inf]], np.float32).repeat(4, axis=0)

    def body(a):
        t = _load(a)
        r = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=r, data=t)                    # 1/0
        e = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, scale=100.0)   # overflow
        d = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=e, data2=e, op=nl.subtract)  # inf - inf
        s = nl.ndarray(t.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s, data=t, op0=nl.multiply, operand0=1e30)  # fp32 overflow
        o = nl.ndarray(t.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=o, srcs=[e, e], reduce_op=nl.add)  # inf + inf in the DMA
        return _store(r), _store(d), o

    old = np.seterr(all="raise")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            r, d, o = in_kernel(body, x)
        assert np.geterr()["divide"] == "raise"  # the caller's setting is left alone
    finally:
        np.seterr(**old)
    assert np.isposinf(r[:, 0]).all() and (r[:, 1] == -1.0).all()
    assert np.isnan(d[:, 2]).all() and np.isposinf(o[:, 2]).all()


# -- R03 / R05 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_direct_four_byte_dma_transpose_is_accepted(dtype):
    # nki.isa.dma_transpose page: "src.dtype is 2 bytes" is an HWDGE/indirect constraint.
    a = (RNG.standard_normal((8, 16)) * 100).astype(dtype)

    def body(h):
        t = nl.ndarray((16, 8), h.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=h)
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, a), a.T)


def test_ap_offset_counts_from_the_view_start():
    a = RNG.standard_normal((4, 16)).astype(np.float32)

    def body(h):
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h[2:4].ap([[16, 2], [2, 4]], offset=1))  # rows 2..3, odd cols
        return _store(t)

    np.testing.assert_array_equal(in_kernel(body, a), a[2:4, 1:9:2])


# -- R06: dma_compute scales ---------------------------------------------------------------------
def test_dma_compute_negative_scale_is_a_hazard_warning_and_computed():
    x = RNG.standard_normal((2, 8, 6)).astype(np.float32)

    def body(a):
        s0, s1 = _load(a[0]), _load(a[1])
        out = nl.ndarray((8, 6), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=[s0, s1], reduce_op=nl.add, scales=[1, -1])
        return out

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = in_kernel(body, x, strict=False)
    assert len(_hazards(caught, "scales must be 1.0")) == 1
    np.testing.assert_array_equal(out, x[0] - x[1])
    with raises_rule("dma_compute", "scales must be 1.0"):
        in_kernel(body, x, strict=True)


# -- R07: duplicate scatter rows ---------------------------------------------------------------------
def _padded_scatter_add(g, data, idx):
    i = _load(idx)
    d = _load(data)
    acc = g.ap([[g.shape[1], idx.shape[0]], [1, g.shape[1]]], vector_offset=i)
    nisa.dma_compute(dst=acc, srcs=[acc, d], reduce_op=nl.add)
    return g


def test_padded_scatter_rows_aimed_at_row_zero_with_zero_data_warn():
    g, data = randn(RNG, (6, 4), (5, 4))
    data[3:] = 0.0  # two padded rows: zero data aimed at row 0
    idx = np.array([[0], [2], [5], [0], [0]], np.int32)
    expected = g.copy()
    for r in range(5):
        expected[idx[r, 0]] += data[r]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = in_kernel(_padded_scatter_add, g.copy(), data, idx, strict=False)
    assert len(_hazards(caught, "duplicate scatter indices")) == 1
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    with raises_rule("dma_compute", "duplicate scatter indices"):
        in_kernel(_padded_scatter_add, g.copy(), data, idx, strict=True)
    data[4] = 1.0  # two non-zero contributions to row 0: a real lost-update race
    with raises_rule("dma_compute", "duplicate scatter indices"):
        in_kernel(_padded_scatter_add, g.copy(), data, idx, strict=False)


def test_scatter_copy_duplicates_with_identical_data_warn_conflicting_raise():
    def body(dst, data, idx):
        i = _load(idx)
        d = _load(data)
        nisa.dma_copy(dst=dst.ap([[4, 3], [1, 4]], vector_offset=i), src=d)
        return dst

    dst = np.full((5, 4), -7.0, np.float32)
    data = np.stack([np.arange(4.0), np.arange(4.0), np.ones(4)]).astype(np.float32)
    idx = np.array([[1], [1], [3]], np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = in_kernel(body, dst.copy(), data, idx, strict=False)
    assert len(_hazards(caught, "duplicate scatter indices")) == 1
    np.testing.assert_array_equal(out[1], data[0])
    np.testing.assert_array_equal(out[3], data[2])
    data[1, 2] = 9.0
    with raises_rule("dma_copy", "duplicate scatter indices"):
        in_kernel(body, dst.copy(), data, idx, strict=False)


# -- R08 ---------------------------------------------------------------------------------------------
def test_multi_column_index_tiles_are_rejected_with_the_reason():
    def body(a, ix):
        i = _load(ix)
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[8, 4], [1, 8]], vector_offset=i))

    with pytest.raises(NkiError, match="undocumented") as info:
        in_kernel(body, np.zeros((8, 8), np.float32), np.zeros((4, 2), np.int32))
    assert info.value.rule == "vector_offset shape"


# -- R09: address= placement ---------------------------------------------------------------------
KIB = 1024


def _two_big_tiles(a, same_address):
    n = 100 * KIB // 4  # 100 KiB per partition each; two unplaced ones still fit (212,992 B)
    t1 = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf, address=(0, 0))
    t2 = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf,
                    address=(0, 0) if same_address else (0, 100 * KIB))
    t3 = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf, address=(0, 0))
    return t1, t2, t3


def test_tiles_sharing_an_address_are_one_allocation():
    def body(a):
        tiles = _two_big_tiles(a, same_address=True)
        nisa.memset(tiles[0], 1.0)
        return _store(tiles[0][0:2, 0:4])

    out, rep = in_kernel(body, np.zeros((1, 1), np.float32), report=True)
    assert (out == 1.0).all()
    assert rep.peak_sbuf_bytes_per_partition < 101 * KIB

    def unplaced(a):
        n = 100 * KIB // 4
        keep = [nl.ndarray((128, n), nl.float32, buffer=nl.sbuf) for _ in range(3)]
        return _store(keep[0][0:1, 0:1])

    with raises_rule("ndarray", "SBUF capacity"):
        in_kernel(unplaced, np.zeros((1, 1), np.float32))


def test_overlapping_live_placements_are_a_hazard():
    def body(a):
        t1 = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
        t2 = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf, address=(0, 128))  # overlaps
        t3 = nl.ndarray((64, 64), nl.float32, buffer=nl.sbuf, address=(64, 1024))  # disjoint
        return t1, t2, t3

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(NkiError):  # no output: the kernel returns on-chip tiles
            in_kernel(body, np.zeros((1, 1), np.float32), strict=False)
    assert len(_hazards(caught, "overlapping placement")) == 1
    with raises_rule("ndarray", "overlapping placement"):
        in_kernel(body, np.zeros((1, 1), np.float32), strict=True)


def test_overlapping_placements_are_reported_once_per_program():
    # an address-reusing allocator overlaps live handles many times; one warning per program
    def body(a):
        keep = [nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 64 * k))
                for k in range(5)]  # each overlaps the previous one
        t = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(t, float(len(keep)))
        return _store(t)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = in_kernel(body, np.zeros((1, 1), np.float32), strict=False)
    assert float(out[0, 0]) == 5.0
    assert len(_hazards(caught, "overlapping placement")) == 1


def test_placement_outside_the_partition_is_rejected():
    def body(a):
        nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 224 * KIB - 128))

    with raises_rule("ndarray", "SBUF placement"):
        in_kernel(body, np.zeros((1, 1), np.float32))


def test_dma_compute_scales_apply_per_source_in_both_rmw_forms():
    g, data = randn(RNG, (6, 4), (3, 4))
    idx = np.array([[5], [0], [2]], np.int32)

    def scatter(out, d, ix):
        acc = out.ap([[4, 3], [1, 4]], vector_offset=_load(ix))
        nisa.dma_compute(dst=acc, srcs=[acc, _load(d)], reduce_op=nl.add, scales=[1.0, -1.0])
        return out

    def gather(src, d, ix):
        t = _load(d)
        nisa.dma_compute(dst=t, srcs=[src.ap([[4, 3], [1, 4]], vector_offset=_load(ix)), t],
                         reduce_op=nl.add, scales=[-2.0, 1.0])
        return _store(t)

    expected = g.copy()
    expected[idx[:, 0]] -= data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NkiHazardWarning)
        np.testing.assert_array_equal(in_kernel(scatter, g.copy(), data, idx, strict=False),
                                      expected)
        np.testing.assert_array_equal(in_kernel(gather, g, data, idx, strict=False),
                                      data - 2.0 * g[idx[:, 0]])
