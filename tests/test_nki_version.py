"""A real ``nki`` older than 0.7 is refused with a message naming the version found."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nkilib_msda._nki import MIN_NKI_VERSION, require_supported_nki

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("version", ["0.6.0", "0.5.1", "0.3.0+abc", "v0.6"])
def test_old_versions_are_refused(version):
    with pytest.raises(ImportError, match=r"needs NKI >= 0\.7.*found nki " + version.replace("+", r"\+")):
        require_supported_nki(version)


@pytest.mark.parametrize("version", ["0.7.0", "0.8.0", "0.8.0.dev3+g1234", "1.0", None, "unknown"])
def test_supported_or_unknown_versions_pass(version):
    require_supported_nki(version)
    assert MIN_NKI_VERSION == (0, 7)


@pytest.mark.parametrize("version,ok", [("0.6.2", False), ("0.8.0", True)])
def test_import_with_a_fake_real_nki(tmp_path, version, ok):
    """End to end: a complete-looking ``nki`` package on the path decides the import."""
    pkg = tmp_path / "nki"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\ndef jit(f):\n    return f\n")
    (pkg / "isa.py").write_text("def dma_copy(**kw):\n    pass\n")
    (pkg / "language.py").write_text("")
    code = textwrap.dedent("""
        import nkilib_msda._nki as m
        print(m.USING_REAL_NKI, m.backend_name())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    env.pop("NKILIB_MSDA_NKI", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"True neuron nki {version}"
    else:
        assert proc.returncode != 0
        assert f"found nki {version}" in proc.stderr and "NKI >= 0.7" in proc.stderr
