"""The GPU benchmark's judgement tables (nkilib_msda/bench/guard.py) from hand-made rows: ours
against the best accurate peer, and the time over the floor against the accepted run."""

from __future__ import annotations

import json

from nkilib_msda.bench import guard
from nkilib_msda.bench.report import Row


def row(impl, us, shape="bevformer-tsa", dtype="float32", method="graph", floor_us=40.0):
    return Row(shape, impl, dtype, "fwd+bwd", method, us, None, 1000, floor_us)


def test_peers_table_divides_ours_by_the_best_accurate_peer():
    rows = [row("ours", 300.0), row("msda-triton", 400.0), row("cuda", 500.0),
            row("ours", 100.0, method="do_bench"),  # eager rows are not the ratio's
            row("ours", 90.0, dtype="bfloat16"), row("msda-triton", 100.0, dtype="bfloat16")]
    lines = guard.peers_table(rows).splitlines()
    assert lines[2] == "| bevformer-tsa | bfloat16 | 90.0 | 100.0 | — | 0.90 |"
    assert lines[3] == "| bevformer-tsa | float32 | 300.0 | 400.0 | 500.0 | 0.75 |"


def test_peers_table_without_peers_says_so():
    lines = guard.peers_table([row("triton", 300.0)]).splitlines()
    assert lines[2] == "| bevformer-tsa | float32 | 300.0 | — | — | — |"


def test_floor_table_flags_a_jump_against_the_accepted_run(tmp_path):
    path = str(tmp_path / "accepted.json")
    guard.write_accepted(path, [row("ours", 320.0)], "run A")  # 8.0x the floor
    assert json.load(open(path))["accepted"]["bevformer-tsa/float32"] == {
        "over_floor": 8.0, "us": 320.0, "run": "run A"}
    accepted = guard.load_accepted(path)
    slower = guard.floor_table([row("ours", 368.0)], accepted).splitlines()[2]
    assert slower == "| bevformer-tsa | float32 | 9.20× | 8.00× (run A) | +15.0% **jump** |"
    same = guard.floor_table([row("ours", 324.0)], accepted).splitlines()[2]
    assert same.endswith("| +1.2% |")
    new = guard.floor_table([row("ours", 50.0, shape="ddetr-decoder")], accepted).splitlines()[2]
    assert new == "| ddetr-decoder | float32 | 1.25× | — | — |"


def test_accepting_a_run_keeps_shapes_it_did_not_run(tmp_path):
    path = str(tmp_path / "accepted.json")
    guard.write_accepted(path, [row("ours", 320.0), row("ours", 80.0, shape="ddetr-decoder")], "A")
    guard.write_accepted(path, [row("triton", 280.0)], "B")  # the backend's row when no API row
    accepted = guard.load_accepted(path)
    assert accepted["bevformer-tsa/float32"]["run"] == "B"
    assert accepted["ddetr-decoder/float32"]["run"] == "A"
    assert guard.load_accepted(str(tmp_path / "missing.json")) == {}
