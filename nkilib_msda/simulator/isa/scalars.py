"""``nisa.NkiScalar``, ``nisa.scalar_load`` and ``nisa.scalar_store`` (NKI 0.8 runtime scalars).

https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.NkiScalar.html,
.../nki.isa.scalar_load.html, .../nki.isa.scalar_store.html, nki/deep-dives/nki-scalar.html.
A scalar holds one device integer; arithmetic (``+``, ``-``, unary ``-``, ``*``) with a Python
int or a scalar of the same dtype gives a new scalar and wraps at the scalar's width (32-bit:
``100000 * 100000 == 1410065408``). Comparisons are recorded but "cannot be used": the emulator
returns a comparison scalar whose value raises when read. Scalars bound ``nl.fori_loop``.
Not modelled: ``nl.int64`` (the emulator has no int64 dtype) and a scalar as ``scalar_offset``
of an access pattern (use the ``fori_loop`` induction register there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nkilib_msda.simulator.access import read, write
from nkilib_msda.simulator.dtypes import int32
from nkilib_msda.simulator.errors import NkiError, nki_error
from nkilib_msda.simulator.tensor import NkiTensor

__all__ = ["NkiScalar", "scalar_load", "scalar_store"]


def _wrap32(v: int) -> int:
    return int(np.array(v & 0xFFFFFFFF, dtype=np.uint32).view(np.int32))


class NkiScalar:
    """One runtime integer (nl.int32) loaded by ``scalar_load``."""

    def __init__(self, state: Any, dtype: Any = None, is_comparison: bool = False) -> None:
        self._value = _wrap32(int(state))
        self.dtype = int32 if dtype is None else dtype
        self.is_comparison = is_comparison

    def __nki_scalar_value__(self) -> int:
        if self.is_comparison:
            raise NkiError("NkiScalar: comparison: the result of a scalar comparison cannot be "
                           "used (NkiScalar docs)")
        return self._value

    def _other(self, other: Any, op: str) -> int:
        if isinstance(other, NkiScalar):
            return other.__nki_scalar_value__()
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return int(other)
        raise nki_error("NkiScalar", "operand", f"{op}: the other operand must be a Python int or "
                                                f"an NkiScalar, got {type(other).__name__}")

    def _new(self, v: int) -> "NkiScalar":
        return NkiScalar(v, self.dtype)

    def __add__(self, o: Any) -> "NkiScalar":
        return self._new(self.__nki_scalar_value__() + self._other(o, "+"))

    __radd__ = __add__

    def __sub__(self, o: Any) -> "NkiScalar":
        return self._new(self.__nki_scalar_value__() - self._other(o, "-"))

    def __rsub__(self, o: Any) -> "NkiScalar":
        return self._new(self._other(o, "-") - self.__nki_scalar_value__())

    def __mul__(self, o: Any) -> "NkiScalar":
        return self._new(self.__nki_scalar_value__() * self._other(o, "*"))

    __rmul__ = __mul__

    def __neg__(self) -> "NkiScalar":
        return self._new(-self.__nki_scalar_value__())

    def _cmp(self, o: Any, fn: Any) -> "NkiScalar":
        return NkiScalar(int(fn(self.__nki_scalar_value__(), self._other(o, "compare"))),
                         self.dtype, is_comparison=True)

    def __lt__(self, o: Any) -> "NkiScalar":
        return self._cmp(o, lambda a, b: a < b)

    def __le__(self, o: Any) -> "NkiScalar":
        return self._cmp(o, lambda a, b: a <= b)

    def __gt__(self, o: Any) -> "NkiScalar":
        return self._cmp(o, lambda a, b: a > b)

    def __ge__(self, o: Any) -> "NkiScalar":
        return self._cmp(o, lambda a, b: a >= b)

    def __bool__(self) -> bool:
        raise NkiError("NkiScalar: control flow: a runtime scalar has no Python truth value "
                       "(it is computed on device); use nl.while_loop / nl.fori_loop")

    def __repr__(self) -> str:
        return f"NkiScalar({self.dtype})"


def _check_1x1(ins: str, role: str, t: Any) -> NkiTensor:
    if not isinstance(t, NkiTensor) or t.size != 1 or t.buffer == "psum":
        raise nki_error(ins, role, f"{role} must be a 1x1 tensor in SBUF or HBM, got "
                                   f"{getattr(t, 'shape', type(t).__name__)} "
                                   f"{getattr(t, 'buffer', '')}")
    if str(t.dtype) != "int32":
        raise nki_error(ins, "dtype", f"{role} must be nl.int32 (nl.int64 is not modelled; "
                                      f"unsigned dtypes are rejected), got {t.dtype}")
    return t


def scalar_load(src: Any) -> NkiScalar:
    """Load a 1x1 nl.int32 tensor (SBUF or HBM) into an NkiScalar."""
    t = _check_1x1("scalar_load", "src", src)
    return NkiScalar(int(read(t, "scalar_load").reshape(-1)[0]), t.dtype)


def scalar_store(dst: Any, value: Any) -> None:
    """Store an NkiScalar into a 1x1 nl.int32 tensor (a Python int is rejected, as documented)."""
    t = _check_1x1("scalar_store", "dst", dst)
    if not isinstance(value, NkiScalar):
        raise nki_error("scalar_store", "value", f"value must be an NkiScalar (use nisa.memset for "
                                                 f"constants), got {type(value).__name__}")
    write(t, np.array([value.__nki_scalar_value__()], dtype=np.int32), "scalar_store")
