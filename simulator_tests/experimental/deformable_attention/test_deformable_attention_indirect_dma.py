"""Every indirect DMA of the MSDA kernels covers all 128 partitions from partition 0 and every
multi-column index tile starts 16-byte aligned (issue 29, findings 2 and 4), on every preset's
shape, both value layouts, both gather methods, LNC 1 and 2 and a ragged query tail.

The kernel tests run the emulator in strict mode, where ``check_index_tile`` raises on a
violation (docs/emulator.md, "Indirect DMAs in strict mode"); here every call is also recorded
so the test fails if no indirect DMA ran at all, and the results are compared with the float64
reference on the same rounded inputs.
"""

from __future__ import annotations

import dataclasses

import pytest

from msda_cases import PRESETS, assert_close, make_inputs
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import ms_deformable_attention
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import ms_deformable_attention_bwd
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.simulator import simulate
from nkilib_msda.simulator.isa import _dma_operands, dma
from nkilib_msda.workloads import make_grad_output, max_relative_error, tolerance

# 300 queries: both cores of LNC 2 end in a ragged forward tile and a partial backward block.
QUERIES = 300
# Presets on maps above this many pixels (all but tiny and default) take 3-30 s per case
# here: `pytest -m slow` runs them.
FAST_PIXELS = 2500
PRESET_PARAMS = [pytest.param(name, marks=() if sum(h * w for h, w in case.spatial_shapes) <= FAST_PIXELS
                              else pytest.mark.slow)
                 for name, case in sorted(PRESETS.items())]


@pytest.fixture
def index_tiles(monkeypatch):
    """Record (instruction, first partition, partitions, columns, byte offset in the
    partition) of every indirect DMA's index tile."""
    seen = []
    check = _dma_operands.check_index_tile

    def record(instruction, idx):
        offset = (idx.offset % idx.partition_stride) * idx.dtype.itemsize
        seen.append((instruction, idx.start_partition, idx.shape[0], idx.shape[1], offset))
        check(instruction, idx)

    monkeypatch.setattr(_dma_operands, "check_index_tile", record)
    monkeypatch.setattr(dma, "check_index_tile", record)
    return seen


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("gather", ["transpose", "copy"])
@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_indirect_dmas_use_all_partitions_from_zero(preset, layout, gather, lnc, index_tiles):
    case = dataclasses.replace(PRESETS[preset], num_queries=QUERIES, batch=1, value_layout=layout)
    _check_case(case, lnc, index_tiles, gather_method=gather)


@pytest.mark.parametrize("lnc", [1, 2])
def test_capped_chunks_are_128_partition_dmas(lnc, index_tiles):
    """Scatter slices of P_s = 32 and copy-gather slices of 64 partitions: each is a
    128-partition DMA whose other rows are skipped."""
    case = dataclasses.replace(PRESETS["default"], num_queries=QUERIES, batch=2)
    _check_case(case, lnc, index_tiles, gather_method="copy", bwd_knobs={
        "max_gather_indices_per_indirect": 64, "max_scatter_indices_per_indirect": 32})


def _check_case(case, lnc, index_tiles, gather_method, bwd_knobs=None):
    args = make_inputs(case, seed=lnc)
    out = simulate(ms_deformable_attention, lnc=lnc)(**args, gather_method=gather_method)
    assert_close(out, ms_deformable_attention_ref(**args), case.value_dtype)
    grad = make_grad_output(case, seed=lnc)
    got = simulate(ms_deformable_attention_bwd, lnc=lnc)(grad, **args, gather_method=gather_method,
                                                          **(bwd_knobs or {}))
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    for name, g, r in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"), got, refs):
        assert max_relative_error(g, r) <= tolerance(name, case.value_dtype), name
    kinds = {ins for ins, *_ in index_tiles}
    assert "dma_compute" in kinds and ({"dma_copy", "dma_transpose"} & kinds)
    assert all(first == 0 and parts == 128 for _, first, parts, _, _ in index_tiles), \
        sorted({(i, f, p) for i, f, p, _, _ in index_tiles if (f, p) != (0, 128)})
    assert all(cols == 1 or offset % 16 == 0 for *_, cols, offset in index_tiles)
