"""The calibration table: recorded versus modelled time per record, never showing a time
recorded by another timing model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nkilib_msda.simulator.timing.fingerprint import graph_hash
from nkilib_msda.tools.calibration.records import (FAMILIES, PS_PER_US, Row, config_text,
                                                   kernel_commit)
from nkilib_msda.tools.calibration.references import lnc_of

__all__ = ["print_table", "coverage", "coverage_table"]


def print_table(rows: list[Row], cache: dict[str, Any], checkout: Path, markdown: bool,
                fitted: dict[str, Any] | None = None) -> None:
    """Recorded versus modelled time per record (plain columns, or a markdown table)."""
    head = ["kernel", "set", "config", "LNC", "recorded", "rec µs", "est µs", "low µs",
            "high µs", "ratio", "fitted µs", "fitted ratio", "run", "record note", "commit"]
    fitted_us = (fitted or {}).get("fitted_us", {})
    model = graph_hash()
    lines = []
    for r, d, scope, why in rows:
        e = cache.get(r.key(), {})
        if not scope or (d.recorded_ps is None and not e):
            continue  # out of scope, or nothing recorded and nothing run
        if e.get("status") == "ran" and e.get("model") != model:  # never show stale times
            e = {"status": "not run", "reason": "graph of another timing model (stale)"}
        rec_us = d.recorded_ps / PS_PER_US if d.recorded_ps else None
        est = e.get("estimate_us")
        ratio = est / rec_us if est and rec_us else None
        fit_us = fitted_us.get(r.key())
        fit_ratio = fit_us / rec_us if fit_us and rec_us else None
        run = e.get("status", "-")
        if run == "ran":
            run = "match" if e.get("match") else f"MISMATCH ({e.get('worst_rel_err', 0):.2g})"
        fmt = lambda x: "-" if x is None else f"{x:,.1f}"  # noqa: E731
        if run in ("error", "timeout", "not run"):
            run = f"{run}: {e.get('reason', '')}"[:90].replace("|", "/")
        lines.append([r.kernel, FAMILIES[r.kernel].set_name, config_text(r),
                      str(lnc_of(r.values)),
                      "-" if d.recorded_ps is None else f"{d.recorded_ps:,}", fmt(rec_us),
                      fmt(est), fmt(e.get("low_us")), fmt(e.get("high_us")),
                      "-" if ratio is None else f"{ratio:.2f}", fmt(fit_us),
                      "-" if fit_ratio is None else f"{fit_ratio:.2f}", run,
                      "; ".join(x for x in (d.note, FAMILIES[r.kernel].note) if x)
                      + ("" if d.use_in_fit else " (not fitted)"),
                      e.get("commit", kernel_commit(checkout, FAMILIES[r.kernel].kernel_file))[:10]])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
    else:
        for ln in [head] + lines:
            print("  ".join(ln))


_COVERAGE_COLUMNS = ("records", "in scope", "with a value", "ran", "matched", "timed out",
                     "error", "stale", "not reached")


def coverage(rows: list[Row], cache: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per family: records, in scope, in scope with a usable value (not a placeholder), and
    of those: ran under the current graph hash (and matched their reference), timed out,
    failed, ran under another graph hash only (stale), and never run (not reached)."""
    model = graph_hash()
    out: dict[str, dict[str, int]] = {}
    for r, d, scope, _ in rows:
        c = out.setdefault(r.kernel, dict.fromkeys(_COVERAGE_COLUMNS, 0))
        c["records"] += 1
        if not scope:
            continue
        c["in scope"] += 1
        if d.recorded_ps is None or "placeholder" in d.note:
            continue
        c["with a value"] += 1
        e = cache.get(r.key()) or {}
        status = e.get("status")
        if status == "ran" and e.get("model") == model:
            c["ran"] += 1
            c["matched"] += bool(e.get("match"))
        elif status == "ran":
            c["stale"] += 1
        elif status == "timeout":
            c["timed out"] += 1
        elif status == "error":
            c["error"] += 1
        else:
            c["not reached"] += 1
    return out


def coverage_table(rows: list[Row], cache: dict[str, Any]) -> str:
    """Markdown: :func:`coverage` per family (set: fit or check)."""
    cov = coverage(rows, cache)
    lines = ["| family | set | " + " | ".join(_COVERAGE_COLUMNS) + " |",
             "|---|---|" + "---|" * len(_COVERAGE_COLUMNS)]
    for kernel, c in cov.items():
        lines.append(f"| {kernel} | {FAMILIES[kernel].set_name} | "
                     + " | ".join(str(c[k]) for k in _COVERAGE_COLUMNS) + " |")
    return "\n".join(lines)
