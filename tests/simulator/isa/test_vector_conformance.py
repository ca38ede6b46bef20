"""Vector group, from the pages' stated semantics (https://awsdocs-neuron.readthedocs-hosted.com/
en/latest/nki/api/generated/):
- nki.isa.tensor_tensor.html: element-wise ``dst = data1 <op> data2``.
- nki.isa.tensor_scalar.html: ``(data <op0> operand0) <op1> operand1``; ``reverse0=True``
  computes ``operand0 <op0> data``; operands are scalars or (P, 1) vectors.
- nki.isa.tensor_reduce.html: reduction of the free axes given by ``axis``.
- nki.isa.tensor_copy.html: copy with the dtype cast of the destination.
- nki.isa.memset.html: fill with a constant.
- nki.isa.tensor_copy_predicated.html: where the (uint8/16/32) predicate is true, copy src
  (a tile or a scalar) into dst; elsewhere dst is unmodified.
- nki.isa.tensor_copy.html: equal dtypes copy bit-accurately (e.g. int32 values above 2**24).
"""

import numpy as np

from nkilib_msda.simulator import nisa, nl

from _isa_helpers import load, randn, run, store

RNG = np.random.default_rng(12)


def test_tensor_tensor_elementwise_ops():
    a = RNG.standard_normal((2, 8, 5)).astype(np.float32)

    def body(h):
        x, y = load(h[0]), load(h[1])
        outs = []
        for op in (nl.add, nl.subtract, nl.multiply, nl.maximum):
            d = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=d, data1=x, data2=y, op=op)
            outs.append(store(d))
        return tuple(outs)

    got = run(body, a)
    for out, ref in zip(got, (a[0] + a[1], a[0] - a[1], a[0] * a[1], np.maximum(a[0], a[1]))):
        np.testing.assert_array_equal(out, ref)


def test_tensor_scalar_two_ops_and_reverse():
    a, v = randn(RNG, (8, 6), (8, 1))

    def body(h, hv):
        x, col = load(h), load(hv)
        d1 = nl.ndarray((8, 6), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d1, data=x, op0=nl.subtract, operand0=col, op1=nl.multiply,
                           operand1=3.0)
        d2 = nl.ndarray((8, 6), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d2, data=x, op0=nl.subtract, operand0=2.0, reverse0=True)
        return store(d1), store(d2)

    d1, d2 = run(body, a, v)
    np.testing.assert_array_equal(d1, (a - v) * np.float32(3.0))
    np.testing.assert_array_equal(d2, np.float32(2.0) - a)


def test_tensor_reduce_over_the_last_free_axis():
    a = RNG.standard_normal((8, 4, 6)).astype(np.float32)

    def body(h):
        x = load(h)
        s = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.maximum, data=x, axis=(2,))
        return store(s)

    np.testing.assert_array_equal(run(body, a), a.max(axis=2))


def test_tensor_copy_casts_and_memset_fills():
    a = (RNG.standard_normal((8, 6)) * 50).astype(np.float32)

    def body(h):
        x = load(h)
        i = nl.ndarray((8, 6), nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=i, src=x)
        m = nl.ndarray((8, 6), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=m, value=-2.5)
        return store(i), store(m)

    i, m = run(body, a)
    np.testing.assert_array_equal(i, np.rint(a).astype(np.int32))
    assert (m == -2.5).all()


def test_tensor_copy_predicated_keeps_dst_where_false():
    a = RNG.standard_normal((8, 6)).astype(np.float32)
    pred = (RNG.random((8, 6)) < 0.5).astype(np.uint8)

    def body(h, hp):
        src, p = load(h), load(hp)
        d = nl.ndarray((8, 6), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=d, value=7.0)
        nisa.tensor_copy_predicated(dst=d, src=src, predicate=p)
        return store(d)

    np.testing.assert_array_equal(run(body, a, pred), np.where(pred != 0, a, np.float32(7.0)))


def test_tensor_copy_same_dtype_is_bit_accurate():
    big = (np.arange(48, dtype=np.int64).reshape(8, 6) + 2**24 + 1).astype(np.int32)

    def body(h):
        x = load(h)
        d = nl.ndarray((8, 6), nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=x)
        return store(d)

    np.testing.assert_array_equal(run(body, big), big)  # not representable in fp32
