"""nkilib_msda.validation.arrays: the one torch <-> NumPy bridge, bf16 bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.validation.arrays import as_float64, to_numpy, to_torch

torch = pytest.importorskip("torch")


def _every_bf16_bit_pattern() -> np.ndarray:
    """All 65,536 bf16 values (NaNs, infinities, subnormals, -0.0 included), shuffled."""
    bits = np.random.default_rng().permutation(np.arange(1 << 16, dtype=np.uint32)).astype(np.uint16)
    return bits.view(ml_dtypes.bfloat16).reshape(256, 256)


def test_bf16_crosses_both_ways_bit_for_bit():
    a = _every_bf16_bit_pattern()
    t = to_torch(a)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == a.shape
    assert np.array_equal(t.view(torch.int16).numpy(), a.view(np.int16))
    back = to_numpy(t)
    assert back.dtype == ml_dtypes.bfloat16
    assert np.array_equal(back.view(np.uint16), a.view(np.uint16))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_other_dtypes_keep_dtype_and_values(dtype):
    a = (np.random.default_rng().standard_normal((3, 5)) * 100).astype(dtype)
    t = to_torch(a)
    assert t.dtype == getattr(torch, np.dtype(dtype).name)
    back = to_numpy(t)
    assert back.dtype == a.dtype and np.array_equal(back, a)


def test_copies_not_views():
    a = np.random.default_rng().standard_normal((4, 4)).astype(np.float32)
    t = to_torch(a)
    a[0, 0] = 123.0
    assert float(t[0, 0]) != 123.0
    t2 = torch.randn(4, 4)
    b = to_numpy(t2)
    t2[0, 0] = 321.0
    assert b[0, 0] != 321.0


def test_non_contiguous_tensors_and_arrays():
    t = torch.randn(6, 4, dtype=torch.bfloat16).t()
    assert not t.is_contiguous()
    assert np.array_equal(to_numpy(t).astype(np.float32), t.float().numpy())
    a = np.random.default_rng().standard_normal((6, 4)).astype(ml_dtypes.bfloat16).T
    assert torch.equal(to_torch(a), torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16))


def test_float8_becomes_float32_and_device_is_honoured():
    a = np.random.default_rng().standard_normal((3, 3)).astype(ml_dtypes.float8_e4m3fn)
    t = to_torch(a, device="meta")
    assert t.dtype == torch.float32 and t.device.type == "meta"
    assert np.array_equal(to_torch(a).numpy(), a.astype(np.float32))


def test_requires_grad_and_bf16_tensors_widen_to_float64():
    t = torch.randn(3, 4, dtype=torch.bfloat16, requires_grad=True)
    got = as_float64(t)
    assert got.dtype == np.float64 and np.array_equal(got, t.detach().double().numpy())
    a = np.random.default_rng().standard_normal(5).astype(ml_dtypes.bfloat16)
    assert np.array_equal(as_float64(a), a.astype(np.float64))
    assert as_float64([1, 2]).dtype == np.float64
