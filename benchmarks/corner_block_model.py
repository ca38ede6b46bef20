"""Corner-block value layout vs today's four-corner gather: the analytic DMA model (issue 30, item 4).

For the side-by-side shapes (``benchmarks/msda_side_by_side.py`` SHAPES) prints, per direction
and LNC, the per-core counts of each design (indirect descriptors, software-DGE instructions,
bytes, HBM scratch) and the modelled time under every scenario structure (nominal / spread /
serial) and parameter set (nominal / swdge-bound / descriptor-bound / low / high), priced with
the timing model's formulas and ranges by ``benchmarks/corner_cost.py``. The ``emulator`` column is
our kernel's cached nominal estimate (``msda_side_by_side.json``), to check the analytic
four-corner row against the timing model's full schedule.

Usage::

    python benchmarks/corner_block_model.py [--shapes basic tsa-small ...] [--lnc 1 2]
        [--directions fwd bwd]
    python benchmarks/corner_block_model.py --measured-bwd basic tsa-small ... [--lnc 1 2]
        [--scenarios] [--before OLD_JSON]
    python benchmarks/corner_block_model.py --predict-bwd OLD_JSON [--shapes ...] [--lnc 1 2]

``--measured-bwd`` reads the emulator's rows of the side-by-side cache instead
(``msda_side_by_side.json``: ``ours-4c/bwd`` four-corner, ``ours/bwd`` the planner's layout,
``aws/bwd``) and prints, per shape and LNC, the backward's modelled time with four corners and
with corner blocks and the robust ratio against AWS at the same scenario and band corner
(``--scenarios``: every scenario and band corner).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from msda_side_by_side import DEFAULT_JSON, SHAPES  # noqa: E402

from nkilib_msda.simulator.timing.scenarios import SCENARIOS  # noqa: E402
from nkilib_msda.simulator.timing.scenarios import robust_ratio as paired_ratio  # noqa: E402

from corner_cost import (DESIGNS_BWD, DESIGNS_FWD, PARAMETER_SETS, STRUCTURES,  # noqa: E402
                         Phase, backward_phases, forward_phases, modelled_us, robust_ratio,
                         scenario_params)

from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (  # noqa: E402
    choose_forward_layout, samples_per_cell, scratch_bytes)
from nkilib_msda.validation.msda import MSDAProblem  # noqa: E402
from nkilib_msda.workloads import MSDACase  # noqa: E402

DEFAULT_SHAPES = ("basic", "decoder-small", "tsa-small", "sca-small", "decoder-base", "tsa-base",
                  "sca-base")


def problem_of(case: MSDACase) -> MSDAProblem:
    return MSDAProblem(
        batch=case.batch, num_queries=case.num_queries, num_heads=case.num_heads,
        head_dim=case.head_dim, num_levels=case.num_levels, num_points=case.num_points,
        spatial_shapes=tuple(case.spatial_shapes), level_start_index=case.level_start_index,
        value_layout=case.value_layout, sampling_locations_layout=case.locations_layout,
        align_corners=case.align_corners, padding_mode=case.padding_mode)


def _counts(phases: list[Phase]) -> tuple[float, float, float]:
    """(indirect descriptors, software-DGE instructions, DMA bytes) of one core."""
    desc = sum(t.descriptors for ph in phases for t in ph.transfers if t.swdge)
    inst = sum(t.instructions for ph in phases for t in ph.transfers if t.swdge)
    nbytes = sum(t.nbytes for ph in phases for t in ph.transfers)
    return desc, inst, nbytes


def _emulator_estimate(shape: str, direction: str, lnc: int) -> str:
    try:
        runs = json.loads(DEFAULT_JSON.read_text())["runs"]
        return f"{runs[f'ours/{direction}/{shape}/lnc{lnc}']['timing']['estimate_us']:,.0f}"
    except (OSError, KeyError, TypeError, ValueError):
        return "-"


def table(shapes: list[str], lncs: list[int], direction: str) -> list[str]:
    designs = DESIGNS_FWD if direction == "fwd" else DESIGNS_BWD
    make = forward_phases if direction == "fwd" else backward_phases
    lines = [f"### {direction}", "",
             "| shape | LNC | design | indirect desc / core | SWDGE instr | DMA MB | scratch / value "
             "| emulator µs | nominal µs | " + " | ".join(f"{s} worst" for s in STRUCTURES)
             + " | robust ratio (where) |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(STRUCTURES) + "---|"]
    for name in shapes:
        case = SHAPES[name]
        p = problem_of(case)
        value_bytes = p.batch * p.total_pixels * p.num_heads * p.head_dim * 2
        for lnc in lncs:
            base = make(p, "bfloat16", lnc, "four-corner")
            for d in designs:
                ph = make(p, "bfloat16", lnc, d)
                desc, inst, nbytes = _counts(ph)
                per_struct = []
                for st in STRUCTURES:
                    worst = max(modelled_us(ph, lnc, st, ps) / modelled_us(base, lnc, st, ps)
                                for ps in PARAMETER_SETS)
                    per_struct.append(f"{worst:.2f}")
                ratio, where = robust_ratio(ph, base, lnc)
                emu = _emulator_estimate(name, direction, lnc) if d == "four-corner" else ""
                lines.append(
                    f"| {name} | {lnc} | {d} | {desc:,.0f} | {inst:,.0f} | {nbytes / 1e6:,.1f} | "
                    f"{scratch_bytes(p, 'bfloat16', d) / value_bytes:.2f} | {emu} | "
                    f"{modelled_us(ph, lnc):,.0f} | " + " | ".join(per_struct)
                    + f" | {ratio:.2f} ({where}) |")
    return lines


def detail(shape: str, lnc: int, direction: str) -> list[str]:
    """Modelled µs of every design under every scenario for one shape."""
    p = problem_of(SHAPES[shape])
    designs = DESIGNS_FWD if direction == "fwd" else DESIGNS_BWD
    make = forward_phases if direction == "fwd" else backward_phases
    lines = [f"#### {shape} {direction} LNC {lnc}: modelled µs per scenario", "",
             "| scenario | " + " | ".join(designs) + " |", "|---|" + "---|" * len(designs)]
    phases = {d: make(p, "bfloat16", lnc, d) for d in designs}
    for st in STRUCTURES:
        for ps in PARAMETER_SETS:
            lines.append(f"| {st}/{ps} | " + " | ".join(
                f"{modelled_us(phases[d], lnc, st, ps):,.0f}" for d in designs) + " |")
    return lines


def emulator_check(shape: str, lnc: int, direction: str) -> list[str]:
    """Run today's kernel in the emulator (report=True) and compare its timing-model schedule,
    re-evaluated at each parameter set, with the analytic four-corner row (nominal structure:
    the only one the emulator's model has)."""
    import os
    os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")
    from nkilib_msda.experimental.deformable_attention import (
        ms_deformable_attention, ms_deformable_attention_bwd)
    from nkilib_msda.simulator import simulate
    from nkilib_msda.workloads import make_grad_output, make_inputs

    case = SHAPES[shape]
    args = make_inputs(case, seed=0)
    if direction == "fwd":
        _, report = simulate(ms_deformable_attention, lnc=lnc, report=True)(**args)
        phases = forward_phases(problem_of(case), "bfloat16", lnc, "four-corner")
    else:
        *_, report = simulate(ms_deformable_attention_bwd, lnc=lnc, report=True)(
            make_grad_output(case, seed=0), **args)
        phases = backward_phases(problem_of(case), "bfloat16", lnc, "four-corner")
    lines = [f"#### emulator vs analytic, four-corner, {shape} {direction} LNC {lnc} (µs)", "",
             "| parameters | emulator (timing model) | analytic | analytic / emulator |",
             "|---|---|---|---|"]
    for ps in PARAMETER_SETS:
        emu = report.timing.evaluate(scenario_params("nominal", ps))
        ana = modelled_us(phases, lnc, "nominal", ps)
        lines.append(f"| {ps} | {emu:,.0f} | {ana:,.0f} | {ana / emu:.2f} |")
    return lines


def measure(shape: str, lnc: int) -> str:
    """Run the forward with both gather layouts in the emulator (report=True), check both
    against the float64 reference, and return one markdown row: modelled µs per parameter set
    (nominal structure, the emulator's timing model) and the ratio corner-block / four-corner."""
    import os
    os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention
    from nkilib_msda.reference import ms_deformable_attention_ref
    from nkilib_msda.simulator import simulate
    from nkilib_msda.workloads import compare, make_inputs, tolerance

    case = SHAPES[shape]
    args = make_inputs(case, seed=0)
    ref = ms_deformable_attention_ref(**args)
    times, desc, ok = {}, {}, True
    for layout in ("four-corner", "corner-block"):
        out, rep = simulate(ms_deformable_attention, lnc=lnc, report=True)(**args, gather_layout=layout)
        ok = ok and compare("output", out, ref, tolerance("output", case.value_dtype)).ok
        times[layout] = {ps: rep.timing.evaluate(scenario_params("nominal", ps)) for ps in PARAMETER_SETS}
        desc[layout] = sum(v.descriptors for (k, _), v in rep.dma.items() if k.startswith("indirect"))
    a, b = times["four-corner"], times["corner-block"]
    ratios = {ps: b[ps] / a[ps] for ps in PARAMETER_SETS}
    worst = max(ratios, key=lambda k: ratios[k])
    return (f"| {shape} | {lnc} | {desc['four-corner']:,} / {desc['corner-block']:,} | "
            + " | ".join(f"{a[ps]:,.0f} / {b[ps]:,.0f}" for ps in PARAMETER_SETS)
            + f" | {ratios['nominal']:.2f} | {ratios[worst]:.2f} ({worst}) | {'yes' if ok else 'NO'} |")


CORNERS = (("low", "low_us"), ("nominal", "estimate_us"), ("high", "high_us"))


def measured_backward(shapes: list[str], lncs: list[int], per_scenario: bool,
                      path: Path = DEFAULT_JSON, before: Path | None = None) -> list[str]:
    """Markdown tables from the cached emulator rows: four-corner (``ours-4c``, or where the
    cache has none the ``ours`` row of the ``before`` cache) against the planner's layout
    (``ours``; corner blocks where "auto" picks them) and both against AWS, each ratio at one
    scenario and band corner ("range": ours / four-corner over all 27 points)."""
    runs = json.loads(path.read_text())["runs"]
    old = json.loads(before.read_text())["runs"] if before else {}
    out = ["| shape | LNC | layout (ours) | µs four-corner / ours | ours / four-corner nominal, range "
           "(worst where) | robust ours/AWS four-corner → ours (where) | ours / lower bound | model |",
           "|---|---|---|---|---|---|---|---|"]
    detail = ["| shape | LNC | scenario | low µs 4c / ours / AWS | nominal µs 4c / ours / AWS "
              "| high µs 4c / ours / AWS | ours/AWS low, nominal, high (four-corner) |",
              "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for lnc in lncs:
            four = runs.get(f"ours-4c/bwd/{shape}/lnc{lnc}") or old.get(f"ours/bwd/{shape}/lnc{lnc}")
            ours = runs.get(f"ours/bwd/{shape}/lnc{lnc}")
            aws = runs.get(f"aws/bwd/{shape}/lnc{lnc}")
            aws = aws if aws and aws.get("status") == "ok" and aws.get("timing") else None
            if not four or not ours or four.get("status") != "ok" or ours.get("status") != "ok":
                out.append(f"| {shape} | {lnc} | - | not run | | | | |")
                continue
            models = {str(r.get("model_hash")) for r in (four, ours, aws) if r}
            sf, so = four["timing"]["scenarios"], ours["timing"]["scenarios"]
            layout = "corner-block" if ours["counts"]["dma"]["indirect_transpose"]["descriptors"] < \
                four["counts"]["dma"]["indirect_transpose"]["descriptors"] else "four-corner"
            points = [(so[s][k] / sf[s][k], f"{s}, {c}") for s in SCENARIOS for c, k in CORNERS]
            worst = max(points, key=lambda rw: rw[0])  # the first of equal ratios
            best = min(r for r, _ in points)
            robust = "-"
            if aws and len(models) == 1:
                sa = aws["timing"]["scenarios"]
                r4, r = paired_ratio(sf, sa), paired_ratio(so, sa)
                if r4 and r:
                    robust = f"{r4[0]:.2f} → {r[0]:.2f} ({r[1]}, {r[2]})"
                    for s in SCENARIOS if per_scenario else ():
                        cells = [f"{sf[s][k]:,.0f} / {so[s][k]:,.0f} / {sa[s][k]:,.0f}" for _, k in CORNERS]
                        ratios = ", ".join(f"{so[s][k] / sa[s][k]:.2f}" for _, k in CORNERS)
                        ratios4 = ", ".join(f"{sf[s][k] / sa[s][k]:.2f}" for _, k in CORNERS)
                        detail.append(f"| {shape} | {lnc} | {s} | " + " | ".join(cells)
                                      + f" | {ratios} ({ratios4}) |")
            out.append(
                f"| {shape} | {lnc} | {layout} | {four['timing']['estimate_us']:,.0f} / "
                f"{ours['timing']['estimate_us']:,.0f} | "
                f"{ours['timing']['estimate_us'] / four['timing']['estimate_us']:.2f}, "
                f"{best:.2f}–{worst[0]:.2f} ({worst[1]}) | {robust} | "
                f"{ours['timing']['estimate_us'] / ours['timing']['lower_bound_us']:.2f} | "
                f"{', '.join(sorted(models))} |")
    return out + ([""] + detail if per_scenario else [])


def predicted_backward(shapes: list[str], lncs: list[int], path: Path) -> list[str]:
    """The premise check before building corner-block gathers: each cached four-corner ``ours``
    backward row of ``path`` scaled, scenario by scenario and band corner by band corner, by
    the analytic corner-gather / four-corner ratio (the analytic parameter set of a pinned
    scenario is that scenario's; of ``*/nominal`` the band corner), paired with AWS's row."""
    runs = json.loads(path.read_text())["runs"]
    out = ["| shape | LNC | robust ours/AWS four-corner (where) | predicted with corner-block gathers (where) |",
           "|---|---|---|---|"]
    analytic_set = {"low": "low", "nominal": "nominal", "high": "high"}
    for shape in shapes:
        p = problem_of(SHAPES[shape])
        for lnc in lncs:
            ours, aws = runs.get(f"ours/bwd/{shape}/lnc{lnc}"), runs.get(f"aws/bwd/{shape}/lnc{lnc}")
            if not ours or not aws or aws.get("status") != "ok" or not aws.get("timing"):
                continue
            base = backward_phases(p, "bfloat16", lnc, "four-corner")
            cand = backward_phases(p, "bfloat16", lnc, "corner-gather")
            so, sa = ours["timing"]["scenarios"], aws["timing"]["scenarios"]
            now, new = (0.0, ""), (0.0, "")
            for s in SCENARIOS:
                st, ps = s.split("/")
                for c, k in CORNERS:
                    q = analytic_set[c] if ps == "nominal" else ps
                    r = modelled_us(cand, lnc, st, q) / modelled_us(base, lnc, st, q)
                    now = max(now, (so[s][k] / sa[s][k], f"{s}, {c}"))
                    new = max(new, (so[s][k] / sa[s][k] * r, f"{s}, {c}"))
            out.append(f"| {shape} | {lnc} | {now[0]:.2f} ({now[1]}) | {new[0]:.2f} ({new[1]}) |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), choices=sorted(SHAPES))
    ap.add_argument("--lnc", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--detail", nargs="*", default=["basic", "decoder-small"],
                    help="shapes to print per-scenario times for (LNC 2)")
    ap.add_argument("--check-emulator", nargs="*", default=[], metavar="SHAPE",
                    help="also run today's kernel on these shapes in the emulator (LNC 2)")
    ap.add_argument("--measure", nargs="*", default=[], metavar="SHAPE",
                    help="run the forward of these shapes with both layouts in the emulator")
    ap.add_argument("--measured-bwd", nargs="*", default=None, metavar="SHAPE",
                    help="print the cached emulator backward rows of these shapes (see above)")
    ap.add_argument("--before", type=Path, default=None, metavar="JSON",
                    help="with --measured-bwd: a side-by-side cache whose ours/bwd rows are the "
                    "four-corner rows where this cache has no ours-4c row")
    ap.add_argument("--predict-bwd", type=Path, default=None, metavar="JSON",
                    help="the premise check: predicted robust ratio of corner-block gathers from "
                    "the four-corner ours/bwd rows of this side-by-side cache")
    ap.add_argument("--scenarios", action="store_true",
                    help="with --measured-bwd: every scenario and band corner")
    args = ap.parse_args(argv)
    out: list[str] = []
    if args.predict_bwd is not None:
        print("\n".join(predicted_backward(args.shapes, args.lnc, args.predict_bwd)))
        return
    if args.measured_bwd is not None:
        print("\n".join(measured_backward(args.measured_bwd or list(DEFAULT_SHAPES), args.lnc,
                                          args.scenarios, before=args.before)))
        return
    if args.measure:
        out += ["### Emulator: four-corner / corner-block forward, modelled µs (nominal structure)", "",
                "| shape | LNC | indirect descriptors (all cores) | " + " | ".join(PARAMETER_SETS)
                + " | ratio nominal | worst ratio | both correct |",
                "|---|---|---|" + "---|" * len(PARAMETER_SETS) + "---|---|---|"]
        for shape in args.measure:
            for lnc in args.lnc:
                out.append(measure(shape, lnc))
                print(out[-1], file=sys.stderr, flush=True)
        print("\n".join(out))
        return
    for shape in args.check_emulator:
        for direction in args.directions:
            out += emulator_check(shape, 2, direction) + [""]
    for direction in args.directions:
        out += table(args.shapes, args.lnc, direction) + [""]
        for shape in args.detail:
            out += detail(shape, 2, direction) + [""]
    out.append("### Planner decision (forward, `choose_forward_layout`)")
    out.append("")
    for name in args.shapes:
        p = problem_of(SHAPES[name])
        out.append(f"- {name} ({samples_per_cell(p):.2f} samples per cell and head): " + ", ".join(
            f"LNC {lnc} {choose_forward_layout(p, 'bfloat16', lnc)}" for lnc in args.lnc))
    print("\n".join(out))


if __name__ == "__main__":
    main()
