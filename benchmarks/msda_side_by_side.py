"""Modelled Trainium time of our NKI MSDA kernels next to AWS's ``nkilib`` ones, per shape and LNC.

Runs every (kernel, direction, shape, LNC) in the emulator, one subprocess each (so each run's
wall time and peak memory are its own), checks every output against the float64 reference,
caches the results as JSON (data only) and prints markdown tables:

1. the side by side: modelled estimate [low-high] of ours and AWS's, ours/AWS, the **robust
   ratio** (the worst paired ours/AWS over the timing model's nine scenarios and their band
   corners, both kernels at the same scenario and corner; docs/timing.md, "Scenarios") and the
   scenario where it is worst, the modelled lower bound and what bounds each kernel, and a
   ranking stated only where it holds at both ends of the bands (``ours.high < aws.low`` or
   the reverse), otherwise "overlap"; with a saved
   baseline (``--save-baseline``: our cached runs' timing, kept under ``"baseline"`` in the
   JSON before our kernels change; an entry's optional ``"note"``, such as "stale", is shown
   next to its time), ours before next to ours now;
2. what bounds each kernel: engine busy times (instruction counts where the timing model is
   absent), indirect-DMA descriptor counts and mean sizes, HBM bytes, DMA queue occupancy where
   the timing model exposes it.

Every run record keeps the timing model's hash (``model_hash``:
:func:`nkilib_msda.simulator.timing.fingerprint.model_hash`, over every source of the timing
model and its calibration data) and the SHA-256 of the kernel's source (``kernel_sha256``: AWS's
kernel file; ours: every file of our MSDA kernel folder and ``kernel_commons.py``). A ratio is
printed only for two rows of the same model hash ("models differ" otherwise), and a cached row
of another model is re-run. Every row also keeps the commit and date it ran at.

Our kernel variants (``--kernels``): ``ours`` (default arguments), ``ours-cb`` and ``ours-4c``
(the corner-block or four-corner gather layout, ``gather_layout="corner-block"`` /
``"four-corner"``, where the kernel takes that argument; a kernel without it records an error
naming the argument). Each variant gets its own
side-by-side with AWS's rows.

AWS's kernels are imported from an nki-library checkout (``--nki-library PATH``; its
``src/nkilib_src`` or ``nkilib_src`` directory) and run unchanged through
:func:`nkilib_msda.simulator.install_as_nki`. Without that option only ours run. The shapes are
those of nki-library's MSDA tests (bf16 value, float16 locations/weights as those tests draw).

Usage::

    python benchmarks/msda_side_by_side.py --nki-library PATH [--shapes basic tsa-base ...]
        [--lnc 1 2] [--kernels ours ours-cb ours-4c aws] [--directions fwd bwd] [--json OUT] [--jobs N]
        [--force] [--table-only] [--save-baseline]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

from nkilib_msda._env import ONE_BLAS_THREAD, child_environment  # noqa: E402
from nkilib_msda.simulator.timing.fingerprint import model_hash  # noqa: E402
from nkilib_msda.simulator.timing.scenarios import robust_ratio  # noqa: E402
from nkilib_msda.workloads import NKI_LIBRARY_SHAPE_DESCRIPTIONS, NKI_LIBRARY_SHAPES  # noqa: E402

# nki-library's MSDA test shapes, named workloads of the package.
SHAPES = NKI_LIBRARY_SHAPES
SHAPE_DESCRIPTIONS = NKI_LIBRARY_SHAPE_DESCRIPTIONS

# Our kernel variants (each compared with AWS's): keyword arguments added to the kernel call.
# "ours-cb" / "ours-4c": the corner-block / four-corner gather layout (docs/kernels.md), where
# the kernel has that argument.
OUR_VARIANTS = {"ours": {}, "ours-cb": {"gather_layout": "corner-block"},
                "ours-4c": {"gather_layout": "four-corner"}}
KERNELS = (*OUR_VARIANTS, "aws")
DEFAULT_KERNELS = ("ours", "aws")  # what the tables show unless told
DIRECTIONS = ("fwd", "bwd")
DEFAULT_JSON = Path(__file__).with_name("msda_side_by_side.json")
AWS_MODULE = "nkilib_src.nkilib.experimental.deformable_attention"
# Indirect (per-row) DMA kinds of the cost report: the descriptors that dominate MSDA.
# Emulator hazard warnings worth a note in the table (others, such as an allocator's
# overlapping placement, are bookkeeping).
FLAGGED_WARNINGS = ("cross-core race", "duplicate scatter")
INDIRECT_KINDS = ("indirect_gather", "indirect_transpose", "indirect_scatter", "indirect_rmw")


def run_key(kernel: str, direction: str, shape: str, lnc: int) -> str:
    return f"{kernel}/{direction}/{shape}/lnc{lnc}"


# -- one run (the worker subprocess) ---------------------------------------------------------

def aws_source_dir(nki_library: str) -> Path:
    """The directory holding ``nkilib_src`` in an nki-library checkout (``src/`` or the root)."""
    root = Path(nki_library)
    for cand in (root / "src", root):
        if (cand / "nkilib_src" / "nkilib").is_dir():
            return cand
    raise FileNotFoundError(f"--nki-library: expected {root}/src/nkilib_src/nkilib (an nki-library "
                            f"checkout), not found")


def _load_kernel(kernel: str, direction: str, nki_library: str | None) -> Any:
    if kernel in OUR_VARIANTS:
        from nkilib_msda.experimental.deformable_attention import (
            ms_deformable_attention, ms_deformable_attention_bwd)
        return ms_deformable_attention if direction == "fwd" else ms_deformable_attention_bwd
    if nki_library is None:
        raise ValueError("kernel 'aws' needs --nki-library PATH")
    import importlib

    from nkilib_msda.simulator import install_as_nki
    install_as_nki()
    sys.path.insert(0, str(aws_source_dir(nki_library)))
    name = "ms_deformable_attention" if direction == "fwd" else "ms_deformable_attention_bwd"
    return getattr(importlib.import_module(f"{AWS_MODULE}.{name}"), name)


def kernel_files(kernel: str, direction: str, nki_library: str | None) -> list[Path]:
    """The source files a kernel's checksum covers: AWS's kernel file, or every file of our
    MSDA kernel folder (kernels, emission helpers, planners) and ``kernel_commons.py``."""
    if kernel == "aws":
        if nki_library is None:
            raise ValueError("kernel 'aws' needs --nki-library PATH")
        name = "ms_deformable_attention" if direction == "fwd" else "ms_deformable_attention_bwd"
        return [aws_source_dir(nki_library) / Path(*AWS_MODULE.split(".")) / f"{name}.py"]
    if kernel not in OUR_VARIANTS:
        raise ValueError(f"kernel: expected one of {list(KERNELS)}, got {kernel!r}")
    import nkilib_msda.experimental as experimental
    root = Path(experimental.__file__).parent
    return sorted((root / "deformable_attention").rglob("*.py")) + [root / "kernel_commons.py"]


def kernel_sha256(paths: list[Path]) -> str:
    """SHA-256 of one file, or of the files' (name, bytes) in order."""
    if len(paths) == 1:
        return hashlib.sha256(paths[0].read_bytes()).hexdigest()
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def variant_kwargs(kernel: str, fn: Any) -> dict[str, Any]:
    """The keyword arguments of our variant ``kernel`` for the kernel function ``fn``; a
    ValueError (naming the argument) where ``fn`` does not take them."""
    import inspect
    extra = OUR_VARIANTS.get(kernel, {})
    missing = sorted(set(extra) - set(inspect.signature(fn).parameters))
    if missing:
        raise ValueError(f"kernel {kernel!r}: expected {getattr(fn, '__name__', fn)} to take "
                         f"{', '.join(missing)}, it does not (this variant does not apply)")
    return dict(extra)


def _timing_fields(report: Any) -> dict[str, Any] | None:
    """The timing model's numbers from a CostReport, or None when the emulator has none."""
    timing = getattr(report, "timing", None)
    if timing is None:
        return None
    out: dict[str, Any] = {}
    for name in ("estimate_us", "low_us", "high_us", "lower_bound_us", "bound_by"):
        value = getattr(timing, name, None)
        out[name] = value if isinstance(value, (str, type(None))) else float(value)
    for name in ("engine_busy_us", "critical_path_us"):
        out[name] = {str(k): float(v) for k, v in dict(getattr(timing, name, {}) or {}).items()}
    for name in ("makespan_us", "hbm_us"):
        if getattr(timing, name, None) is not None:
            out[name] = float(getattr(timing, name))
    scenarios = getattr(timing, "scenarios", None)
    if scenarios is not None:
        out["scenarios"] = {name: {"estimate_us": float(s.estimate_us), "low_us": float(s.low_us),
                                   "high_us": float(s.high_us), "bound_by": str(s.bound_by)}
                            for name, s in scenarios.items()}
    return out


def _count_fields(report: Any) -> dict[str, Any]:
    """Instruction counts per engine and DMA descriptors per kind (from the CostReport)."""
    engines = {e: report.instruction_count(e) for e in report.instructions}
    dma: dict[str, dict[str, float]] = {}
    for (kind, _direction), stats in report.dma.items():
        entry = dma.setdefault(kind, {"instructions": 0, "descriptors": 0, "descriptor_bytes": 0,
                                      "hbm_bytes": 0})
        entry["instructions"] += stats.instructions
        entry["descriptors"] += stats.descriptors
        entry["descriptor_bytes"] += stats.descriptor_bytes
        entry["hbm_bytes"] += stats.hbm_bytes
    return {"instructions": engines, "dma": dma, "dma_hbm_bytes": report.dma_hbm_bytes(),
            "dma_descriptors": report.dma_descriptors(),
            "peak_sbuf_bytes_per_partition": report.peak_sbuf_bytes_per_partition}


def run_one(kernel: str, direction: str, shape: str, lnc: int, nki_library: str | None,
            seed: int = 0) -> dict[str, Any]:
    """Simulate one configuration; return its record (timing, counts, errors vs the reference)."""
    import resource
    import warnings

    from nkilib_msda.workloads import compare, make_grad_output, make_inputs, tolerance
    from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
    from nkilib_msda.simulator import simulate

    case = SHAPES[shape]
    args = make_inputs(case, seed=seed)
    fn = _load_kernel(kernel, direction, nki_library)
    extra = variant_kwargs(kernel, fn)
    record: dict[str, Any] = {"kernel": kernel, "direction": direction, "shape": shape, "lnc": lnc,
                              "model_hash": model_hash(),
                              "kernel_sha256": kernel_sha256(kernel_files(kernel, direction,
                                                                          nki_library))}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        if direction == "fwd":
            out, report = simulate(fn, lnc=lnc, report=True)(**args, **extra)
            outputs = {"output": out}
        else:
            grad_output = make_grad_output(case, seed=seed)
            *grads, report = simulate(fn, lnc=lnc, report=True)(grad_output, **args, **extra)
            outputs = dict(zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"),
                               grads))
        record["emulator_wall_s"] = round(time.perf_counter() - start, 2)
    record["warnings"] = sorted({_warning_label(w.message) for w in caught
                                 if "Hazard" in type(w.message).__name__})
    if direction == "fwd":
        refs = {"output": ms_deformable_attention_ref(**args)}
    else:
        refs = dict(zip(outputs, ms_deformable_attention_bwd_ref(grad_output, **args)))
    errors = {}
    for name, out in outputs.items():
        tol = tolerance(name, case.value_dtype)
        c = compare(name, out, refs[name], tol)
        errors[name] = {"max_rel": c.max_rel, "rel_l2": c.rel_l2, "tolerance": tol, "ok": c.ok}
    record["errors"] = errors
    record["correct"] = all(e["ok"] for e in errors.values())
    record["timing"] = _timing_fields(report)
    record["counts"] = _count_fields(report)
    record["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return record


def _warning_label(message: Any) -> str:
    """A short label for a hazard warning ('dma_compute: cross-core race', ...)."""
    text = str(message)
    head = text.split(":", 2)
    return ":".join(head[:2]).strip() if len(head) > 1 else text[:60]


# -- driver ----------------------------------------------------------------------------------

def load_results(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "runs": {}}


def save_results(path: Path, results: dict[str, Any]) -> None:
    """Write the results atomically (a run stopped mid-write leaves the previous file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _spawn(key: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env=child_environment(ONE_BLAS_THREAD))
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout_s:.0f} s",
                "emulator_wall_s": round(time.perf_counter() - start, 1)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            record = json.loads(line)
            record.setdefault("status", "ok")
            return record
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"status": "error", "error": " | ".join(tail)[-400:],
            "emulator_wall_s": round(time.perf_counter() - start, 1)}


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.json)
    results = load_results(path)
    todo = []
    model = model_hash()
    meta = _meta(args)
    run_at = {"commit": meta.get("commit", "?"), "date": meta["date"]}  # kept per row
    for shape in args.shapes:
        for direction in args.directions:
            for lnc in args.lnc:
                for kernel in args.kernels:
                    key = run_key(kernel, direction, shape, lnc)
                    cached = results["runs"].get(key, {})
                    stale = (cached.get("status") != "ok" or cached.get("model_hash") != model
                             or (args.need_timing and not cached.get("timing")))
                    if args.force or stale:
                        todo.append((key, kernel, direction, shape, lnc))
    base = [sys.executable, str(Path(__file__).resolve())]
    if args.nki_library:
        base += ["--nki-library", args.nki_library]
    base.append("--worker")

    def job(item: tuple) -> tuple[str, dict[str, Any]]:
        key, kernel, direction, shape, lnc = item
        argv = base + [kernel, direction, shape, str(lnc)]
        record = _spawn(key, argv, args.timeout)
        record.update(kernel=kernel, direction=direction, shape=shape, lnc=lnc, **run_at)
        print(f"{key}: {record.get('status')} in {record.get('emulator_wall_s')} s"
              + (f" ({record.get('error')})" if record.get("status") != "ok" else ""), flush=True)
        return key, record

    # Longest first (the last recorded seconds of each row, else the estimate), so that
    # parallel jobs end together; each record is saved as soon as it ends.
    def expected_s(item: tuple) -> float:
        done = results["runs"].get(item[0], {}).get("emulator_wall_s")
        return float(done or estimated_wall_s(results["runs"], item[0]) or 0.0)

    todo.sort(key=expected_s, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in as_completed([pool.submit(job, item) for item in todo]):
            key, record = future.result()
            results["runs"][key] = record
            results["meta"] = _meta(args)
            save_results(path, results)
    return results


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "command": "python benchmarks/msda_side_by_side.py " + " ".join(
            a if a != args.nki_library else "PATH" for a in sys.argv[1:]),
    }
    try:
        meta["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        pass
    return meta


# -- tables (pure functions of the records) --------------------------------------------------

def rank(ours: dict[str, Any] | None, aws: dict[str, Any] | None) -> str:
    """'ours faster' / 'AWS faster' only where it holds at both ends of the bands, else 'overlap'
    ('-' when either timing is missing)."""
    if not ours or not aws:
        return "-"
    if ours["high_us"] < aws["low_us"]:
        return "ours faster"
    if aws["high_us"] < ours["low_us"]:
        return "AWS faster"
    return "overlap"


def _fmt_us(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _fmt_band(timing: dict[str, Any] | None) -> str:
    if not timing:
        return "-"
    return (f"{_fmt_us(timing['estimate_us'])} [{_fmt_us(timing['low_us'])}–"
            f"{_fmt_us(timing['high_us'])}]")


def _status_note(record: dict[str, Any] | None) -> str:
    """'' for a correct run; otherwise a short mark for the table."""
    if record is None:
        return "not run"
    if record.get("status") != "ok":
        return record.get("status", "error")
    notes = []
    if not record.get("correct", False):
        notes.append("WRONG " + ",".join(n for n, e in record.get("errors", {}).items() if not e["ok"]))
    flagged = [w.split(": ", 1)[-1] for w in record.get("warnings", [])
               if any(f in w for f in FLAGGED_WARNINGS)]
    if flagged:
        notes.append("warns " + ", ".join(sorted(set(flagged))))
    return " (".join(notes) + (")" if len(notes) > 1 else "")


def _before_text(entry: dict[str, Any] | None) -> str:
    """A baseline entry's nominal µs, with its note ("stale", ...) if it has one."""
    if not entry:
        return "-"
    note = entry.get("note")
    return _fmt_us(entry["timing"]["estimate_us"]) + (f" ({note})" if note else "")


def _timing(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None or record.get("status") != "ok":
        return None
    return record.get("timing")


def same_model(ours: dict[str, Any] | None, aws: dict[str, Any] | None) -> bool:
    """Both rows were modelled by one timing model (equal, recorded model hashes)."""
    return bool(ours and aws and ours.get("model_hash") and
                ours.get("model_hash") == aws.get("model_hash"))


def _comparable(ours: dict[str, Any] | None, aws: dict[str, Any] | None
                ) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """Both rows' timings, or the text that stands for the ratio when they cannot be divided:
    "-" without timing, "models differ" for rows of two timing models."""
    to, ta = _timing(ours), _timing(aws)
    if not to or not ta:
        return "-"
    if not same_model(ours, aws):
        return "models differ"
    return to, ta


def ratio_text(ours: dict[str, Any] | None, aws: dict[str, Any] | None) -> str:
    """Nominal ours/AWS, or the text of :func:`_comparable`."""
    timings = _comparable(ours, aws)
    if isinstance(timings, str):
        return timings
    to, ta = timings
    return f"{to['estimate_us'] / ta['estimate_us']:.2f}"


def robust_text(ours: dict[str, Any] | None, aws: dict[str, Any] | None) -> str:
    """The robust ratio and where it is worst ("0.97 (spread/nominal, low)"), or the text of
    :func:`_comparable`."""
    timings = _comparable(ours, aws)
    if isinstance(timings, str):
        return timings
    to, ta = timings
    worst = robust_ratio(to.get("scenarios") or {}, ta.get("scenarios") or {})
    if worst is None:
        return "-"
    ratio, scenario, corner = worst
    return f"{ratio:.2f} ({scenario}, {corner})"


def side_by_side_table(runs: dict[str, Any], shapes: list[str], lncs: list[int],
                       directions: list[str] = list(DIRECTIONS),
                       kernels: list[str] = list(DEFAULT_KERNELS),
                       baseline: dict[str, Any] | None = None, ours_kernel: str = "ours") -> str:
    """Markdown: per shape, direction and LNC, ours before (``baseline``: run key -> saved
    entry, see save_baseline),
    both kernels' modelled bands, ratio, ratio to the lower bound and ranking; "ours" is
    our variant ``ours_kernel`` (a key of OUR_VARIANTS)."""
    baseline = baseline or {}
    lines = ["| shape | dir | LNC | ours before µs | ours µs [low–high] | AWS µs [low–high] "
             "| ours/AWS | robust ours/AWS (worst scenario, corner) | ranking "
             "| lower bound µs ours / AWS | ours / lower bound | bound by ours / AWS | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for direction in directions:
            for lnc in lncs:
                ours = runs.get(run_key(ours_kernel, direction, shape, lnc))
                aws = runs.get(run_key("aws", direction, shape, lnc))
                to, ta = _timing(ours), _timing(aws)
                ratio, robust = ratio_text(ours, aws), robust_text(ours, aws)
                lb = " / ".join(_fmt_us(t["lower_bound_us"]) if t and t.get("lower_bound_us")
                                is not None else "-" for t in (to, ta))
                to_lb = (f"{to['estimate_us'] / to['lower_bound_us']:.2f}"
                         if to and to.get("lower_bound_us") else "-")
                before_text = _before_text(baseline.get(run_key("ours", direction, shape, lnc)))
                bound = " / ".join(str(t.get("bound_by")) if t else "-" for t in (to, ta))
                notes = "; ".join(f"{who}: {_status_note(r)}" for who, kernel, r in
                                  ((ours_kernel, ours_kernel, ours), ("AWS", "aws", aws))
                                  if kernel in kernels and _status_note(r))
                ranking = rank(to, ta) if same_model(ours, aws) or not (to and ta) \
                    else "models differ"
                lines.append(f"| {shape} | {direction} | {lnc} | {before_text} | {_fmt_band(to)} "
                             f"| {_fmt_band(ta)} | {ratio} | {robust} | {ranking} | {lb} "
                             f"| {to_lb} | {bound} | {notes} |")
    return "\n".join(lines)


def compact_table(runs: dict[str, Any], shapes: list[str], lnc: int = 2,
                  directions: list[str] = list(DIRECTIONS),
                  baseline: dict[str, Any] | None = None, ours_kernel: str = "ours") -> str:
    """Markdown, one LNC (the README's short version): nominal µs of ours before (``baseline``),
    ours (our variant ``ours_kernel``) and AWS's, and the ranking."""
    baseline = baseline or {}
    lines = [f"| shape | dir | ours before µs (LNC {lnc}) | ours µs | AWS µs | ours/AWS "
             "| robust ours/AWS | ranking over the band |",
             "|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for direction in directions:
            ours = runs.get(run_key(ours_kernel, direction, shape, lnc))
            aws = runs.get(run_key("aws", direction, shape, lnc))
            to, ta = _timing(ours), _timing(aws)
            if not to and not ta:
                continue
            cells = []
            for t, record in ((to, ours), (ta, aws)):
                note = _status_note(record)
                text = _fmt_us(t["estimate_us"]) if t else "-"
                cells.append(text + (" (wrong result)" if note.startswith("WRONG") else ""))
            ratio = ratio_text(ours, aws)
            robust = robust_text(ours, aws).split(" (")[0]
            ranking = rank(to, ta) if same_model(ours, aws) or not (to and ta) else "models differ"
            before_text = _before_text(baseline.get(run_key("ours", direction, shape, lnc)))
            lines.append(f"| {shape} | {direction} | {before_text} | {cells[0]} | {cells[1]} "
                         f"| {ratio} | {robust} | {ranking} |")
    return "\n".join(lines)


def _busy_text(record: dict[str, Any]) -> str:
    timing = record.get("timing")
    if timing and timing.get("engine_busy_us"):
        busy = sorted(timing["engine_busy_us"].items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k} {_fmt_us(v)}" for k, v in busy
                         if v > 0 and k != "dma" and not k.startswith("queue"))
    instr = record.get("counts", {}).get("instructions", {})
    return "instr: " + ", ".join(f"{k} {v:,}" for k, v in instr.items() if v)


def _critical_text(record: dict[str, Any]) -> str:
    """The three largest shares of the critical path at nominal parameters."""
    crit = (record.get("timing") or {}).get("critical_path_us") or {}
    top = sorted(crit.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {_fmt_us(v)}" for k, v in top if v > 0) or "-"


def _descriptor_text(record: dict[str, Any]) -> str:
    dma = record.get("counts", {}).get("dma", {})
    parts = []
    for kind in INDIRECT_KINDS:
        entry = dma.get(kind)
        if entry and entry["descriptors"]:
            mean = entry["descriptor_bytes"] / entry["descriptors"]
            parts.append(f"{kind.replace('indirect_', '')} {entry['descriptors']:,} × {mean:.0f} B")
    return ", ".join(parts) or "-"


def _queue_text(record: dict[str, Any]) -> str:
    """DMA occupancy: the busiest DMA engine and the DGE issue queues (busy µs, busiest core)."""
    busy = (record.get("timing") or {}).get("engine_busy_us", {})
    parts = [f"{k} {_fmt_us(v)}" for k, v in sorted(busy.items())
             if (k == "dma" or k.startswith("queue")) and v > 0]
    return ", ".join(parts) or "-"


def bounds_table(runs: dict[str, Any], shapes: list[str], lncs: list[int],
                 kernels: list[str] = list(DEFAULT_KERNELS), directions: list[str] = list(DIRECTIONS)) -> str:
    """Markdown: what bounds each kernel (issue 21's 'measure first')."""
    lines = ["| shape | dir | LNC | kernel | bound by | critical path µs (top 3) | engine busy µs "
             "| indirect descriptors × mean size | HBM MB | DMA busy µs | emulator s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for direction in directions:
            for lnc in lncs:
                for kernel in kernels:
                    record = runs.get(run_key(kernel, direction, shape, lnc))
                    if record is None or record.get("status") != "ok":
                        continue
                    timing = record.get("timing") or {}
                    hbm = record.get("counts", {}).get("dma_hbm_bytes", 0) / 1e6
                    lines.append(f"| {shape} | {direction} | {lnc} | {kernel} | "
                                 f"{timing.get('bound_by', '-')} | {_critical_text(record)} | "
                                 f"{_busy_text(record)} | "
                                 f"{_descriptor_text(record)} | {hbm:,.1f} | {_queue_text(record)} | "
                                 f"{record.get('emulator_wall_s', '-')} |")
    return "\n".join(lines)


def missing_runs(runs: dict[str, Any], shapes: list[str], lncs: list[int],
                 kernels: list[str] = list(DEFAULT_KERNELS), directions: list[str] = list(DIRECTIONS)) -> list[str]:
    """Keys of the requested runs that have no successful record."""
    return [run_key(k, d, s, n) for s in shapes for d in directions for n in lncs for k in kernels
            if runs.get(run_key(k, d, s, n), {}).get("status") != "ok"]


def estimated_wall_s(runs: dict[str, Any], key: str) -> float | None:
    """Emulator seconds a missing run would take: the measured seconds per sample of the same
    kernel, direction and LNC on the largest shape that ran, times this shape's samples."""
    kernel, direction, shape, lnc = key.split("/")
    done = [r for r in runs.values() if r.get("status") == "ok" and r.get("kernel") == kernel
            and r.get("direction") == direction and f"lnc{r.get('lnc')}" == lnc
            and r.get("shape") in SHAPES]
    if not done:
        return None
    ref = max(done, key=lambda r: SHAPES[r["shape"]].num_samples)
    return ref["emulator_wall_s"] / SHAPES[ref["shape"]].num_samples * SHAPES[shape].num_samples


def render(results: dict[str, Any], shapes: list[str], lncs: list[int], kernels: list[str],
           directions: list[str]) -> str:
    runs = results.get("runs", {})
    meta = results.get("meta", {})
    baseline = results.get("baseline", {})
    shown = [r for k, r in runs.items() if k.split("/")[2] in shapes and r.get("status") == "ok"
             and r.get("kernel") in kernels]
    models = sorted({r.get("model_hash") or "none" for r in shown})
    ran_at = sorted({f"{r.get('commit', '?')} ({r.get('date', '?')})" for r in shown})
    out = [f"Modelled Trn2 time (µs), last command at commit {meta.get('commit', '?')}, "
           f"{meta.get('date', '?')}: `{meta.get('command', '')}`; rows run at commit "
           f"{', '.join(ran_at) or '-'}; timing model hash of the rows: "
           f"{', '.join(models) or '-'} (current {model_hash()})"]
    variants = [k for k in OUR_VARIANTS if k in kernels] or ["ours"]
    for ours_kernel in variants:
        out += ["", side_by_side_table(runs, shapes, lncs, directions, kernels, baseline,
                                       ours_kernel)]
    out += ["", bounds_table(runs, shapes, lncs, kernels, directions)]
    if 2 in lncs:
        for ours_kernel in variants:
            out += ["", compact_table(runs, shapes, 2, directions, baseline, ours_kernel)]
    missing = missing_runs(runs, shapes, lncs, kernels, directions)
    if missing:
        def note(key: str) -> str:
            est = estimated_wall_s(runs, key)
            return key + (f" (~{est / 60:.0f} min of emulator time)" if est else "")
        out += ["", "PARTIAL: no result for " + ", ".join(note(k) for k in missing)]
    return "\n".join(out)


def save_baseline(results: dict[str, Any], shapes: list[str], lncs: list[int],
                  directions: list[str]) -> list[str]:
    """Copy our cached runs' timing (with the commit they ran at) into ``results["baseline"]``,
    the "ours before" column; returns the keys saved."""
    baseline = results.setdefault("baseline", {})
    saved = []
    for shape in shapes:
        for direction in directions:
            for lnc in lncs:
                key = run_key("ours", direction, shape, lnc)
                timing = _timing(results["runs"].get(key))
                if timing:
                    baseline[key] = {"timing": timing,
                                     "commit": results.get("meta", {}).get("commit", "?")}
                    saved.append(key)
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nki-library", default=None,
                        help="nki-library checkout holding src/nkilib_src (AWS's kernels)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--lnc", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--kernels", nargs="+", default=None, choices=list(KERNELS))
    parser.add_argument("--directions", nargs="+", default=list(DIRECTIONS), choices=list(DIRECTIONS))
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="result cache (JSON)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (default 1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--force", action="store_true", help="re-run cached results")
    parser.add_argument("--need-timing", action="store_true",
                        help="re-run cached results that have no modelled timing")
    parser.add_argument("--table-only", action="store_true", help="print the cached tables only")
    parser.add_argument("--save-baseline", action="store_true",
                        help="keep our cached runs' timing as the 'ours before' column, then exit")
    parser.add_argument("--worker", nargs=4, metavar=("KERNEL", "DIR", "SHAPE", "LNC"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kernel, direction, shape, lnc = args.worker
        record = run_one(kernel, direction, shape, int(lnc), args.nki_library)
        record["status"] = "ok"
        print(json.dumps(record), flush=True)
        return 0
    if args.kernels is None:
        args.kernels = list(DEFAULT_KERNELS) if args.nki_library else ["ours"]
    if args.save_baseline:
        results = load_results(Path(args.json))
        saved = save_baseline(results, args.shapes, args.lnc, args.directions)
        save_results(Path(args.json), results)
        print(f"baseline: {len(saved)} runs of ours saved")
        return 0
    if "aws" in args.kernels and not args.nki_library:
        parser.error("--kernels aws needs --nki-library PATH")
    results = load_results(Path(args.json)) if args.table_only else run_all(args)
    print(render(results, args.shapes, args.lnc, args.kernels, args.directions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
