"""The simulator test set: tests that run the package's NKI kernels in a simulator (the
emulator; see docs/emulator.md). Every test under this folder carries the ``simulator`` marker,
so ``pytest -m simulator`` (or ``pytest simulator_tests``) runs exactly this set."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.simulator)
