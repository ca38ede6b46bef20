"""Fingerprints of the timing model, to tell results of one model from those of another.

- :func:`graph_hash`: what a *recorded graph* depends on: the emulator's event and access
  geometry code, the recorder, the cost formulas and the hardware constants baked into node
  durations. Not the scheduler nor the unknowns' values (a pickled graph is re-scheduled with
  the current code, and every duration is linear in the unknowns). The calibration cache
  re-uses a graph only under the same graph hash.
- :func:`model_hash`: what a *modelled time* depends on: every source of the timing model
  (``simulator/timing/*.py``, scheduler, scenarios and constants included), the event and
  access geometry code, and the calibration data files. Two cached timings may be compared
  (a ratio) only if their model hashes are equal.

Both are the first 12 hex digits of a SHA-1 over the files' bytes (sorted by path).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["GRAPH_SOURCES", "graph_hash", "model_hash", "model_files"]

_PACKAGE = Path(__file__).resolve().parents[2]  # nkilib_msda/
GRAPH_SOURCES = ("simulator/access_geometry.py", "simulator/events.py",
                 "simulator/timing/recorder.py", "simulator/timing/costs.py",
                 "simulator/timing/guard.py", "simulator/timing/graph.py")


def _digest(paths: list[Path], extra: bytes = b"") -> str:
    h = hashlib.sha1()
    for path in sorted(paths):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(extra)
    return h.hexdigest()[:12]


def graph_hash(package_root: Path | None = None) -> str:
    """Hash of what a recorded graph depends on (``package_root``: the ``nkilib_msda``
    folder, for tests)."""
    from nkilib_msda.simulator.timing.constants import HARDWARE
    root = package_root or _PACKAGE
    return _digest([root / rel for rel in GRAPH_SOURCES],
                   repr(sorted(HARDWARE.items())).encode())


def model_files(package_root: Path | None = None) -> list[Path]:
    """The files :func:`model_hash` covers."""
    root = package_root or _PACKAGE
    timing = root / "simulator" / "timing"
    return (sorted(timing.glob("*.py")) + sorted((timing / "calibration").glob("*.json"))
            + [root / "simulator" / "access_geometry.py", root / "simulator" / "events.py"])


def model_hash(package_root: Path | None = None) -> str:
    """Hash of what a modelled time depends on (see the module docstring)."""
    return _digest(model_files(package_root))
