"""Host time per call of the Triton path on a CUDA device, stage by stage (decoder shapes).

    python benchmarks/host_overhead_gpu.py [--shape ddetr-decoder] [--calls 200]

Each number is the wall time per call of back-to-back calls with no synchronisation inside
(the GPU queue absorbs the launches), i.e. what Python, torch and the Triton launches cost on
the host; a decoder-sized call is bounded by max(this, its GPU time). Rows: allocation
baselines, the backend functions called directly (direct compiled-kernel launches on and off),
and the public function with autograd. Ends with a markdown table; ``--profile N`` adds where
the host time of a forward+backward goes (:mod:`host_profile`: ours, the trivial Function floor
and the CUDA op, N profiled calls each).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import nkilib_msda
from bench_gpu import SHAPES, _load_cuda_op, add_cuda_op_dir, make_inputs, shape_name
from nkilib_msda.backends.triton import backend as tb
from nkilib_msda.bench.floor import autograd_floor
from host_profile import host_profile
from nkilib_msda.pytorch.problem_cache import validated_problem


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def gpu_us(fn) -> float:
    import triton.testing

    fn()
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3


def _stub_forward(value, problem, sampling_locations, attention_weights, plan=None):
    return torch.empty(problem.output_shape, dtype=value.dtype, device=value.device)


def _stub_backward(grad_output, value, problem, sampling_locations, attention_weights,
                   compute=(True, True, True), deterministic=None, plan=None):
    return (torch.zeros_like(value), torch.empty_like(sampling_locations),
            torch.empty_like(attention_weights))


def _with_stub_backend(fn):
    """``fn()`` with the Triton backend's two entry points replaced by stubs that only make
    the tensors the real ones allocate (fp32): what the torch layer and autograd cost alone."""
    real = tb.msda_forward, tb.msda_backward
    tb.msda_forward, tb.msda_backward = _stub_forward, _stub_backward
    try:
        return fn()
    finally:
        tb.msda_forward, tb.msda_backward = real


def _torch_layer_pieces(leaves, problem) -> dict:
    """Single steps of the torch layer's forward + backward, timed alone on this host."""
    from nkilib_msda._env import read_env
    from nkilib_msda.pytorch import _modes, dispatch
    from nkilib_msda.pytorch.call import bind_msda_call

    value, loc, attn = leaves
    levels = problem.spatial_shapes
    return {
        "can_skip_dispatcher(3 tensors)": lambda: _modes.can_skip_dispatcher(value, loc, attn),
        "autocast_disabled('cuda')": lambda: _modes.autocast_disabled("cuda"),
        "select_backend('triton', needs_backward)": lambda: dispatch.select_backend(
            "triton", problem, value, loc, needs_backward=True),
        "bind_msda_call (validation + selection)": lambda: bind_msda_call(
            value, levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros", "triton", None,
            needs_backward=True),
        "read_env(NKILIB_MSDA_DETERMINISTIC)": lambda: read_env("NKILIB_MSDA_DETERMINISTIC"),
        "torch.are_deterministic_algorithms_enabled()":
            torch.are_deterministic_algorithms_enabled,
        "value.contiguous()": value.contiguous,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="ddetr-decoder", type=shape_name, choices=list(SHAPES))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cuda-op-dir", default="", metavar="DIR",
                        help="Deformable-DETR's models/ops folder with the extension built in "
                             "place: adds its fwd+bwd through its autograd.Function (fp32)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile N fwd+bwd calls of ours, the floor and the CUDA op")
    args = parser.parse_args(argv)
    add_cuda_op_dir(args.cuda_op_dir)
    _ext, cuda_function, _note = _load_cuda_op()
    shape = SHAPES[args.shape]
    api = nkilib_msda.multi_scale_deformable_attention
    table = ["| dtype | stage | host µs/call |", "|---|---|---|"]
    profiles = []
    for dtype_name in args.dtypes.split(","):
        value, loc, attn, grad = make_inputs(shape, getattr(torch, dtype_name))
        problem = validated_problem(value, shape.levels, None, loc, attn)
        leaves = [t.detach().clone().requires_grad_(True) for t in (value, loc, attn)]

        def api_fwd_bwd():
            out = api(leaves[0], shape.levels, None, leaves[1], leaves[2], backend="triton")
            return torch.autograd.grad(out, leaves, grad)

        def api_fwd():
            with torch.no_grad():
                return api(value, shape.levels, None, loc, attn, backend="triton")

        cpu_leaves = [torch.zeros(4, requires_grad=True) for _ in range(3)]

        class TrivialCPU(torch.autograd.Function):
            @staticmethod
            def forward(ctx, v, l, a):
                return v * 1.0

            @staticmethod
            def backward(ctx, g):
                return g, g, g

        stages = {
            "autograd floor: trivial Function fwd+bwd, CUDA tensors (baseline)":
                autograd_floor(leaves, grad),
            "autograd floor: trivial Function fwd+bwd, CPU tensors (baseline)":
                lambda: torch.autograd.grad(TrivialCPU.apply(*cpu_leaves), cpu_leaves,
                                            torch.ones(4)),
            "torch.empty (baseline)": lambda: torch.empty(problem.output_shape, device="cuda"),
            "torch.zeros_like(value) (baseline)": lambda: torch.zeros_like(value),
            "validated_problem (cached)": lambda: validated_problem(value, shape.levels, None,
                                                                    loc, attn),
            "unsupported_reason (cached)": lambda: tb.unsupported_reason(problem, value, loc),
            "backend msda_forward": lambda: tb.msda_forward(value, problem, loc, attn),
            "backend msda_backward": lambda: tb.msda_backward(grad, value, problem, loc, attn,
                                                              deterministic=False),
            "api forward (no grad)": api_fwd,
            "api forward+backward (autograd.grad)": api_fwd_bwd,
        }
        stages["api forward+backward, stub backend (allocations only)"] = \
            lambda: _with_stub_backend(api_fwd_bwd)
        for name, fn in _torch_layer_pieces(leaves, problem).items():
            stages[f"piece: {name}"] = fn
        cuda_fwd_bwd = None
        if cuda_function is not None and dtype_name == "float32":  # the op has no bf16
            shapes_t = torch.tensor(shape.levels, dtype=torch.long, device="cuda")
            starts_t = torch.tensor(problem.level_start_index, dtype=torch.long, device="cuda")

            def cuda_fwd_bwd():  # noqa: F811 - defined only when the op is there
                out = cuda_function.apply(leaves[0], shapes_t, starts_t, leaves[1], leaves[2], 64)
                return torch.autograd.grad(out, leaves, grad)

            stages["Deformable-DETR CUDA op fwd+bwd, its autograd.Function (baseline)"] = \
                cuda_fwd_bwd
        for fast in (True, False):
            tb._FAST_LAUNCH[0] = fast
            for name, fn in stages.items():
                if not fast and ("baseline" in name or "stub" in name or name.startswith("piece")):
                    continue
                label = f"{name} [direct launch {'on' if fast else 'off'}]"
                us = per_call_us(fn, args.calls)
                table.append(f"| {dtype_name} | {label} | {us:.1f} |")
                print(table[-1], flush=True)
        tb._FAST_LAUNCH[0] = True
        table.append(f"| {dtype_name} | GPU time of api forward+backward (graph replay) | "
                     f"{gpu_us(api_fwd_bwd):.1f} |")
        table.append(f"| {dtype_name} | GPU time of api forward (graph replay) | "
                     f"{gpu_us(api_fwd):.1f} |")
        if cuda_fwd_bwd is not None:
            table.append(f"| {dtype_name} | GPU time of the Deformable-DETR CUDA op fwd+bwd "
                         f"(graph replay) | {gpu_us(cuda_fwd_bwd):.1f} |")
        print("\n".join(table[-3:]), flush=True)
        if args.profile:
            profiled = {f"ours {dtype_name}, public function fwd+bwd": api_fwd_bwd,
                        f"ours {dtype_name}, public function fwd+bwd, stub backend":
                            lambda: _with_stub_backend(api_fwd_bwd),
                        f"trivial Function fwd+bwd, {dtype_name} CUDA tensors (floor)":
                            stages["autograd floor: trivial Function fwd+bwd, CUDA tensors (baseline)"]}
            if cuda_fwd_bwd is not None:
                profiled["Deformable-DETR CUDA op fwd+bwd, its autograd.Function"] = cuda_fwd_bwd
            for label, fn in profiled.items():
                profiles.append(host_profile(fn, args.profile, label, sync=torch.cuda.synchronize))
                print(profiles[-1], flush=True)
    print("\n" + "\n".join(table))
    if profiles:
        print("\n" + "\n\n".join(profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
