"""The package's kernel tests run the emulator in strict mode: an uninitialised read or any
hazard warning (NkiHazardWarning) fails the test (docs/emulator.md, "Memory, hazards and
strict mode"); and with full_indirect: every indirect DMA covers all 128 partitions from
partition 0 and multi-column index tiles start 16-byte aligned (docs/emulator.md, "Indirect
DMAs as AWS issues them")."""

from __future__ import annotations

import pytest

from nkilib_msda.simulator.jit import FULL_INDIRECT_ENV, STRICT_ENV


@pytest.fixture(autouse=True)
def _strict_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STRICT_ENV, "1")
    monkeypatch.setenv(FULL_INDIRECT_ENV, "1")
