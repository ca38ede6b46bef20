"""Errors raised by the NKI emulator.

Every violation of an enforced NKI rule raises :class:`NkiError` whose message has the form
``"<instruction>: <rule>: <detail>"`` so tests (and users) can see which instruction broke
which rule.
"""

from __future__ import annotations

__all__ = ["NkiError", "NkiWarning", "nki_error", "OtherProgramAborted"]


class NkiError(Exception):
    """A kernel broke an NKI rule the compiler or the hardware would reject (or hit UB)."""


class NkiWarning(UserWarning):
    """Behaviour that is legal but suspicious (e.g. accumulate onto non-matmul PSUM data)."""


def nki_error(instruction: str, rule: str, detail: str) -> NkiError:
    """Build an :class:`NkiError` with the message ``f"{instruction}: {rule}: {detail}"``."""
    return NkiError(f"{instruction}: {rule}: {detail}")


class OtherProgramAborted(Exception):
    """Raised in one LNC program because another program of the same run failed or the run was
    interrupted (Ctrl-C); never the cause of a failure, so callers re-raise the other error."""
