"""Shared pytest configuration of both test roots (``simulator_tests``: NKI kernels in a
simulator; ``tests``: everything else): always run NKI kernels on the package's emulator, and
put the test helper modules that both roots use on ``sys.path`` (they are imported by their
plain names, e.g. ``from msda_cases import MSDACase``)."""

import os
import sys
from pathlib import Path

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

# Each shared helper lives beside most of its users: the kernel cases (msda_cases,
# block_attn_res_cases) with the kernel tests, the torch inputs (_torch_inputs) with the
# torch-layer tests.
_ROOT = Path(__file__).resolve().parent
for _helpers in (_ROOT / "simulator_tests" / "experimental", _ROOT / "tests" / "pytorch"):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "default", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile(
        "thorough", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra
    pass
