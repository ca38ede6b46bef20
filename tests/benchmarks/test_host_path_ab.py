"""benchmarks/host_path_ab.py: the side-by-side host-path script runs its child per tree and
prints the table (a CPU dry run; the timed run needs a CUDA device), and a failing child is
reported with its output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "host_path_ab.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO)


def test_dry_run_on_cpu_prints_every_row_of_each_tree():
    done = _run("--trees", f"this={REPO}", "--device", "cpu", "--rounds", "1", "--inner", "1",
                "--steps", "1")
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("| row |"):]
    for row in ("ours, shapes as Python ints", "ours, shapes as CUDA tensors",
                "trivial autograd.Function (floor)"):
        line = next(x for x in table.splitlines() if x.startswith(f"| {row} |"))
        assert float(line.split("|")[2].split()[0]) > 0


def test_a_failing_child_is_reported_with_its_output(tmp_path):
    (tmp_path / "nkilib_msda").mkdir()
    (tmp_path / "nkilib_msda" / "__init__.py").write_text("raise ImportError('broken tree')\n")
    done = _run("--trees", f"broken={tmp_path}", "--device", "cpu", "--rounds", "1")
    assert done.returncode != 0
    assert "broken tree" in done.stderr and f"child for tree {tmp_path}" in done.stderr


def test_trees_argument_is_required():
    done = _run()
    assert done.returncode == 2 and "--trees: expected LABEL=DIR" in done.stderr
