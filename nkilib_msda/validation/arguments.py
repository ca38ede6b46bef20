"""Checks of single plain arguments, one definition each, shared by every layer above.

:func:`check_positive_int` is THE positive-int check: a bool, a float (even ``2.0``), a string
or a number below 1 raise one exception type, ``ValueError``, whose message names the argument,
says what was expected and shows what was received.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_positive_int"]


def check_positive_int(name: str, arg: Any) -> int:
    """``arg`` as an int >= 1 (NumPy integers accepted); ValueError naming ``name`` otherwise."""
    if isinstance(arg, bool) or not isinstance(arg, numbers.Integral) or arg < 1:
        raise ValueError(f"{name}: expected a positive int, got {arg!r} ({type(arg).__name__})")
    return int(arg)
