"""Timing model on our MSDA kernels (small shapes): the modelled time scales with N_q."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nkilib_msda.tools.check import run_backward, run_forward
from nkilib_msda.workloads import PRESETS, make_grad_output, make_inputs

pytestmark = pytest.mark.emulator_only  # the emulator's modelled time

CASE = replace(PRESETS["tiny"], num_queries=256)


def _work_us(report):
    t = report.timing
    assert t.low_us <= t.estimate_us <= t.high_us
    return t.estimate_us - t.params["launch_floor_us"]


def test_forward_time_grows_linearly_with_queries():
    """Doubling the added queries doubles the added time. (The forward prepares the next tile
    while gathering the current one, so the first tile's preparation is a fixed cost that a
    plain ratio of two times would count as work.)"""
    def work(queries):
        return _work_us(run_forward(make_inputs(replace(CASE, num_queries=queries), seed=1))[1])

    t256, t512, t1024 = work(256), work(512), work(1024)
    assert (t1024 - t512) / (t512 - t256) == pytest.approx(2.0, rel=0.2)
    assert t512 > t256 > 0


def test_doubling_queries_roughly_doubles_the_backward_time():
    def work(case):
        args = make_inputs(case, seed=2)
        return _work_us(run_backward(make_grad_output(case, seed=2), args)[1])

    assert work(replace(CASE, num_queries=512)) / work(CASE) == pytest.approx(2.0, rel=0.25)
