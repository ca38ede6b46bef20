"""Checks of single plain arguments, one definition each, shared by every layer above.

:func:`check_positive_int` is THE positive-int check: a bool, a float (even ``2.0``), a string
or a number below 1 raise one exception type, ``ValueError``, whose message names the argument,
says what was expected and shows what was received. :func:`check_probability` (a real number in
[0, 1]) and :func:`check_positive_number` (a finite real number > 0) follow the same rule; NaN
fails both.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_positive_int", "check_probability", "check_positive_number"]


def check_positive_int(name: str, arg: Any) -> int:
    """``arg`` as an int >= 1 (NumPy integers accepted); ValueError naming ``name`` otherwise."""
    if isinstance(arg, bool) or not isinstance(arg, numbers.Integral) or arg < 1:
        raise ValueError(f"{name}: expected a positive int, got {arg!r} ({type(arg).__name__})")
    return int(arg)


def check_probability(name: str, arg: Any) -> float:
    """``arg`` as a float in [0, 1] (any real number type but bool); ValueError naming ``name``
    otherwise (NaN included)."""
    if isinstance(arg, bool) or not isinstance(arg, numbers.Real) or not 0 <= float(arg) <= 1:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {arg!r} "
                         f"({type(arg).__name__})")
    return float(arg)


def check_positive_number(name: str, arg: Any) -> float:
    """``arg`` as a finite float > 0 (any real number type but bool); ValueError naming ``name``
    otherwise (NaN and inf included)."""
    if isinstance(arg, bool) or not isinstance(arg, numbers.Real) or not 0 < float(arg) < math.inf:
        raise ValueError(f"{name}: expected a finite positive number, got {arg!r} "
                         f"({type(arg).__name__})")
    return float(arg)
