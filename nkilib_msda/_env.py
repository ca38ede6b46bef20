"""One parser for the package's environment variables and boolean switches.

Every ``NKILIB_MSDA_*`` variable is read through :func:`env_flag` (on/off switches such as
``NKILIB_MSDA_DETERMINISTIC`` and ``NKILIB_MSDA_EMULATOR_STRICT``) or :func:`env_choice` (one of a
fixed set of words, such as ``NKILIB_MSDA_NKI`` and ``NKILIB_MSDA_BACKEND``). An unset or empty
variable means "use the default"; any other value that is not accepted raises
:class:`EnvironmentVariableError` (a ``ValueError``) naming the variable, the accepted values and
the value received, instead of being silently ignored. :func:`check_optional_bool` does the same
for a public ``True``/``False``/``None`` argument such as ``deterministic=``.

This module imports nothing from the package, so any module (the emulator included) can use it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

__all__ = ["EnvironmentVariableError", "TRUE_WORDS", "FALSE_WORDS", "RENAMED_FROM", "env_flag",
           "env_choice", "check_optional_bool"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class EnvironmentVariableError(ValueError):
    """An environment variable holds a value the package does not accept."""


# Renamed variables, new name -> old name: when only the old one is set it is still read,
# with a DeprecationWarning ("emulator" is the package's one word for its NKI emulator).
RENAMED_FROM = {"NKILIB_MSDA_EMULATOR_STRICT": "NKILIB_MSDA_SIM_STRICT"}


def _lookup(name: str) -> tuple[str, str]:
    """(the variable actually read, its stripped value): ``name``, or its old name."""
    raw = os.environ.get(name, "").strip()
    old = RENAMED_FROM.get(name)
    if not raw and old and os.environ.get(old, "").strip():
        warnings.warn(f"{old} is deprecated: set {name} instead", DeprecationWarning, stacklevel=4)
        return old, os.environ[old].strip()
    return name, raw


def env_flag(name: str, default: bool | None = None) -> bool | None:
    """The boolean environment variable ``name``: ``default`` when unset or empty.

    Accepted (case-insensitive, surrounding spaces ignored): 1/true/yes/on and 0/false/no/off.
    """
    name, raw = _lookup(name)
    if not raw:
        return default
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvironmentVariableError(
        f"{name}: expected one of {'/'.join(TRUE_WORDS)} (on) or {'/'.join(FALSE_WORDS)} (off), "
        f"or unset, got {raw!r}")


def env_choice(name: str, choices: Sequence[str], default: str = "") -> str:
    """The environment variable ``name`` as one of ``choices`` (lower-cased); ``default`` when
    unset or empty."""
    name, raw = _lookup(name)
    if not raw:
        return default
    word = raw.lower()
    if word not in choices:
        raise EnvironmentVariableError(
            f"{name}: expected one of {list(choices)} (or unset), got {raw!r}")
    return word


def check_optional_bool(name: str, value: Any) -> bool | None:
    """A public argument that must be True, False or None (NumPy bools accepted)."""
    if value is None or isinstance(value, bool):
        return value
    if type(value).__name__ in ("bool_", "bool") and hasattr(value, "item"):  # NumPy bool
        return bool(value)
    raise TypeError(f"{name}: expected True, False or None, got {type(value).__name__} {value!r}")
