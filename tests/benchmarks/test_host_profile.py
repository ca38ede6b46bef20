"""benchmarks/host_profile.py: who a cProfile entry's own time is charged to, and a table whose
group rows add up to the profiled time of the calls."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def host_profile(monkeypatch):
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    import host_profile

    return host_profile


@pytest.mark.parametrize("filename,function,group", [
    ("~", "<method 'run_backward' of 'torch._C._EngineBase' objects>", "autograd engine (C++)"),
    ("/x/site-packages/torch/autograd/__init__.py", "grad", "torch Python"),
    ("~", "<built-in method torch.empty_like>", "torch C ops"),
    ("/x/site-packages/triton/compiler/compiler.py", "runner", "triton"),
    ("~", "<built-in method __triton_launcher.launch>", "triton"),
    ("/repo/nkilib_msda/backends/triton/backend.py", "msda_backward", "nkilib_msda backends"),
    ("/repo/nkilib_msda/pytorch/call.py", "backward", "nkilib_msda torch layer"),
    ("~", "<built-in method builtins.isinstance>", "other"),
])
def test_groups(host_profile, filename, function, group):
    assert host_profile.group_of(filename, function) == group


def test_group_rows_add_up_to_the_profiled_time(host_profile):
    torch = pytest.importorskip("torch")
    x = torch.randn(64, requires_grad=True)

    def call():
        return torch.autograd.grad((x * 2).sum(), x)

    table = host_profile.host_profile(call, 50, "tiny", top=3)
    total = float(re.search(r"([\d.]+) µs under cProfile", table).group(1))
    rows = re.findall(r"^\| ([^|`]+) \| ([\d.]+) \| \d+% \|$", table, re.M)
    assert [name.strip() for name, _ in rows] == list(host_profile.GROUPS)
    assert sum(float(us) for _, us in rows) == pytest.approx(total, abs=0.1 * len(rows))
    assert dict((n.strip(), float(us)) for n, us in rows)["autograd engine (C++)"] > 0
    assert len(re.findall(r"^\| `", table, re.M)) == 3
