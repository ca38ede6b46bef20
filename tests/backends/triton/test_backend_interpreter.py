"""Triton kernels under the CPU interpreter (TRITON_INTERPRET=1) at tiny sizes.

The interpreter mode is fixed when ``@triton.jit`` runs, so the cases execute in one
subprocess with the variable set (the rest of the suite keeps compiled-mode Triton); each case
is reported as its own test. Compared with the NumPy float64 reference within the GPU checks' tolerances
(``nkilib_msda.workloads.GPU_TOLERANCES``, relative L2), forward and all three gradients.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is an optional dependency (pip install .[gpu])")
pytest.importorskip("torch")

CASES_SCRIPT = Path(__file__).with_name("_interpreter_cases.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
CASE_NAMES = [
    "fp32_blnc_zeros",
    "fp32_bnlc_b2qhlp_border_align_c6",
    "fp32_blnc_b2qhlp_zeros_align_head_fastest",
    "bf16_bnlc_zeros",
    "bf16_kept_scratch_repeated",
    "fp16_blnc_border",
    "samples_kernel_lp_not_pow2",
    "int64_indexing_forced",
    "deterministic_bitwise",
    "compute_subsets",
    "samples_backward",
    "points_backward_fast_mode",
    "multi_query_programs",
    "nonfinite_coordinates",
    "nonfinite_values_outside_map",
    "edge_numerics",
]


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    # The repository first, then whatever path found triton for this process.
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, str(CASES_SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"interpreter cases crashed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_case_list_matches_script(interpreter_results):
    assert sorted(interpreter_results) == sorted(CASE_NAMES)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_interpreter_case(interpreter_results, case):
    result = interpreter_results[case]
    assert result["ok"], (
        f"{case}: relative L2 errors [out, grad_value, grad_loc, grad_attn] = {result['errors']} "
        f"(tolerance {result['tolerance']}) {result['note']}")
