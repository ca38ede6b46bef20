"""Scalar (activation), GpSimd (iota) and Tensor-engine (matmul, transpose) groups, from the
pages' stated semantics (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/
generated/):
- nki.isa.activation.html: ``dst = op(data * scale + bias)``, bias a (P, 1) vector; with
  ``reduce_res`` the activated values are summed along the free axis.
- nki.isa.iota.html: an affine index expression of the partition (channel_multiplier) and
  the free pattern, plus an offset.
- nki.isa.nc_matmul.html: ``dst[M, N] = stationary[K, M].T @ moving[K, N]`` (fp32 in PSUM).
- nki.isa.nc_transpose.html: ``dst = data.T`` through the PE array (into PSUM).
"""

import numpy as np

from nkilib_msda.simulator import nisa, nl

from _isa_helpers import load, randn, run, store

RNG = np.random.default_rng(13)


def test_activation_scale_bias_and_reduce():
    a, b = randn(RNG, (8, 6), (8, 1))

    def body(h, hb):
        x, bias = load(h), load(hb)
        d = nl.ndarray((8, 6), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=d, op=nl.exp, data=x, bias=bias, scale=0.5, reduce_op=nl.add,
                        reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return store(d), store(r)

    d, r = run(body, a, b)
    ref = np.exp(a.astype(np.float64) * 0.5 + b)
    np.testing.assert_allclose(d, ref, rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], ref.sum(axis=1), rtol=1e-5)


def test_iota_affine_values():
    def body(h):
        t = nl.ndarray((4, 2, 3), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=t, pattern=[[10, 2], [1, 3]], offset=7, channel_multiplier=100)
        return store(t)

    p, i, j = np.meshgrid(np.arange(4), np.arange(2), np.arange(3), indexing="ij")
    np.testing.assert_array_equal(run(body, np.zeros((1, 1), np.float32)),
                                  7 + 100 * p + 10 * i + j)


def test_nc_matmul_and_nc_transpose():
    s = RNG.standard_normal((32, 16)).astype(np.float32)   # [K, M]
    m = RNG.standard_normal((32, 24)).astype(np.float32)   # [K, N]

    def body(hs, hm):
        st, mv = load(hs), load(hm)
        ps = nl.ndarray((16, 24), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=st, moving=mv)
        out = nl.ndarray((16, 24), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=ps)
        pt = nl.ndarray((16, 32), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=pt, data=st)
        tt = nl.ndarray((16, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=tt, src=pt)
        return store(out), store(tt)

    out, tt = run(body, s, m)
    np.testing.assert_allclose(out, s.T.astype(np.float64) @ m, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tt, s.T)
