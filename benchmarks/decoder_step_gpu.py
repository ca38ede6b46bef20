"""Deformable-DETR's decoder on a CUDA device: a training step of six decoder layers, and the
MSDA call alone, ours against Deformable-DETR's CUDA op, in interleaved rounds (medians).

    python benchmarks/decoder_step_gpu.py [--cuda-op-dir DIR] [--rounds 7] [--steps 20]

``DIR`` is Deformable-DETR's ``models/ops`` folder with its extension built in place
(docs/performance.md, "GPU host time", says how); without it the CUDA-op rows are skipped.

Rows, µs per step or call (``steps`` back-to-back, one synchronisation at the end, so each
number is max(host time, GPU time) of one step; per round every row runs once, in table order,
and the table gives each row's median over the rounds and the spread [min-max]):

- **decoder step**: forward + ``autograd.grad`` of a scalar loss with respect to every
  parameter and the memory; 6 layers of self-attention, MSDA cross-attention (d_model 256,
  8 heads, 4 levels, 4 points) and FFN; B=2, 300 queries, the 800x1333 image's 4 levels. Ours
  eager with the shapes as CUDA tensors (Deformable-DETR's call) and as Python ints; ours under
  ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees) with CUDA tensor shapes;
  the same decoder with Deformable-DETR's own ``MSDeformAttn`` (the CUDA op, fp32), eager.
- **MSDA fwd+bwd**: the call alone on the ddetr-decoder workload through autograd: our public
  function (int shapes, CUDA tensor shapes), the CUDA op's ``MSDeformAttnFunction``, and a
  trivial ``autograd.Function`` with three inputs (the autograd engine's floor).

Checks before timing (printed, and the script exits 1 if one fails): the compiled decoder's
output and gradients against eager (ours), and ours against the CUDA-op decoder (same
weights), forward and gradients, fp32.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from typing import Callable

import torch
from torch import nn

import nkilib_msda
from nkilib_msda.bench.floor import autograd_floor
from nkilib_msda.bench.gpu import _load_cuda_op, add_cuda_op_dir
from nkilib_msda.bench.shapes import SHAPES, make_inputs
from nkilib_msda.validation.layouts import level_starts
from nkilib_msda.workloads import DDETR_LEVELS

D_MODEL, HEADS, LEVELS, POINTS, FFN, LAYERS = 256, 8, 4, 4, 1024, 6
BATCH, QUERIES = 2, 300
CHECK_TOL = 1e-4  # relative L2, fp32 (atomics order and TF32-free matmuls)


class DecoderLayer(nn.Module):
    """Deformable-DETR's decoder layer (post-norm, no dropout): self-attention over the
    queries, MSDA cross-attention into the memory, FFN."""

    def __init__(self, cross_attn: nn.Module) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
        self.cross_attn = cross_attn
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(D_MODEL) for _ in range(3))
        self.ffn = nn.Sequential(nn.Linear(D_MODEL, FFN), nn.ReLU(), nn.Linear(FFN, D_MODEL))

    def forward(self, tgt, query_pos, reference_points, memory, shapes, starts):
        q = tgt + query_pos
        tgt = self.norm2(tgt + self.self_attn(q, q, tgt, need_weights=False)[0])
        tgt = self.norm1(tgt + self.cross_attn(tgt + query_pos, reference_points, memory, shapes,
                                               starts))
        return self.norm3(tgt + self.ffn(tgt))


class Decoder(nn.Module):
    def __init__(self, make_cross_attn: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(make_cross_attn()) for _ in range(LAYERS))

    def forward(self, tgt, query_pos, reference_points, memory, shapes, starts):
        for layer in self.layers:
            tgt = layer(tgt, query_pos, reference_points, memory, shapes, starts)
        return tgt


def _inputs(seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    pixels = sum(h * w for h, w in DDETR_LEVELS)
    return dict(
        tgt=torch.randn(BATCH, QUERIES, D_MODEL, device="cuda", generator=g),
        query_pos=torch.randn(BATCH, QUERIES, D_MODEL, device="cuda", generator=g),
        reference_points=torch.rand(BATCH, QUERIES, LEVELS, 2, device="cuda", generator=g),
        memory=torch.randn(BATCH, pixels, D_MODEL, device="cuda", generator=g).requires_grad_(),
        loss_weights=torch.randn(BATCH, QUERIES, D_MODEL, device="cuda", generator=g))


def _step_fn(decoder: nn.Module, forward: Callable, inputs: dict, shapes, starts) -> Callable:
    """One training step: forward, a scalar loss (a fixed random weighting of the output: the
    mean square of a LayerNorm output would be nearly constant, its gradients noise), gradients
    of every parameter and the memory."""
    wrt = [*decoder.parameters(), inputs["memory"]]

    def step():
        out = forward(inputs["tgt"], inputs["query_pos"], inputs["reference_points"],
                      inputs["memory"], shapes, starts)
        return out, torch.autograd.grad((out * inputs["loss_weights"]).sum(), wrt)

    return step


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(name: str, got, want, failures: list) -> None:
    (out, grads), (want_out, want_grads) = got, want
    errors = [_rel(out, want_out)] + [_rel(g, w) for g, w in zip(grads, want_grads)]
    ok = all(e < CHECK_TOL for e in errors) and all(torch.isfinite(g).all() for g in grads)
    print(f"check {name}: max rel-L2 {max(errors):.2e} over output and {len(grads)} gradients "
          f"-> {'PASS' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(name)


def _snapshot(result):
    out, grads = result
    return out.detach().clone(), tuple(g.clone() for g in grads)


def per_call_us(fn: Callable, steps: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def _decoders(cuda_op_module) -> dict:
    torch.manual_seed(0)
    ours = Decoder(lambda: nkilib_msda.MSDeformAttn(D_MODEL, LEVELS, HEADS, POINTS)).cuda()
    decoders = {"ours": ours}
    if cuda_op_module is not None:
        theirs = Decoder(lambda: cuda_op_module(D_MODEL, LEVELS, HEADS, POINTS)).cuda()
        theirs.load_state_dict(ours.state_dict())
        decoders["cuda_op"] = theirs
    return decoders


def _cuda_op_module(ops_dir: str):
    """Deformable-DETR's ``MSDeformAttn`` (``models/ops/modules``, which imports its Function
    relatively: imported as ``ops.modules`` from the folder above), or None."""
    ops_dir = os.path.abspath(ops_dir)
    sys.path.insert(0, os.path.dirname(ops_dir))
    try:
        return importlib.import_module(f"{os.path.basename(ops_dir)}.modules").MSDeformAttn
    except (ImportError, AttributeError) as exc:
        print(f"Deformable-DETR's MSDeformAttn not importable ({exc}): CUDA-op rows skipped")
        return None


def _shape_tensors(levels) -> tuple[torch.Tensor, torch.Tensor]:
    """Deformable-DETR's ``spatial_shapes`` (N_l, 2) and ``level_start_index`` (N_l,), int64
    on the GPU."""
    return (torch.tensor(levels, dtype=torch.long, device="cuda"),
            torch.tensor(list(level_starts(levels)), dtype=torch.long, device="cuda"))


def _msda_rows(cuda_function) -> dict:
    """The MSDA call alone on the ddetr-decoder workload, fp32, through autograd."""
    shape = SHAPES["ddetr-decoder"]
    value, loc, attn, grad = make_inputs(shape, torch.float32)
    leaves = [t.detach().clone().requires_grad_(True) for t in (value, loc, attn)]
    shapes_t, starts_t = _shape_tensors(shape.levels)
    api = nkilib_msda.multi_scale_deformable_attention

    rows = {
        "MSDA fwd+bwd, ours, int shapes": lambda: torch.autograd.grad(
            api(leaves[0], shape.levels, None, leaves[1], leaves[2]), leaves, grad),
        "MSDA fwd+bwd, ours, CUDA tensor shapes": lambda: torch.autograd.grad(
            api(leaves[0], shapes_t, starts_t, leaves[1], leaves[2]), leaves, grad),
        "MSDA fwd+bwd, trivial autograd.Function (floor)": autograd_floor(leaves, grad),
    }
    if cuda_function is not None:
        rows["MSDA fwd+bwd, CUDA op's MSDeformAttnFunction"] = lambda: torch.autograd.grad(
            cuda_function.apply(leaves[0], shapes_t, starts_t, leaves[1], leaves[2], 64), leaves,
            grad)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cuda-op-dir", default="", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    add_cuda_op_dir(args.cuda_op_dir)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    _ext, cuda_function, _note = _load_cuda_op()
    decoders = _decoders(_cuda_op_module(args.cuda_op_dir) if cuda_function is not None
                         else None)
    inputs = _inputs(1)
    shapes_t, starts_t = _shape_tensors(DDETR_LEVELS)
    ours = decoders["ours"]
    compiled = torch.compile(ours, mode="reduce-overhead", fullgraph=True)
    steps = {
        "decoder step, ours eager, CUDA tensor shapes":
            _step_fn(ours, ours, inputs, shapes_t, starts_t),
        "decoder step, ours eager, Python int shapes":
            _step_fn(ours, ours, inputs, DDETR_LEVELS, None),
        "decoder step, ours compile(mode=\"reduce-overhead\"), CUDA tensor shapes":
            _step_fn(ours, compiled, inputs, shapes_t, starts_t),
    }
    if "cuda_op" in decoders:
        theirs = decoders["cuda_op"]
        steps["decoder step, CUDA op module eager (fp32)"] = \
            _step_fn(theirs, theirs, inputs, shapes_t, starts_t)

    failures: list = []
    want = _snapshot(steps["decoder step, ours eager, Python int shapes"]())
    for name, fn in steps.items():
        for _ in range(3):  # warm-up; compile: warm-up run, recording run, replay
            got = _snapshot(fn())
        _compare(name, got, want, failures)
    from torch._dynamo.utils import counters
    print(f"cudagraph skips: {counters['inductor']['cudagraph_skips']}", flush=True)
    if counters["inductor"]["cudagraph_skips"]:
        failures.append("cudagraph skipped")

    rows = {**steps, **_msda_rows(cuda_function)}
    for fn in rows.values():
        per_call_us(fn, 3)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            samples[name].append(per_call_us(fn, args.steps))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.rounds} "
          f"interleaved rounds of {args.steps} back-to-back calls; µs per call")
    print("| row | median µs | [min-max] |\n|---|---:|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"[{min(values):.1f}-{max(values):.1f}] |")
    if failures:
        print(f"FAILED checks: {failures}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
