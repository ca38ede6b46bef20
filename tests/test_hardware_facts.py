"""One definition of each hardware fact (nkilib_msda/hardware.py), one planner SBUF budget.

The package is scanned token by token (comments and docstrings do not count): the partition
count 128 and the SBUF figures may appear as numbers only in the facts module, apart from an
explicit allow-list of unrelated 128s.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest

import nkilib_msda
from nkilib_msda import hardware
from nkilib_msda.validation.msda import MSDAProblem

PKG = Path(nkilib_msda.__file__).parent
FACTS = PKG / "hardware.py"
# 128s that are not the partition count.
ALLOWED_128 = {
    "backends/triton/plan.py": "a GPU block size",
    "workloads.py": "image sizes of named shapes (Mask2Former 128x128)",
}
SBUF_NUMBERS = {"211968", "212984", "212992", "207872", "204792", "204800", "229376", "262144",
                "245760", "237568"}
SBUF_PRODUCT = re.compile(r"\b(175|192|207|224|239|256)\s*\*\s*(1024|KIB)\b")


def _code_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if p != FACTS)


def _number_tokens(path: Path) -> list[tuple[str, int]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(t.string.replace("_", ""), t.start[0]) for t in tokens if t.type == tokenize.NUMBER]


def _code_only(path: Path) -> str:
    """The module's source with strings and comments blanked out."""
    out = []
    for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if t.type not in (tokenize.STRING, tokenize.COMMENT):
            out.append(t.string)
    return " ".join(out)


def test_the_partition_count_is_defined_once():
    found = []
    for path in _code_files():
        rel = path.relative_to(PKG).as_posix()
        found += [f"{rel}:{line}" for number, line in _number_tokens(path)
                  if number == "128" and rel not in ALLOWED_128]
    assert not found, f"use nkilib_msda.hardware.PARTITIONS (or a named fact) instead: {found}"


def test_sbuf_figures_are_defined_once():
    found = []
    for path in _code_files():
        rel = path.relative_to(PKG).as_posix()
        found += [f"{rel}:{line}" for number, line in _number_tokens(path) if number in SBUF_NUMBERS]
        if SBUF_PRODUCT.search(_code_only(path)):
            found.append(f"{rel}: an SBUF size written as N * 1024")
    assert not found, f"SBUF sizes live in nkilib_msda.hardware: {found}"


def test_facts_module_imports_nothing():
    tree = ast.parse(FACTS.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)


def test_the_one_budget():
    assert hardware.USABLE_SBUF_BYTES == {"trn2": 212_992, "trn3": 245_760}
    assert hardware.PLANNER_SBUF_RESERVE_BYTES == 8 * 1024
    assert hardware.PLANNER_SBUF_BUDGET == {"trn2": 204_800, "trn3": 237_568}
    for target in hardware.TARGETS:
        assert hardware.planner_sbuf_budget(hardware.USABLE_SBUF_BYTES[target]) \
            == hardware.PLANNER_SBUF_BUDGET[target]


def test_emulator_targets_read_the_facts():
    from nkilib_msda.simulator.targets import TARGETS

    assert set(TARGETS) == set(hardware.TARGETS)
    for name, target in TARGETS.items():
        assert target.num_partitions == hardware.PARTITIONS
        assert target.sbuf_bytes_per_partition == hardware.SBUF_BYTES_PER_PARTITION[name]
        assert target.usable_sbuf_bytes_per_partition == hardware.USABLE_SBUF_BYTES[name]
        assert target.psum_bytes_per_partition == hardware.PSUM_BYTES
        assert target.psum_bank_bytes * target.psum_num_banks == hardware.PSUM_BYTES


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_kernels_budget_in_the_emulator_is_the_planners(target):
    """Inside a kernel, kernel_sbuf_budget() is the target's usable SBUF minus the reserve; on
    trn2 it equals the host planners' default, so host and kernel plans agree."""
    from nkilib_msda.experimental.kernel_commons import kernel_sbuf_budget
    from nkilib_msda.simulator import jit, language as nl, simulate
    from nkilib_msda.simulator import isa as nisa

    @jit
    def budget(x):
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=kernel_sbuf_budget())
        nisa.dma_copy(dst=out, src=t)
        return out

    got = int(simulate(budget, target=target)(np.zeros((1, 1), np.float32))[0, 0])
    assert got == hardware.PLANNER_SBUF_BUDGET[target]


def _problem(**kw) -> MSDAProblem:
    levels = kw.pop("levels", ((4, 5), (2, 3)))
    starts, acc = [], 0
    for h, w in levels:
        starts.append(acc)
        acc += h * w
    base = dict(batch=1, num_queries=300, num_heads=8, head_dim=32, num_levels=len(levels),
                num_points=4, spatial_shapes=tuple(levels), level_start_index=tuple(starts),
                value_layout="BLNC", sampling_locations_layout="BQHLP2", align_corners=False,
                padding_mode="zeros")
    base.update(kw)
    return MSDAProblem(**base)


def test_every_planner_defaults_to_the_one_budget_and_quotes_it():
    from nkilib_msda.experimental.block_attn_res.tiling import plan_backward, plan_forward
    from nkilib_msda.experimental.deformable_attention.plan.backward_config import \
        plan_backward as plan_msda_backward
    from nkilib_msda.experimental.deformable_attention.plan.forward_config import \
        plan_forward as plan_msda_forward

    budget = hardware.PLANNER_SBUF_BUDGET["trn2"]
    assert plan_msda_backward(_problem(), "bfloat16").sbuf_budget == budget
    assert plan_forward(4, 256, 512, "bfloat16").sbuf_budget == budget
    assert plan_msda_forward(_problem(), "bfloat16").sbuf_bytes <= budget
    quoted = f"{budget:,}"
    with pytest.raises(ValueError, match=f"over the budget {quoted} "):
        plan_msda_backward(_problem(head_dim=4096, num_points=512), "float32")  # N_p bounds it
    with pytest.raises(ValueError, match=f"budget {quoted} B"):
        plan_msda_forward(_problem(num_heads=16, num_points=256, head_dim=512), "float32")
    with pytest.raises(ValueError, match=f"no tiling fits the {quoted} SBUF bytes"):
        plan_forward(4, 128, 20000, "float32")
    with pytest.raises(ValueError, match=f"no tiling fits the {quoted} SBUF bytes"):
        plan_backward(4, 128, 20000, "float32")
