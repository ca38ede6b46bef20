"""Running the calibration records through the emulator: one configuration per subprocess
(``_main(CHECKOUT, PAYLOAD)`` in a fresh interpreter), results in a JSON cache
(data only) and the recorded timing graphs pickled beside it. A cached result is re-used only
under the same kernel commit and the same graph hash
(:func:`nkilib_msda.simulator.timing.fingerprint.graph_hash`)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nkilib_msda._env import ONE_BLAS_THREAD, child_environment
from nkilib_msda.simulator.timing.fingerprint import graph_hash
from nkilib_msda.tools.calibration.records import FAMILIES, Row, config_text, kernel_commit
from nkilib_msda.tools.calibration.references import BUILDERS, attention_columns, lnc_of

__all__ = ["CHILD_ENV", "run_one", "run_records", "graph_file", "load_cache", "save_cache"]

_PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # the folder holding nkilib_msda/
# The child imports this very package (not another installed copy) and runs one record.
_CHILD = (f"import sys; sys.path.insert(0, {str(_PACKAGE_PARENT)!r}); "
          "from nkilib_msda.tools.calibration.runner import _main; "
          "raise SystemExit(_main(sys.argv[1:]))")
CHILD_ENV = ONE_BLAS_THREAD  # the children's overrides (see nkilib_msda._env)


def run_one(checkout: Path, kernel: str, values: dict[str, Any],
            graph_path: Path | None = None) -> dict[str, Any]:
    """Run one configuration in this process; returns the JSON-able result (and pickles the
    recorded timing to ``graph_path``)."""
    import warnings

    import numpy as np
    sys.path.insert(0, str(checkout / "src"))
    from nkilib_msda.simulator import install_as_nki, simulate
    install_as_nki()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(19)
    func, args, kwargs, reference = BUILDERS[kernel](values, rng)
    start = time.perf_counter()
    *outs, report = simulate(func, lnc=lnc_of(values), report=True)(*args, **kwargs)
    wall = time.perf_counter() - start
    out = outs[0] if len(outs) == 1 else outs
    ok, worst = reference(out)
    result: dict[str, Any] = {"status": "ran", "match": bool(ok), "worst_rel_err": worst,
                              "emulator_s": round(wall, 2)}
    timing = getattr(report, "timing", None)
    if timing is not None:
        result.update(estimate_us=timing.estimate_us, low_us=timing.low_us,
                      high_us=timing.high_us, bound_by=str(timing.bound_by),
                      lower_bound_us=timing.lower_bound_us,
                      engine_busy_us={k: round(v, 3) for k, v in timing.engine_busy_us.items()},
                      num_nodes=timing.num_nodes)
        if graph_path is not None:  # the recorded graph, so the fit can re-schedule it
            graph_path.parent.mkdir(parents=True, exist_ok=True)
            graph_path.write_bytes(pickle.dumps(timing))
    return result


def graph_file(graphs: Path, key: str) -> Path:
    """Where the recorded graph of record ``key`` is pickled under the folder ``graphs``."""
    return graphs / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".pkl")


def load_cache(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def save_cache(path: Path, cache: dict[str, Any], updated: list[str] | None = None) -> None:
    """Write the cache; entries ``updated`` by this process are merged into what is on disk
    (other runs, such as the other shards of ``--shard``, may be writing their entries
    meanwhile: the read-merge-write holds an exclusive lock on ``<cache>.lock``)."""
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = load_cache(path)
        merged.update({k: cache[k] for k in updated} if updated else cache)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(merged, indent=1, sort_keys=True, default=str) + "\n")
        tmp.replace(path)
    cache.update(merged)


def _work(row: Row) -> int:
    """A proxy for a record's work: attention_cte's score elements, batch x query length x
    (KV length + prior length); for the other families the product of the positive integer
    config values. (The product over attention's columns would multiply in the prior and
    window lengths and the context-parallel rank and degree, and put a 2048-token record
    with a prefix cache behind a 32k-token one.)"""
    if row[0].kernel == "attention_cte":
        v = attention_columns(dict(row[0].values))
        return int(v["bs"]) * int(v["seqlen_q"]) * (int(v["seqlen_kv"]) + int(v.get("prior_len") or 0))
    return math.prod(v for v in row[0].config().values()
                     if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def run_records(checkout: Path, rows: list[Row], cache_path: Path, graphs: Path, *,
                timeout_s: float = 300.0, limit: int | None = None, rerun: bool = False,
                shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Run every in-scope record with a recorded value that has no fresh cached result,
    smallest first, one subprocess each; returns the cache. ``shard`` ``(k, n)``: only the
    records at positions ``k, k + n, ...`` of that order (``n`` processes share the work)."""
    kernels = list(dict.fromkeys(r.kernel for r, *_ in rows))
    rows = sorted(rows, key=lambda x: (kernels.index(x[0].kernel), _work(x)))
    k, n = shard
    rows = rows[k::n]
    cache = load_cache(cache_path)
    model = graph_hash()
    started = 0
    for r, d, scope, _why in rows:
        commit = kernel_commit(checkout, FAMILIES[r.kernel].kernel_file)
        entry = cache.get(r.key())
        path = graph_file(graphs, r.key())
        fresh = (entry is not None and entry.get("commit") == commit and not rerun
                 and (entry.get("status") != "ran" or (path.exists()
                                                       and entry.get("model") == model)))
        if fresh or not scope or d.recorded_ps is None or "placeholder" in d.note:
            continue
        if r.kernel not in BUILDERS:
            cache[r.key()] = {"commit": commit, "status": "not run",
                              "reason": "no input builder/reference for this family yet"}
            save_cache(cache_path, cache, [r.key()])
            continue
        if limit is not None and started >= limit:
            continue
        started += 1
        payload = json.dumps([r.kernel, dict(r.values), str(path)], default=str)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(checkout), payload],
                                  capture_output=True, text=True, timeout=timeout_s,
                                  env=child_environment(CHILD_ENV))
            if proc.returncode == 0:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                result = {"status": "error", "reason": tail[-1][:300] if tail else "?"}
        except subprocess.TimeoutExpired:
            result = {"status": "timeout", "reason": f"over {timeout_s:.0f} s"}
        result.update(commit=commit, model=model, wall_s=round(time.perf_counter() - t0, 1))
        cache[r.key()] = result
        save_cache(cache_path, cache, [r.key()])
        print(f"[{started}] {r.kernel} {config_text(r)}: {result['status']}"
              f" {result.get('match', '')} {result.get('reason', '')}", file=sys.stderr)
    return cache


def _main(argv: list[str]) -> int:
    """``CHECKOUT PAYLOAD``: run one configuration, print its JSON result."""
    checkout, payload = argv
    kernel, values, graph = json.loads(payload)
    print(json.dumps(run_one(Path(checkout).resolve(), kernel, values, Path(graph))))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
