"""`nkilib-msda profile`: the modelled Trainium timeline of one MSDA kernel run in the emulator.

Writes a Chrome/Perfetto trace (``chrome://tracing`` or https://ui.perfetto.dev) and a PNG
timeline (one row per engine, DMA queue and DMA engine of each core) of the timing model
(docs/timing.md), and prints the modelled time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from nkilib_msda.workloads import PRESETS, make_grad_output, make_inputs, resolve_preset

__all__ = ["run_profile", "plot_timeline"]

KERNELS = ("fwd", "bwd")


def _simulate(kernel: str, preset: str, lnc: int, target: str | None, seed: int) -> Any:
    """The CostReport (with ``.timing``) of one simulated kernel run."""
    from nkilib_msda.experimental.deformable_attention import (ms_deformable_attention,
                                                               ms_deformable_attention_bwd)
    from nkilib_msda.tools.check import msda_progress
    from nkilib_msda.simulator import simulate

    case = PRESETS[resolve_preset(preset)]
    args = make_inputs(case, seed=seed)
    progress = msda_progress(args, kernel)  # a bar on stderr for long runs (terminal only)
    if kernel == "fwd":
        _, report = simulate(ms_deformable_attention, lnc=lnc, target=target, report=True,
                             progress=progress)(**args)
        return report
    grad_output = make_grad_output(case, seed=seed)
    *_, report = simulate(ms_deformable_attention_bwd, lnc=lnc, target=target, report=True,
                          progress=progress)(grad_output, **args)
    return report


def plot_timeline(timing: Any, path: str | Path, title: str = "") -> None:
    """A PNG of ``timing``'s trace: one row per (core, engine / queue / DMA engine) that did
    work, bars coloured by what the time was spent on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = timing.trace_events()
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("name") == "thread_name"}
    rows: dict[tuple[int, int], list[tuple[float, float]]] = {}
    colours: dict[tuple[int, int], list[Any]] = {}
    palette: dict[str, Any] = {}
    cmap = plt.get_cmap("tab10")
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["tid"])
        rows.setdefault(key, []).append((e["ts"], max(e["dur"], 1e-3)))
        cat = e.get("cat", "")
        if cat not in palette:
            palette[cat] = cmap(len(palette) % 10)
        colours.setdefault(key, []).append(palette[cat])
    keys = sorted(rows)
    fig, ax = plt.subplots(figsize=(14, 0.28 * len(keys) + 1.5))
    for y, key in enumerate(keys):
        ax.broken_barh(rows[key], (y - 0.4, 0.8), facecolors=colours[key], linewidth=0)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"core {k[0]} {names.get(k, k[1])}" for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("modelled time (µs, launch floor not shown)")
    ax.set_title(title or timing.summary(), fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()]
    ax.legend(handles, list(palette), fontsize=7, loc="upper right", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_profile(preset: str = "default", kernel: str = "fwd", lnc: int = 1,
                target: str | None = None, out: str | Path = "profile", seed: int = 0,
                echo: Callable[[str], None] = print) -> dict[str, Path]:
    """Simulate ``kernel`` (fwd or bwd) on ``preset``; write ``<stem>.trace.json`` and
    ``<stem>.png`` under ``out``; return their paths."""
    if preset not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if lnc not in (1, 2) or isinstance(lnc, bool):
        raise ValueError(f"lnc: expected 1 or 2, got {lnc!r}")
    report = _simulate(kernel, preset, lnc, target, seed)
    timing = report.timing
    if timing is None:
        raise RuntimeError("profile: the timing model is switched off (NKILIB_MSDA_EMULATOR_TIMING=0)")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{preset}_{kernel}_lnc{lnc}_{timing.target}"
    paths = {"trace": out_dir / f"{stem}.trace.json", "png": out_dir / f"{stem}.png"}
    timing.to_chrome_trace(paths["trace"])
    plot_timeline(timing, paths["png"], title=f"{preset} {kernel} LNC {lnc}: {timing.summary()}")
    echo(f"{preset} {kernel} lnc={lnc}: {timing.summary()}")
    busy = ", ".join(f"{k} {v:,.1f}" for k, v in timing.engine_busy_us.items() if v > 0)
    echo(f"  busy per engine (us, busiest core): {busy}")
    crit = ", ".join(f"{k} {v:,.1f}" for k, v in sorted(timing.critical_path_us.items(),
                                                         key=lambda kv: -kv[1]))
    echo(f"  critical path (us): {crit}")
    for kind, path in paths.items():
        echo(f"  wrote {kind}: {path}")
    return paths
