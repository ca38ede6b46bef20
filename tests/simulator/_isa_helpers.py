"""Shared helpers of the instruction-group conformance tests (tests written from the NKI 0.8
pages' stated semantics; each test cites its page). The kernel runner and load/store helpers
are the emulator tests' own (tests/simulator/_core_helpers.py, on sys.path through
the root conftest.py)."""

from __future__ import annotations

from _core_helpers import in_kernel as run
from _core_helpers import gather_inputs, gather_rows, load, randn, store

__all__ = ["DOCS", "run", "load", "store", "randn", "gather_inputs", "gather_rows"]

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/"
