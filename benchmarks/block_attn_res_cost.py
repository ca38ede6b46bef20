"""Cost report of the Block AttnRes NKI kernels for the shapes of docs/block_attn_res.md.

Writes benchmarks/block_attn_res_cost.md (``python benchmarks/block_attn_res_cost.py``).

Method (exact, not a sample): the kernels' instruction stream is the same for every full
128-token tile, plus a fixed per-program part (loading u; the beta combine). So each shape is
simulated (bf16, LNC=2, partial block, RMSNorm on, both caches) on T_k = 2*k*128 tokens for
k = 1 and k = 2 tiles per program; per-tile = R(2) - R(1), fixed = R(1) - per-tile, and the full
shape is fixed + (BT/256) * per-tile per program. A third run (k = 3) checks the extrapolation
exactly. Everything else about the shape (L, D, mode, SBUF plan) is the real one.

Time model (the emulator counts, it does not time): HBM at 0.725 TB/s per LNC=2 logical core
(docs/block_attn_res.md); each compute engine of each physical core runs ~1 element per partition per
cycle with the documented per-instruction cost max(MIN_II, N) + MIN_II, MIN_II = 64, at an
assumed 1.4 GHz; N = elements / 128 per instruction (full tiles). The Tensor engine is charged
max(64, N) + 64 + 128 (stationary load) cycles per matmul. Engines and DMA are assumed to
overlap perfectly, so modelled time = max(DMA, slowest engine).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.experimental.block_attn_res.tiling import TOKEN_TILE, plan_backward, plan_forward
from nkilib_msda.simulator import simulate

SHAPES = {  # name: (B, T, L, D), L counting the partial block
    "A": (2, 4096, 26, 512),
    "B": (1, 4096, 33, 1536),
    "C": (1, 8192, 9, 4096),
}
LNC = 2
HBM_BYTES_PER_S = 0.725e12
CLOCK_HZ = 1.4e9
MIN_II = 64
PE_STATIONARY_LOAD = 128
ENGINES = ("vector", "scalar", "gpsimd", "tensor")


def compulsory_bytes(direction: str, b: int, t: int, n_src: int, d: int) -> int:
    """docs/block_attn_res.md shapes (bf16, partial block given, both caches)."""
    tokens = b * t
    v_passes = 2 if direction == "fwd" else 4
    return v_passes * n_src * tokens * d + 2 * tokens * d + 8 * tokens * n_src


@dataclass
class Counts:
    """Additive counts of one program (per physical core)."""

    instructions: dict[str, int]
    cycles: dict[str, float]
    hbm_bytes: float
    dma_instructions: int

    def __add__(self, other: "Counts") -> "Counts":
        return self._combine(other, 1.0)

    def __sub__(self, other: "Counts") -> "Counts":
        return self._combine(other, -1.0)

    def scaled(self, k: float) -> "Counts":
        return Counts({e: v * k for e, v in self.instructions.items()},
                      {e: v * k for e, v in self.cycles.items()}, self.hbm_bytes * k,
                      self.dma_instructions * k)

    def _combine(self, other: "Counts", sign: float) -> "Counts":
        return Counts({e: self.instructions[e] + sign * other.instructions[e] for e in ENGINES},
                      {e: self.cycles[e] + sign * other.cycles[e] for e in ENGINES},
                      self.hbm_bytes + sign * other.hbm_bytes,
                      self.dma_instructions + sign * other.dma_instructions)


def _program_counts(report) -> Counts:
    instructions, cycles = {}, {}
    for engine in ENGINES:
        ops = report.instructions[engine]
        instructions[engine] = sum(c for c, _ in ops.values())
        total = 0.0
        for opcode, (count, elements) in ops.items():
            per_instr = elements / TOKEN_TILE / count  # tensor: elements = M*N, N = moving columns
            if engine == "tensor":
                total += count * (max(MIN_II, per_instr) + MIN_II + PE_STATIONARY_LOAD)
            else:
                total += count * (max(MIN_II, per_instr) + MIN_II)
        cycles[engine] = total
    return Counts(instructions, cycles, float(report.dma_hbm_bytes()),
                  report.instruction_count("dma"))


def _simulate(direction: str, n_src: int, tokens: int, d: int, seed: int = 0) -> list[Counts]:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n_src, tokens, d)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal(d) / math.sqrt(4 * d)).astype(np.float32)
    gamma = np.ones(d, np.float32)
    fwd = simulate(block_attn_res_fwd, lnc=LNC, report=direction == "fwd")(values, w, gamma)
    if direction == "fwd":
        report = fwd[-1]
    else:
        grad_h = rng.standard_normal((tokens, d)).astype(ml_dtypes.bfloat16)
        report = simulate(block_attn_res_bwd, lnc=LNC, report=True)(
            grad_h, values, w, fwd[2], gamma, fwd[1])[-1]
    programs = report.programs or [report]
    return [_program_counts(p) for p in programs]


def extrapolate(direction: str, b: int, t: int, n_src: int, d: int) -> tuple[Counts, bool, float]:
    """Per-program counts for the full shape (program 0; both issue the same stream), whether the k=3
    check matched exactly, and the simulation seconds."""
    start = time.time()
    runs = {k: _simulate(direction, n_src, LNC * k * TOKEN_TILE, d)[0] for k in (1, 2, 3)}
    per_tile = runs[2] - runs[1]
    fixed = runs[1] - per_tile
    predicted3 = fixed + per_tile.scaled(3)
    exact = (all(abs(predicted3.cycles[e] - runs[3].cycles[e]) < 1e-6 for e in ENGINES)
             and abs(predicted3.hbm_bytes - runs[3].hbm_bytes) < 1e-6)
    tiles_per_program = math.ceil(b * t / TOKEN_TILE / LNC)
    return fixed + per_tile.scaled(tiles_per_program), exact, time.time() - start


def _row(name: str, direction: str, shape: tuple[int, int, int, int]) -> dict:
    b, t, n_src, d = shape
    counts, exact, seconds = extrapolate(direction, b, t, n_src, d)
    plan = (plan_forward if direction == "fwd" else plan_backward)(n_src, b * t, d, "bfloat16", LNC)
    compulsory = compulsory_bytes(direction, b, t, n_src, d)
    hbm_total = counts.hbm_bytes * LNC  # both programs move the same bytes (equal tile counts)
    dma_s = hbm_total / HBM_BYTES_PER_S
    engine_s = {e: counts.cycles[e] / CLOCK_HZ for e in ENGINES}
    slowest = max(engine_s, key=engine_s.get)
    modelled = max(dma_s, engine_s[slowest])
    mode = f"{plan.mode} x{plan.buffers}"
    if direction == "fwd" and plan.mode == "stream":
        mode = f"stream G={plan.group} x{plan.buffers}"
    naive = _naive_bytes(direction, b, t, n_src, d)
    return dict(name=name, direction=direction, shape=shape, mode=mode, naive=naive,
                naive_us=naive / HBM_BYTES_PER_S * 1e6,
                sbuf=plan.total_sbuf_bytes, compulsory=compulsory, hbm=hbm_total,
                dma_us=dma_s * 1e6, engine_us={e: s * 1e6 for e, s in engine_s.items()},
                slowest=slowest, modelled_us=modelled * 1e6,
                achieved_tbs=compulsory / modelled / 1e12, instructions=counts.instructions,
                dma_instructions=counts.dma_instructions, exact=exact, seconds=seconds)


def _naive_bytes(direction: str, b: int, t: int, n_src: int, d: int) -> int:
    """HBM bytes of the framework chain in bf16, [BT, L] score tensors ignored (an estimate).

    Forward: stack (read + write V), RMSNorm (read V, write x_hat), dot with w (read x_hat),
    weighted sum (read V, write h): 6 V + h. Backward (autograd of that chain): weighted sum
    (read V, dh; write dV), dot (read x_hat; write d x_hat), RMSNorm (read V, d x_hat; write dV
    contribution), add the two dV parts (read 2, write 1), unstack (read + write): ~12 V + dh.
    """
    v = 2 * n_src * b * t * d
    return (6 * v if direction == "fwd" else 12 * v) + 2 * b * t * d


def render(rows: list[dict]) -> str:
    lines = ["# Block AttnRes NKI kernels: cost report vs compulsory bytes", "",
             "Generated by `python benchmarks/block_attn_res_cost.py` (NKI emulator, trn2, bf16, "
             "LNC=2, partial block, RMSNorm on, both caches). See the script's docstring for the "
             "exact method: every shape is simulated on 1, 2 and 3 token tiles per program and "
             "extrapolated linearly (the per-tile instruction stream is identical; the 3-tile run "
             "checks the extrapolation exactly).", "",
             "**Times are a model, not a measurement**: HBM 0.725 TB/s per logical core; engines "
             f"at an assumed {CLOCK_HZ / 1e9:.1f} GHz with max(64, N) + 64 cycles per instruction "
             "(+128 per matmul for the stationary load); perfect overlap.", "",
             "| shape (B, T, L, D) | dir | mode | SBUF B/part | compulsory MB | kernel HBM MB | "
             "HBM / compulsory | DMA µs | Vector µs | Scalar µs | Tensor µs | modelled µs (bound) | "
             "achieved TB/s (model) | naive chain MB (µs at peak) | vs naive |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, t, n_src, d = r["shape"]
        e = r["engine_us"]
        lines.append(
            f"| {r['name']}: {b}, {t}, {n_src}, {d} | {r['direction']} | {r['mode']} | {r['sbuf']:,} | "
            f"{r['compulsory'] / 1e6:.1f} | {r['hbm'] / 1e6:.1f} | {r['hbm'] / r['compulsory']:.3f} | "
            f"{r['dma_us']:.0f} | {e['vector']:.0f} | {e['scalar']:.0f} | {e['tensor']:.0f} | "
            f"{r['modelled_us']:.0f} ({r['slowest'] if r['modelled_us'] > r['dma_us'] else 'dma'}) | "
            f"{r['achieved_tbs']:.3f} ({r['achieved_tbs'] / (HBM_BYTES_PER_S / 1e12):.0%}) | "
            f"{r['naive'] / 1e6:.0f} ({r['naive_us']:.0f}) | {r['naive_us'] / r['modelled_us']:.1f}x |")
    lines += ["", "Instruction counts per program (physical core):", "",
              "| shape | dir | vector | scalar | gpsimd | tensor | dma | extrapolation exact | sim s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        i = r["instructions"]
        lines.append(f"| {r['name']} | {r['direction']} | {i['vector']:,.0f} | {i['scalar']:,.0f} | "
                     f"{i['gpsimd']:,.0f} | {i['tensor']:,.0f} | {r['dma_instructions']:,.0f} | "
                     f"{'yes' if r['exact'] else 'NO'} | {r['seconds']:.0f} |")
    ratios = [r["naive_us"] / r["modelled_us"] for r in rows]
    lines += ["", ANALYSIS.format(naive_min=min(ratios), naive_max=max(ratios))]
    return "\n".join(lines) + "\n"


ANALYSIS = """## Reading the numbers

- **HBM traffic is at the compulsory minimum** (kernel / compulsory = 1.00-1.01): V is read once
  in each direction (the backward keeps the tile's slab on chip between its two passes; shapes B
  and C use one slab buffer so it fits). The small excess is the per-program broadcast of w and
  gamma to 128 partitions and the LNC=2 beta exchange.
- **The kernels are engine-bound in this model, not DMA-bound.** One VectorE or ScalarE pass over
  a [128, D] source tile costs D + 64 cycles, so one pass over V is about the DMA time of V.
  Forward, per source: ScalarE does the sum of squares (activation square + accumulate) and
  reduces the u-product (activation copy + accumulate); VectorE does the u-product and the FMA
  into the fp32 accumulator: two passes on each engine, balanced. Stream mode (shapes B, C) adds
  one ScalarE rescale of the accumulator per group of sources (2 groups for B and C).
  Backward, per source: VectorE does the products with dh and u and two fused FMAs for dV (4
  passes), ScalarE the two reductions and the b*v term (3 passes), TensorE the beta matmuls
  (moving = [a_hi, a_lo], contracted over the 128 tokens into one PSUM bank).
- Against the naive framework chain (which moves V ~6x forward and ~12x backward) the modelled
  kernel time is {naive_min:.1f}-{naive_max:.1f}x lower, even crediting the chain with full bandwidth.
- What would close the gap to the 70 % target: a fused multiply-and-reduce on VectorE
  (newer NKI has `scalar_tensor_tensor(..., reduce_res=)`; not in the emulated 0.5/0.6 surface)
  would remove one pass per dot, i.e. forward 1.5 and backward 3 passes per engine; moving one
  product to GpSimd (`engine=gpsimd`, throughput on trn2 unverified here) would balance the
  backward further. Both keep the HBM traffic unchanged.
- Modelled numbers assume perfect overlap of DMA and engines and ignore DMA fixed costs (~600 ns
  of descriptor generation per HWDGE instruction, docs/kernels.md; the slab DMAs are large and
  double-buffered in the x2 modes); a profile on hardware is the real test.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    parser.add_argument("--shapes", default="ABC")
    args = parser.parse_args()
    rows = [_row(name, direction, SHAPES[name]) for name in args.shapes for direction in ("fwd", "bwd")]
    text = render(rows)
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
