"""On-chip (GpSimd) gathering for the MSDA forward: a design study in plain arithmetic
(issue 30, item 4, last paragraph; docs/kernels.md, "On-chip gathering").

Two designs replace the indirect-DMA gathers of one level by GpSimd gathers from SBUF:

- ``nc_n_gather`` gathers within each partition. Our kernels put a query's samples on one
  partition, so every partition that handles queries must hold the whole map of the head it
  gathers from: fill bytes = map bytes x 128 partitions (per head and batch); the map of one
  head must fit one partition. Indices are uint32 element offsets, one per gathered element.
- ``local_gather`` (channel layout): each GpSimd core serves 16 partitions and all 16 gather the
  same positions, each from its own partition (the NumPy semantics of the page's example). With
  one channel of one head per partition (zero-bordered, row-major, so the corners (x, x+1) are
  one ``num_elem_per_idx=2`` run), 128 partitions hold 4 heads: the map is loaded once (a DMA
  transpose, no replication); per partition (H+2)(W+2) 2-byte elements, and the element offsets
  must fit uint16 (the dtype of the page's example and of AWS's MoE kernel).

Both gather ``samples x 4 corners x C_h`` elements. No page gives a GpSimd cost for either
instruction, so the gather is priced over a range: ``FAST`` = 1 GpSimd cycle per gathered
element per partition (the documented GpSimd ``150 + N`` form of iota/affine_select),
``SLOW`` = 16 (each of the 8 GpSimd cores moving one element per cycle for its 16 partitions).
The Vector work is carried over from our forward (its nominal Vector busy time in the cache:
coordinates, corner products, reduction; the designs need the same arithmetic on another
layout); nc_n_gather adds one uint32 index per gathered element (1 Vector cycle each). Fast
end: launch floor + max(fill, gather at FAST_CYCLES, Vector) (perfect overlap); slow end:
launch floor + fill + gather at SLOW_CYCLES + Vector (none). The weight broadcast to the
channel partitions and the transpose back to the query layout are NOT counted (they only add
to the on-chip designs). One core (LNC 1), Trn2 constants of the timing model
(``nkilib_msda.simulator.timing.constants``).

The current kernels' forward times per scenario are read from ``msda_side_by_side.json``
(``ours/fwd/<shape>/lnc1``): the on-chip designs use no indirect DMA, so their time does not
depend on the scenario; a design can win in a scenario where our kernel's time there exceeds
the design's. Usage::

    python benchmarks/onchip_gather_model.py [--markdown] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkilib_msda.hardware import PARTITIONS, PLANNER_SBUF_BUDGET
from nkilib_msda.simulator.timing.constants import hardware_for, nominal_params
from nkilib_msda.workloads import NKI_LIBRARY_SHAPES, MSDACase

__all__ = ["LevelCost", "ShapeVerdict", "level_cost", "shape_verdict", "backward_shares",
           "design_us", "main", "FAST_CYCLES", "SLOW_CYCLES"]

DEFAULT_JSON = Path(__file__).resolve().parent / "msda_side_by_side.json"
SHAPE_ORDER = ("basic", "decoder-small", "tsa-small", "sca-small", "decoder-base", "tsa-base",
               "sca-base")
FAST_CYCLES = 1.0    # GpSimd cycles per gathered element per partition, assumed best case
SLOW_CYCLES = 16.0   # assumed worst case
INDEX_CYCLES = 1.0   # Vector cycles per uint32 element index that nc_n_gather needs
GPSIMD_CORES = 8
PARTITIONS_PER_GPSIMD_CORE = PARTITIONS // GPSIMD_CORES
UINT16_LIMIT = 1 << 16
VALUE_BYTES = 2      # bf16 value, the side-by-side shapes' dtype

_HW = hardware_for("trn2")
_P = nominal_params("trn2")
DMA_BYTES_PER_NS = _HW.dma_bytes_per_ns * _HW.dma_engines  # one core, all 16 engines
GPSIMD_GHZ = _HW.clock_ghz["gpsimd"]
VECTOR_GHZ = _HW.clock_ghz["vector"]
SBUF_BUDGET = PLANNER_SBUF_BUDGET["trn2"]


@dataclass(frozen=True)
class LevelCost:
    """One level of one shape: the SBUF facts and the work of each on-chip design (LNC 1).

    ``map_bytes``: one head's map, H*W*C_h*2. ``ngather_fill_bytes``: map x 128 partitions x
    N_h x B (the replication nc_n_gather needs). ``local_partition_bytes``: one channel with a
    zero border, (H+2)(W+2)*2. ``elements``: gathered elements, B*N_q*N_h*N_p*4*C_h."""

    shape: str
    level: int
    height: int
    width: int
    map_bytes: int
    fits_one_partition: bool
    fits_16_partitions: bool
    ngather_fill_bytes: int
    local_partition_bytes: int
    local_offsets_fit_uint16: bool
    local_fill_bytes: int
    elements: int

    @property
    def ngather_fill_us(self) -> float:
        return self.ngather_fill_bytes / DMA_BYTES_PER_NS / 1e3

    @property
    def local_fill_us(self) -> float:
        return self.local_fill_bytes / (DMA_BYTES_PER_NS * _HW.dma_transpose_efficiency) / 1e3

    def gpsimd_us(self, cycles_per_element: float) -> float:
        """GpSimd time of the level's gathers at ``cycles_per_element`` per partition."""
        return self.elements / PARTITIONS * cycles_per_element / GPSIMD_GHZ / 1e3

    @property
    def index_build_us(self) -> float:
        """Vector time to build nc_n_gather's uint32 element indices."""
        return self.elements / PARTITIONS * INDEX_CYCLES / VECTOR_GHZ / 1e3


def level_cost(case: MSDACase, level: int) -> LevelCost:
    """The arithmetic of one level (see :class:`LevelCost`)."""
    if not 0 <= level < case.num_levels:
        raise ValueError(f"level: expected 0 <= level < {case.num_levels}, got {level}")
    height, width = case.spatial_shapes[level]
    if height < 1 or width < 1:
        raise ValueError(f"spatial_shapes[{level}]: expected positive (H, W), got {(height, width)}")
    map_bytes = height * width * case.head_dim * VALUE_BYTES
    padded = (height + 2) * (width + 2)
    samples = case.batch * case.num_queries * case.num_heads * case.num_points
    return LevelCost(
        shape=case.name, level=level, height=height, width=width, map_bytes=map_bytes,
        fits_one_partition=map_bytes <= SBUF_BUDGET,
        fits_16_partitions=map_bytes <= PARTITIONS_PER_GPSIMD_CORE * SBUF_BUDGET,
        ngather_fill_bytes=map_bytes * PARTITIONS * case.num_heads * case.batch,
        local_partition_bytes=padded * VALUE_BYTES,
        local_offsets_fit_uint16=padded <= UINT16_LIMIT,
        local_fill_bytes=map_bytes * case.num_heads * case.batch,
        elements=samples * 4 * case.head_dim)


@dataclass(frozen=True)
class ShapeVerdict:
    """A shape's forward at LNC 1: each on-chip design's time range (fast: gather, fill and
    Vector overlap perfectly at FAST_CYCLES; slow: they run one after another at SLOW_CYCLES;
    None where the design does not fit) and our kernel's modelled time per scenario."""

    shape: str
    levels: tuple[LevelCost, ...]
    ngather_us: tuple[float, float] | None
    local_us: tuple[float, float] | None
    current_us: dict[str, tuple[float, float, float]]
    aws_fastest_us: float | None

    def wins(self, design: tuple[float, float] | None, bound: int, corner: int = 1) -> list[str]:
        """Scenarios where our kernel's time exceeds the design's (``bound`` 0: the design's
        fast end, 1: its slow end; ``corner`` 0: our low band corner, 1: nominal, 2: high)."""
        if design is None:
            return []
        return [s for s, us in self.current_us.items() if us[corner] > design[bound]]


def design_us(levels: tuple[LevelCost, ...], local: bool,
              vector_us: float) -> tuple[float, float] | None:
    """(fast, slow) µs of one design over ``levels`` with ``vector_us`` of carried-over Vector
    work; None where the design does not fit SBUF or its index dtype."""
    launch = _P["launch_floor_us"]
    if local:
        if not all(lv.local_offsets_fit_uint16 for lv in levels) or \
                sum(lv.local_partition_bytes for lv in levels) > SBUF_BUDGET:
            return None
        fill = sum(lv.local_fill_us for lv in levels)
    else:
        if not all(lv.fits_one_partition for lv in levels):
            return None
        fill = sum(lv.ngather_fill_us for lv in levels)
    fast = sum(lv.gpsimd_us(FAST_CYCLES) for lv in levels)
    slow = sum(lv.gpsimd_us(SLOW_CYCLES) for lv in levels)
    vector = vector_us + (0.0 if local else sum(lv.index_build_us for lv in levels))
    return launch + max(fill, fast, vector), launch + fill + slow + vector


def _runs(path: Path) -> dict[str, Any]:
    runs: dict[str, Any] = json.loads(path.read_text())["runs"]
    return runs


def shape_verdict(case: MSDACase, runs: dict[str, Any]) -> ShapeVerdict:
    """Both designs' forward time on ``case`` and our kernel's per-scenario time (LNC 1)."""
    levels = tuple(level_cost(case, lvl) for lvl in range(case.num_levels))
    row = runs.get(f"ours/fwd/{case.name}/lnc1")
    if row is None:
        raise KeyError(f"runs: expected a row 'ours/fwd/{case.name}/lnc1', got none")
    current = {s: (float(t["low_us"]), float(t["estimate_us"]), float(t["high_us"]))
               for s, t in row["timing"]["scenarios"].items()}
    vector = float(row["timing"]["engine_busy_us"]["vector"])
    aws = runs.get(f"aws/fwd/{case.name}/lnc1")
    aws_fastest = None if aws is None else min(
        float(t["low_us"]) for t in aws["timing"]["scenarios"].values())
    return ShapeVerdict(case.name, levels, design_us(levels, False, vector),
                        design_us(levels, True, vector), current, aws_fastest)


def backward_shares(runs: dict[str, Any], shape: str) -> tuple[int, int, int, float]:
    """Our backward at LNC 1: (gather descriptors, scatter descriptors, scatter instructions,
    GpSimd µs of the scatters' fixed per-instruction cost at the nominal swdge_fixed_ns)."""
    dma = runs[f"ours/bwd/{shape}/lnc1"]["counts"]["dma"]
    gather = sum(dma.get(k, {}).get("descriptors", 0) for k in ("indirect_transpose", "indirect"))
    scatter = dma.get("indirect_rmw", {})
    fixed_us = scatter.get("instructions", 0) * _P["swdge_fixed_ns"] / 1e3
    return gather, scatter.get("descriptors", 0), scatter.get("instructions", 0), fixed_us


def _span(pair: tuple[float, float] | None) -> str:
    return "does not fit" if pair is None else f"{pair[0]:,.0f}–{pair[1]:,.0f}"


def _level_lines(verdicts: list[ShapeVerdict]) -> list[str]:
    lines = ["| shape | level | map B/head | fits 1 / 16 partitions | nc_n_gather fill MB (µs) "
             "| local_gather B/partition, uint16 | gathered M elements | GpSimd µs fast–slow |",
             "|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        for lv in v.levels:
            lines.append(
                f"| {lv.shape} | {lv.height}×{lv.width} | {lv.map_bytes:,} "
                f"| {'yes' if lv.fits_one_partition else 'no'} / "
                f"{'yes' if lv.fits_16_partitions else 'no'} "
                f"| {lv.ngather_fill_bytes / 1e6:,.0f} ({lv.ngather_fill_us:,.0f}) "
                f"| {lv.local_partition_bytes:,}, {'yes' if lv.local_offsets_fit_uint16 else 'no'} "
                f"| {lv.elements / 1e6:.1f} "
                f"| {lv.gpsimd_us(FAST_CYCLES):,.0f}–{lv.gpsimd_us(SLOW_CYCLES):,.0f} |")
    return lines


def _verdict_lines(verdicts: list[ShapeVerdict]) -> list[str]:
    lines = ["| shape | ours fwd µs, 9 scenarios (nominal corner) min–max | nc_n_gather µs fast–slow "
             "| local_gather µs fast–slow | scenarios where nc_n_gather / local_gather beats ours: "
             "fast, slow, slow vs our low corner | local_gather / AWS's fastest scenario and "
             "corner: fast, slow |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        cur = [us[1] for us in v.current_us.values()]
        counts = " / ".join(", ".join(str(len(v.wins(d, b, c))) for b, c in ((0, 1), (1, 1), (1, 0)))
                            if d is not None else "-" for d in (v.ngather_us, v.local_us))
        aws = "-" if v.aws_fastest_us is None or v.local_us is None else \
            f"{v.local_us[0] / v.aws_fastest_us:.2f}, {v.local_us[1] / v.aws_fastest_us:.2f}"
        lines.append(f"| {v.shape} | {min(cur):,.0f}–{max(cur):,.0f} | {_span(v.ngather_us)} "
                     f"| {_span(v.local_us)} | {counts} (of {len(v.current_us)}) | {aws} |")
    return lines


def _backward_lines(runs: dict[str, Any], shapes: list[str]) -> list[str]:
    lines = ["| shape | bwd gather / scatter descriptors | gather share | scatter instructions "
             "(fixed swdge µs, nominal) |", "|---|---|---|---|"]
    for shape in shapes:
        gather, scatter, instructions, fixed_us = backward_shares(runs, shape)
        share = gather / (gather + scatter) if gather + scatter else math.nan
        lines.append(f"| {shape} | {gather:,} / {scatter:,} | {share:.0%} "
                     f"| {instructions:,} ({fixed_us:,.0f}) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the markdown tables")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="side-by-side cache with the ours/fwd and ours/bwd rows")
    args = parser.parse_args(argv)
    runs = _runs(args.json)
    verdicts = [shape_verdict(NKI_LIBRARY_SHAPES[s], runs) for s in SHAPE_ORDER]
    if args.markdown:
        print("\n".join(_level_lines(verdicts) + [""] + _verdict_lines(verdicts) + [""]
                        + _backward_lines(runs, list(SHAPE_ORDER))))
        return 0
    for v in verdicts:
        cur = [us[1] for us in v.current_us.values()]
        print(f"{v.shape}: ours {min(cur):,.0f}–{max(cur):,.0f} µs; nc_n_gather "
              f"{_span(v.ngather_us)}, wins (slow) in {sorted(v.wins(v.ngather_us, 1))}; "
              f"local_gather {_span(v.local_us)}, wins (slow) in {sorted(v.wins(v.local_us, 1))}, "
              f"robustly in {sorted(v.wins(v.local_us, 1, 0))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
