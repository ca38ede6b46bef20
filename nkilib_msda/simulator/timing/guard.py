"""The timing model never breaks an emulation: a failing recorder method is switched off and
reported once (jit.py turns it into a :class:`TimingWarning` and ``report.timing`` is None)."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

__all__ = ["TimingWarning", "guarded"]


class TimingWarning(UserWarning):
    """The timing model could not record an instruction; the run has no ``report.timing``."""


_F = TypeVar("_F", bound=Callable[..., Any])


def guarded(method: _F) -> _F:
    """A failure of the timing model must not break the emulation: the first exception is
    kept in ``Timeline.failure`` and the recorder stops (jit.py warns, timing is None)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported through TimingWarning
            self.failure = f"{method.__name__}: {type(exc).__name__}: {exc}"
            return None

    return wrapper  # type: ignore[return-value]
