"""Let the calibration data vote on the timing model's structure (issue 30, item 3).

The timing model's structures (:data:`nkilib_msda.simulator.timing.scenarios.STRUCTURES`:
``nominal``, ``spread``, ``serial``; docs/timing.md, "Scenarios") differ in which DMA engines a
transfer may use where no document says. Each recorded calibration graph is re-mapped to every
structure (``timing.scenarios["<structure>/nominal"]``; no kernel is re-run) and compared with
AWS's recorded latencies twice: at the nominal parameter values, and after the same fit as
:func:`nkilib_msda.tools.calibration.fit.fit` (unknowns within their ranges plus one global
scale) on the fit set. The structure the data prefer is the one with the smallest median
``|modelled / recorded - 1|`` on the fit and check records together at nominal values (a
structure that needs the fit to push parameters onto their bounds is not a better model).

One analysis-only hypothesis is compared beside them: ``spread-all`` (:data:`HYPOTHESES`),
every DMA on all 16 engines, direct copies with an SBUF side included. No structure of the
model moves a direct copy (the documented partition rule stays in all three), so the
few-partition records that the partition rule may make too slow can only vote through it. It
re-uses the model's ``spread`` re-mapping on a copy of the graph with every transfer marked;
it is not a scenario of the model.

Nothing here writes the calibration data file: the model's ``report.timing`` is the
``nominal`` structure, whose fit stays the job of ``run_fit`` / ``write_calibration``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nkilib_msda.simulator.timing.graph import NODE_TRANSFER
from nkilib_msda.simulator.timing.scenarios import STRUCTURES, restructure
from nkilib_msda.simulator.timing.schedule import Timing
from nkilib_msda.tools.calibration.fit import Sample, errors, fit, samples
from nkilib_msda.tools.calibration.records import Row, config_text
from nkilib_msda.tools.calibration.references import lnc_of

__all__ = ["HYPOTHESES", "restructured", "compare_structures", "preferred", "structure_table",
           "record_group", "group_table", "record_table", "run_structures"]


HYPOTHESES = ("spread-all",)  # analysis-only structures (module docstring)


def _spread_all(timing: Any) -> Timing:
    """``timing``'s recorded graph with every DMA on all 16 engines (``spread``'s re-mapping
    applied to every transfer, direct copies included)."""
    graph = timing.graph
    marked = np.where((graph.kind == NODE_TRANSFER) & (graph.dma_flags == 0), 1, graph.dma_flags)
    return Timing(restructure(replace(graph, dma_flags=marked), "spread"))


def restructured(found: Sequence[Sample], structure: str) -> list[Sample]:
    """The samples with each recorded graph re-mapped to ``structure`` (one of the model's
    STRUCTURES or of HYPOTHESES; the parameters stay free: the scenario
    ``"<structure>/nominal"`` pins none)."""
    if structure not in STRUCTURES + HYPOTHESES:
        raise ValueError(f"structure: expected one of {list(STRUCTURES + HYPOTHESES)}, got "
                         f"{structure!r}")
    if structure == "nominal":
        return list(found)
    if structure == "spread-all":
        return [Sample(s.kernel, s.key, s.recorded_us, _spread_all(s.timing)) for s in found]
    return [Sample(s.kernel, s.key, s.recorded_us, s.timing.scenarios[f"{structure}/nominal"])
            for s in found]


def compare_structures(fit_set: Sequence[Sample], check_set: Sequence[Sample],
                       structures: Sequence[str] = STRUCTURES) -> dict[str, Any]:
    """Per structure: errors of the fit and check sets (and both together) at nominal
    parameters, the fit's parameters, scale and bound hits, and the errors at the fitted
    values; per record, the modelled/recorded ratio at nominal parameters."""
    if not fit_set:
        raise ValueError("compare_structures: fit_set must hold at least one sample, got none")
    out: dict[str, Any] = {"structures": {}, "ratios": {}}
    for structure in structures:
        fs, cs = restructured(fit_set, structure), restructured(check_set, structure)
        nominal = {name: mid for name, (_, mid, _) in fs[0].timing.ranges().items()}
        result = fit(fs)
        out["structures"][structure] = {
            "fit_set_nominal": errors(fs, nominal, 1.0),
            "check_set_nominal": errors(cs, nominal, 1.0),
            "both_nominal": errors(fs + cs, nominal, 1.0).get("all", {}),
            "fit_set_fitted": errors(fs, result["params"], result["scale"]),
            "check_set_fitted": errors(cs, result["params"], result["scale"]),
            "scale": result["scale"], "params": result["params"],
            "at_bound": result["at_bound"], "success": result["success"]}
        for s in fs + cs:
            out["ratios"].setdefault(s.key, {"kernel": s.kernel, "recorded_us": s.recorded_us})
            out["ratios"][s.key][structure] = s.timing.evaluate(nominal) / s.recorded_us
    out["preferred"] = preferred(out)
    return out


def preferred(comparison: dict[str, Any]) -> str:
    """Of the model's structures, the one with the smallest median |ratio - 1| over all
    records at nominal parameters (ties: the earlier of :data:`STRUCTURES`)."""
    table = {s: row for s, row in comparison["structures"].items() if s in STRUCTURES}
    return min(table, key=lambda s: (table[s]["both_nominal"].get("median_abs_err", float("inf")),
                                     STRUCTURES.index(s)))


def _cell(e: dict[str, Any] | None) -> str:
    if not e:
        return "-"
    return (f"{e['median_abs_err']:.1%} / {e['worst_factor']:.2f}× "
            f"[{e['min_ratio']:.2f}–{e['max_ratio']:.2f}] (n={e['n']})")


def structure_table(comparison: dict[str, Any]) -> str:
    """Markdown: per structure and kernel family, median |ratio - 1| / worst factor [ratio
    range] at nominal and at fitted parameters, the fitted scale and bound hits."""
    lines = ["| structure | records | nominal: median / worst [range] (n) "
             "| fitted: median / worst [range] (n) | fitted scale | parameters on a bound |",
             "|---|---|---|---|---|---|"]
    for structure, row in comparison["structures"].items():
        groups = [("fit", "all"), ("check", "all")] + [
            ("fit", k) for k in row["fit_set_nominal"] if k != "all"] + [
            ("check", k) for k in row["check_set_nominal"] if k != "all"]
        for set_name, kernel in groups:
            nominal = row[f"{set_name}_set_nominal"].get(kernel)
            fitted = row[f"{set_name}_set_fitted"].get(kernel)
            if not nominal:
                continue
            label = f"{set_name} set" + ("" if kernel == "all" else f": {kernel}")
            lines.append(f"| {structure} | {label} | {_cell(nominal)} | {_cell(fitted)} "
                         f"| {row['scale']:.3f} | {', '.join(row['at_bound']) or '-'} |")
        lines.append(f"| {structure} | fit + check | {_cell(row['both_nominal'])} | | | |")
    return "\n".join(lines)


def record_group(key: str) -> str:
    """The family of a record ``key``; attention_cte split into its context-parallel records,
    its prefix-cache records (prior KV) and the others."""
    kernel, config = key.split("|", 1)
    if kernel != "attention_cte":
        return kernel
    columns = {item.split("=", 1)[0] for item in config.split(",")}
    if "cp_degree" in columns:
        return "attention_cte: context parallel"
    return "attention_cte: prefix cache" if "prior_len" in columns else "attention_cte: other"


def group_table(comparison: dict[str, Any]) -> str:
    """Markdown: per group of :func:`record_group` and structure, at nominal parameters,
    median |ratio - 1| / worst factor and the number of records off by more than 2x."""
    structures = list(comparison["structures"])
    groups: dict[str, list[dict[str, Any]]] = {}
    for key, r in comparison["ratios"].items():
        groups.setdefault(record_group(key), []).append(r)
    lines = ["| records | n | " + " | ".join(structures) + " |",
             "|---|---|" + "---|" * len(structures)]
    for name in sorted(groups):
        cells = []
        for structure in structures:
            a = np.array([r[structure] for r in groups[name]])
            worst = np.maximum(a, 1 / a)
            cells.append(f"{np.median(np.abs(a - 1)):.1%} / {worst.max():.2f}× "
                         f"({int((worst > 2).sum())} > 2×)")
        lines.append(f"| {name} | {len(groups[name])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def record_table(comparison: dict[str, Any], threshold: float = 1.25,
                 labels: dict[str, str] | None = None) -> str:
    """Markdown: the records whose nominal-structure ratio is at least ``threshold`` (too
    slow) or at most ``1 / threshold`` (too fast), with their ratio under every structure;
    ``labels``: record key -> short text (default: the key's configuration)."""
    labels = labels or {}
    structures = list(comparison["structures"])
    lines = ["| kernel | record | recorded µs | " + " | ".join(structures) + " |",
             "|---|---|---|" + "---|" * len(structures)]
    rows = [(k, r) for k, r in comparison["ratios"].items()
            if not 1 / threshold < r.get("nominal", 1.0) < threshold]
    for key, r in sorted(rows, key=lambda kr: -kr[1].get("nominal", 1.0)):
        config = labels.get(key, key.split("|", 1)[1])
        lines.append(f"| {r['kernel']} | {config} | {r['recorded_us']:,.1f} | "
                     + " | ".join(f"{r[s]:.2f}" for s in structures) + " |")
    return "\n".join(lines)


def run_structures(rows: list[Row], cache: dict[str, Any], graphs: Path, out: Path) -> dict[str, Any]:
    """Compare the structures on every record with a graph of the current model; saved to
    ``out`` (JSON) and printed as markdown."""
    fit_set = samples(rows, cache, graphs, "fit")
    check_set = samples(rows, cache, graphs, "check")
    if not fit_set:
        raise SystemExit("calibrate_timing: no fit-set record with a timing graph; run the "
                         "qkv_tkg and mlp_tkg configurations first")
    comparison = compare_structures(fit_set, check_set, STRUCTURES + HYPOTHESES)
    out.write_text(json.dumps(comparison, indent=1, sort_keys=True) + "\n")
    print(structure_table(comparison))
    print()
    print(group_table(comparison))
    print()
    labels = {r.key(): f"{config_text(r)} (LNC {lnc_of(r.values)})" for r, *_ in rows}
    print(record_table(comparison, labels=labels))
    medians = ", ".join(f"{name} {row['both_nominal']['median_abs_err']:.1%}"
                        for name, row in comparison["structures"].items())
    print(f"\npreferred structure of the model (median |ratio - 1| over {len(fit_set)} fit and "
          f"{len(check_set)} check records at nominal parameters): {comparison['preferred']} "
          f"({medians})")
    return comparison
