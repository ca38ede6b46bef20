"""Run the NKI MSDA forward and backward kernels in the CPU emulator and check them.

No Neuron SDK and no torch needed: NumPy arrays go in, the emulator executes the ``@nki.jit``
kernels instruction by instruction (enforcing the NKI rules), and the results are compared with
the float64 NumPy reference on the same rounded inputs. The cost report lists instructions and
elements per engine, DMA bytes/descriptors and peak SBUF/PSUM use.

    python examples/simulate_kernels.py
    python examples/simulate_kernels.py --queries 300 --dtype float32 --lnc 2 --padding-mode border
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from nkilib_msda.experimental.deformable_attention import (  # noqa: E402
    ms_deformable_attention, ms_deformable_attention_bwd)
from nkilib_msda.reference import (  # noqa: E402
    ms_deformable_attention_bwd_ref, ms_deformable_attention_ref)
from nkilib_msda.simulator import simulate  # noqa: E402

LEVEL_PRESETS = {
    "tiny": ((8, 10), (4, 5), (2, 3)),
    "small": ((20, 24), (10, 12), (5, 6), (3, 3)),
}
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def make_arrays(args: argparse.Namespace, shapes: tuple) -> dict:
    """Random inputs already rounded to what the kernels take (locations float32)."""
    rng = np.random.default_rng(args.seed)
    total = sum(h * w for h, w in shapes)
    b, q, nh, c, p, nl = args.batch, args.queries, args.heads, args.channels, args.points, len(shapes)
    vshape = (b, total, nh, c) if args.value_layout == "BLNC" else (b, nh, total, c)
    value = rng.standard_normal(vshape).astype(DTYPES[args.dtype])
    loc = rng.uniform(-0.05, 1.05, (b, q, nh, nl, p, 2)).astype(np.float32)
    if args.loc_layout == "B2QHLP":
        loc = np.ascontiguousarray(np.moveaxis(loc, -1, 1))
    attn = rng.uniform(0.1, 1.0, (b, q, nh, nl, p))
    attn = (attn / attn.sum(axis=(3, 4), keepdims=True)).astype(DTYPES[args.dtype])
    grad = rng.standard_normal((b, q, nh * c)).astype(DTYPES[args.dtype])
    return dict(value=value, loc=loc, attn=attn, grad=grad)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(got.astype(np.float64) - want).max()) / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", choices=sorted(LEVEL_PRESETS), default="tiny")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--queries", type=int, default=160)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--value-layout", choices=["BLNC", "BNLC"], default="BLNC")
    parser.add_argument("--loc-layout", choices=["BQHLP2", "B2QHLP"], default="BQHLP2")
    parser.add_argument("--align-corners", action="store_true")
    parser.add_argument("--padding-mode", choices=["zeros", "border"], default="zeros")
    # The default is the package's one rule for the LNC degree (as `nkilib-msda check` and
    # `simulate`): NEURON_LOGICAL_NC_CONFIG, else 1.
    parser.add_argument("--lnc", type=int, choices=[1, 2], default=None,
                        help="logical NeuronCores (default: NEURON_LOGICAL_NC_CONFIG, else 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="errors only, no cost reports")
    args = parser.parse_args()

    shapes = LEVEL_PRESETS[args.levels]
    starts = tuple(int(s) for s in np.cumsum([0] + [h * w for h, w in shapes])[:-1])
    arrays = make_arrays(args, shapes)
    options = (args.value_layout, args.loc_layout, args.align_corners, args.padding_mode)
    common = (shapes, starts)

    start = time.perf_counter()
    out, fwd_report = simulate(ms_deformable_attention, lnc=args.lnc, report=True)(
        arrays["value"], *common, arrays["loc"], arrays["attn"], *options)
    fwd_time = time.perf_counter() - start
    ref_out = ms_deformable_attention_ref(arrays["value"], *common, arrays["loc"], arrays["attn"],
                                          *options)
    lnc = fwd_report.to_dict()["num_programs"]
    print(f"forward  (LNC {lnc}, {fwd_time:.1f} s simulated): output max relative error "
          f"{relative_error(out, ref_out):.2e}  dtype {out.dtype}")

    start = time.perf_counter()
    *grads, bwd_report = simulate(ms_deformable_attention_bwd, lnc=args.lnc, report=True)(
        arrays["grad"], arrays["value"], *common, arrays["loc"], arrays["attn"], *options)
    bwd_time = time.perf_counter() - start
    ref_grads = ms_deformable_attention_bwd_ref(arrays["grad"], arrays["value"], *common,
                                                arrays["loc"], arrays["attn"], *options)
    names = ("grad_value", "grad_sampling_locations", "grad_attention_weights")
    errors = "  ".join(f"{n} {relative_error(g, r):.2e}" for n, g, r in zip(names, grads, ref_grads))
    print(f"backward (LNC {lnc}, {bwd_time:.1f} s simulated): max relative errors {errors}")
    if not args.quiet:
        print("\n== forward cost report ==\n" + str(fwd_report))
        print("\n== backward cost report ==\n" + str(bwd_report))


if __name__ == "__main__":
    main()
