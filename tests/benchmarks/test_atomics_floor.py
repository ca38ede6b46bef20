"""benchmarks/atomics_floor.py under the Triton interpreter: the floor kernel adds exactly what
the fast backward adds to grad_value (same rows, coefficients and channel vectors), fp32 and
bf16 (whose accumulator is fp32), on fresh inputs of a tiny shape with corners outside the map."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is an optional dependency (pip install .[gpu])")
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def test_floor_adds_what_the_fast_backward_adds():
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "atomics_floor.py"), "--check"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("tolerance 1e-05") == 2
