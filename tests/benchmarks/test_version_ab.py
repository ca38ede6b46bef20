"""benchmarks/version_ab.py without a GPU: the version spec with per-version environment and
the switch decision (a version must beat the default on every group beyond the noise)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import version_ab  # noqa: E402


def test_version_spec_carries_its_environment():
    assert version_ab.parse_version("a=/x") == ("a", "/x", {})
    assert version_ab.parse_version("b=.@A=1@B=x=y") == ("b", ".", {"A": "1", "B": "x=y"})


def _groups(times: dict[str, list[list[float]]]) -> dict:
    """label -> per-group round values, as time_rounds leaves them."""
    groups: dict = {}
    for label, per_group in times.items():
        for g, rounds in enumerate(per_group):
            groups.setdefault(("s", "d", str(g)), []).append(
                version_ab.Case(label, "s", "d", str(g), fn=lambda: None, rounds=rounds))
    return groups


def test_decide_picks_a_version_that_wins_everywhere(tmp_path):
    envs = {"default": {}, "fast": {"X": "1"}, "mixed": {"Y": "2"}, "again": {}}
    groups = _groups({
        "default": [[100, 101, 100], [50, 50.5, 50]],
        "fast": [[90, 91, 90], [45, 45.2, 45]],
        "mixed": [[80, 80, 80], [50.2, 50.1, 50]],  # not faster on the second group
        "again": [[100.5, 100, 100], [50, 50, 50.3]],
    })
    out = tmp_path / "env"
    assert version_ab.decide(groups, envs, str(out)) == "fast"
    assert out.read_text() == "export X=1\n"


def test_decide_refuses_gains_within_the_twin_noise(tmp_path):
    envs = {"default": {}, "fast": {"X": "1"}, "again": {}}
    groups = _groups({
        "default": [[100, 100, 100]],
        "fast": [[97, 97, 97]],
        "again": [[96, 96, 96]],  # the same code timed twice moved by 4
    })
    out = tmp_path / "env"
    assert version_ab.decide(groups, envs, str(out)) is None
    assert out.read_text() == ""
