"""Cost table of the NKI MSDA forward kernel, from the emulator's report (counts, not timings).

Usage: python benchmarks/nki_cost_report.py [--lnc 2] > table.md

For each shape and gather method it runs the kernel in the emulator with ``report=True``,
checks the output against the float64 reference, and prints a markdown table with
- indirect descriptors per sampled point (B * N_q * N_h * N_l * N_p) and bytes per descriptor,
- HBM bytes of the parameter loads and the output store versus their compulsory size,
- instructions per engine per 128 queries,
- peak SBUF / PSUM bytes per partition (per core) and the emulator's wall time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import (
    plan_forward_from_args, ms_deformable_attention)
from nkilib_msda.workloads import S4, MSDACase, make_inputs
from nkilib_msda.reference import ms_deformable_attention_ref
from nkilib_msda.simulator import simulate

SHAPES = (
    MSDACase(name="default (DDETR-like, S4)", num_queries=1024, spatial_shapes=S4),
    MSDACase(name="BEVFormer-base decoder", num_queries=900, num_points=4,
             spatial_shapes=((200, 200),), locations_layout="B2QHLP"),
)
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


def measure(case: MSDACase, gather: str, lnc: int) -> dict:
    args = make_inputs(case)
    cfg = plan_forward_from_args(**args, gather_method=gather, lnc=lnc)
    start = time.perf_counter()
    out, report = simulate(ms_deformable_attention, lnc=lnc, report=True)(
        **args, gather_method=gather)
    seconds = time.perf_counter() - start
    ref = ms_deformable_attention_ref(**args)
    err = float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    d = report.to_dict()
    samples = case.batch * case.num_queries * case.num_heads * case.num_levels * case.num_points
    indirect = {k: v for k, v in d["dma"].items() if k.startswith("indirect")}
    desc = sum(v["descriptors"] for v in indirect.values())
    desc_min = min(v["descriptor_bytes_min"] for v in indirect.values())
    desc_max = max(v["descriptor_bytes_max"] for v in indirect.values())
    params = sum(args[k].nbytes for k in ("sampling_locations", "attention_weights"))
    out_bytes = out.nbytes
    direct_in = sum(v["hbm_bytes"] for k, v in d["dma"].items() if k == "direct/hbm_to_sbuf")
    direct_out = sum(v["hbm_bytes"] for k, v in d["dma"].items() if k == "direct/sbuf_to_hbm")
    per_128 = 128.0 / (case.batch * case.num_queries)
    return dict(
        case=case, gather=cfg.gather_method, lnc=lnc, cfg=cfg, seconds=seconds, max_rel_err=err,
        descriptors_per_sample=desc / samples, descriptor_bytes=(desc_min, desc_max),
        compulsory_descriptor_bytes=case.head_dim * args["value"].itemsize,
        gathered_bytes=sum(v["hbm_bytes"] for v in indirect.values()),
        param_hbm=(direct_in, params), out_hbm=(direct_out, out_bytes),
        instr_per_128={e: d["engines"][e]["instructions"] * per_128 for e in ENGINES},
        elements_per_128={e: d["engines"][e]["elements"] * per_128 for e in ENGINES},
        peak_sbuf=d["peak_sbuf_bytes_per_partition"], peak_psum=d["peak_psum_bytes_per_partition"])


def markdown(rows: list[dict]) -> str:
    head = ("| shape | gather | q_pack | descriptors / sample | B / descriptor (min-max; "
            "C_h*dtype) | gathered MB | params HBM B (compulsory) | output HBM B (compulsory) | "
            + " | ".join(f"{e} instr / 128 q" for e in ENGINES)
            + " | peak SBUF B/part | peak PSUM B/part | max rel err | emulator s |")
    sep = "|" + "---|" * (head.count("|") - 1)
    lines = [head, sep]
    for r in rows:
        c = r["case"]
        lines.append(
            f"| {c.name}: B{c.batch} N_q {c.num_queries} N_h {c.num_heads} C_h {c.head_dim} "
            f"N_l {c.num_levels} N_p {c.num_points}, lnc {r['lnc']} | {r['gather']} | "
            f"{r['cfg'].q_pack} | {r['descriptors_per_sample']:.3f} | "
            f"{r['descriptor_bytes'][0]}-{r['descriptor_bytes'][1]} "
            f"({r['compulsory_descriptor_bytes']}) | {r['gathered_bytes'] / 1e6:.1f} | "
            f"{r['param_hbm'][0]:,} ({r['param_hbm'][1]:,}) | "
            f"{r['out_hbm'][0]:,} ({r['out_hbm'][1]:,}) | "
            + " | ".join(f"{r['instr_per_128'][e]:,.1f}" for e in ENGINES)
            + f" | {r['peak_sbuf']:,} | {r['peak_psum']:,} | {r['max_rel_err']:.1e} | "
            f"{r['seconds']:.1f} |")
    return "\n".join(lines)


def vector_elements_table(rows: list[dict]) -> str:
    lines = ["| shape | gather | " + " | ".join(f"{e} elements / 128 q" for e in ENGINES) + " |",
             "|---|---|" + "---|" * len(ENGINES)]
    for r in rows:
        lines.append(f"| {r['case'].name} | {r['gather']} | "
                     + " | ".join(f"{r['elements_per_128'][e]:,.0f}" for e in ENGINES) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lnc", type=int, default=2, choices=(1, 2))
    opts = parser.parse_args()
    rows = [measure(case, gather, opts.lnc) for case in SHAPES for gather in ("transpose", "copy")]
    print(markdown(rows))
    print()
    print(vector_elements_table(rows))
    print()
    for r in rows:
        print(f"- {r['case'].name} / {r['gather']}: {r['cfg'].describe()}")


if __name__ == "__main__":
    main()
