"""Tensor-engine matmul/transposes and their accumulation semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _compute_helpers import load, randn, rng, run
from nkilib_msda.simulator import NkiError, nisa, nl

F32 = np.float32


def test_nc_matmul_fp32_and_bf16_inputs_flatten_free_dims():
    g = rng(20)
    st = g.standard_normal((64, 2, 8)).astype(F32)  # K=64, M=16
    mv = g.standard_normal((64, 3, 40)).astype(F32)  # N=120
    st_bf = st.astype(ml_dtypes.bfloat16)
    mv_bf = mv.astype(ml_dtypes.bfloat16)

    def body(hs, hm, hsb, hmb):
        out = nl.ndarray((16, 120), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, load(hs), load(hm))
        out_bf = nl.ndarray((16, 3, 40), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out_bf, load(hsb), load(hmb), accumulate=False)
        return out, out_bf

    out, out_bf, report = run(body, st, mv, st_bf, mv_bf, report=True)
    ref = st.reshape(64, 16).astype(np.float64).T @ mv.reshape(64, 120)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    ref_bf = (st_bf.astype(np.float64).reshape(64, 16).T @ mv_bf.astype(np.float64).reshape(64, 120))
    np.testing.assert_allclose(out_bf.reshape(16, 120), ref_bf, rtol=1e-5, atol=1e-5)
    assert report.instruction_count("tensor", "nc_matmul") == 2


def test_nc_matmul_accumulation_group_and_auto_detect():
    g = rng(21)
    a = [g.standard_normal((32, 8)).astype(F32) for _ in range(3)]
    b = [g.standard_normal((32, 10)).astype(F32) for _ in range(3)]

    def body(a0, a1, a2, b0, b1):
        sa = [load(a0), load(a1), load(a2)]
        sb = [load(b0), load(b1)]
        acc = nl.ndarray((8, 10), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, sa[0], sb[0], accumulate=False)
        nisa.nc_matmul(acc, sa[1], sb[1], accumulate=True)
        auto = nl.ndarray((8, 10), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(auto, sa[2], sb[0])  # None on fresh PSUM: overwrites
        nisa.nc_matmul(auto, sa[0], sb[1])  # None after a matmul: accumulates
        nisa.nc_matmul(acc, sa[2], sb[1], accumulate=False)  # restarts the group
        return acc, auto

    acc, auto = run(body, a[0], a[1], a[2], b[0], b[1])
    mm = lambda x, y: x.astype(np.float64).T @ y  # noqa: E731
    np.testing.assert_allclose(acc, mm(a[2], b[1]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(auto, mm(a[2], b[0]) + mm(a[0], b[1]), rtol=1e-5, atol=1e-5)


def test_nc_matmul_accumulate_true_needs_prior_overwrite():
    a = rng(22).standard_normal((4, 4)).astype(F32)

    def fresh(ha):
        x = load(ha)
        acc = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, x, x, accumulate=True)
        return acc

    def after_memset(ha):
        x = load(ha)
        acc = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(acc, 0.0)
        nisa.nc_matmul(acc, x, x, accumulate=True)
        return acc

    def after_copy(ha):
        x = load(ha)
        acc = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, x, x, accumulate=False)
        nisa.tensor_copy(acc, x)
        nisa.nc_matmul(acc, x, x, accumulate=True)
        return acc

    for body in (fresh, after_memset, after_copy):
        with pytest.raises(NkiError, match="nc_matmul: accumulate without overwrite"):
            run(body, a)


def test_nc_matmul_sizes_and_bf16_dst_on_trn3():
    st, mv = randn(rng(23), (8, 4), (8, 1024))

    def body(hs, hm):
        out = nl.ndarray((4, 1024), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(out, load(hs, dtype=nl.bfloat16), load(hm, dtype=nl.bfloat16))
        return out

    got = run(body, st, mv, target="trn3")
    ref = (st.astype(ml_dtypes.bfloat16).astype(np.float64).T
           @ mv.astype(ml_dtypes.bfloat16).astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2 ** -7, atol=1e-2)
    with pytest.raises(NkiError, match="nc_matmul: dst dtype"):
        run(body, st, mv, target="trn2")


def test_nc_matmul_transpose_mode_is_bit_exact():
    data = rng(24).standard_normal((16, 24)).astype(F32)
    data[0, 0] = np.nan
    data[3, 5] = np.inf

    def body(hd):
        x = load(hd)
        ident = nl.shared_identity_matrix(16, dtype=nl.float32)
        out = nl.ndarray((24, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, x, ident, is_transpose=True)
        return out

    got = run(body, data)
    np.testing.assert_array_equal(got.view(np.uint32), data.T.copy().view(np.uint32))


def test_nc_transpose_tensor_and_vector_engines():
    g = rng(25)
    big = g.standard_normal((128, 2, 40)).astype(ml_dtypes.bfloat16)
    small = g.integers(-100, 100, size=(20, 30)).astype(np.int32)

    def body(hb, hs):
        pe_out = nl.ndarray((80, 128), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(pe_out, load(hb))
        ve_out = nl.ndarray((30, 20), dtype=nl.int32, buffer=nl.sbuf)
        nisa.nc_transpose(ve_out, load(hs, buffer=nl.psum))
        forced = nl.ndarray((30, 20), dtype=nl.int32, buffer=nl.psum)
        nisa.nc_transpose(forced, load(hs), engine=nisa.engine.vector)
        return pe_out, ve_out, forced

    pe_out, ve_out, forced, report = run(body, big, small, report=True)
    np.testing.assert_array_equal(pe_out.view(np.uint16), big.reshape(128, 80).T.view(np.uint16))
    np.testing.assert_array_equal(ve_out, small.T)
    np.testing.assert_array_equal(forced, small.T)
    assert report.instruction_count("tensor", "nc_transpose") == 1
    assert report.instruction_count("vector", "nc_transpose") == 2


def test_pe_transpose_starts_an_accumulation_group():
    a = rng(26).standard_normal((8, 8)).astype(F32)

    def body(ha):
        x = load(ha)
        out = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(out, x)
        nisa.nc_matmul(out, x, x, accumulate=True)
        return out

    np.testing.assert_allclose(run(body, a), a.T + a.astype(np.float64).T @ a, rtol=1e-5, atol=1e-5)


def test_accumulate_after_view_assignment_into_psum_is_flagged():
    """`psum_view[...] = tile` is a copy, not an overwriting matmul: accumulating on it is UB."""
    import numpy as np
    import pytest

    from nkilib_msda.simulator import NkiError, nisa, nki, nl, simulate

    @nki.jit
    def kernel(a):
        s = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        p = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=s, moving=s)
        p[...] = s
        nisa.nc_matmul(dst=p, stationary=s, moving=s, accumulate=True)
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=p)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(NkiError, match="accumulate"):
        simulate(kernel)(np.ones((4, 4), np.float32))
