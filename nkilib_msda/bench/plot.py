"""Draw the GPU benchmark's bar chart from one run's ``results.json`` (:mod:`nkilib_msda.bench.gpu`).

    python benchmarks/bench_plot.py RESULTS_JSON [PNG]      (PNG default: bench_gpu.png beside it)

Every bar comes from that one run, so the picture shows the numbers of the run's tables: the
public function of this package (eager, and CUDA-graph replay where measured), and the peers
the run measured (PyTorch ``grid_sample``, Deformable-DETR's CUDA op). A series the run did not
measure has no bar and no legend entry. Public Triton MSDA kernels are not timed by
bench_gpu.py (they are a separate side-by-side run), so they never appear here. Values are
printed on the bars; the legend sits above the panels, outside every axis.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# (impl, timing method) -> legend label, in drawing order.
SERIES = {
    ("ours", "do_bench"): "nkilib_msda triton backend, public function + autograd (eager)",
    ("ours", "graph"): "nkilib_msda triton backend, same call replayed in a CUDA graph",
    ("ref", "do_bench"): "PyTorch grid_sample (Deformable-DETR's PyTorch path)",
    ("cuda", "do_bench"): "Deformable-DETR CUDA op",
    ("cuda", "graph"): "Deformable-DETR CUDA op, replayed in a CUDA graph",
    ("msda-triton", "graph"): "roulbac/msda-triton (fp32 grad_value accumulation), CUDA graph",
}
MODES = ("fwd", "fwd+bwd")
MODE_TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward (all three gradients)"}


def load(path: str | Path) -> dict[str, Any]:
    """results.json of bench_gpu.py: {"device", "command", "rows": [Row fields, ...]}."""
    with open(path) as f:
        results = json.load(f)
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        raise ValueError(f"{path}: expected bench_gpu.py's results.json with a 'rows' list")
    return results


def _groups(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(shape, dtype) in first-seen order (the run's order)."""
    seen: dict[tuple[str, str], None] = {}
    for r in rows:
        seen.setdefault((r["shape"], r["dtype"]), None)
    return list(seen)


def plot(results: dict[str, Any], path: str | Path) -> Any:
    """Write the PNG to ``path``; returns the matplotlib Figure (kept open for inspection)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if (r["impl"], r["method"]) in SERIES]
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    if not modes:
        raise ValueError("results.json has no rows of the plotted series "
                         f"{sorted(SERIES)} (impl, method)")
    groups = _groups(rows)
    present = [s for s in SERIES if any((r["impl"], r["method"]) == s for r in rows)]
    width = 0.8 / len(present)
    colors = {s: f"C{i}" for i, s in enumerate(SERIES)}
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(8.0, 1.9 * len(groups) + 2), 4.2 * len(modes)),
                             squeeze=False)
    handles = {}
    for ax, mode in zip(axes[:, 0], modes):
        top = 0.0
        for i, series in enumerate(present):
            xs, ys = [], []
            for j, (shape, dtype) in enumerate(groups):
                hit = [r["us"] for r in rows if (r["shape"], r["dtype"], r["mode"]) == (shape, dtype, mode)
                       and (r["impl"], r["method"]) == series]
                if hit:
                    xs.append(j + (i - (len(present) - 1) / 2) * width)
                    ys.append(hit[0])
            if not xs:
                continue
            bars = ax.bar(xs, ys, width, color=colors[series], label=SERIES[series])
            ax.bar_label(bars, labels=[f"{y:.0f}" if y >= 100 else f"{y:.1f}" for y in ys],
                         fontsize=7, padding=1)
            handles[series] = bars
            top = max(top, max(ys))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{s}\n{d}" for s, d in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(top=top * 3)  # room for the value labels inside the axes
        ax.set_ylabel("µs, median (log scale)")
        ax.set_title(MODE_TITLES[mode], fontsize=10)
    legend_rows = len(handles)
    fig.suptitle(f"Multi-scale deformable attention, {results.get('device', 'GPU')}", fontsize=10)
    fig.legend([handles[s] for s in present if s in handles],
               [SERIES[s] for s in present if s in handles],
               loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=1, fontsize=8, frameon=False)
    header = (0.4 + 0.2 * legend_rows) / fig.get_figheight()  # inches -> figure fraction
    fig.tight_layout(rect=(0, 0.03, 1, 1 - header))
    fig.text(0.5, 0.005, f"one run: {results.get('command', '')}", ha="center", va="bottom",
             fontsize=7)
    fig.savefig(path, dpi=110)
    return fig


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python benchmarks/bench_plot.py RESULTS_JSON [PNG]", file=sys.stderr)
        return 2
    source = Path(args[0])
    target = Path(args[1]) if len(args) == 2 else source.with_name("bench_gpu.png")
    plot(load(source), target)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
