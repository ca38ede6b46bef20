"""The calibration report's coverage count (nkilib_msda/tools/calibration/report.py): each
in-scope record with a value is counted once, by what the cache holds for it."""

import numpy as np

from nkilib_msda.simulator.timing.fingerprint import graph_hash
from nkilib_msda.tools.calibration import records as cal
from nkilib_msda.tools.calibration.report import coverage, coverage_table


def _row(i, recorded=12_345_678, scope=True, note="measured"):
    rec = cal.Record("mlp_cte", "t", i, {"batch": i, "tpbSgCyclesSum": recorded},
                     "tpbSgCyclesSum")
    return rec, cal.Decision(recorded, False, note), scope, ""


def test_coverage_counts_each_record_by_its_cache_status():
    rng = np.random.default_rng()
    n = {k: int(rng.integers(0, 5)) for k in ("match", "mismatch", "timeout", "error",
                                               "stale", "absent")}
    rows, cache, i = [], {}, 0
    for kind, count in n.items():
        for _ in range(count):
            i += 1
            row = _row(i)
            rows.append(row)
            entry = {"match": {"status": "ran", "match": True, "model": graph_hash()},
                     "mismatch": {"status": "ran", "match": False, "model": graph_hash()},
                     "timeout": {"status": "timeout"}, "error": {"status": "error"},
                     "stale": {"status": "ran", "match": True, "model": "old"}}.get(kind)
            if entry:
                cache[row[0].key()] = entry
    rows += [_row(100, scope=False), _row(101, recorded=None, note="no measurement"),
             _row(102, recorded=7_000_000, note="round-number placeholder")]
    c = coverage(rows, cache)["mlp_cte"]
    assert c["records"] == i + 3 and c["in scope"] == i + 2 and c["with a value"] == i
    assert c["ran"] == n["match"] + n["mismatch"] and c["matched"] == n["match"]
    assert (c["timed out"], c["error"], c["stale"], c["not reached"]) == (
        n["timeout"], n["error"], n["stale"], n["absent"])
    table = coverage_table(rows, cache)
    assert table.splitlines()[2].startswith(f"| mlp_cte | check | {i + 3} | {i + 2} | {i} |")
