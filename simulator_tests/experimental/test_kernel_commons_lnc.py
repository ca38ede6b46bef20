"""Which core am I, how many: every kernel shards by ``nl.num_programs()`` / ``nl.program_id(0)``.

The LNC degree reaches a kernel three ways (LNC page of the NKI docs): the environment
variable ``NEURON_LOGICAL_NC_CONFIG`` with a plain call (no grid: ``nl.program_ndim()`` is 0
but both cores run), the deprecated bracket launch ``kernel[2]``, or LNC 1. Each must give the
same result, and at LNC 2 each core must do half of the work (a kernel that decided "one core"
from ``program_ndim() == 0`` would make both cores do everything: grad_value counted twice).
Work per core is read from the per-program cost reports.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from msda_cases import MSDACase, assert_close, make_inputs
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    ms_deformable_attention)
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import (
    ms_deformable_attention_bwd)
from nkilib_msda.workloads import make_grad_output, max_relative_error, tolerance
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.simulator import simulate
from block_attn_res_cases import make_problem

pytestmark = pytest.mark.emulator_only  # the emulator's LNC launch modes and cost reports

LEVELS = ((6, 5), (3, 4), (2, 7))
CASE = MSDACase(num_queries=512, num_heads=2, num_points=2, spatial_shapes=LEVELS)
GRAD_TOL = {name: tolerance(name, CASE.value_dtype)
            for name in ("grad_value", "grad_sampling_locations", "grad_attention_weights")}


def _launch(kernel, how: str, monkeypatch):
    """The kernel launched at LNC 2 by env var ("env"), by bracket ("bracket"), or at LNC 1."""
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    if how == "env":
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
        return simulate(kernel, report=True)
    if how == "bracket":
        with warnings.catch_warnings():   # the bracket launch may warn that it is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            return simulate(kernel[2], report=True)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    return simulate(kernel, report=True)


def _run(runner, *args, **kwargs):
    with warnings.catch_warnings():   # the bracket launch may warn that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        return runner(*args, **kwargs)


def _indirect_descriptors(report) -> int:
    return sum(s.descriptors for (kind, _), s in report.dma.items() if kind.startswith("indirect"))


def _programs(report) -> list:
    return list(report.programs) if report.programs else [report]


@pytest.mark.parametrize("how", ["env", "bracket", "lnc1"])
@pytest.mark.parametrize("gather", ["transpose", "copy"])
def test_forward_lnc_launches(how, gather, monkeypatch):
    args = make_inputs(CASE)
    out, rep = _run(_launch(ms_deformable_attention, how, monkeypatch), **args,
                    gather_method=gather)
    assert_close(out, ms_deformable_attention_ref(**args), CASE.value_dtype, f"forward {how}")
    samples = CASE.num_queries * CASE.num_heads * CASE.num_levels * CASE.num_points
    programs = _programs(rep)
    assert len(programs) == (1 if how == "lnc1" else 2)
    for prog in programs:   # every core gathers exactly its share: 4 corners per sample
        assert _indirect_descriptors(prog) == 4 * samples // len(programs)
    one = _run(simulate(ms_deformable_attention, lnc=1), **args, gather_method=gather)
    np.testing.assert_array_equal(out.astype(np.float32), one.astype(np.float32))


@pytest.mark.parametrize("how", ["env", "bracket", "lnc1"])
def test_backward_lnc_launches(how, monkeypatch):
    """grad_value is counted once (not once per core), and each core scatters half."""
    args = make_inputs(CASE)
    grad = make_grad_output(CASE)
    *outs, rep = _run(_launch(ms_deformable_attention_bwd, how, monkeypatch), grad, **args,
                      max_scatter_indices_per_indirect=128)
    refs = ms_deformable_attention_bwd_ref(grad, **args)
    for (name, tol), got, ref in zip(GRAD_TOL.items(), outs, refs):
        err = max_relative_error(got, ref)
        assert err <= tol, f"{name} ({how}): relative error {err:.3g} > {tol}"
    programs = _programs(rep)
    assert len(programs) == (1 if how == "lnc1" else 2)
    scatters = [sum(s.descriptors for (kind, _), s in p.dma.items() if kind == "indirect_rmw")
                for p in programs]
    samples = CASE.num_queries * CASE.num_heads * CASE.num_levels * CASE.num_points
    assert scatters == [4 * samples // len(programs)] * len(programs)


@pytest.mark.parametrize("how", ["env", "bracket"])
def test_block_attn_res_forward_env_lnc_matches_lnc1(how, monkeypatch):
    values, _, w, gamma, *_ = make_problem(5, 4, False, 1, 256, 256, "bfloat16")
    *out2, rep2 = _run(_launch(block_attn_res_fwd, how, monkeypatch), values, w, gamma, 0.7,
                       1e-6, True)
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    *out1, rep1 = _run(simulate(block_attn_res_fwd, lnc=1, report=True), values, w, gamma, 0.7,
                       1e-6, True)
    for a, b in zip(out2, out1):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    programs = _programs(rep2)
    assert len(programs) == 2
    # half of the tokens each; both cores also read the [D] weight vectors (broadcast to 128
    # partitions), so a core's HBM traffic is a bit over half of LNC 1's, never all of it
    for prog in programs:
        assert prog.dma_hbm_bytes() <= 0.7 * rep1.dma_hbm_bytes()
        assert prog.instruction_count("dma") <= 0.7 * rep1.instruction_count("dma")
