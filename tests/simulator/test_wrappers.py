"""Experimental nl.* math wrappers: new tiles, lowering, and the hardware-failure errors."""

from __future__ import annotations

import numpy as np
import pytest

from _compute_helpers import load, randn, rng, run
from nkilib_msda.simulator import NkiError, nisa, nl

F32 = np.float32


def test_binary_wrappers_tile_tile_tile_scalar_and_reverse():
    a, b = randn(rng(30), (4, 6), (4, 6))

    def body(ha, hb):
        x, y = load(ha), load(hb)
        return (nl.add(x, y), nl.subtract(2.0, x), nl.multiply(x, 3.0),
                nl.maximum(x, y, dtype=nl.bfloat16), nl.greater(x, y), nl.minimum(x, 0.0))

    s, r, m, mx, gt, mn, report = run(body, a, b, report=True)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(r, F32(2.0) - a)
    np.testing.assert_array_equal(m, a * F32(3.0))
    np.testing.assert_array_equal(mx.astype(F32), np.maximum(a, b).astype(mx.dtype).astype(F32))
    assert gt.dtype == np.uint8
    np.testing.assert_array_equal(gt, (a > b).astype(np.uint8))
    np.testing.assert_array_equal(mn, np.minimum(a, 0))
    assert report.instruction_count("vector", "tensor_tensor") == 3
    assert report.instruction_count("vector", "tensor_scalar") == 3


def test_floor_and_ceil_are_exact_and_cast():
    x = np.array([[-2.5, -2.0, -0.5, -1e-7, 0.0, 0.5, 1.99, 3.0, 2 ** 22 + 0.5, -7.25]], dtype=F32)

    def body(hx):
        t = load(hx)
        return nl.floor(t, dtype=nl.int32), nl.ceil(t, dtype=nl.int32), nl.floor(t)

    fi, ci, ff, report = run(body, x, report=True)
    np.testing.assert_array_equal(fi, [[-3, -2, -1, -1, 0, 0, 1, 3, 2 ** 22, -8]])
    np.testing.assert_array_equal(ci, [[-2, -2, 0, 0, 0, 1, 2, 3, 2 ** 22 + 1, -7]])
    assert ff.dtype == F32
    np.testing.assert_array_equal(ff, np.floor(x))
    assert report.instruction_count("vector", "floor") == 2
    assert report.instruction_count("vector", "ceil") == 1


def test_floor_of_bf16_input_into_int32():
    x = np.array([[-1.5, 2.75, 100.5, -0.25]], dtype=F32)

    def body(hx):
        return nl.floor(load(hx, dtype=nl.bfloat16), dtype=nl.int32)

    np.testing.assert_array_equal(run(body, x), [[-2, 2, 100, -1]])


def test_activation_and_unary_wrappers():
    x = rng(31).uniform(-2, 2, (4, 5)).astype(F32)

    def body(hx):
        t = load(hx)
        return nl.exp(t), nl.copy(t, dtype=nl.float16), nl.negative(t), nl.relu(t), nl.abs(t)

    e, c, n, r, a, report = run(body, x, report=True)
    np.testing.assert_allclose(e, np.exp(x.astype(np.float64)), rtol=1e-6)
    assert c.dtype == np.float16
    np.testing.assert_array_equal(c, x.astype(np.float16))
    np.testing.assert_array_equal(n, -x)
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    np.testing.assert_array_equal(a, np.abs(x))
    assert report.instruction_count("scalar", "activation") == 4


def test_where_selects_and_reductions():
    g = rng(32)
    x, y = randn(g, (4, 3, 5), (4, 3, 5))
    cond = (g.random((4, 3, 5)) > 0.5).astype(F32)

    def body(hx, hy, hc):
        a, b, c = load(hx), load(hy), load(hc)
        return (nl.where(c, a, b), nl.where(c, a, -1.0), nl.sum(a, axis=2),
                nl.max(a, axis=(1, 2), keepdims=True), nl.min(a, axis=-1),
                nl.mean(a, axis=[1, 2]))

    w, ws, s, mx, mn, mean = run(body, x, y, cond)
    np.testing.assert_array_equal(w, np.where(cond != 0, x, y))
    np.testing.assert_array_equal(ws, np.where(cond != 0, x, F32(-1.0)))
    np.testing.assert_allclose(s, x.astype(np.float64).sum(axis=2), rtol=1e-6, atol=1e-6)
    assert mx.shape == (4, 1, 1)
    np.testing.assert_array_equal(mx[:, 0, 0], x.reshape(4, -1).max(axis=1))
    np.testing.assert_array_equal(mn, x.min(axis=-1))
    assert mean.shape == (4, 1)  # on-chip results stay 2-D
    np.testing.assert_allclose(mean[:, 0], x.astype(np.float64).reshape(4, -1).mean(axis=1),
                               rtol=1e-6, atol=1e-6)


def test_transpose_and_matmul_wrappers_return_psum_tiles():
    a, b = randn(rng(33), (16, 8), (16, 12))

    def body(ha, hb):
        x, y = load(ha), load(hb)
        t = nl.transpose(x)
        m = nl.matmul(x, y, transpose_x=True)
        assert t.buffer == "psum" and m.buffer == "psum" and m.dtype == nl.float32
        return t, m

    t, m = run(body, a, b)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_allclose(m, a.astype(np.float64).T @ b, rtol=1e-5, atol=1e-5)


def test_op_identities_work_as_isa_operators():
    a = np.array([[1.0, -4.0]], dtype=F32)

    def body(ha):
        x = load(ha)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(out, x, x, op=nl.add)
        red = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(red, nl.max, x, axis=1)  # nl.max stands for nl.maximum
        return out, red

    out, red = run(body, a)
    np.testing.assert_array_equal(out, 2 * a)
    assert red[0, 0] == 1.0


@pytest.mark.parametrize("call,rule", [
    (lambda x, y: nl.divide(x, y), "nl.divide: fails on hardware"),
    (lambda x, y: nl.mod(x, y), "nl.mod: fails on hardware"),
    (lambda x, y: nl.fmod(x, y), "nl.fmod: fails on hardware"),
    (lambda x, y: nl.power(x, 2.0), "nl.power: scalar exponent"),
    (lambda x, y: nl.matmul(x, y), "nl.matmul: transpose_x"),
    (lambda x, y: nl.add(x, y[:, 0:1]), "nl.add: no broadcasting"),
    (lambda x, y: nl.sum(x, axis=0), "nl.sum: reduce axis"),
    (lambda x, y: nl.exp(np.ones((2, 2))), "nl.exp: operand type"),
])
def test_wrappers_reject_what_fails_on_hardware(call, rule):
    a = np.ones((4, 4), dtype=F32)

    def body(ha, hb):
        return call(load(ha), load(hb))

    with pytest.raises(NkiError, match=rule):
        run(body, a, a)


def test_divide_is_not_an_alu_op_either():
    a = np.ones((2, 2), dtype=F32)

    def body(ha):
        x = load(ha)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(out, x, x, op=nl.divide)
        return out

    with pytest.raises(NkiError, match="tensor_tensor: unsupported ALU op"):
        run(body, a)


def test_unary_alu_wrappers_invert_and_logical_not():
    ints = np.array([[0, 5, -1, 0x0F0F]], dtype=np.int32)
    floats = np.array([[0.0, 2.5, -0.0, np.nan]], dtype=F32)

    def body(hi, hf):
        return nl.invert(load(hi)), nl.logical_not(load(hf)), nl.bitwise_xor(load(hi), 0xFF)

    inv, lnot, xor = run(body, ints, floats)
    np.testing.assert_array_equal(inv, ~ints)
    np.testing.assert_array_equal(lnot, [[1.0, 0.0, 1.0, 0.0]])
    np.testing.assert_array_equal(xor, ints ^ 0xFF)
