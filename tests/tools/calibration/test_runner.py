"""The calibration runner (nkilib_msda/tools/calibration/runner.py): each record runs in a
child process with one BLAS thread, and its result lands in the cache."""

import json
import subprocess
import sys

import numpy as np

from nkilib_msda._env import child_environment
from nkilib_msda.tools.calibration import records as cal
from nkilib_msda.tools.calibration import runner


def _row(hidden):
    rec = cal.Record("mlp_cte", "perms", 1, {"batch": 1, "seqlen": 512, "hidden": hidden,
                                              "tpbSgCyclesSum": 12_345_678}, "tpbSgCyclesSum")
    return rec, cal.Decision(12_345_678, False, "measured"), True, ""


def test_children_get_one_blas_thread_and_results_are_cached(tmp_path, monkeypatch):
    rng = np.random.default_rng()
    hidden = int(rng.integers(1, 1 << 16))
    estimate = float(rng.uniform(1, 1000))
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append((cmd, kwargs))
        out = json.dumps({"status": "ran", "match": True, "estimate_us": estimate})
        return subprocess.CompletedProcess(cmd, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)
    (tmp_path / "PROVENANCE.json").write_text(json.dumps({"*": "abc1234"}))  # no git call
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")
    monkeypatch.setenv("SOME_OTHER_SETTING", "kept")
    cache = runner.run_records(tmp_path, [_row(hidden)], tmp_path / "runs.json",
                               tmp_path / "graphs", timeout_s=5)
    (cmd, kwargs), = seen
    assert cmd[:2] == [sys.executable, "-c"] and kwargs["timeout"] == 5
    env = kwargs["env"]
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert env["SOME_OTHER_SETTING"] == "kept"  # the rest of the environment is passed on
    key = _row(hidden)[0].key()
    assert cache[key]["estimate_us"] == estimate and cache[key]["commit"] == "abc1234"
    assert json.loads((tmp_path / "runs.json").read_text())[key]["estimate_us"] == estimate


def test_the_child_environment_limits_openblas_to_one_thread():
    """A real child started with the runner's settings (the variable OpenBLAS reads)."""
    code = "import os; print(os.environ['OPENBLAS_NUM_THREADS'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_environment(runner.CHILD_ENV), check=True)
    assert out.stdout.strip() == "1"


def test_attention_records_are_ordered_by_score_elements():
    """A prefix-cached 2048-token record comes before a 32k-token one (the product of all
    columns would put it last), context-parallel columns counted by their no-CP names."""
    def row(values):
        rec = cal.Record("attention_cte", "t", 1, {**values, "tpbSgCyclesSum": 1},
                         "tpbSgCyclesSum")
        return rec, cal.Decision(1, False, ""), True, ""

    prefix = row({"bs": 2, "seqlen_q": 2048, "seqlen_kv": 2048, "prior_len": 4096,
                  "prior_used_len": 4095, "sliding_window": 128})
    long = row({"bs": 1, "seqlen_q": 32768, "seqlen_kv": 32768})
    cp = row({"bs": 3, "q_seqlen_partial": 512, "kv_seqlen": 8192, "cp_rank_id": 13,
              "cp_degree": 16})
    assert runner._work(prefix) == 2 * 2048 * (2048 + 4096)
    assert runner._work(cp) == 3 * 512 * 8192
    assert sorted([long, prefix, cp], key=runner._work) == [cp, prefix, long]


def test_shards_split_the_records_and_merge_into_one_cache(tmp_path, monkeypatch):
    """Two shards run disjoint records whose union is every record; each merges its own
    entries into the shared cache file (locked read-merge-write), so both survive."""
    hiddens = [int(h) for h in np.random.default_rng().choice(1 << 16, size=5, replace=False)]
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append(json.loads(cmd[-1])[1]["hidden"])
        out = json.dumps({"status": "ran", "match": True, "estimate_us": 1.0})
        return subprocess.CompletedProcess(cmd, 0, stdout=out + "\n", stderr="")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)
    (tmp_path / "PROVENANCE.json").write_text(json.dumps({"*": "abc1234"}))
    rows = [_row(h) for h in hiddens]
    per_shard = []
    for k in range(2):
        before = len(ran)
        runner.run_records(tmp_path, rows, tmp_path / "runs.json", tmp_path / "graphs",
                           shard=(k, 2))
        per_shard.append(set(ran[before:]))
    assert per_shard[0].isdisjoint(per_shard[1]) and per_shard[0] | per_shard[1] == set(hiddens)
    assert len(per_shard[0]) == 3 and len(per_shard[1]) == 2
    cached = json.loads((tmp_path / "runs.json").read_text())
    assert set(cached) == {r[0].key() for r in rows}
    assert not list(tmp_path.glob("runs.json.*.tmp"))  # no temporary file is left behind
