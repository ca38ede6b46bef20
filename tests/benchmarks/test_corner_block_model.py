"""benchmarks/corner_block_model.py ``--measured-bwd``: the paired ratios it prints from cached
side-by-side rows (a synthetic cache, so every number is known)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from corner_block_model import measured_backward  # noqa: E402

from nkilib_msda.simulator.timing.scenarios import SCENARIOS  # noqa: E402


def _row(scale: float, descriptors: int, worst: str = "", factor: float = 1.0) -> dict:
    scenarios = {s: {"low_us": 10.0 * scale, "estimate_us": 20.0 * scale, "high_us": 40.0 * scale}
                 for s in SCENARIOS}
    if worst:
        scenarios[worst] = {k: v * factor for k, v in scenarios[worst].items()}
    return {"status": "ok", "model_hash": "m1",
            "timing": {"estimate_us": 20.0 * scale, "lower_bound_us": 5.0, "scenarios": scenarios},
            "counts": {"dma": {"indirect_transpose": {"descriptors": descriptors}}}}


def test_measured_backward_pairs_each_scenario_and_corner(tmp_path: Path) -> None:
    runs = {"ours-4c/bwd/basic/lnc2": _row(1.0, 400),
            "ours/bwd/basic/lnc2": _row(0.5, 100, worst="serial/nominal", factor=1.5),
            "aws/bwd/basic/lnc2": _row(1.25, 400)}
    path = tmp_path / "cache.json"
    path.write_text(json.dumps({"runs": runs}))
    lines = measured_backward(["basic", "tsa-small"], [2], per_scenario=True, path=path)
    row = next(line for line in lines if line.startswith("| basic | 2 | corner-block"))
    # 0.5 at nominal; 0.75 where the corner-block row is 1.5x worse; robust 0.8 -> 0.6
    assert ("| 20 / 10 | 0.50, 0.50–0.75 (serial/nominal, low) | 0.80 → 0.60 (serial/nominal, low) "
            "| 2.00 | m1 |") in row
    assert "| tsa-small | 2 | - | not run |" in "\n".join(lines)
    # a four-corner row from an older cache where this one has no ours-4c row
    del runs["ours-4c/bwd/basic/lnc2"]
    path.write_text(json.dumps({"runs": runs}))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"runs": {"ours/bwd/basic/lnc2": _row(1.0, 400)}}))
    again = measured_backward(["basic"], [2], per_scenario=False, path=path, before=old)
    assert any(line.startswith("| basic | 2 | corner-block | 20 / 10 |") for line in again)
    detail = [line for line in lines if line.startswith("| basic | 2 | ")][1:]
    assert len(detail) == len(SCENARIOS)
    serial = next(line for line in detail if "| serial/nominal |" in line)
    assert serial.endswith("| 0.60, 0.60, 0.60 (0.80, 0.80, 0.80) |")
