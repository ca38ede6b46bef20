"""NKI dtypes (string-like, as in beta 2) and the NKI cast rules.

``str(nl.bfloat16) == "bfloat16"`` and ``nl.bfloat16 == "bfloat16"`` hold, as nki-library
compares dtypes by their string form. Low-precision floats map to ``ml_dtypes``.

Cast rules (:func:`cast_values`), docs/emulator.md:
- float -> int: round half to even, then saturate to the integer range. NaN -> 0 (the docs
  are silent; 0 is the choice that cannot produce an out-of-range index). +-inf saturate.
- int -> int: saturate (the engines compute through fp32 and saturate on the way out).
- narrowing float -> float: round to nearest even via ml_dtypes / NumPy; tfloat32 keeps 10
  mantissa bits (RNE) in a 4-byte fp32 container.
- any -> bool_: ``value != 0`` stored as uint8 0/1.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import ml_dtypes
import numpy as np

from nkilib_msda.simulator.errors import nki_error

__all__ = [
    "quiet_fp", "NkiDtype", "to_nki_dtype", "cast_values", "ALL_DTYPES",
    "float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
    "float8_e5m2", "float8_e8m0fnu", "int8", "int16", "int32", "uint8", "uint16", "uint32", "bool_",
]


_F = TypeVar("_F", bound=Callable[..., Any])


def quiet_fp(fn: _F) -> _F:
    """Run ``fn`` under a local ``np.errstate(all="ignore")``: NaN/inf are legitimate
    hardware results of emulated instructions, so NumPy floating-point warnings never escape
    the emulator and a caller's ``np.seterr(all="raise")`` never raises inside it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class NkiDtype(str):
    """A string-like NKI dtype: ``str(dt)`` is its NKI name; ``.np`` the NumPy storage dtype."""

    np: np.dtype
    itemsize: int
    is_float: bool
    is_int: bool
    is_signed: bool

    def __new__(cls, name: str, np_dtype: Any, is_float: bool, is_signed: bool) -> "NkiDtype":
        self = super().__new__(cls, name)
        self.np = np.dtype(np_dtype)
        self.itemsize = int(self.np.itemsize)
        self.is_float = is_float
        self.is_int = not is_float
        self.is_signed = is_signed
        return self

    def __repr__(self) -> str:
        return f"nl.{str.__str__(self)}"

    def __str__(self) -> str:
        return str.__str__(self)

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq


float32 = NkiDtype("float32", np.float32, True, True)
bfloat16 = NkiDtype("bfloat16", ml_dtypes.bfloat16, True, True)
float16 = NkiDtype("float16", np.float16, True, True)
tfloat32 = NkiDtype("tfloat32", np.float32, True, True)  # fp32 container, 10-bit mantissa
float8_e4m3 = NkiDtype("float8_e4m3", ml_dtypes.float8_e4m3, True, True)
float8_e4m3fn = NkiDtype("float8_e4m3fn", ml_dtypes.float8_e4m3fn, True, True)
float8_e5m2 = NkiDtype("float8_e5m2", ml_dtypes.float8_e5m2, True, True)
float8_e8m0fnu = NkiDtype("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, True, False)
int8 = NkiDtype("int8", np.int8, False, True)
int16 = NkiDtype("int16", np.int16, False, True)
int32 = NkiDtype("int32", np.int32, False, True)
uint8 = NkiDtype("uint8", np.uint8, False, False)
uint16 = NkiDtype("uint16", np.uint16, False, False)
uint32 = NkiDtype("uint32", np.uint32, False, False)
bool_ = NkiDtype("bool_", np.uint8, False, False)  # stored as uint8 0/1

ALL_DTYPES: dict[str, NkiDtype] = {
    str(d): d
    for d in (float32, bfloat16, float16, tfloat32, float8_e4m3, float8_e4m3fn, float8_e5m2,
              float8_e8m0fnu, int8, int16, int32, uint8, uint16, uint32, bool_)
}
_ALIASES = {"bool": bool_, "fp32": float32, "bf16": bfloat16, "fp16": float16}

# NumPy storage dtype -> NKI dtype (tfloat32 and bool_ are never inferred from NumPy data).
_FROM_NUMPY: dict[np.dtype, NkiDtype] = {
    np.dtype(np.float32): float32, np.dtype(ml_dtypes.bfloat16): bfloat16,
    np.dtype(np.float16): float16, np.dtype(ml_dtypes.float8_e4m3): float8_e4m3,
    np.dtype(ml_dtypes.float8_e4m3fn): float8_e4m3fn, np.dtype(ml_dtypes.float8_e5m2): float8_e5m2,
    np.dtype(ml_dtypes.float8_e8m0fnu): float8_e8m0fnu,
    np.dtype(np.int8): int8, np.dtype(np.int16): int16, np.dtype(np.int32): int32,
    np.dtype(np.uint8): uint8, np.dtype(np.uint16): uint16, np.dtype(np.uint32): uint32,
    np.dtype(np.bool_): bool_,
}


def to_nki_dtype(x: Any) -> NkiDtype:
    """Normalise an NKI dtype, its name, a NumPy/ml_dtypes dtype or a Python type.

    Python ``float``/``int``/``bool`` map to float32/int32/bool_. Dtypes NKI does not have
    (float64, int64, ...) raise NkiError; objects that are not dtypes raise TypeError.
    """
    if isinstance(x, NkiDtype):
        return x
    if isinstance(x, str):
        if x in ALL_DTYPES:
            return ALL_DTYPES[x]
        if x in _ALIASES:
            return _ALIASES[x]
        try:
            np_dtype = np.dtype(x)
        except TypeError:
            raise nki_error("dtype", "unsupported dtype", f"{x!r} is not an NKI dtype "
                            f"(expected one of {sorted(ALL_DTYPES)})") from None
        return _from_numpy(np_dtype, x)
    if x is float:
        return float32
    if x is bool:
        return bool_
    if x is int:
        return int32
    try:
        np_dtype = np.dtype(x)
    except TypeError:
        raise TypeError(f"dtype: expected an NKI dtype, a dtype name or a NumPy dtype, "
                        f"got {type(x).__name__} {x!r}") from None
    return _from_numpy(np_dtype, x)


def _from_numpy(np_dtype: np.dtype, original: Any) -> NkiDtype:
    try:
        return _FROM_NUMPY[np_dtype]
    except KeyError:
        raise nki_error("dtype", "unsupported dtype",
                        f"{original!r} ({np_dtype}) has no NKI equivalent; NKI supports "
                        f"{sorted(ALL_DTYPES)}") from None


def _round_tfloat32(values: np.ndarray) -> np.ndarray:
    """Round float32 values to 10 mantissa bits, nearest-even, in an fp32 container."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32)
    out = rounded.view(np.float32)
    finite = np.isfinite(f)
    return np.where(finite, out, f).astype(np.float32)


@quiet_fp
def cast_values(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Cast ``values`` to ``dtype`` with the NKI rules; returns an array of ``dtype.np``."""
    dt = to_nki_dtype(dtype)
    values = np.asarray(values)
    src = values.dtype
    if src == dt.np and dt is not bool_ and dt is not tfloat32:
        return values
    if dt is bool_:
        return (values != 0).astype(np.uint8)
    if dt.is_float:
        if src.kind in "iub":
            values = values.astype(np.float64)
        if dt is tfloat32:
            return _round_tfloat32(values.astype(np.float32))
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(dt.np)
    info = np.iinfo(dt.np)
    if src.kind in "iub":
        if src.kind == "b":
            return values.astype(dt.np)
        wide = values.astype(np.int64)
        return np.clip(wide, info.min, info.max).astype(dt.np)
    wide = values.astype(np.float64)
    wide = np.rint(wide)  # round half to even
    wide = np.where(np.isnan(wide), 0.0, wide)
    wide = np.clip(wide, float(info.min), float(info.max))
    return wide.astype(dt.np)
