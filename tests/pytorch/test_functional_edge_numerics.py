"""Numerics at the edges agree across backends (docs/math.md, "Non-finite inputs"):
infinite attention weights (also on samples with corners outside the map) and grad_output
near the float32 maximum, on the reference backend (both of its CPU formulations) and on the
nki backend (the NKI kernels in the emulator), against the float64 NumPy reference. The same
checks run for triton under its interpreter and on CUDA (tests/backends/triton/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from nkilib_msda.backends.reference import backend as reference_torch
from nkilib_msda.backends.reference._grad_scale import row_scales


def _load_edge_numerics():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "edge_numerics.py"
    spec = importlib.util.spec_from_file_location("nkilib_edge_numerics", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


edge = _load_edge_numerics()
BACKENDS = ("reference", "reference-general-path", "nki")
CONFIGS = (("zeros", "BLNC", 0), ("zeros", "BNLC", 1), ("border", "BLNC", 2), ("border", "BNLC", 3))


def _backend(name, monkeypatch):
    if name == "reference-general-path":  # the formulation every non-CPU device runs
        monkeypatch.setattr(reference_torch, "_CPU_PATH", False)
        return "reference"
    return name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding_mode,value_layout,seed", CONFIGS)
def test_infinite_attention_weights(backend, padding_mode, value_layout, seed, monkeypatch):
    problems = edge.infinite_weight_mismatches(_backend(backend, monkeypatch), "cpu",
                                               padding_mode, value_layout, seed)
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding_mode,value_layout,seed", CONFIGS)
def test_grad_output_near_float32_max(backend, padding_mode, value_layout, seed, monkeypatch):
    problems = edge.huge_grad_mismatches(_backend(backend, monkeypatch), "cpu", padding_mode,
                                         value_layout, seed)
    assert not problems, "; ".join(problems)


def test_row_scales_are_exact_powers_of_two():
    big = torch.tensor([3e38, -1e38, 1.0])
    rows = torch.stack([torch.tensor([1.5, -0.25, 0.0]), big, torch.tensor([2.0, 0.0, 0.0]),
                        torch.tensor([float("inf"), 1.0, 0.0]), torch.tensor([float("nan"), 5.0, 0.0]),
                        torch.zeros(3)])
    down, up = row_scales(rows)
    assert down.shape == (6, 1)
    assert torch.equal(down[[0, 3, 4, 5]], torch.ones(4, 1))  # below 2, inf, NaN, zero: untouched
    assert down[2].item() == 0.5 and up[2].item() == 2.0
    scaled = rows[1] * down[1]
    assert 1.0 <= scaled.abs().max().item() < 4.0  # 2^-126 is the smallest normal scale
    assert torch.equal(scaled * up[1], rows[1])  # exact round trip
    assert torch.equal(down * up, torch.ones(6, 1))
