"""Shared pytest configuration of both test roots (``simulator_tests``: NKI kernels in a
simulator; ``tests``: everything else): always run NKI kernels on the package's emulator, and
put this checkout and the folders of the test helper modules on ``sys.path``.

pytest runs with ``--import-mode=importlib`` (pyproject ``addopts``): test modules are imported
under names derived from their paths, so two test files may share a base name (both roots
mirror the package file by file: ``tests/reference/test_msda.py`` and
``tests/validation/test_msda.py``), and no test folder is put on ``sys.path``. The helper
modules (any ``.py`` file under the roots that is neither a ``test_*.py`` file nor a
``conftest.py``: ``msda_cases``, ``_torch_inputs``, ``_core_helpers``, ...) are imported by their
plain names, so their folders go on ``sys.path`` here; their names are unique across both roots
(``tests/test_mirrored_tests.py``)."""

import os
import sys
from pathlib import Path

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

_ROOT = Path(__file__).resolve().parent
TEST_ROOTS = ("simulator_tests", "tests")


def helper_folders(root: Path = _ROOT) -> list[Path]:
    """The folders holding test helper modules, sorted."""
    return sorted({p.parent for top in TEST_ROOTS for p in (root / top).rglob("*.py")
                   if not p.name.startswith("test_") and p.name != "conftest.py"})


# This checkout first (its nkilib_msda, not another installed copy), then the helper folders.
for _folder in [_ROOT, *helper_folders()][::-1]:
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "default", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile(
        "thorough", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra
    pass
