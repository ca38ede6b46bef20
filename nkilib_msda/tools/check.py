"""`nkilib-msda check`: run the NKI kernels in the emulator and compare with the float64 reference."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from nkilib_msda.validation.msda import dtype_name
from nkilib_msda.workloads import (PRESET_DESCRIPTIONS, PRESETS, Comparison, compare,
                                   make_grad_output, make_inputs, resolve_preset, tolerance)

__all__ = ["run_check", "run_forward", "run_backward", "msda_progress", "compare", "Comparison"]


def msda_progress(args: dict, desc: str, show: bool = True) -> Any:
    """``simulate``'s ``progress=`` for an MSDA kernel on ``make_inputs`` arguments: queries
    done, read off attention_weights, which both kernels read once per query tile
    (simulator/progress.py); False when ``show`` is False."""
    from nkilib_msda.simulator import Progress

    if not show:
        return False
    batch, queries = args["attention_weights"].shape[:2]
    return Progress(streamed_input="attention_weights", total=batch * queries, unit="query",
                    desc=desc)


def run_forward(args: dict, lnc: int = 1, progress: bool = False, **kernel_kwargs):
    """Simulate the forward kernel on ``make_inputs`` arguments; return (output, report, seconds).
    ``progress``: a progress bar on stderr for long runs (a terminal only)."""
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention
    from nkilib_msda.simulator import simulate

    start = time.perf_counter()
    out, report = simulate(ms_deformable_attention, lnc=lnc, report=True,
                           progress=msda_progress(args, "forward", progress))(**args, **kernel_kwargs)
    return out, report, time.perf_counter() - start


def run_backward(grad_output: np.ndarray, args: dict, lnc: int = 1, progress: bool = False,
                 **kernel_kwargs):
    """Simulate the backward kernel; return ((grad_value, grad_loc, grad_attn), report, seconds)."""
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention_bwd
    from nkilib_msda.simulator import simulate

    start = time.perf_counter()
    *grads, report = simulate(ms_deformable_attention_bwd, lnc=lnc, report=True,
                              progress=msda_progress(args, "backward", progress))(
        grad_output, **args, **kernel_kwargs)
    return tuple(grads), report, time.perf_counter() - start


def run_check(preset: str = "default", dtype: str = "bfloat16", param_dtype: str = "float16",
              value_layout: str | None = None, sampling_locations_layout: str | None = None,
              align_corners: bool = False, padding_mode: str = "zeros", lnc: int = 1,
              gather_method: str | None = None, backward: bool = True, seed: int = 0,
              show_report: bool = False, echo=print, progress: bool = False) -> bool:
    """Run forward (and backward) kernels in the emulator on a preset; print a short summary
    (shape, errors against the reference, modelled times, CHECK PASSED / CHECK FAILED) and,
    with ``show_report``, the kernels' cost reports after it. Returns whether every tolerance
    was met. ``progress``: a progress bar on stderr while a kernel runs longer than 2 s (a
    terminal only)."""
    from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref

    preset = resolve_preset(preset)
    if lnc not in (1, 2) or isinstance(lnc, bool):
        raise ValueError(f"lnc: expected 1 or 2, got {lnc!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    case = replace(PRESETS[preset], value_dtype=dtype, param_dtype=param_dtype,
                   value_layout=value_layout or PRESETS[preset].value_layout,
                   locations_layout=sampling_locations_layout or PRESETS[preset].locations_layout,
                   align_corners=align_corners, padding_mode=padding_mode)
    args = make_inputs(case, seed=seed)
    vdt = dtype_name(args["value"].dtype)
    echo(f"preset {preset}: {PRESET_DESCRIPTIONS[preset]}")
    echo(f"B={case.batch} N_q={case.num_queries} N_h={case.num_heads} C_h={case.head_dim} "
         f"N_l={case.num_levels} N_p={case.num_points} levels={list(case.spatial_shapes)} "
         f"L={case.total_pixels}")
    echo(f"value {vdt} {case.value_layout}, locations/weights {param_dtype} "
         f"{case.locations_layout}, align_corners={align_corners}, padding={padding_mode}, "
         f"lnc={lnc}" + (f", gather_method={gather_method}" if gather_method else ""))
    kernel_kwargs = {"gather_method": gather_method} if gather_method else {}

    out, fwd_report, fwd_s = run_forward(args, lnc=lnc, progress=progress, **kernel_kwargs)
    ref = ms_deformable_attention_ref(**args)
    rows = [compare("forward output", out, ref, tolerance("output", vdt))]
    timings = [f"forward simulated in {fwd_s:.1f} s"]
    reports = [("forward", fwd_report)]

    if backward:
        grad_output = make_grad_output(case, seed=seed)
        grads, bwd_report, bwd_s = run_backward(grad_output, args, lnc=lnc, progress=progress,
                                                **kernel_kwargs)
        refs = ms_deformable_attention_bwd_ref(grad_output, **args)
        for name, g, r in zip(("grad_value", "grad_sampling_locations", "grad_attention_weights"), grads, refs):
            rows.append(compare(name, g, r, tolerance(name, vdt)))
        timings.append(f"backward simulated in {bwd_s:.1f} s")
        reports.append(("backward", bwd_report))

    echo("")
    echo("| output | max|err|/max|ref| | rel L2 | tolerance | status |")
    echo("|---|---|---|---|---|")
    for row in rows:
        echo(row.row())
    echo("")
    echo("; ".join(timings) + " (emulator wall time, not a hardware timing)")
    for name, report in reports:
        if report.timing is not None:  # the timing model (docs/timing.md)
            echo(f"{name} kernel: {report.timing.summary()}")
    ok = all(r.ok for r in rows)
    echo("")
    echo("CHECK PASSED" if ok else "CHECK FAILED")
    if not show_report:
        echo(f"(cost reports of {'both kernels' if backward else 'the kernel'}: "
             "nkilib-msda check --report)")
        return ok
    for name, report in reports:  # the detail, after the summary
        echo("")
        echo(f"== {name} kernel cost report ==")
        echo(str(report))
    return ok
