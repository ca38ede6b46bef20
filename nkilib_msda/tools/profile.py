"""`nkilib-msda profile`: the modelled Trainium timeline of one MSDA kernel run in the emulator.

Writes a Chrome/Perfetto trace (``chrome://tracing`` or https://ui.perfetto.dev) and, where
matplotlib is installed (the ``bench`` extra), a PNG timeline (one row per engine, DMA queue and
DMA engine of each core, coloured by the categories ``bound_by`` uses) of the timing model
(docs/timing.md), and prints the modelled time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from nkilib_msda.workloads import PRESETS, make_grad_output, make_inputs, resolve_preset

__all__ = ["run_profile", "plot_timeline", "timeline_rows", "check_out_dir",
           "check_timing_enabled", "ProfileError", "PNG_NEEDS"]

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


# Trace categories that are also values of ``Timing.bound_by`` and can be drawn as bars; the
# other bounds (latencies, launch floor, HBM, shared DMA engines) are gaps or totals.
BAR_BOUNDS = ("tensor", "vector", "scalar", "gpsimd", "dma_descriptors", "dma_bandwidth",
              "dma_issue", "barrier")
PNG_NEEDS = "the picture needs matplotlib, the `bench` extra (pip install -e \".[bench]\")"


class ProfileError(ValueError):
    """A profile request that cannot run (bad ``out``, timing model off): one line."""


def check_out_dir(out: str | Path, name: str = "out") -> Path:
    """``out`` as a directory that exists (created if missing, with its parents) and can be
    written; else :class:`ProfileError` naming ``name``. Checked before the simulation."""
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ProfileError(f"{name}: cannot use {str(path)!r}: {str(p)!r} is a file, "
                                   "not a directory")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfileError(f"{name}: cannot create {str(path)!r}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ProfileError(f"{name}: cannot write into {str(path)!r}: permission denied")
    return path


def check_timing_enabled() -> None:
    """:class:`ProfileError` when ``NKILIB_MSDA_EMULATOR_TIMING`` switches the model off."""
    from nkilib_msda.simulator.jit import TIMING_ENV, timing_enabled

    if not timing_enabled():
        raise ProfileError(f"profile needs the timing model, which {TIMING_ENV}=0 switches off: "
                           "unset it or set it to 1")


def timeline_rows(timing: Any) -> dict[tuple[int, int], list[tuple[float, float, str]]]:
    """(core, track) -> [(start µs, duration µs, category)] of ``timing``'s trace: the bars of
    the PNG. Categories are the trace's, which use ``bound_by``'s words (a transfer is
    ``dma_descriptors`` or ``dma_bandwidth`` by which part of its time dominates)."""
    rows: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for e in timing.trace_events():
        if e.get("ph") == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append(
                (e["ts"], max(e["dur"], 1e-3), e.get("cat", "")))
    return rows


def plot_timeline(timing: Any, path: str | Path, title: str = "") -> None:
    """A PNG of ``timing``'s trace: one row per (core, engine / queue / DMA engine) that did
    work, bars coloured by category (:func:`timeline_rows`); the legend marks the category
    that bounds the kernel. Needs matplotlib (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in timing.trace_events()
             if e.get("name") == "thread_name"}
    rows = timeline_rows(timing)
    cmap = plt.get_cmap("tab10")
    palette = {cat: cmap(k % 10) for k, cat in enumerate(
        dict.fromkeys(cat for key in sorted(rows) for _, _, cat in rows[key]))}
    keys = sorted(rows)
    fig, ax = plt.subplots(figsize=(14, 0.28 * len(keys) + 1.5))
    for y, key in enumerate(keys):
        ax.broken_barh([(ts, dur) for ts, dur, _ in rows[key]], (y - 0.4, 0.8),
                       facecolors=[palette[cat] for _, _, cat in rows[key]], linewidth=0)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"core {k[0]} {names.get(k, k[1])}" for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("modelled time (µs, launch floor not shown)")
    ax.set_title(title or timing.summary(), fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()]
    labels = [f"{cat} (bounds the kernel)" if cat == timing.bound_by else cat for cat in palette]
    ax.legend(handles, labels, fontsize=7, loc="upper right", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_profile(preset: str = "default", kernel: str = "fwd", lnc: int = 1,
                target: str | None = None, out: str | Path = "profile", seed: int = 0,
                echo: Callable[[str], None] = print) -> dict[str, Path]:
    """Simulate ``kernel`` (fwd or bwd) on ``preset``; write ``<stem>.trace.json`` and, with
    matplotlib installed, ``<stem>.png`` under ``out``; return the paths written.

    ``out`` and the timing model's switch are checked before the simulation
    (:class:`ProfileError`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if lnc not in (1, 2) or isinstance(lnc, bool):
        raise ValueError(f"lnc: expected 1 or 2, got {lnc!r}")
    check_timing_enabled()
    out_dir = check_out_dir(out)
    timing = _simulate(kernel, preset, lnc, target, seed).timing
    stem = f"{preset}_{kernel}_lnc{lnc}_{timing.target}"
    paths = {"trace": out_dir / f"{stem}.trace.json"}
    timing.to_chrome_trace(paths["trace"])
    try:
        plot_timeline(timing, out_dir / f"{stem}.png",
                      title=f"{preset} {kernel} LNC {lnc}: {timing.summary()}")
        paths["png"] = out_dir / f"{stem}.png"
    except ImportError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
    echo(f"{preset} {kernel} lnc={lnc}: {timing.summary()}")
    busy = ", ".join(f"{k} {v:,.1f}" for k, v in timing.engine_busy_us.items() if v > 0)
    echo(f"  busy per engine (us, busiest core): {busy}")
    crit = ", ".join(f"{k} {v:,.1f}" for k, v in sorted(timing.critical_path_us.items(),
                                                         key=lambda kv: -kv[1]))
    echo(f"  critical path (us): {crit}")
    for kind, path in paths.items():
        echo(f"  wrote {kind}: {path}")
    if "png" not in paths:
        echo(f"  no PNG: {PNG_NEEDS}")
    return paths
