"""Fingerprints of the timing model (simulator/timing/fingerprint.py): the graph hash follows
what a recorded graph depends on, the model hash everything a modelled time depends on."""

from __future__ import annotations

import shutil
from pathlib import Path

import nkilib_msda
from nkilib_msda.simulator.timing import fingerprint


def _copy_package(tmp_path: Path) -> Path:
    """The files both hashes read, copied into a scratch ``nkilib_msda`` folder."""
    root = Path(nkilib_msda.__file__).parent
    dst = tmp_path / "nkilib_msda"
    for path in fingerprint.model_files(root):
        target = dst / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return dst


def test_the_graph_hash_follows_the_recorder_not_the_scheduler(tmp_path):
    root = _copy_package(tmp_path)
    first = fingerprint.graph_hash(root)
    assert first == fingerprint.graph_hash()  # the copy hashes like the package
    (root / "simulator" / "timing" / "schedule.py").write_text("# re-scheduling changed\n")
    assert fingerprint.graph_hash(root) == first  # graphs are re-scheduled when loaded
    (root / "simulator" / "access_geometry.py").write_text("# another run rule\n")
    assert fingerprint.graph_hash(root) != first  # the recorded graphs are stale


def test_the_model_hash_follows_the_scheduler_and_the_calibration_data(tmp_path):
    root = _copy_package(tmp_path)
    first = fingerprint.model_hash(root)
    assert first == fingerprint.model_hash()
    (root / "simulator" / "timing" / "schedule.py").write_text("# another scheduler\n")
    second = fingerprint.model_hash(root)
    assert second != first
    data = root / "simulator" / "timing" / "calibration" / "trn2.json"
    data.write_text(data.read_text().replace('"scale"', '"scale" ', 1))
    assert fingerprint.model_hash(root) != second
