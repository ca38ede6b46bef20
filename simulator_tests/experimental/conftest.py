"""The package's kernel tests run the emulator in strict mode: an uninitialised read or any
hazard warning (NkiHazardWarning) fails the test (docs/emulator.md, "Memory, hazards and
strict mode")."""

from __future__ import annotations

import pytest

from nkilib_msda.simulator.jit import STRICT_ENV


@pytest.fixture(autouse=True)
def _strict_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STRICT_ENV, "1")
