"""Time the float64 NumPy reference on the BEVFormer-base temporal self-attention size.

B=1, N_q=40000, N_h=8, C_h=32, one 200x200 level, N_p=4 (1.28 M samples), float32 inputs.
Run: python benchmarks/reference_timing.py  (prints a markdown table; best of --repeat runs).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--padding-mode", default="zeros", choices=["zeros", "border", "reflection"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch, queries, heads, channels, points, shapes = 1, 40000, 8, 32, 4, ((200, 200),)
    value = rng.standard_normal((batch, 40000, heads, channels)).astype(np.float32)
    locations = rng.random((batch, queries, heads, 1, points, 2)).astype(np.float32)
    attention = rng.random((batch, queries, heads, 1, points)).astype(np.float32)
    grad_output = rng.standard_normal((batch, queries, heads * channels)).astype(np.float32)
    forward, backward = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        ms_deformable_attention_ref(value, shapes, None, locations, attention, padding_mode=args.padding_mode)
        forward.append(time.perf_counter() - start)
        start = time.perf_counter()
        ms_deformable_attention_bwd_ref(grad_output, value, shapes, None, locations, attention,
                                        padding_mode=args.padding_mode)
        backward.append(time.perf_counter() - start)
    print("| case | forward (s) | backward (s) |")
    print("|---|---|---|")
    print(f"| BEVFormer TSA, {args.padding_mode} | {min(forward):.2f} | {min(backward):.2f} |")


if __name__ == "__main__":
    main()
