"""NKI dtypes and cast rules (docs/emulator.md)."""

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, nl
from nkilib_msda.simulator.dtypes import cast_values, to_nki_dtype


def test_dtypes_are_string_like():
    assert str(nl.bfloat16) == "bfloat16"
    assert nl.bfloat16 == "bfloat16" and nl.float32 != "bfloat16"
    assert str(nl.int32) == str(nl.int32) and nl.int32 != nl.uint32
    assert nl.bfloat16.np == np.dtype(ml_dtypes.bfloat16) and nl.bfloat16.itemsize == 2
    assert nl.bool_.np == np.uint8 and nl.bool_.is_int and not nl.bool_.is_signed
    assert nl.float16.is_float and nl.int8.is_signed and not nl.uint16.is_signed
    assert {nl.float32: 1}["float32"] == 1


@pytest.mark.parametrize("x, expected", [
    (np.float32, "float32"), (ml_dtypes.bfloat16, "bfloat16"), ("float16", "float16"),
    (np.dtype(np.int32), "int32"), (np.uint8, "uint8"), (bool, "bool_"), (float, "float32"),
    ("bool", "bool_"),
])
def test_to_nki_dtype(x, expected):
    assert to_nki_dtype(x) == expected


def test_to_nki_dtype_rejects_non_nki_dtypes():
    with pytest.raises(NkiError, match="dtype: unsupported dtype"):
        to_nki_dtype(np.float64)
    with pytest.raises(NkiError, match="unsupported dtype"):
        to_nki_dtype("int64")
    with pytest.raises(TypeError):
        to_nki_dtype(object())


def test_float_to_int_rounds_half_to_even():
    x = np.array([0.5, 1.5, -2.5, 2.5, -0.5, 0.49999997, 2.6, -2.6], np.float32)
    assert cast_values(x, nl.int32).tolist() == [0, 2, -2, 2, 0, 0, 3, -3]


def test_float_to_int_saturates_and_nan_is_zero():
    x = np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 300.0, -300.0], np.float32)
    assert cast_values(x, nl.int32).tolist() == [2**31 - 1, -2**31, 2**31 - 1, -2**31, 0, 300, -300]
    assert cast_values(x, nl.int8).tolist() == [127, -128, 127, -128, 0, 127, -128]
    assert cast_values(x, nl.uint8).tolist() == [255, 0, 255, 0, 0, 255, 0]
    assert cast_values(np.array([-1.0, 70000.5]), nl.uint16).tolist() == [0, 65535]


def test_int_to_int_saturates():
    x = np.array([-5, 300, 70000], np.int32)
    assert cast_values(x, nl.uint8).tolist() == [0, 255, 255]
    assert cast_values(x, nl.int16).tolist() == [-5, 300, 32767]


def test_bf16_rounding_is_rne():
    # bf16 has 7 mantissa bits: ulp(1) = 2^-7. Halfway cases round to the even mantissa.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8)], np.float32)
    got = cast_values(x, nl.bfloat16).astype(np.float64)
    assert got.tolist() == [1.0, 1 + 2**-6, 1 + 2**-7, -1.0]


def test_fp16_rounding_is_rne():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 2**-25], np.float32)
    got = cast_values(x, nl.float16).astype(np.float64)
    assert got[:2].tolist() == [1.0, 1 + 2**-9]
    assert np.isinf(got[2])  # 65520 is halfway to the next binade: rounds to inf
    assert got[3] == 0.0  # 2^-25 is halfway between 0 and the smallest subnormal 2^-24: even = 0


def test_tfloat32_keeps_10_mantissa_bits():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10], np.float32)
    got = cast_values(x, nl.tfloat32)
    assert got.dtype == np.float32
    assert got.astype(np.float64).tolist() == [1.0, 1 + 2**-9, 1 + 2**-10]


def test_bool_cast():
    x = np.array([0.0, -2.0, 0.5, np.nan], np.float32)
    out = cast_values(x, nl.bool_)
    assert out.dtype == np.uint8 and out.tolist() == [0, 1, 1, 1]


def test_int_to_float():
    x = np.array([2**24 + 1, -3], np.int32)
    assert cast_values(x, nl.float32).tolist() == [2**24, -3.0]  # fp32 RNE
