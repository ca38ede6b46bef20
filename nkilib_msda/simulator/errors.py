"""Errors and warnings raised by the NKI emulator (the lowest layer: imports no emulator module).

Every violation of an enforced NKI rule raises :class:`NkiError` built by :func:`nki_error`:
it carries the structured fields ``instruction``, ``rule`` and ``detail`` and its message
reads ``"<instruction>: <rule>: <detail>"``, so tests and users see which instruction broke
which rule without parsing text.

Hazards (legal per AWS's hardware-tested kernels, but outside what the docs promise) are
:class:`NkiHazardWarning`\\ s issued by :func:`hazard`; in strict mode (see docs/emulator.md,
"Memory, hazards and strict mode") :func:`hazard` raises the equivalent NkiError instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from nkilib_msda._env import EnvironmentVariableError

__all__ = ["NkiError", "NkiWarning", "NkiHazardWarning", "nki_error", "hazard",
           "OtherProgramAborted", "NkiEnvironmentVariableError", "env_error",
           "NkiArgumentError", "argument_error"]


class NkiError(Exception):
    """A kernel broke an NKI rule the compiler or the hardware would reject (or hit UB).

    ``instruction``, ``rule`` and ``detail`` are the structured parts of the message (empty
    strings when the error was raised with a free-text message only)."""

    def __init__(self, message: str = "", *, instruction: str = "", rule: str = "",
                 detail: str = "") -> None:
        super().__init__(message)
        self.instruction = instruction
        self.rule = rule
        self.detail = detail if (detail or instruction or rule) else message

    def __reduce__(self) -> Any:  # keep the structured fields across pickling (threads, xdist)
        return (_rebuild_error, (type(self), str(self), self.instruction, self.rule, self.detail))


def _rebuild_error(cls: type, message: str, instruction: str, rule: str,
                   detail: str) -> "NkiError":
    return cls(message, instruction=instruction, rule=rule, detail=detail)


class NkiEnvironmentVariableError(NkiError, EnvironmentVariableError):
    """A bad environment variable met by the emulator: an NkiError (the emulator's rule
    errors) and the package's one EnvironmentVariableError (a ValueError) alike."""


class NkiArgumentError(NkiError, ValueError):
    """A caller's argument that cannot be passed to a kernel (an empty array, a dtype NKI
    lacks): an NkiError, and a ValueError like every error the caller's arguments cause."""


def argument_error(rule: str, detail: str) -> NkiArgumentError:
    """``"kernel arguments: <rule>: <detail>"`` as an :class:`NkiArgumentError`."""
    return NkiArgumentError(f"kernel arguments: {rule}: {detail}", instruction="kernel arguments",
                            rule=rule, detail=detail)


def env_error(instruction: str, rule: str, cause: EnvironmentVariableError,
              why: str = "") -> NkiEnvironmentVariableError:
    """The emulator's form of a bad-variable error: ``"<instruction>: <rule>: <cause>[; why]"``."""
    detail = f"{cause}; {why}" if why else str(cause)
    return NkiEnvironmentVariableError(f"{instruction}: {rule}: {detail}", instruction=instruction,
                                       rule=rule, detail=detail)


class NkiWarning(UserWarning):
    """Behaviour that is legal but suspicious (e.g. accumulate onto non-matmul PSUM data).

    ``rule`` names the rule (empty when created from a plain message)."""

    def __init__(self, message: str = "", *, instruction: str = "", rule: str = "") -> None:
        super().__init__(message)
        self.instruction = instruction
        self.rule = rule


class NkiHazardWarning(NkiWarning):
    """A hazard: accepted because AWS's hardware-tested kernels rely on it, although the docs
    do not promise it (or describe it as undefined). Strict mode turns it into an NkiError."""


def nki_error(instruction: str, rule: str, detail: str) -> NkiError:
    """The one constructor of rule errors: message ``f"{instruction}: {rule}: {detail}"``."""
    return NkiError(f"{instruction}: {rule}: {detail}", instruction=instruction, rule=rule,
                    detail=detail)


def hazard(instruction: str, rule: str, detail: str, *, strict: bool,
           stacklevel: int = 3) -> None:
    """Report a hazard: an :class:`NkiHazardWarning` naming ``rule``, or (``strict``) raise
    the NkiError with the same fields."""
    if strict:
        raise nki_error(instruction, rule, detail + " (strict mode turns this hazard into an "
                                                    "error)")
    warnings.warn(NkiHazardWarning(f"{instruction}: {rule}: {detail}", instruction=instruction,
                                   rule=rule), stacklevel=stacklevel)


class OtherProgramAborted(Exception):
    """Raised in one LNC program because another program of the same run failed or the run was
    interrupted (Ctrl-C); never the cause of a failure, so callers re-raise the other error."""
