"""Block AttnRes kernels at LNC=2: both programs issue the same instruction sequence.

NKI requires both logical cores to run identical control flow; only data and addresses may
depend on ``nl.program_id``. The emulator's per-program cost reports hold counts only, so this
test records each program's instruction stream (engine, opcode, elements) by wrapping
``CostReport.add_instruction`` (every instruction, DMAs included, is counted through it; each
program has its own report). Elements may legitimately differ only where the data is ragged:
odd BT (one tile of program 1 is one token shorter) and odd D (program 1's weight-gradient band
is one value shorter). Those cases also run the full forward -> backward cascade against the
float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.simulator.report import CostReport
from block_attn_res_cases import make_problem, run_cascade, simulate

pytestmark = pytest.mark.emulator_only  # the emulator's per-program cost reports


@pytest.fixture
def record_streams(monkeypatch):
    """Make every CostReport keep its instruction stream as ``report.stream``."""
    original = CostReport.add_instruction

    def add_instruction(self, engine, opcode, elements):
        self.__dict__.setdefault("stream", []).append((engine, opcode, int(elements)))
        original(self, engine, opcode, elements)

    monkeypatch.setattr(CostReport, "add_instruction", add_instruction)


def _streams(tokens, dim, *, n_src=5, dtype="bfloat16", rms_on=True, bwd_mode=None, seed=3):
    """(forward streams, backward streams) of programs 0 and 1 at LNC=2."""
    values, grad_h, w, gamma, *_ = make_problem(seed, n_src, False, 1, tokens, dim, dtype)
    gamma_arg = gamma if rms_on else None
    fwd = simulate(block_attn_res_fwd, lnc=2, report=True)(values, w, gamma_arg, 0.7, 1e-6, rms_on)
    rms = fwd[1] if rms_on else None
    bwd = simulate(block_attn_res_bwd, lnc=2, report=True)(grad_h, values, w, fwd[-2], gamma_arg, rms,
                                                           0.7, rms_on, bwd_mode)
    return ([p.stream for p in fwd[-1].programs], [p.stream for p in bwd[-1].programs],
            fwd[-1], bwd[-1])


def _opcodes(stream):
    return [(engine, opcode) for engine, opcode, _ in stream]


@pytest.mark.parametrize("tokens,dim,kwargs", [
    (260, 512, {}),                                  # 2 tiles of 65 tokens per program
    (256, 200, dict(rms_on=False)),                  # D not a multiple of 128, RMSNorm off
    (130, 1536, dict(bwd_mode="stream", n_src=3)),   # re-reading backward
    (128, 384, dict(dtype="float32")),               # fp32 (one coefficient split)
])
def test_even_shapes_issue_identical_streams(record_streams, tokens, dim, kwargs):
    fwd, bwd, fwd_report, bwd_report = _streams(tokens, dim, **kwargs)
    for name, (s0, s1) in (("forward", fwd), ("backward", bwd)):
        assert len(s0) > 20, name
        assert s0 == s1, f"{name}: first difference at {_first_difference(s0, s1)}"
    assert ("sync", "core_barrier", 0) in bwd[0]
    for report in (fwd_report, bwd_report):  # the per-program count view agrees
        p0, p1 = report.programs
        assert p0.instructions == p1.instructions and p0.dma_hbm_bytes() == p1.dma_hbm_bytes()


def _first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    return min(len(a), len(b)), "length", (len(a), len(b))


@pytest.mark.parametrize("tokens,dim,rms_on", [(259, 257, True), (131, 129, False)])
def test_odd_shapes_issue_the_same_opcodes(record_streams, tokens, dim, rms_on):
    """Odd BT and odd D: same instruction sequence; only element counts at the ragged ends."""
    fwd, bwd, _, _ = _streams(tokens, dim, rms_on=rms_on)
    for name, (s0, s1) in (("forward", fwd), ("backward", bwd)):
        assert _opcodes(s0) == _opcodes(s1), f"{name}: {_first_difference(_opcodes(s0), _opcodes(s1))}"
        total0, total1 = (sum(e for _, _, e in s) for s in (s0, s1))
        assert 0 < (total0 - total1) / total0 < 4 / tokens, name  # about one token's work
    # the last instruction copies the staged weight-gradient band: one value shorter on program 1
    assert bwd[0][-1] == ("dma", "dma_copy", (dim + 1) // 2)
    assert bwd[1][-1] == ("dma", "dma_copy", dim // 2)


def test_one_token_program_one_differs_only_by_the_token_tile(record_streams):
    """BT = 1 at LNC=2: program 1 has no token; its stream is program 0's minus one contiguous
    block (the tile), so the beta combine and the weight-gradient writes stay identical."""
    _, (s0, s1), _, _ = _streams(1, 256)
    start = _first_difference(s0, s1)[0]
    removed = len(s0) - len(s1)
    assert removed > 0 and s1 == s0[:start] + s0[start + removed:]
    assert ("sync", "core_barrier", 0) in s1[start:]


@pytest.mark.parametrize("case", [
    # odd BT and odd D (staged weight-gradient bands), RMSNorm on and off
    dict(n_blocks=4, partial=True, batch=1, seq=259, dim=257, lnc=2, scale=0.9),
    dict(n_blocks=6, partial=False, batch=1, seq=131, dim=129, rms_on=False, lnc=2, scale=1.3),
    # BT = 1 (program 1 has no token but still adds the partials of its band)
    dict(n_blocks=3, partial=False, batch=1, seq=1, dim=130, lnc=2),
    # D < 128, odd; D = 1
    dict(n_blocks=2, partial=True, batch=3, seq=30, dim=63, lnc=2, dtype="float32"),
    dict(n_blocks=2, partial=True, batch=1, seq=20, dim=1, lnc=2, dtype="float32"),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_ragged_lnc2_cascades_match_the_reference(case):
    run_cascade(**case)


def test_lnc2_weight_gradients_match_lnc1():
    """Same inputs at LNC=1 and LNC=2: the split sum agrees with the single-program sum."""
    values, grad_h, w, gamma, *_ = make_problem(11, 7, True, 1, 300, 257, "float32")
    fwd = simulate(block_attn_res_fwd)(values, w, gamma)
    one = simulate(block_attn_res_bwd)(grad_h, values, w, fwd[2], gamma, fwd[1])
    two = simulate(block_attn_res_bwd, lnc=2)(grad_h, values, w, fwd[2], gamma, fwd[1])
    np.testing.assert_array_equal(one[0], two[0])
    for a, b in zip(one[1:], two[1:]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * np.abs(a).max())
