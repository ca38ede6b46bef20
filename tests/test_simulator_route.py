"""The route docs/emulator.md gives for running simulator_tests/ under the official
``nki.simulate``, proven with the emulator standing in for the Neuron SDK.

A fresh interpreter registers the emulator as ``nki`` (``install_as_nki``) before anything
imports ``nkilib_msda``, so ``nkilib_msda._nki`` takes it for a real ``nki``
(``USING_REAL_NKI``) and the simulator tests' ``nki_route.simulate`` calls ``nki.simulate``,
with ``kernel[2]`` at LNC 2, exactly as it would with the SDK installed. The run uses the
documented command (``NKILIB_MSDA_NKI=auto``, ``-m "simulator and not emulator_only"``) and
counts the ``nki.simulate`` calls. Without ``NKILIB_MSDA_NKI=auto`` the same run stays on the
emulator (the test roots' conftest.py sets ``emulator`` by default): checked too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["simulator_tests/experimental/deformable_attention/test_ms_deformable_attention_nonfinite.py",
         "simulator_tests/experimental/deformable_attention/test_ms_deformable_attention.py"]
SELECT = "simulator and not emulator_only"

PROBE = """
import sys
from nkilib_msda.simulator import install_as_nki
install_as_nki()  # stands in for the Neuron SDK's nki
import nki
import pytest

calls = {"all": 0, "lnc2": 0}
official = nki.simulate


def counting(kernel):
    calls["all"] += 1
    calls["lnc2"] += getattr(kernel, "lnc", 1) == 2
    return official(kernel)


nki.simulate = counting
code = pytest.main(["-p", "no:cacheprovider", "-m", %(select)r, "-k", "nonfinite or lnc1_equals_lnc2",
                    *%(files)r])
from nkilib_msda._nki import USING_REAL_NKI
import nki_route
try:
    nki_route.simulate(lambda: None, report=True)
    refused = False
except RuntimeError:
    refused = True
print(f"ROUTE real_nki={USING_REAL_NKI} calls={calls['all']} lnc2={calls['lnc2']} report_refused={refused}")
sys.exit(int(code))
"""


def test_simulator_tests_run_through_nki_simulate_when_nki_is_importable():
    env = {k: v for k, v in os.environ.items() if k != "NEURON_LOGICAL_NC_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NKILIB_MSDA_NKI"] = "auto"  # the documented route: the test roots' conftest defaults to the emulator
    proc = subprocess.run([sys.executable, "-c", PROBE % {"select": SELECT, "files": FILES}], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "simulator tests run kernels through: nki.simulate (neuron nki" in out, out[-3000:]
    summary = re.search(r"(\d+) passed", out)
    assert summary and int(summary.group(1)) >= 30 and " failed" not in out, out[-3000:]
    route = re.search(r"ROUTE real_nki=True calls=(\d+) lnc2=(\d+) report_refused=True", out)
    assert route, out[-3000:]
    calls, lnc2 = int(route.group(1)), int(route.group(2))
    # every kernel run went through nki.simulate (some nonfinite tests check the reference
    # alone); test_lnc1_equals_lnc2 launches kernel[2] once per gather method
    assert calls >= 20 and lnc2 == 2, (calls, lnc2)


def test_without_auto_the_simulator_tests_stay_on_the_emulator():
    env = {k: v for k, v in os.environ.items() if k not in ("NKILIB_MSDA_NKI", "NEURON_LOGICAL_NC_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co",
                           "-m", SELECT, FILES[0]], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "simulator tests run kernels through: the nkilib_msda emulator" in proc.stdout, proc.stdout[-2000:]
