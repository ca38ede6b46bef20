"""Cost of per-level point counts (padding to max P), CPU time and NKI emulator counts.

Usage: python benchmarks/point_counts_cost.py [--queries 300] [--repeats 5] [--emulator-queries 128]

D-FINE / DEIMv2 decoder shape (640x640 input: levels 80x80, 40x40, 20x20; 8 heads of 32
channels), num_points=(3, 6, 3): 12 real points per head and level set, padded to 3 x 6 = 18.
Compared with a uniform 4 points per level (the same 12 points, nothing padded):

- CPU, reference backend, float32, forward and forward + backward, 1 thread, median of
  ``--repeats``; also transformers' ``grid_sample`` formulation of the same per-level call;
- NKI forward kernel in the emulator (``report=True``): indirect descriptors (one per
  sampled point and corner row) and instructions per engine, which scale with the points the
  kernel samples, and the timing model's modelled Trainium time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

import nkilib_msda
from nkilib_msda.validation.layouts import level_starts

LEVELS = ((80, 80), (40, 40), (20, 20))
PER_LEVEL = (3, 6, 3)
UNIFORM = (4, 4, 4)


def _inputs(counts, queries, heads=8, channels=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    length = sum(h * w for h, w in LEVELS)
    value = torch.randn(1, length, heads, channels, generator=g)
    loc = torch.rand(1, queries, heads, sum(counts), 2, generator=g)
    weights = torch.rand(1, queries, heads, sum(counts), generator=g)
    return value, loc, weights


def grid_sample_v2(value, loc, weights, counts):
    """transformers' per-level grid_sample formulation (method "default")."""
    batch, _, heads, channels = value.shape
    queries = loc.shape[1]
    outs, point = [], 0
    for (h, w), start, count in zip(LEVELS, level_starts(LEVELS), counts):
        level = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(batch * heads, channels, h, w)
        grid = (2 * loc[:, :, :, point:point + count] - 1).permute(0, 2, 1, 3, 4).flatten(0, 1)
        outs.append(F.grid_sample(level, grid, mode="bilinear", padding_mode="zeros",
                                  align_corners=False))
        point += count
    attn = weights.permute(0, 2, 1, 3).reshape(batch * heads, 1, queries, sum(counts))
    out = (torch.cat(outs, -1) * attn).sum(-1).view(batch, heads * channels, queries)
    return out.transpose(1, 2)


def _time(fn, repeats):
    fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def cpu_rows(queries, repeats):
    rows = []
    for label, counts, impl in (
            ("num_points=(3,6,3), padded to 18", PER_LEVEL, "ours"),
            ("uniform 4 points (12, no padding)", UNIFORM, "ours"),
            ("grid_sample formulation, (3,6,3)", PER_LEVEL, "grid_sample")):
        value, loc, weights = _inputs(counts, queries)

        def run(backward, counts=counts, impl=impl, value=value, loc=loc, weights=weights):
            ts = [t.clone().requires_grad_(backward) for t in (value, loc, weights)]
            if impl == "ours":
                out = nkilib_msda.multi_scale_deformable_attention(
                    ts[0], LEVELS, None, ts[1], ts[2], backend="reference", num_points=counts)
            else:
                out = grid_sample_v2(*ts, counts)
            if backward:
                out.sum().backward()

        rows.append((label, _time(lambda: run(False), repeats), _time(lambda: run(True), repeats)))
    return rows


def emulator_rows(queries):
    from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
        ms_deformable_attention)
    from nkilib_msda.simulator import simulate
    from nkilib_msda.workloads import MSDACase, make_inputs

    rows = []
    for label, points in (("padded (3,6,3) -> 6 per level", 6), ("uniform 4 per level", 4)):
        case = MSDACase(num_queries=queries, num_points=points, spatial_shapes=LEVELS,
                        value_dtype="float32", param_dtype="float32")
        start = time.perf_counter()
        _, report = simulate(ms_deformable_attention, report=True)(**make_inputs(case))
        seconds = time.perf_counter() - start
        d = report.to_dict()
        desc = sum(v["descriptors"] for k, v in d["dma"].items() if k.startswith("indirect"))
        instr = {e: d["engines"][e]["instructions"] for e in ("tensor", "vector", "gpsimd", "dma")}
        timing = getattr(report, "timing", None)
        modelled = None if timing is None else float(timing.estimate_us)
        rows.append((label, desc, instr, modelled, seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--emulator-queries", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"CPU, reference backend, fp32, 1 thread, B=1, N_q={args.queries}, N_h=8, C_h=32, "
          f"levels {LEVELS}\n")
    print("| call | forward ms | forward + backward ms |\n| --- | ---: | ---: |")
    for label, fwd, both in cpu_rows(args.queries, args.repeats):
        print(f"| {label} | {fwd * 1e3:.1f} | {both * 1e3:.1f} |")
    print(f"\nNKI forward kernel, emulator report, fp32, N_q={args.emulator_queries}\n")
    print("| call | indirect descriptors | instructions (tensor / vector / gpsimd / dma) | "
          "modelled trn2 µs |\n| --- | ---: | --- | ---: |")
    for label, desc, instr, modelled, _ in emulator_rows(args.emulator_queries):
        shown = "n/a" if modelled is None else f"{modelled:.1f}"
        print(f"| {label} | {desc} | {' / '.join(str(v) for v in instr.values())} | {shown} |")


if __name__ == "__main__":
    main()
