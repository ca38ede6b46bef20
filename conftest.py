"""Shared pytest configuration: always run NKI kernels on the package's emulator."""

import os

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "default", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile(
        "thorough", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra
    pass
