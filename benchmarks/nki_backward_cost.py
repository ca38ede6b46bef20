"""Cost report of the NKI MSDA backward kernel, from the emulator's instruction/DMA counters.

Writes ``benchmarks/nki_backward_cost.md``: per case, indirect gather and scatter descriptors
(and DMA instructions) per sampled point, K, the HBM bytes spent zeroing and reducing the K
fp32 buffers as a share of all DMA HBM traffic, and peak SBUF per partition. Counts, not
timings (the emulator does not model time). Usage: ``python benchmarks/nki_backward_cost.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward  # noqa: E402
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import (  # noqa: E402
    ms_deformable_attention_bwd)
from nkilib_msda.workloads import (  # noqa: E402
    PRESETS, MSDACase, make_inputs, numpy_dtype)
from nkilib_msda.simulator import simulate  # noqa: E402
from nkilib_msda.validation.msda import validate_msda_args  # noqa: E402

LNC = 2
CASES = [
    ("S4 default (upstream #2 shape, B=1)", MSDACase(num_queries=256), {}),
    ("S4 BNLC", MSDACase(num_queries=256, value_layout="BNLC"), {}),
    ("S4 copy gather, 128-row scatters", MSDACase(num_queries=256),
     {"gather_method": "copy", "max_gather_indices_per_indirect": 128, "max_scatter_indices_per_indirect": 128}),
    ("S4 num_scatter_buffers=4", MSDACase(num_queries=256), {"num_scatter_buffers": 4}),
    ("S4 scatter cap 32 (K=1)", MSDACase(num_queries=256), {"max_scatter_indices_per_indirect": 32}),
    ("BEVFormer fast (B=2, N_q=512)", MSDACase(batch=2, num_queries=512, locations_layout="B2QHLP"), {}),
    ("#11 N_h=4 C_h=256 N_p=4", MSDACase(num_heads=4, head_dim=256, num_points=4, locations_layout="B2QHLP"), {}),
    ("1 level 50x50, N_l=1 N_p=4 (TSA-like)",
     MSDACase(num_queries=512, num_points=4, spatial_shapes=((50, 50),)), {}),
    ("1 level 50x50, scatter cap 256 (upstream K, pairs kept)",
     MSDACase(num_queries=512, num_points=4, spatial_shapes=((50, 50),)), {"max_scatter_indices_per_indirect": 256}),
    ("S4 fp32 value", MSDACase(num_queries=256, value_dtype="float32", param_dtype="float32"), {}),
]
MODEL_CASES = [  # BEVFormer-base sizes (nkilib_msda.workloads presets); minutes in the emulator
    ("BEVFormer-base SCA (N_q=18000, BNLC)", PRESETS["bevformer-sca"], {}),
    ("BEVFormer-base TSA (N_q=40000, 200x200)", PRESETS["bevformer-tsa"], {}),
    ("BEVFormer-base decoder (N_q=900, 200x200)", PRESETS["bevformer-decoder"], {}),
    ("BEVFormer-base decoder, scatter cap 256 (upstream K, pairs kept)", PRESETS["bevformer-decoder"],
     {"max_scatter_indices_per_indirect": 256}),
]


def measure(case: MSDACase, knobs: dict) -> dict:
    args = make_inputs(case)
    grad = np.random.default_rng(1).standard_normal(
        (case.batch, case.num_queries, case.num_heads * case.head_dim), dtype=np.float32
    ).astype(numpy_dtype(case.value_dtype))
    t0 = time.time()
    *_, report = simulate(ms_deformable_attention_bwd, lnc=LNC, report=True)(grad, **args, **knobs)
    seconds = time.time() - t0
    problem = validate_msda_args(args["value"], args["spatial_shapes"], args["level_start_index"],
                                 args["sampling_locations"], args["attention_weights"], args["value_layout"],
                                 args["sampling_locations_layout"], args["align_corners"], args["padding_mode"])
    cfg = plan_backward(problem, case.value_dtype, LNC, **{k: v for k, v in knobs.items()})
    samples = problem.num_samples
    buffer_bytes = cfg.scratch_hbm_bytes  # every set, batch and core: zeroed once (HBM writes)
    reduce_bytes = sum(s.hbm_bytes for (k, _), s in report.dma.items() if k == "compute")  # buffers read once
    gather_desc = report.dma_descriptors("indirect_gather") + report.dma_descriptors("indirect_transpose")
    gather_instr = sum(s.instructions for (k, _), s in report.dma.items()
                       if k in ("indirect_gather", "indirect_transpose"))
    scatter = [s for (k, _), s in report.dma.items() if k == "indirect_rmw"]
    total_hbm = report.dma_hbm_bytes()
    return {
        "samples": samples, "K": cfg.num_buffers, "buffers": cfg.scatter_sets * LNC * cfg.num_buffers,
        "gather_desc": gather_desc / samples, "gather_instr": gather_instr / samples,
        "scatter_desc": report.dma_descriptors("indirect_rmw") / samples,
        "scatter_instr": sum(s.instructions for s in scatter) / samples,
        "zero_mb": buffer_bytes / 1e6, "reduce_mb": reduce_bytes / 1e6, "total_mb": total_hbm / 1e6,
        "share": (buffer_bytes + reduce_bytes) / total_hbm,
        "scatter_mb": sum(s.hbm_bytes for s in scatter) / 1e6,
        "peak_sbuf": report.peak_sbuf_bytes_per_partition, "peak_psum": report.peak_psum_bytes_per_partition,
        "pe": report.instruction_count("tensor"), "vector": report.instruction_count("vector"),
        "plan": cfg.describe(), "seconds": seconds,
    }


HEADER = """# NKI MSDA backward: cost report (emulator counters)

Generated by `python benchmarks/nki_backward_cost.py` (LNC={lnc}, bf16 value unless noted, fp16
locations/weights, default knobs unless noted). Counts come from the emulator's per-instruction
accounting (`simulate(..., report=True)`), summed over both logical cores; they are not timings.
"desc/pt" = indirect DMA descriptors per sampled point (b, q, h, l, p); "instr/pt" = indirect DMA
instructions per sampled point. "zero MB" = HBM bytes written to zero the fp32 K buffers
(every set, batch and core), "reduce MB" = HBM bytes read by the fixed-order reduction; "share"
= (zero + reduce) / all DMA HBM bytes (gathers, scatter read-modify-writes, loads, stores,
zeroing and reduction). Peak SBUF is per partition (the planners' trn2 budget: 204,800 B).

| case | K (bufs total) | gather desc/pt | gather instr/pt | scatter desc/pt | scatter instr/pt | scatter RMW MB | zero MB | reduce MB | all HBM MB | zero+reduce share | peak SBUF B/part | emulator s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(Path(__file__).with_name("nki_backward_cost.md")))
    parser.add_argument("--quick", action="store_true", help="only the first two cases")
    parser.add_argument("--no-models", action="store_true", help="skip the BEVFormer-base sizes")
    opts = parser.parse_args(argv)
    rows = []
    results = []
    cases = CASES[:2] if opts.quick else CASES + ([] if opts.no_models else MODEL_CASES)
    for name, case, knobs in cases:
        r = measure(case, knobs)
        results.append((name, r))
        rows.append(
            f"| {name} | {r['K']} ({r['buffers']}) | {r['gather_desc']:.2f} | {r['gather_instr']:.4f} | "
            f"{r['scatter_desc']:.2f} | {r['scatter_instr']:.4f} | {r['scatter_mb']:.1f} | {r['zero_mb']:.1f} | "
            f"{r['reduce_mb']:.1f} | {r['total_mb']:.1f} | {100 * r['share']:.0f}% | {r['peak_sbuf']:,} | "
            f"{r['seconds']:.0f} |")
        print(rows[-1], flush=True)
    text = HEADER.format(lnc=LNC) + "\n".join(rows) + "\n\nPlans (backward_config.describe()):\n\n"
    for name, r in results:
        text += f"- {name}: `{r['plan']}`\n"
    Path(opts.out).write_text(text + "\n" + _analysis(results))
    print(f"wrote {opts.out}")
    return 0


def _analysis(results) -> str:
    by = dict(results)
    need = ("BEVFormer-base SCA (N_q=18000, BNLC)", "BEVFormer-base decoder (N_q=900, 200x200)",
            "BEVFormer-base decoder, scatter cap 256 (upstream K, pairs kept)", "S4 num_scatter_buffers=4")
    if any(n not in by for n in need):
        return ""
    sca, dec, dec_up, sets = (by[n] for n in need)
    return ANALYSIS.format(
        sca_rmw=sca["scatter_mb"], sca_all=sca["total_mb"], sca_share=100 * sca["share"],
        dec_up=100 * dec_up["share"], dec=100 * dec["share"], dec_ratio=dec_up["total_mb"] / dec["total_mb"],
        dec_instr=dec["scatter_instr"], dec_up_instr=dec_up["scatter_instr"], sets=100 * sets["share"])


ANALYSIS = """## What dominates

Per sampled point the kernel issues 4 gather descriptors (one C_h row per corner; two
128-channel pieces on the transpose path when C_h > 128) and 4 scatter descriptors in BLNC,
2 in BNLC (the x-pair is one contiguous 2*C_h run). Each scatter descriptor is a
read-modify-write of an fp32 row, so the scatter moves 2 x 4 x C_h x 4 B per point versus
4 x C_h x 2 B for the bf16 gather: with enough queries per pixel (S4 shapes, BEVFormer SCA)
the scatter RMW is the largest HBM stream (SCA: {sca_rmw:.0f} of {sca_all:.0f} MB, buffers
{sca_share:.0f}%). On hardware the descriptor *count* is likely to bound both streams rather
than their bytes (64-256 B descriptors; small-descriptor DMA efficiency is undocumented,
docs/performance.md); batching (transpose index columns, x-pairs) cuts DMA instructions
(0.002-0.016 per point) but not descriptors, except for BNLC pairs.

The K-buffer cost (zero once, read once) is proportional to lnc * sets * K * B * L * N_h * C_h
and independent of N_q, so it dominates when queries are few per pixel. With upstream's fixed
K = ceil(128 / (N_h * N_l)) a 900-query decoder on a 200x200 map spends {dec_up:.0f}% of its HBM
traffic on the buffers (K = 16); the default plan here caps K so that buffer bytes stay below
the scatter's RMW bytes (fewer partitions per scatter instead), which takes that case to
{dec:.0f}% and cuts its total HBM bytes {dec_ratio:.0f}x, at the price of more (smaller)
scatter instructions ({dec_instr:.3f} vs {dec_up_instr:.3f} per point; descriptors unchanged).
K cannot go below 1, so a small decoder still pays lnc fp32 copies of grad_value. With no cap,
extra scatter sets (num_scatter_buffers) lower K rather than multiply the buffers (S4 with 4
sets: {sets:.0f}%, 4x the scatter instructions); with an explicit cap they multiply. Peak SBUF
stays far below the trn2 budget because only T blocks of N_p samples per partition plus one
block of gathered rows are live.
"""


if __name__ == "__main__":
    sys.exit(main())
