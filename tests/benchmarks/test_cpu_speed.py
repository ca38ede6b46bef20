"""benchmarks/cpu_speed.py: the error table alone (``--repeat 0``) on a few decoder queries,
under the benchmark's short shape names."""

from __future__ import annotations

import sys
from pathlib import Path

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_error_table_only(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    import cpu_speed

    assert cpu_speed.main(["--shapes", "ddetr_dec", "--dtypes", "float64", "--repeat", "0",
                           "--check-queries", "3"]) == 0
    out = capsys.readouterr().out
    assert "ours (ms)" not in out
    row = next(line for line in out.splitlines() if line.startswith("| ddetr_dec | float64 |"))
    ours_out, gs_out, ours_grad, gs_grad = (float(x) for x in row.strip("| ").split(" | ")[2:])
    assert ours_out < 1e-13 and ours_grad < 1e-13 and gs_out < 1e-12 and gs_grad < 1e-12
    sys.modules.pop("cpu_speed", None)
