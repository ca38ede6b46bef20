"""The TorchNeuron path (``neuron`` device = PrivateUse1) on a CPU stand-in device whose kernel
launches run in the emulator. The checks run in one fresh subprocess because the stand-in
renames PyTorch's PrivateUse1 backend (global, once per process); see _neuron_checks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulator_only  # the nki backend's stand-in device runs the emulator

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parents[1]


@pytest.fixture(scope="module")
def checks_output() -> str:
    result = _run()
    return result.stdout + "\n" + result.stderr[-4000:]


def _run() -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), str(_HERE), str(_ROOT / "tests" / "pytorch"),
                                         env.get("PYTHONPATH", "")])
    env.pop("NEURON_LOGICAL_NC_CONFIG", None)
    env.pop("NKILIB_MSDA_BACKEND", None)
    return subprocess.run([sys.executable, str(_HERE / "_neuron_checks.py")], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", ["functional_forward_backward", "direct_op_call", "module",
                                  "block_attn_res", "lnc_degree", "no_torch_neuronx_message"])
def test_neuron_standin(name, checks_output):
    assert f"PASSED {name}\n" in checks_output, checks_output
