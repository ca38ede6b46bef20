"""A model exported with torch.export and saved loads and runs in a fresh process that only
imports nkilib_msda (and torch, in either order): the operators are registered as soon as both
are imported, without ``import nkilib_msda`` importing torch itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def _python(*args: str, backend: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_HERE.parents[1]), env.get("PYTHONPATH", "")])
    env.pop("NKILIB_MSDA_BACKEND", None)
    if backend is not None:
        env["NKILIB_MSDA_BACKEND"] = backend
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def saved_program(tmp_path_factory):
    """The directory holding the program exported (and its io) by a fresh CPU process."""
    directory = tmp_path_factory.mktemp("export")
    saved = _python(str(_HERE / "_export_roundtrip.py"), "save", str(directory))
    assert "PASSED save" in saved.stdout, saved.stdout + saved.stderr[-4000:]
    return directory


def test_exported_program_loads_and_runs_after_only_importing_nkilib_msda(saved_program):
    tmp_path = saved_program
    # Without importing nkilib_msda the program cannot be loaded (the test can fail).
    bare = _python("-c", f"import torch; torch.export.load({str(tmp_path / 'tiny.pt2')!r})")
    assert bare.returncode != 0
    for first, second in (("torch", "nkilib_msda"), ("nkilib_msda", "torch")):
        script = (f"import sys, {first}, {second}; "
                  f"sys.argv = ['x', 'load', {str(tmp_path)!r}]; "
                  f"exec(open({str(_HERE / '_export_roundtrip.py')!r}).read())")
        loaded = _python("-c", script)
        assert "PASSED load" in loaded.stdout, (first, loaded.stdout + loaded.stderr[-4000:])


def test_import_nkilib_msda_alone_does_not_import_torch():
    result = _python("-c", "import sys, nkilib_msda; assert 'torch' not in sys.modules; "
                           "import torch; torch.ops.nkilib_msda.block_attn_res; print('ok')")
    assert result.stdout.strip() == "ok", result.stderr[-4000:]


def test_exported_program_selects_the_backend_where_it_runs(saved_program):
    """Exported on CPU with the automatic choice (the reference backend there), the program
    records "auto", so a process with NKILIB_MSDA_BACKEND=nki runs the nki kernels (counted in
    the backend module, outputs within the float32 tolerance of the exporting run's)."""
    ran = _python(str(_HERE / "_export_roundtrip.py"), "load-nki", str(saved_program),
                  backend="nki")
    assert "PASSED load-nki" in ran.stdout, ran.stdout + ran.stderr[-4000:]
