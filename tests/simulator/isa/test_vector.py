"""Vector-engine instructions: hand-computed and float64-reference results."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _compute_helpers import fp32_tiles, load, randn, rng, run
from nkilib_msda.simulator import nisa, nl

F32 = np.float32


def _two_inputs(shape=(8, 12), seed=0):
    g = rng(seed)
    return (g.standard_normal(shape).astype(F32), g.standard_normal(shape).astype(F32))


REFS = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "maximum": np.maximum, "minimum": np.minimum,
    "equal": lambda a, b: (a == b), "not_equal": lambda a, b: (a != b),
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal,
    "logical_and": lambda a, b: (a != 0) & (b != 0), "logical_or": lambda a, b: (a != 0) | (b != 0),
    "logical_xor": lambda a, b: (a != 0) ^ (b != 0),
}


@pytest.mark.parametrize("opname", sorted(REFS))
def test_tensor_tensor_arithmetic_matches_fp32(opname):
    a, b = _two_inputs()
    b[0, :4] = a[0, :4]  # make equalities happen
    a[1, :3] = 0.0

    def body(ha, hb):
        x, y = load(ha), load(hb)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=out, data1=x, data2=y, op=getattr(nl, opname))
        return out

    got = run(body, a, b)
    np.testing.assert_array_equal(got, REFS[opname](a, b).astype(F32))


def test_tensor_tensor_pairs_free_dims_row_major_and_reads_psum():
    a, b = _two_inputs((4, 6))

    def body(ha, hb):
        x = load(ha, shape=(4, 2, 3))
        y = load(hb, buffer=nl.psum)
        out = nl.ndarray((4, 3, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(out, x, y, nl.add)
        return out

    np.testing.assert_array_equal(run(body, a, b), (a + b).reshape(4, 3, 2))


def test_tensor_tensor_int32_defaults_to_exact_gpsimd_and_vector_rounds():
    a = np.array([[2 ** 30 + 1, -7, 2 ** 31 - 10]], dtype=np.int32)
    b = np.array([[3, 2, 100]], dtype=np.int32)

    def body(ha, hb):
        x, y = load(ha), load(hb)
        exact = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(exact, x, y, nl.add)
        rounded = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(rounded, x, y, nl.add, engine=nisa.engine.vector)
        return exact, rounded

    exact, rounded, report = run(body, a, b, report=True)
    # exact int64 math, saturated into int32 on the way out
    np.testing.assert_array_equal(exact, [[2 ** 30 + 4, -5, 2 ** 31 - 1]])
    # fp32 math: the ulp at 2**30 is 128, so 2**30 + 1 and the sum round to 2**30
    assert rounded[0, 0] == 2 ** 30
    assert rounded[0, 1] == -5
    assert report.instruction_count("gpsimd", "tensor_tensor") == 1
    assert report.instruction_count("vector", "tensor_tensor") == 1


def test_tensor_tensor_bitvec_on_raw_bits():
    a = np.array([[-8, 0x0F0F, 1, -1]], dtype=np.int32)
    b = np.array([[1, 0x00FF, 31, 4]], dtype=np.int32)

    def body(ha, hb):
        x, y = load(ha), load(hb)
        outs = []
        for op in (nl.bitwise_and, nl.bitwise_or, nl.bitwise_xor, nl.left_shift, nl.right_shift):
            o = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
            nisa.tensor_tensor(o, x, y, op)
            outs.append(o)
        return tuple(outs)

    band, bor, bxor, shl, shr = run(body, a, b)
    np.testing.assert_array_equal(band, a & b)
    np.testing.assert_array_equal(bor, a | b)
    np.testing.assert_array_equal(bxor, a ^ b)
    # shifts by >= the bit width clear the value; 1 << 31 is the int32 sign bit
    np.testing.assert_array_equal(shl, [[-16, 0, -2 ** 31, -16]])
    # logical right shift of the int32 bit pattern
    expected = (a.view(np.uint32) >> b.view(np.uint32)).view(np.int32)
    np.testing.assert_array_equal(shr, expected)
    assert shr[0, 0] == 0x7FFFFFFC


def test_tensor_tensor_power_runs_on_gpsimd():
    a = np.array([[2.0, 9.0, 0.5]], dtype=F32)
    b = np.array([[3.0, 0.5, -1.0]], dtype=F32)

    def body(ha, hb):
        x, y = load(ha), load(hb)
        o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(o, x, y, nl.power)
        return o

    got, report = run(body, a, b, report=True)
    np.testing.assert_allclose(got, [[8.0, 3.0, 2.0]], rtol=1e-6)
    assert report.instruction_count("gpsimd", "tensor_tensor") == 1


def test_bf16_and_fp16_destinations_round_to_nearest_even():
    one = np.ones((1, 4), dtype=F32)
    # bf16 has 7 mantissa bits: ulp(1) = 2**-7; halfway cases go to the even neighbour
    delta = np.array([[2 ** -8, 3 * 2 ** -8, 2 ** -8 + 2 ** -12, -(2 ** -9)]], dtype=F32)
    big = np.array([[2048.0, 2048.0, 2048.0, 2048.0]], dtype=F32)
    small = np.array([[1.0, 3.0, 1.5, 2.5]], dtype=F32)  # fp16 ulp above 2048 is 2

    def body(h1, hd, hb, hs):
        o_bf = nl.ndarray((1, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(o_bf, load(h1), load(hd), nl.add)
        o_h = nl.ndarray((1, 4), dtype=nl.float16, buffer=nl.sbuf)
        nisa.tensor_tensor(o_h, load(hb), load(hs), nl.add)
        return o_bf, o_h

    bf, h = run(body, one, delta, big, small)
    assert bf.dtype == ml_dtypes.bfloat16 and h.dtype == np.float16
    np.testing.assert_array_equal(bf.astype(F32), [[1.0, 1.015625, 1.0078125, 1.0]])
    np.testing.assert_array_equal(h.astype(F32), [[2048.0, 2052.0, 2050.0, 2050.0]])


def test_tensor_copy_float_to_int_is_rne_and_saturating():
    src = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3e9, -3e9, 7.49, np.inf]], dtype=F32)
    small = np.array([[-5.0, 300.0, 254.5, 255.5]], dtype=F32)

    def body(hs, hsmall):
        x = load(hs)
        i32 = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(i32, x)
        u8 = nl.ndarray((1, 4), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_copy(u8, load(hsmall))
        return i32, u8

    i32, u8 = run(body, src, small)
    np.testing.assert_array_equal(
        i32, [[0, 2, 2, 0, -2, -2, 2 ** 31 - 1, -2 ** 31, 7, 2 ** 31 - 1]])
    np.testing.assert_array_equal(u8, [[0, 255, 254, 255]])


def test_tensor_copy_bit_exact_on_vector_but_fp32_on_scalar_engine():
    src = np.array([[2 ** 24 + 1, -(2 ** 30) - 3, 5]], dtype=np.int32)

    def body(hs):
        x = load(hs, buffer=nl.psum)
        exact = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(exact, x)
        via_fp32 = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(via_fp32, x, engine=nisa.engine.scalar)
        return exact, via_fp32

    exact, via_fp32, report = run(body, src, report=True)
    np.testing.assert_array_equal(exact, src)
    np.testing.assert_array_equal(via_fp32, src.astype(F32).astype(np.int64).astype(np.int32))
    assert via_fp32[0, 0] == 2 ** 24  # 2**24 + 1 is not representable in fp32
    assert report.instruction_count("scalar", "tensor_copy") == 1
    assert report.instruction_count("vector", "tensor_copy") == 1


def test_tensor_scalar_two_ops_reverse_flags_and_vector_operands():
    a, col = randn(rng(3), (6, 5), (6, 1))

    def body(ha, hc):
        x, c = load(ha), load(hc)
        plain = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(plain, x, nl.subtract, 0.25, op1=nl.multiply, operand1=c)
        rev = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(rev, x, nl.subtract, c, reverse0=True, op1=nl.subtract,
                           operand1=3.0, reverse1=True)
        unary = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(unary, x, nl.abs, None, op1=nl.maximum, operand1=0.5)
        return plain, rev, unary

    plain, rev, unary = run(body, a, col)
    np.testing.assert_allclose(plain, (a - F32(0.25)) * col, rtol=1e-6)
    np.testing.assert_allclose(rev, F32(3.0) - (col - a), rtol=1e-6)
    np.testing.assert_array_equal(unary, np.maximum(np.abs(a), F32(0.5)))


def test_tensor_scalar_bitvec_rsqrt_on_gpsimd_and_scalar_engine_pair():
    ints = np.array([[0x1234, -1, 7]], dtype=np.int32)
    pos = np.array([[4.0, 0.25, 16.0]], dtype=F32)

    def body(hi, hp):
        x = load(hi)
        bits = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(bits, x, nl.bitwise_and, 0xFF, op1=nl.left_shift, operand1=4)
        p = load(hp)
        rs = nl.ndarray(p.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(rs, p, nl.rsqrt, None)
        act = nl.ndarray(p.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(act, p, nl.multiply, 2.0, op1=nl.add, operand1=1.0,
                           engine=nisa.engine.scalar)
        return bits, rs, act

    bits, rs, act, report = run(body, ints, pos, report=True)
    np.testing.assert_array_equal(bits, [[0x340, 0xFF0, 0x70]])
    np.testing.assert_allclose(rs, [[0.5, 2.0, 0.25]], rtol=1e-6)
    np.testing.assert_array_equal(act, [[9.0, 1.5, 33.0]])
    assert report.instruction_count("gpsimd", "tensor_scalar") == 1
    assert report.instruction_count("scalar", "tensor_scalar") == 1
    assert report.instruction_count("vector", "tensor_scalar") == 1


def test_scalar_tensor_tensor_fused_multiply_add():
    v, w, acc = randn(rng(4), (8, 16), (8, 1), (8, 16))

    def body(hv, hw, hacc):
        x, s, a = load(hv), load(hw), load(hacc)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=out, data=x, op0=nl.multiply, operand0=s,
                                  op1=nl.add, operand1=a)
        rev = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(rev, x, nl.multiply, 2.0, nl.subtract, a, reverse1=True)
        return out, rev

    out, rev = run(body, v, w, acc)
    np.testing.assert_allclose(out, v * w + acc, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rev, acc - 2 * v, rtol=1e-6, atol=1e-6)


def test_memset_fills_with_cast():
    def body():
        f = nl.ndarray((4, 3), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(f, 1.00390625)  # 1 + 2**-8: halfway in bf16 -> 1.0 (even)
        i = nl.ndarray((4, 3), dtype=nl.int32, buffer=nl.psum)
        nisa.memset(i, -7)
        z = nl.ndarray((4, 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(z, 0, engine=nisa.gpsimd_engine)  # real-nki shorthand
        return f, i, z

    f, i, z, report = run(body, report=True)
    np.testing.assert_array_equal(f.astype(F32), np.ones((4, 3)))
    np.testing.assert_array_equal(i, np.full((4, 3), -7))
    np.testing.assert_array_equal(z, np.zeros((4, 3)))
    assert report.instruction_count("gpsimd", "memset") == 1
    assert report.instruction_count("vector", "memset") == 2


def test_tensor_reduce_ops_axes_negate_and_keepdims():
    g = rng(5)
    a = g.standard_normal((4, 3, 5)).astype(F32)
    ints = g.integers(0, 2 ** 16, size=(4, 6)).astype(np.int32)

    def body(ha, hi):
        x = load(ha)
        s = nl.ndarray((4, 3, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(s, nl.add, x, axis=(2,), keepdims=True)
        m = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(m, nl.maximum, x, axis=[1, 2], negate=True)
        d = nl.ndarray((4, 3), dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_reduce(d, nl.subtract, x, axis=-1)
        p = nl.ndarray((4, 3), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(p, nl.multiply, x, axis=2)
        o = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_reduce(o, nl.bitwise_or, load(hi), axis=1)
        return s, m, d, p, o

    s, m, d, p, o = run(body, a, ints)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(s[..., 0], a64.sum(axis=2), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(m[:, 0], -a.reshape(4, -1).max(axis=1))
    np.testing.assert_allclose(d, a64[..., 0] - a64[..., 1:].sum(axis=2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, a64.prod(axis=2), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(o[:, 0], np.bitwise_or.reduce(ints, axis=1))


def test_reciprocal_is_exact_fp32_division():
    a = np.array([[3.0, -0.1, 7.0, 1e-3]], dtype=F32)

    def body(ha):
        o = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(o, load(ha))
        return o

    np.testing.assert_array_equal(run(body, a), F32(1.0) / a)


def test_tensor_copy_predicated_keeps_unselected_elements():
    old = np.arange(8, dtype=F32).reshape(2, 4)
    new = -np.arange(8, dtype=F32).reshape(2, 4) - 100
    pred = np.array([[1, 0, 2, 0], [0, 0, 1, 255]], dtype=np.uint8)

    def body(ho, hn, hp):
        dst = load(ho)
        nisa.tensor_copy_predicated(dst, load(hn), load(hp))
        dst2 = load(ho)
        nisa.tensor_copy_predicated(dst2, load(hn), load(hp), reverse_pred=True)
        return dst, dst2

    a, b = run(body, old, new, pred)
    np.testing.assert_array_equal(a, np.where(pred != 0, new, old))
    np.testing.assert_array_equal(b, np.where(pred == 0, new, old))


def test_select_reduce_with_running_max():
    on_true = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], dtype=F32)
    pred = np.array([[1, 0, 1], [0, 1, 0]], dtype=np.uint8)

    def body(ht, hp):
        t, p = load(ht), load(hp)
        out = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        red = nl.ndarray((2, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(out, p, t, -10.0, reduce_res=red,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return out, red

    out, red = run(body, on_true, pred)
    np.testing.assert_array_equal(out, [[1.0, -10.0, 3.0], [-10.0, 5.0, -10.0]])
    np.testing.assert_array_equal(red[:, 0], [3.0, 5.0])


def test_tensor_tensor_scan_recurrence():
    g = rng(6)
    d0 = g.uniform(0.5, 1.0, (3, 5)).astype(F32)
    d1 = g.standard_normal((3, 5)).astype(F32)

    def body(h0, h1):
        out = nl.ndarray((3, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(out, load(h0), load(h1), 2.0, nl.multiply, nl.add)
        return out

    expected = np.empty_like(d0)
    state = np.full(3, 2.0, dtype=F32)
    for i in range(5):
        state = d0[:, i] * state + d1[:, i]
        expected[:, i] = state
    np.testing.assert_allclose(run(body, d0, d1), expected, rtol=1e-6, atol=1e-6)


def test_tensor_scalar_reduce_accumulates_across_instructions():
    a, b = randn(rng(7), (4, 6), (4, 3))

    def body(ha, hb):
        x, y = load(ha), load(hb)
        dx, r1, dy, r2, mx = fp32_tiles(x.shape, (4, 1), y.shape, (4, 1), (4, 1))
        nisa.tensor_scalar_reduce(dx, x, nl.multiply, 2.0, nl.add, r1)
        nisa.tensor_scalar_reduce(dy, y, nl.add, 1.0, nl.add, r2,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.tensor_scalar_reduce(dy, y, nl.subtract, 0.5, nl.max, mx,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=0.75)
        return dx, r1, r2, mx

    dx, r1, r2, mx = run(body, a, b)
    np.testing.assert_array_equal(dx, 2 * a)
    first = (2 * a.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(r1[:, 0], first, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(r2[:, 0], first + (b + 1.0).sum(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(mx[:, 0], np.maximum(0.75, (b - F32(0.5)).max(axis=1)))
