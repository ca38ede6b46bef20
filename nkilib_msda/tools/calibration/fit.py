"""Fitting the timing model's unknowns to the recorded latencies, and the write path of the
result: a sane fit becomes the target's calibration data file
(:mod:`nkilib_msda.simulator.timing.calibrated`), which the constants read."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pickle
from pathlib import Path
from typing import Any

from nkilib_msda.simulator.timing import calibrated
from nkilib_msda.simulator.timing.fingerprint import graph_hash
from nkilib_msda.tools.calibration.records import FAMILIES, PS_PER_US, Row
from nkilib_msda.tools.calibration.runner import graph_file

__all__ = ["Sample", "samples", "fit", "errors", "sane", "run_fit", "calibration_data",
           "write_calibration", "PRIOR_WEIGHT", "BOUND_MARGIN"]

PRIOR_WEIGHT = 0.05  # pull of each parameter towards its nominal value, per unit of its range
# A fitted parameter moved from its nominal value to within this share of its range from a
# bound is "on a bound" (the prior's pull keeps it from touching it exactly).
BOUND_MARGIN = 0.02


@dataclasses.dataclass
class Sample:
    kernel: str
    key: str
    recorded_us: float
    timing: Any


def samples(rows: list[Row], cache: dict[str, Any], graphs: Path, set_name: str,
            model: str | None = None) -> list[Sample]:
    """Records of the fit (``use_in_fit``) or check set (any recorded value) that ran, matched
    their reference and have a timing graph recorded under the graph hash ``model`` (default:
    the current one)."""
    out = []
    model = model or graph_hash()
    for r, d, scope, _ in rows:
        fam = FAMILIES[r.kernel]
        e = cache.get(r.key(), {})
        if fam.set_name != set_name or not scope or d.recorded_ps is None:
            continue
        if set_name == "fit" and not d.use_in_fit:
            continue
        if set_name == "check" and "placeholder" in d.note:
            continue
        path = graph_file(graphs, r.key())
        if e.get("status") != "ran" or not e.get("match") or not path.exists() \
                or e.get("model") != model:
            continue  # no graph, or one recorded by another model (stale)
        out.append(Sample(r.kernel, r.key(), d.recorded_ps / PS_PER_US,
                          pickle.loads(path.read_bytes())))
    return out


def fit(samples: list[Sample]) -> dict[str, Any]:
    """Least squares on log(scale * modelled / recorded) over the unknown parameters (bounded
    to their ranges, with a weak pull towards nominal so unidentified ones stay put) and one
    free global scale."""
    import numpy as np
    from scipy.optimize import least_squares
    ranges = samples[0].timing.ranges()
    names = list(ranges)
    lo = np.array([ranges[n][0] for n in names])
    hi = np.array([ranges[n][2] for n in names])
    nom = np.array([ranges[n][1] for n in names])
    span = np.where(hi > lo, hi - lo, 1.0)
    rec = np.log([s.recorded_us for s in samples])

    def residuals(x: Any) -> Any:
        p = dict(zip(names, x[:-1]))
        model = np.log([s.timing.evaluate(p) for s in samples])
        prior = PRIOR_WEIGHT * (x[:-1] - nom) / span
        return np.concatenate([x[-1] + model - rec, prior])

    x0 = np.concatenate([nom, [0.0]])
    free = hi > lo
    lb = np.concatenate([np.where(free, lo, lo - 1e-9), [math.log(0.1)]])
    ub = np.concatenate([np.where(free, hi, hi + 1e-9), [math.log(10.0)]])
    # soft-L1 loss: a few records off by 2-3x through structural gaps of the model (see
    # docs/calibration.md) must not drag every parameter to a bound
    res = least_squares(residuals, x0, bounds=(lb, ub), x_scale=np.concatenate([span, [1.0]]),
                        diff_step=1e-3, loss="soft_l1", f_scale=0.1)
    params = dict(zip(names, (float(v) for v in res.x[:-1])))
    return {"params": params, "scale": float(math.exp(res.x[-1])), "nominal": dict(zip(names, nom)),
            "ranges": ranges, "cost": float(res.cost), "success": bool(res.success),
            "at_bound": [n for n, v, a, b, m in zip(names, res.x[:-1], lo, hi, nom)
                         if b > a and abs(v - m) > 1e-6 * (b - a)
                         and min(v - a, b - v) < BOUND_MARGIN * (b - a)]}


def errors(samples: list[Sample], params: dict[str, float], scale: float) -> dict[str, Any]:
    """Per kernel and overall: n, median |ratio - 1|, worst factor max(ratio, 1/ratio)."""
    import numpy as np
    by: dict[str, list[float]] = {}
    for s in samples:
        by.setdefault(s.kernel, []).append(scale * s.timing.evaluate(params) / s.recorded_us)
    out: dict[str, Any] = {}
    everything = [r for v in by.values() for r in v]
    for name, ratios in list(by.items()) + [("all", everything)]:
        if not ratios:
            continue
        a = np.array(ratios)
        out[name] = {"n": int(a.size), "median_abs_err": float(np.median(np.abs(a - 1))),
                     "worst_factor": float(np.max(np.maximum(a, 1 / a))),
                     "median_ratio": float(np.median(a)), "min_ratio": float(a.min()),
                     "max_ratio": float(a.max())}
    return out


def sane(summary: dict[str, Any]) -> tuple[bool, str]:
    """A fit is written back only if it converged, no parameter ended on a bound of its range
    (one there absorbs a structural error of the model rather than measuring a constant), its
    scale is within 2x of 1 (the units are picoseconds), it improves the fit set's median
    error and it does not worsen the check set's."""
    if not summary["success"]:
        return False, "least squares did not converge"
    if summary.get("at_bound"):
        return False, "parameters on a bound of their range: " + ", ".join(summary["at_bound"])
    if not 0.5 <= summary["scale"] <= 2.0:
        return False, f"global scale {summary['scale']:.3f} is not within [0.5, 2]"
    before = summary["fit_set_nominal"]["all"]["median_abs_err"]
    after = summary["fit_set_fitted"]["all"]["median_abs_err"]
    if after >= before:
        return False, f"no improvement of the fit set ({before:.1%} -> {after:.1%})"
    # Validation gate (no parameter is chosen by it): fitted values that make the held-out
    # check set worse are not adopted as the model's nominal values.
    check_before = summary["check_set_nominal"].get("all", {}).get("median_abs_err")
    check_after = summary["check_set_fitted"].get("all", {}).get("median_abs_err")
    if check_before is not None and check_after is not None and check_after > check_before:
        return False, (f"the fitted values make the check set worse ({check_before:.1%} -> "
                       f"{check_after:.1%} median error)")
    return True, ""


def run_fit(rows: list[Row], cache: dict[str, Any], graphs: Path, out: Path) -> dict[str, Any]:
    """Fit on the fit set; errors of nominal and fitted parameters on both sets; saved to
    ``out`` (JSON) and printed."""
    fit_set = samples(rows, cache, graphs, "fit")
    check_set = samples(rows, cache, graphs, "check")
    if not fit_set:
        raise SystemExit("calibrate_timing: no fit-set record with a timing graph; run the "
                         "qkv_tkg and mlp_tkg configurations first")
    result = fit(fit_set)
    nominal = result["nominal"]
    summary = {
        **result,
        "fit_set_nominal": errors(fit_set, nominal, 1.0),
        "fit_set_fitted": errors(fit_set, result["params"], result["scale"]),
        "check_set_nominal": errors(check_set, nominal, 1.0),
        "check_set_fitted": errors(check_set, result["params"], result["scale"]),
        "fitted_us": {s.key: result["scale"] * s.timing.evaluate(result["params"])
                      for s in fit_set + check_set},
        "fit_keys": [s.key for s in fit_set],
    }
    out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"fit: scale {summary['scale']:.3f}; parameters (nominal -> fitted, range):")
    for name, value in summary["params"].items():
        lo, nom, hi = summary["ranges"][name]
        print(f"  {name}: {nom:g} -> {value:.4g}  [{lo:g}, {hi:g}]")
    for label in ("fit_set_nominal", "fit_set_fitted", "check_set_nominal", "check_set_fitted"):
        for kernel, e in summary[label].items():
            print(f"{label:18s} {kernel:15s} n={e['n']:3d} median|r-1|={e['median_abs_err']:.1%} "
                  f"worst factor={e['worst_factor']:.2f} ratios [{e['min_ratio']:.2f}, "
                  f"{e['max_ratio']:.2f}]")
    return summary


def calibration_data(summary: dict[str, Any], target: str, commit: str,
                     date: str | None = None, digits: int = 3) -> calibrated.CalibrationData:
    """The calibration record of a fit ``summary`` (:func:`run_fit`): adopted (fitted values,
    rounded to ``digits`` significant digits, become the nominal values) only if
    :func:`sane`; otherwise kept with the reason and empty ``nominals``."""
    ok, why = sane(summary)
    fitted = {name: float(f"{value:.{digits}g}") for name, value in summary["params"].items()}
    changed = {name: value for name, value in fitted.items()
               if not math.isclose(value, summary["nominal"][name], rel_tol=1e-3, abs_tol=1e-9)}
    families = sorted({key.split("|", 1)[0] for key in summary.get("fit_keys", [])}) or \
        sorted(name for name, fam in FAMILIES.items() if fam.set_name == "fit")
    n = summary.get("fit_set_nominal", {}).get("all", {}).get("n", 0)
    note = (f"{n} fit records; adopted" if ok else f"{n} fit records; not adopted: {why}")
    return calibrated.CalibrationData(
        target=target, commit=commit, date=date or datetime.date.today().isoformat(),
        fit_set=tuple(families), scale=round(float(summary["scale"]), 6), adopted=ok,
        nominals=changed if ok else {}, note=note, fitted=fitted)


def write_calibration(summary: dict[str, Any], target: str, commit: str,
                      directory: Path | None = None) -> Path:
    """Write the target's calibration data file from a fit ``summary``; returns its path."""
    data = calibration_data(summary, target, commit)
    path = calibrated.write(data, directory)
    print(("calibration adopted: " if data.adopted else "calibration kept, not adopted: ")
          + f"{path} ({data.note})")
    return path
