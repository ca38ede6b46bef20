"""Instructions the MSDA kernels emit per preset (issue 29, finding 8), from the emulator.

Every loop of the kernels is a Python loop that NKI 0.8's tracer unrolls, so the instruction
stream (compile time, NEFF size) grows with B * N_q. This counts the instructions one core
issues (LNC 1) for the forward and the backward on each preset of ``nkilib_msda.workloads``,
full size (about 8 minutes for all presets on one core; the timing model is off).

Usage: python benchmarks/instruction_counts.py [--presets tiny default ...]
"""

from __future__ import annotations

import argparse
import os

from nkilib_msda.experimental.deformable_attention.ms_deformable_attention import ms_deformable_attention
from nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd import ms_deformable_attention_bwd
from nkilib_msda.simulator import simulate
from nkilib_msda.workloads import PRESETS, make_grad_output, make_inputs


def count(report) -> int:
    """All instructions of the run (every engine, DMA included)."""
    return sum(entry[0] for per_engine in report.instructions.values() for entry in per_engine.values())


def measure(name: str) -> dict:
    case = PRESETS[name]
    args = make_inputs(case)
    *_, fwd = simulate(ms_deformable_attention, lnc=1, report=True)(**args)
    *_, bwd = simulate(ms_deformable_attention_bwd, lnc=1, report=True)(make_grad_output(case), **args)
    return {"preset": name, "queries": case.batch * case.num_queries, "fwd": count(fwd), "bwd": count(bwd)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=sorted(PRESETS))
    args = parser.parse_args()
    os.environ.setdefault("NKILIB_MSDA_EMULATOR_TIMING", "0")  # counts only
    print("| preset | B·N_q | forward instructions | backward instructions |")
    print("|---|---|---|---|")
    for name in args.presets:
        r = measure(name)
        print(f"| {r['preset']} | {r['queries']:,} | {r['fwd']:,} | {r['bwd']:,} |", flush=True)


if __name__ == "__main__":
    main()
