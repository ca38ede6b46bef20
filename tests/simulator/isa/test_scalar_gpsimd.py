"""Scalar-engine activation and GpSimd instructions (iota, affine_select, nc_n_gather)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from _compute_helpers import fp32_tiles, load, randn, rng, run
from nkilib_msda.simulator import NkiWarning, nisa, nl

F32 = np.float32
_erf = np.vectorize(math.erf)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


ACTIVATIONS = {
    "copy": lambda x: x, "exp": np.exp, "sigmoid": _sig, "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh, "silu": lambda x: x * _sig(x), "square": np.square, "abs": np.abs,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), "erf": _erf, "sign": np.sign,
    "softplus": lambda x: np.log1p(np.exp(x)), "arctan": np.arctan, "sin": np.sin,
    "gelu_apprx_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                        (x + 0.044715 * x ** 3))),
}


@pytest.mark.parametrize("opname", sorted(ACTIVATIONS))
def test_activation_with_vector_scale_and_bias(opname):
    g = rng(10)
    x = g.uniform(-0.7, 0.7, (8, 6)).astype(F32)
    scale = g.uniform(0.5, 1.5, (8, 1)).astype(F32)
    bias = g.uniform(-0.3, 0.3, (8, 1)).astype(F32)

    def body(hx, hs, hb):
        out = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(out, getattr(nl, opname), load(hx), bias=load(hb), scale=load(hs))
        return out

    got, report = run(body, x, scale, bias, report=True)
    pre = x.astype(np.float64) * scale + bias
    np.testing.assert_allclose(got, ACTIVATIONS[opname](pre), rtol=2e-6, atol=1e-6)
    assert report.instruction_count("scalar", "activation") == 1


@pytest.mark.parametrize("opname,ref", [("log", np.log), ("sqrt", np.sqrt),
                                        ("rsqrt", lambda v: 1 / np.sqrt(v)),
                                        ("reciprocal", lambda v: 1 / v)])
def test_activation_positive_domain_functions(opname, ref):
    x = rng(11).uniform(0.1, 20.0, (4, 7)).astype(F32)

    def body(hx):
        out = nl.ndarray((4, 7), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.activation(out, getattr(nl, opname), load(hx), scale=0.5, bias=0.25)
        return out

    got = run(body, x).astype(np.float64)
    np.testing.assert_allclose(got, ref(x.astype(np.float64) * 0.5 + 0.25), rtol=2 ** -8)


def test_activation_reduce_registers_reset_and_accumulate():
    a, b = randn(rng(12), (5, 4), (5, 3))

    def body(ha, hb):
        x, y = load(ha), load(hb)
        ex, first, ey, both, sq, legacy = fp32_tiles(x.shape, (5, 1), y.shape, (5, 1), y.shape, (5, 1))
        nisa.activation(ex, nl.exp, x, reduce_op=nl.add, reduce_res=first,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(ey, nl.exp, y, reduce_op=nl.add, reduce_res=both,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation_reduce(sq, nl.square, y, reduce_op=nl.add, reduce_res=legacy)
        return first, both, legacy

    first, both, legacy = run(body, a, b)
    e_a = np.exp(a.astype(np.float64)).sum(axis=1)
    e_b = np.exp(b.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(first[:, 0], e_a, rtol=1e-6)
    np.testing.assert_allclose(both[:, 0], e_a + e_b, rtol=1e-6)
    np.testing.assert_allclose(legacy[:, 0], (b.astype(np.float64) ** 2).sum(axis=1), rtol=1e-6)


def test_activation_out_of_range_warns_once_per_function_and_run():
    x = np.array([[9.0, 0.5], [-4.0, 1.0]], dtype=F32)

    def body(hx):
        t = load(hx)
        a = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(a, nl.sin, t)
        b = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(b, nl.sin, t)
        return a

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(body, x)
    msgs = [w for w in caught if issubclass(w.category, NkiWarning)]
    assert len(msgs) == 1 and "nl.sin" in str(msgs[0].message)
    np.testing.assert_allclose(got, np.sin(x), rtol=1e-6)  # exact value, not hardware garbage


def test_iota_pattern_channel_multiplier_and_cast():
    def body():
        i = nl.ndarray((4, 2, 3), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(i, [[10, 2], [1, 3]], offset=5, channel_multiplier=100)
        f = nl.ndarray((3, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(f, [[-2, 4]], offset=1, channel_multiplier=-1)
        w = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(w, [[1, 2]], offset=2 ** 31 - 1)
        return i, f, w

    i, f, w, report = run(body, report=True)
    p = np.arange(4).reshape(4, 1, 1)
    expected = 5 + 100 * p + 10 * np.arange(2).reshape(1, 2, 1) + np.arange(3).reshape(1, 1, 3)
    np.testing.assert_array_equal(i, expected)
    np.testing.assert_array_equal(f, 1 - np.arange(3).reshape(3, 1) - 2 * np.arange(4))
    np.testing.assert_array_equal(w, [[2 ** 31 - 1, -2 ** 31]])  # int32 wrap-around
    assert report.instruction_count("gpsimd", "iota") == 3


def test_affine_select_causal_mask():
    data = rng(13).standard_normal((4, 6)).astype(F32)

    def body(hd):
        out = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.sbuf)
        # keep where p - j >= 0 (lower triangle), else -1e4
        nisa.affine_select(out, [[-1, 6]], 1, load(hd), -1e4, cmp_op=nl.greater_equal)
        return out

    p = np.arange(4).reshape(4, 1)
    j = np.arange(6).reshape(1, 6)
    np.testing.assert_array_equal(run(body, data), np.where(p - j >= 0, data, F32(-1e4)))


def test_nc_n_gather_per_partition():
    g = rng(14)
    data = g.standard_normal((3, 2, 5)).astype(F32)
    idx = g.integers(0, 10, size=(3, 7)).astype(np.uint32)

    def body(hd, hi):
        out = nl.ndarray((3, 7), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_n_gather(out, load(hd), load(hi))
        return out

    expected = np.take_along_axis(data.reshape(3, 10), idx.astype(np.int64), axis=1)
    np.testing.assert_array_equal(run(body, data, idx), expected)
