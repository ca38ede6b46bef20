"""Calibration results as data: the fitted nominal values of the unknown parameters, one JSON
file per target under ``timing/calibration/<target>.json`` (shipped with the package).

A file records where its values came from (``commit`` of the timing model, ``date``, the
``fit_set`` of nki-library records, the global ``scale``, whether the fit was ``adopted``)
and ``nominals``: parameter name -> fitted value. :mod:`.constants` reads ``nominals`` and
uses each as that parameter's nominal value (the ranges stay as documented there). A fit
that was not adopted (see docs/calibration.md) is kept for reference with empty
``nominals``, so the hand-chosen nominal values stand.

The calibration tools (:mod:`nkilib_msda.tools.calibration`) write these files with
:func:`write`; nothing edits ``constants.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["CalibrationData", "DATA_DIR", "data_path", "load", "write"]

DATA_DIR = Path(__file__).with_name("calibration")
_KEYS = ("target", "commit", "date", "fit_set", "scale", "adopted", "nominals", "note")


@dataclass(frozen=True)
class CalibrationData:
    """One target's calibration record (see the module docstring)."""

    target: str
    commit: str
    date: str
    fit_set: tuple[str, ...]
    scale: float
    adopted: bool
    nominals: Mapping[str, float] = field(default_factory=dict)
    note: str = ""
    fitted: Mapping[str, float] = field(default_factory=dict)  # the fit's values, adopted or not


def data_path(target: str, directory: Path | None = None) -> Path:
    return (directory or DATA_DIR) / f"{target}.json"


def _check(doc: Mapping[str, Any], path: Path) -> CalibrationData:
    missing = [k for k in _KEYS if k not in doc]
    if missing:
        raise ValueError(f"calibration data {path}: missing keys {missing}; expected {list(_KEYS)}")
    nominals = {str(k): float(v) for k, v in dict(doc["nominals"]).items()}
    for name, value in nominals.items():
        if not math.isfinite(value):
            raise ValueError(f"calibration data {path}: nominals[{name!r}] must be finite, "
                             f"got {value!r}")
    if nominals and not doc["adopted"]:
        raise ValueError(f"calibration data {path}: nominals must be empty when adopted is "
                         f"false, got {sorted(nominals)}")
    return CalibrationData(
        target=str(doc["target"]), commit=str(doc["commit"]), date=str(doc["date"]),
        fit_set=tuple(str(s) for s in doc["fit_set"]), scale=float(doc["scale"]),
        adopted=bool(doc["adopted"]), nominals=nominals, note=str(doc["note"]),
        fitted={str(k): float(v) for k, v in dict(doc.get("fitted", {})).items()})


def load(target: str, directory: Path | None = None) -> CalibrationData | None:
    """The calibration record of ``target``, or None when it has none."""
    path = data_path(target, directory)
    if not path.exists():
        return None
    data = _check(json.loads(path.read_text()), path)
    if data.target != target:
        raise ValueError(f"calibration data {path}: target must be {target!r}, got "
                         f"{data.target!r}")
    return data


def write(data: CalibrationData, directory: Path | None = None) -> Path:
    """Write ``data`` as ``<directory>/<target>.json`` (default: the package's data folder);
    returns the path. The file is read back and checked before it replaces the old one."""
    path = data_path(data.target, directory)
    doc = {"target": data.target, "commit": data.commit, "date": data.date,
           "fit_set": list(data.fit_set), "scale": data.scale, "adopted": data.adopted,
           "nominals": dict(sorted(data.nominals.items())), "note": data.note,
           "fitted": dict(sorted(data.fitted.items()))}
    _check(doc, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path
