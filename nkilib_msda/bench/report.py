"""The GPU benchmark's rows and what is printed and written from them: the markdown rows, the
summary and targets tables, results.json and the PNG (:mod:`nkilib_msda.bench.plot`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import re

from nkilib_msda.bench.shapes import SHAPES, compulsory_bytes, shape_name
from nkilib_msda.hardware import KERNEL_DTYPES


@dataclass
class Row:
    shape: str
    impl: str
    dtype: str
    mode: str
    method: str
    us: float
    err: float | None  # fwd: output; fwd+bwd: max over the three gradients
    bytes: int
    floor_us: float
    err_detail: str = ""  # fwd+bwd: "gv/gl/ga" relative L2 errors
    host_us: float | None = None  # host time per call (Python + launches), eager rows only

    @property
    def bandwidth_tbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e12

    @property
    def over_floor(self) -> float:
        return self.us / self.floor_us


TABLE_HEADER = ("| shape | impl | dtype | mode | timing | µs | host µs/call | TB/s (compulsory) | "
                "÷ floor | err vs fp64 (out, or grad value/loc/attn) |\n"
                "|---|---|---|---|---|---|---|---|---|---|")


def format_row(r: Row) -> str:
    err = "—" if r.err is None else (r.err_detail or f"{r.err:.1e}")
    host = "—" if r.host_us is None else f"{r.host_us:.1f}"
    return (f"| {r.shape} | {r.impl} | {r.dtype} | {r.mode} | {r.method} | {r.us:.1f} | {host} | "
            f"{r.bandwidth_tbs:.2f} | {r.over_floor:.1f}× | {err} |")


# (shape, dtype): (best public peer fwd, fwd+bwd µs, target fwd, target fwd+bwd), from the
# side-by-side H200 measurements quoted in benchmarks/RESULTS.md.
TARGETS = {
    ("ddetr-decoder", "float32"): (22.1, 64.5, 20.0, 55.0),
    ("ddetr-decoder", "bfloat16"): (34.4, 94.0, 20.0, 55.0),
    ("ddetr-encoder", "bfloat16"): (223.0, 1313.0, 110.0, 650.0),
    ("ddetr-encoder", "float32"): (246.0, 1329.0, 120.0, 650.0),
    ("bevformer-sca", "float32"): (201.0, 1065.0, 100.0, 530.0),
}


def _pick(rows, shape, dtype, impl, mode, method="do_bench"):
    hit = [r for r in rows if (r.shape, r.dtype, r.impl, r.mode, r.method)
           == (shape, dtype, impl, mode, method)]
    return hit[0] if hit else None


def summary_table(rows: list[Row]) -> str:
    """One line per shape x dtype: ours (public API) eager / graph, deterministic, host."""
    lines = ["| shape | dtype | fwd eager | fwd graph | fwd+bwd eager | fwd+bwd graph | "
             "fwd+bwd deterministic | host µs fwd+bwd | fwd+bwd ÷ floor (graph) | "
             "ref fwd / fwd+bwd | err out; grad v/l/a |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r.shape, r.dtype) for r in rows},
                  key=lambda k: (list(SHAPES).index(k[0]), k[1]))
    fmt = lambda r: "—" if r is None else f"{r.us:.1f}"  # noqa: E731
    for shape, dtype in keys:
        fe, fg = _pick(rows, shape, dtype, "ours", "fwd"), _pick(rows, shape, dtype, "ours", "fwd", "graph")
        be, bg = (_pick(rows, shape, dtype, "ours", "fwd+bwd"),
                  _pick(rows, shape, dtype, "ours", "fwd+bwd", "graph"))
        det = _pick(rows, shape, dtype, "ours-det", "fwd+bwd")
        rf, rb = _pick(rows, shape, dtype, "ref", "fwd"), _pick(rows, shape, dtype, "ref", "fwd+bwd")
        host = "—" if be is None or be.host_us is None else f"{be.host_us:.1f}"
        floor = "—" if bg is None else f"{bg.over_floor:.1f}×"
        err = "—"
        if fe is not None and be is not None and fe.err is not None:
            err = f"{fe.err:.1e}; {be.err_detail}"
        lines.append(f"| {shape} | {dtype} | {fmt(fe)} | {fmt(fg)} | {fmt(be)} | {fmt(bg)} | "
                     f"{fmt(det)} | {host} | {floor} | {fmt(rf)} / {fmt(rb)} | {err} |")
    return "\n".join(lines)


def targets_table(rows: list[Row]) -> str:
    """The performance targets (TARGETS) against this run's eager (do_bench) rows of the public API."""
    lines = ["| shape | dtype | best peer fwd / fwd+bwd | target fwd / fwd+bwd | ours fwd | "
             "ours fwd+bwd | verdict |", "|---|---|---|---|---|---|---|"]
    for (shape, dtype), (pf, pb, tf, tbw) in TARGETS.items():
        f, b = _pick(rows, shape, dtype, "ours", "fwd"), _pick(rows, shape, dtype, "ours", "fwd+bwd")
        if f is None or b is None:
            continue
        verdicts = []
        for what, got, goal in (("fwd", f.us, tf), ("fwd+bwd", b.us, tbw)):
            verdicts.append(f"{what} met" if got <= goal else
                            f"{what} missed by {got - goal:.1f} µs ({got / goal:.2f}×)")
        lines.append(f"| {shape} | {dtype} | {pf} / {pb} | ≤ {tf:g} / ≤ {tbw:g} | {f.us:.1f} | "
                     f"{b.us:.1f} | {'; '.join(verdicts)} |")
    return "\n".join(lines)


def write_plot(results: dict, path: str) -> None:
    """bench_gpu.png from this run's results (the dict written to results.json), drawn by
    :mod:`nkilib_msda.bench.plot` (also ``python benchmarks/bench_plot.py``)."""
    from nkilib_msda.bench.plot import plot

    plot(results, path)


def results_dict(rows: list[Row], device: str, command: str) -> dict:
    """What results.json holds."""
    return {"device": device, "command": command,
            "rows": [asdict(r) | {"tb_s": r.bandwidth_tbs, "over_floor": r.over_floor} for r in rows]}


def rows_from_log(text: str) -> list[Row]:
    """Rows back from the markdown rows a run printed (to re-render the summary, the targets
    and the PNG from a run's log, e.g. one cut short by a time limit). Where the log names the
    run's measured copy bandwidth (its first line), each row's floor is recomputed from it and
    the shape's compulsory bytes, instead of from the printed one-decimal "÷ floor"."""
    found = re.search(r"measured copy bandwidth ([0-9.]+) TB/s", text)
    copy_bw = float(found.group(1)) * 1e12 if found else None
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 10 or shape_name(cells[0]) not in SHAPES:
            continue
        cells[0] = shape_name(cells[0])
        shape, impl, dtype, mode, method, us, host, _tbs, over, err = cells
        shape_bytes = float(_tbs) * 1e12 * float(us) * 1e-6
        floor_us = float(us) / float(over.rstrip("×"))
        if copy_bw is not None and dtype in KERNEL_DTYPES:
            shape_bytes = compulsory_bytes(SHAPES[shape], dtype) * (1 if mode == "fwd" else 2)
            floor_us = shape_bytes / copy_bw * 1e6
        errs = [float(e) for e in err.split("/")] if err != "—" else []
        rows.append(Row(shape, impl, dtype, mode, method, float(us),
                        max(errs) if errs else None, int(shape_bytes), floor_us,
                        err if len(errs) > 1 else "", None if host == "—" else float(host)))
    return rows
