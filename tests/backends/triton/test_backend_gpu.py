"""GPU correctness of the Triton backend against float64 grid_sample (CUDA only).

Runs the cases of benchmarks/check_gpu.py (every dtype, layout combination, align_corners,
padding mode, non-power-of-two C_h, deterministic mode, compute subsets, non-finite inputs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is an optional dependency (pip install .[gpu])")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _load_benchmark(name):
    path = Path(__file__).resolve().parents[3] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"nkilib_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_gpu = _load_benchmark("check_gpu")
edge_numerics = _load_benchmark("edge_numerics")
CASES = list(check_gpu.cases())


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{name}-{str(dtype)[6:]}" for name, dtype, _ in CASES])
def test_check_gpu_case(index):
    name, dtype, kwargs = CASES[index]
    name, dtype_name, errors, ok = check_gpu.check_case(name, dtype, seed=index, **kwargs)
    assert ok, f"{name} {dtype_name}: relative L2 errors [out, gv, gl, ga] = {errors}"


def test_nonfinite_coordinates():
    name, _, errors, ok = check_gpu.check_nonfinite()
    assert ok, f"{name}: {errors}"


def test_edge_numerics():
    """Infinite attention weights; grad_output near the float32 maximum (docs/math.md)."""
    problems = edge_numerics.check_edge_numerics("triton", "cuda")
    assert not problems, "; ".join(problems)


@pytest.mark.slow
def test_encoder_bf16_accuracy():
    for name, _, errors, ok in check_gpu.check_encoder_bf16():
        if "accumulator=native" in name:
            continue  # informational row: bf16 atomics are not the default
        assert ok, f"{name}: {errors}"


@pytest.mark.slow
def test_int64_offsets():
    name, _, errors, ok = check_gpu.check_int64()
    assert ok, f"{name}: {errors}"
