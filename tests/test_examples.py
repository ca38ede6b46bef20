"""The examples run end to end (as subprocesses, with bounded time)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str, timeout: int = 300) -> str:
    env = dict(os.environ, NKILIB_MSDA_NKI="emulator", HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                            text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("lnc", ["", "2"], ids=["unset", "2"])
def test_simulate_kernels_example(monkeypatch, lnc):
    """Its --lnc default is the package's rule, as `nkilib-msda check`'s: NEURON_LOGICAL_NC_CONFIG,
    else 1 (it used to be 2)."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    out = _run("simulate_kernels.py", "--queries", "40", "--quiet")
    lines = [line for line in out.splitlines() if "relative error" in line]
    assert len(lines) == 2
    assert all(f"(LNC {lnc or 1}, " in line for line in lines), lines
    errors = [float(tok) for line in lines for tok in line.replace(",", " ").split()
              if tok[:1].isdigit() and "e" in tok]
    assert len(errors) == 4 and max(errors) < 2e-2


@pytest.mark.slow
def test_hf_deformable_detr_swap_example():
    pytest.importorskip("transformers")
    out = _run("hf_deformable_detr_swap.py", "--steps", "2")
    assert "patched 3 MultiScaleDeformableAttention layers" in out
    assert "step 1: loss" in out


@pytest.mark.slow
def test_train_trn2_dry_run_example():
    out = _run("train_trn2.py", "--dry-run", "--steps", "2")
    assert "step 1: loss" in out
    assert "parameters identical on all 2 ranks: True" in out
    # random image sizes padded to 4 buckets: the count of graphs a static-shape compiler needs
    seen = re.search(r"distinct spatial-shape sets: (\d+) over 2 steps x 2 ranks \(at most 4 buckets\)", out)
    assert seen and 1 <= int(seen.group(1)) <= 4


def test_train_trn2_without_torch_neuronx_says_to_use_dry_run():
    pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("torch_neuronx") is not None:
        pytest.skip("torch-neuronx is installed here")
    env = dict(os.environ, NKILIB_MSDA_NKI="emulator")
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_trn2.py"), "--steps", "1"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert "torch-neuronx" in result.stderr and "--dry-run" in result.stderr


@pytest.mark.slow
def test_train_trn2_dry_run_with_fsdp():
    out = _run("train_trn2.py", "--dry-run", "--steps", "2", "--fsdp")
    assert "step 1: loss" in out
    assert "parameters identical on all 2 ranks: True" in out


@pytest.mark.parametrize("args,needle", [
    (["--bucket-step", "0"], "argument --bucket-step: expected a positive integer, got 0"),
    (["--steps", "-1"], "argument --steps: expected a positive integer, got -1"),
    (["--batch-size", "two"], "argument --batch-size: expected a positive integer, got 'two'"),
])
def test_train_trn2_bad_arguments_are_one_line_and_exit_code_2(args, needle):
    """A bad size or count ends in argparse's one-line error with exit code 2, before any work
    (``--bucket-step 0`` used to print a 29-line traceback, ``--steps -1`` to run no step and
    exit 0)."""
    env = dict(os.environ, NKILIB_MSDA_NKI="emulator")
    result = subprocess.run([sys.executable, str(EXAMPLES / "train_trn2.py"), "--dry-run", *args],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
