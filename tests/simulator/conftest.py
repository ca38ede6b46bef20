"""Emulator tests run in strict mode by default (uninitialised reads and hazard warnings are
errors); tests of the default, official-simulator behaviour pass ``strict=False`` explicitly
(docs/emulator.md, "Memory, hazards and strict mode")."""

from __future__ import annotations

import pytest

from nkilib_msda.simulator.jit import STRICT_ENV


@pytest.fixture(autouse=True)
def _strict_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STRICT_ENV, "1")
