"""The kernels use the documented NKI 0.7/0.8 API forms (docs/kernels.md).

- indirect ``dma_transpose`` index tiles are 2-D uint32 SBUF tiles with 128 rows and a
  unit-stride free dim (no strided index views);
- padded index rows hold an explicit out-of-range value (no fp32 -> uint32 saturation);
- the MSDA backward issues one core barrier per buffer set both cores write (none at LNC 1);
- no deprecated or wrong API names in the kernel sources (``nl.max`` as a reduce op,
  ``total_available_sbuf_size``, ``program_ndim()`` as a core gate, direct ``core_barrier``).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from msda_cases import MSDACase, make_inputs
from nkilib_msda.experimental.deformable_attention import _sampling
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    ms_deformable_attention)
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import (
    ms_deformable_attention_bwd)
from nkilib_msda.workloads import make_grad_output
from nkilib_msda.simulator import simulate
from nkilib_msda.simulator.isa import dma as sim_dma
from nkilib_msda.simulator.tensor import NkiTensor

pytestmark = pytest.mark.emulator_only  # hooks into the emulator's DMA and tensor classes

KERNEL_DIR = pathlib.Path(__file__).resolve().parents[3] / "nkilib_msda" / "experimental"
LEVELS = ((6, 5), (3, 4))


@pytest.fixture
def transpose_indices(monkeypatch):
    """Record the index tensors of every indirect dma_transpose."""
    seen: list = []
    original_ap = NkiTensor.ap
    original_transpose = sim_dma.dma_transpose
    pending: dict = {}

    def ap(self, *args, **kwargs):
        view = original_ap(self, *args, **kwargs)
        if kwargs.get("vector_offset") is not None:
            pending[id(view)] = kwargs["vector_offset"]
        return view

    def dma_transpose(*args, **kwargs):
        src = kwargs.get("src", args[1] if len(args) > 1 else None)
        if id(src) in pending:
            seen.append(pending[id(src)])
        return original_transpose(*args, **kwargs)

    monkeypatch.setattr(NkiTensor, "ap", ap)
    import nkilib_msda.simulator.isa as isa_pkg
    monkeypatch.setattr(isa_pkg, "dma_transpose", dma_transpose)
    return seen


@pytest.mark.parametrize("num_queries", [256, 70])   # full tiles, ragged tiles
def test_forward_transpose_index_tiles_are_contiguous(transpose_indices, num_queries):
    c = MSDACase(num_queries=num_queries, num_heads=2, num_points=3, spatial_shapes=LEVELS)
    simulate(ms_deformable_attention, lnc=1)(**make_inputs(c), gather_method="transpose")
    assert transpose_indices, "no indirect dma_transpose was recorded"
    for idx in transpose_indices:
        assert idx.buffer == "sbuf" and str(idx.dtype) == "uint32" and idx.ndim == 2
        assert idx.shape[0] == 128
        assert idx.shape[1] == 1 or idx.strides[1] == 1, f"strided index view {idx.strides}"


def test_backward_transpose_index_tiles_are_contiguous(transpose_indices):
    c = MSDACase(num_queries=70, num_heads=2, num_points=3, spatial_shapes=LEVELS)
    simulate(ms_deformable_attention_bwd, lnc=1)(make_grad_output(c), **make_inputs(c),
                                                 gather_method="transpose")
    assert transpose_indices, "no indirect dma_transpose was recorded"
    for idx in transpose_indices:
        assert idx.buffer == "sbuf" and str(idx.dtype) == "uint32" and idx.ndim == 2
        assert idx.shape[0] == 128 and (idx.shape[1] == 1 or idx.strides[1] == 1)


def test_padding_row_is_exact_and_out_of_range():
    for rows in (1, 5, 129, 2**24 - 1, 3 * 2**24 + 7):
        value = _sampling.padding_row(rows)
        assert value >= rows and float(np.float32(value)) == value
        assert int(np.uint32(value)) == int(value)   # representable: no saturation involved
    with pytest.raises(ValueError, match="uint32"):
        _sampling.padding_row(2**32 + 1)


@pytest.mark.parametrize("lnc,sets", [(2, 1), (2, 3), (1, 2)])
def test_backward_one_barrier_per_buffer_set(lnc, sets):
    c = MSDACase(num_queries=96, num_heads=2, num_points=2, spatial_shapes=LEVELS)
    *_, rep = simulate(ms_deformable_attention_bwd, lnc=lnc, report=True)(
        make_grad_output(c), **make_inputs(c), num_scatter_buffers=sets,
        max_scatter_indices_per_indirect=64)
    programs = rep.programs or [rep]
    for prog in programs:
        assert prog.instruction_count("sync", "core_barrier") == (sets if lnc == 2 else 0)


def _kernel_sources():
    return sorted(p for p in KERNEL_DIR.rglob("*.py"))


@pytest.mark.parametrize("pattern,why", [
    (r"op\s*=\s*nl\.max\b", "tensor_reduce's ALU op is nl.maximum"),
    (r"total_available_sbuf_size", "deprecated since NKI 0.4: nl.tile_size.sbuf_fmax_bytes"),
    (r"program_ndim\(\)\s*(==|>|!=|<)", "program_ndim() counts grid axes, not cores"),
    (r"nisa\.core_barrier\(", "use kernel_commons.core_barrier (nki.lnc.core_barrier)"),
    (r"2\s*\*\*\s*32\)", "no reliance on fp32 -> uint32 saturation"),
])
def test_kernel_sources_use_current_api(pattern, why):
    offenders = []
    for path in _kernel_sources():
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line) and path.name != "kernel_commons.py":
                offenders.append(f"{path.name}:{no}: {line.strip()}")
    assert not offenders, f"{why}: " + "; ".join(offenders)
