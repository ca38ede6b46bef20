"""The simulator test set: tests that run the package's NKI kernels in a simulator: the
official ``nki.simulate`` where ``nkilib_msda._nki`` selected the Neuron SDK's ``nki``, else the
package's emulator (nki_route.py; docs/emulator.md, "Running the simulator tests under the
official nki.simulate"). Every test under this folder carries the ``simulator`` marker, so
``pytest -m simulator`` (or ``pytest simulator_tests``) runs exactly this set; pytest's header
names the route."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_report_header(config: pytest.Config) -> str:
    from nki_route import ROUTE

    return f"simulator tests run kernels through: {ROUTE}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.simulator)
