"""A model exported with torch.export and saved loads and runs in a fresh process that only
imports nkilib_msda (the operators are registered by ``import nkilib_msda``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_HERE.parents[1]), env.get("PYTHONPATH", "")])
    env.pop("NKILIB_MSDA_BACKEND", None)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_exported_program_loads_and_runs_after_only_importing_nkilib_msda(tmp_path):
    saved = _python(str(_HERE / "_export_roundtrip.py"), "save", str(tmp_path))
    assert "PASSED save" in saved.stdout, saved.stdout + saved.stderr[-4000:]
    # Without importing nkilib_msda the program cannot be loaded (the test can fail).
    bare = _python("-c", f"import torch; torch.export.load({str(tmp_path / 'tiny.pt2')!r})")
    assert bare.returncode != 0
    script = ("import sys, torch, nkilib_msda; "
              f"sys.argv = ['x', 'load', {str(tmp_path)!r}]; "
              f"exec(open({str(_HERE / '_export_roundtrip.py')!r}).read())")
    loaded = _python("-c", script)
    assert "PASSED load" in loaded.stdout, loaded.stdout + loaded.stderr[-4000:]
