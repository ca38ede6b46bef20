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


@pytest.fixture
def index_tiles(monkeypatch):
    """Record (instruction, first partition, partitions, columns) of every indirect DMA."""
    seen = []
    check = _dma_operands.check_index_tile

    def record(instruction, idx):
        seen.append((instruction, idx.start_partition, idx.shape[0], idx.shape[1]))
        check(instruction, idx)

    monkeypatch.setattr(_dma_operands, "check_index_tile", record)
    monkeypatch.setattr(dma, "check_index_tile", record)
    return seen


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("gather", ["transpose", "copy"])
@pytest.mark.parametrize("layout", ["BLNC", "BNLC"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_indirect_dmas_use_all_partitions_from_zero(preset, layout, gather, lnc, index_tiles):
    case = dataclasses.replace(PRESETS[preset], num_queries=QUERIES, batch=1, value_layout=layout)
    args = make_inputs(case, seed=lnc)
    out = simulate(ms_deformable_attention, lnc=lnc)(**args, gather_method=gather)
    assert_close(out, ms_deformable_attention_ref(**args), case.value_dtype)
    grad = make_grad_output(case, seed=lnc)
    got = simulate(ms_deformable_attention_bwd, lnc=lnc)(grad, **args, gather_method=gather)
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    for name, g, r in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"), got, refs):
        assert max_relative_error(g, r) <= tolerance(name, case.value_dtype), name
    kinds = {ins for ins, *_ in index_tiles}
    assert "dma_compute" in kinds and ({"dma_copy", "dma_transpose"} & kinds)
    assert all(first == 0 and parts == 128 for _, first, parts, _ in index_tiles), \
        sorted({(i, f, p) for i, f, p, _ in index_tiles if (f, p) != (0, 128)})
