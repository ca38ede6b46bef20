"""Calibrate the emulator's timing model against AWS nki-library's hardware-measured records.

Usage::

    python benchmarks/calibrate_timing.py PATH_TO_NKI_LIBRARY_CHECKOUT [--kernels qkv_tkg,mlp_tkg]
        [--limit N] [--timeout-s 300] [--rerun] [--shard K/N] [--no-run] [--fit [--write-back]] [--structures]
        [--markdown]

nki-library's integration tests list, per configuration, a value measured on hardware
(``tpbSgCyclesSum`` or ``cyclesQoR``; most likely picoseconds: see docs/calibration.md). This script
parses those lists from the checkout's test files (never importing the tests, which need the
Neuron SDK), runs each in-scope configuration (bf16/fp16, not quantized) through the emulator
with AWS's kernel imported unchanged from the checkout, checks the output against a float64
reference written here, and prints recorded versus modelled time. Results go to
``benchmarks/calibration_runs.json`` (data only); a configuration is re-run only with
``--rerun`` or when its kernel file's commit changed. Each configuration runs in its own
subprocess under ``--timeout-s`` (run it with ``nice``).

``--fit`` fits the unknowns on the fit set (``benchmarks/calibration_fit.json``);
``--write-back`` also writes the result as the target's calibration data file
(``nkilib_msda/simulator/timing/calibration/<target>.json``, adopted only if the fit is sane),
which the timing constants read. ``--structures`` compares the timing model's structures
(``nominal``, ``spread``, ``serial``) on the recorded graphs, at nominal and at fitted
parameters (``benchmarks/calibration_structures.json``; nothing is written back). The library is :mod:`nkilib_msda.tools.calibration`.

No nki-library code is part of this repository: the checkout path is an argument.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from nkilib_msda.tools.calibration.fit import run_fit, write_calibration
from nkilib_msda.tools.calibration.records import FAMILIES, collect
from nkilib_msda.tools.calibration.report import coverage_table, print_table
from nkilib_msda.tools.calibration.runner import load_cache, run_records
from nkilib_msda.tools.calibration.structures import run_structures

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "benchmarks" / "calibration_runs.json"
GRAPHS = REPO / "benchmarks" / "calibration_graphs"  # pickled timing graphs (git-ignored)
FIT_RESULT = REPO / "benchmarks" / "calibration_fit.json"
STRUCTURES_RESULT = REPO / "benchmarks" / "calibration_structures.json"
TARGET = "trn2"  # the emulator's default target, which the records run on


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N, got {text!r}")
    return k, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--kernels", default=",".join(FAMILIES))
    ap.add_argument("--limit", type=int, default=None, help="run at most N new configurations")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N",
                    help="run only every N-th record from the K-th (0-based), so that N "
                         "processes share the runs; they share the cache file")
    ap.add_argument("--no-run", action="store_true", help="print from the cache only")
    ap.add_argument("--markdown", action="store_true",
                    help="markdown tables: coverage per family, then one row per record")
    ap.add_argument("--fit", action="store_true",
                    help="fit the unknown parameters and a global scale on the fit set "
                         "(qkv_tkg, mlp_tkg) and report the error on the check set")
    ap.add_argument("--write-back", action="store_true",
                    help="with --fit: write the result as the target's calibration data file "
                         "(adopted as the nominal values only if the fit is sane)")
    ap.add_argument("--structures", action="store_true",
                    help="compare the timing model's structures (nominal, spread, serial) on "
                         "the recorded graphs: errors at nominal and at fitted parameters")
    args = ap.parse_args(argv)
    checkout = args.checkout.resolve()
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    rows = collect(checkout, kernels)
    if args.no_run:
        cache = load_cache(CACHE)
    else:
        cache = run_records(checkout, rows, CACHE, GRAPHS, timeout_s=args.timeout_s,
                            limit=args.limit, rerun=args.rerun, shard=args.shard)
    fitted = None
    if args.fit:
        fitted = run_fit(collect(checkout, list(FAMILIES)), cache, GRAPHS, FIT_RESULT)
        if args.write_back:
            write_calibration(fitted, TARGET, _commit())
    if args.structures:
        run_structures(collect(checkout, list(FAMILIES)), cache, GRAPHS, STRUCTURES_RESULT)
    if args.markdown:
        print(coverage_table(rows, cache) + "\n")
    print_table(rows, cache, checkout, args.markdown, fitted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
