"""GPU benchmark: our Triton MSDA vs the grid_sample reference, the Deformable-DETR CUDA op and
roulbac/msda-triton (the peers' code comes from folders given on the command line).

``python benchmarks/bench_gpu.py`` (or ``nkilib-msda bench``) times every available
implementation on the same inputs for the shapes of docs/performance.md, in fp32 and bf16,
forward and forward+backward, and prints a markdown table: median µs, effective bandwidth on
compulsory bytes, ratio to the compulsory-bytes floor (bytes / measured copy bandwidth) and
relative L2 error against a float64 grid_sample reference. Writes results.md, results.json and
bench_gpu.png (benchmarks/bench_plot.py, from the same rows) under ``--out``.

Timing: ``triton.testing.do_bench`` medians (L2 flushed between calls; "eager"), and for our
rows, the compiled peers' (and the decoders of every implementation) CUDA-graph replay
(``do_bench_cudagraph``),
which removes the host dispatch cost. "host µs/call" is the wall time per call of back-to-back
eager calls without synchronisation: the Python + launch cost, the bound on small shapes.
Rows ``ours`` / ``ours-det`` go through the public function and autograd (deterministic=False
/ True); ``triton`` calls the backend functions directly.
Inputs follow the anchors: value ~ N(0,1), locations ~ U[0,1), weights normalized over
(N_l, N_p), all in the run dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable

from nkilib_msda.bench import peers
from nkilib_msda.bench.guard import floor_table, load_accepted, peers_table, write_accepted
from nkilib_msda.bench.report import (TABLE_HEADER, Row, format_row, results_dict, rows_from_log,
                                      summary_table, targets_table, write_plot)
from nkilib_msda.bench.shapes import DTYPES, MODES, SHAPES, BenchShape, compulsory_bytes, make_inputs
from nkilib_msda.bench.shapes import shape_name as canonical_shape
from nkilib_msda.workloads import PRESET_ALIASES
from nkilib_msda.workloads import relative_l2 as _relative_l2


def measure_copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    import torch
    import triton.testing

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)


def _load_cuda_op():
    """The original Deformable-DETR extension (``MultiScaleDeformableAttention``) and, when its
    ``models/ops`` folder is importable too (``--cuda-op-dir``), its own autograd.Function."""
    try:
        import MultiScaleDeformableAttention as ext  # noqa: N813
    except ImportError as exc:
        return None, None, f"Deformable-DETR CUDA op not importable ({exc}); 'cuda' rows skipped"
    try:
        from functions.ms_deform_attn_func import MSDeformAttnFunction
    except ImportError:
        MSDeformAttnFunction = None  # noqa: N806
    return ext, MSDeformAttnFunction, None


def add_cuda_op_dir(path: str) -> None:
    """Make a built Deformable-DETR ``models/ops`` folder importable (the extension built in
    place, and its ``functions`` package)."""
    if path:
        sys.path.insert(0, os.path.abspath(path))


def _load_api():
    try:
        import nkilib_msda

        return nkilib_msda.multi_scale_deformable_attention, None
    except Exception as exc:  # the torch layer is optional here
        return None, f"nkilib_msda.multi_scale_deformable_attention unavailable ({exc}); 'api' rows skipped"


def implementations(shape: BenchShape, dtype_name: str, inputs, impls):
    """name -> {mode: callable} for every available implementation."""
    import torch

    from nkilib_msda.backends.triton import backend as tb
    from nkilib_msda.reference.grid_sample import msda_grid_sample
    from nkilib_msda.validation.msda import validate_msda_args

    value, loc, attn, grad = inputs
    problem = validate_msda_args(value, shape.levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    found: dict[str, dict[str, Callable]] = {}
    notes: list[str] = []

    if "triton" in impls:
        def fwd():
            return tb.msda_forward(value, problem, loc, attn)

        def fwd_bwd():
            fwd()
            return tb.msda_backward(grad, value, problem, loc, attn, deterministic=False)

        def fwd_bwd_det():
            fwd()
            return tb.msda_backward(grad, value, problem, loc, attn, deterministic=True)

        found["triton"] = {"fwd": fwd, "fwd+bwd": fwd_bwd}
        found["triton-det"] = {"fwd+bwd": fwd_bwd_det}

    leaves = [t.detach().clone().requires_grad_(True) for t in (value, loc, attn)]
    if "ref" in impls:
        def ref_fwd():
            with torch.no_grad():
                return msda_grid_sample(value, shape.levels, loc, attn)

        def ref_fwd_bwd():
            out = msda_grid_sample(leaves[0], shape.levels, leaves[1], leaves[2])
            return torch.autograd.grad(out, leaves, grad)

        found["ref"] = {"fwd": ref_fwd, "fwd+bwd": ref_fwd_bwd}

    if "cuda" in impls:
        ext, function, note = _load_cuda_op()
        if note:
            notes.append(note)
        elif dtype_name == "float32":  # the op dispatches float and double only
            shapes_t = torch.tensor(shape.levels, dtype=torch.long, device="cuda")
            starts_t = torch.tensor(problem.level_start_index, dtype=torch.long, device="cuda")
            step = 64

            def cuda_fwd():
                return ext.ms_deform_attn_forward(value, shapes_t, starts_t, loc, attn, step)

            def cuda_fwd_bwd():
                if function is not None:  # through its own autograd.Function, as users call it
                    out = function.apply(leaves[0], shapes_t, starts_t, leaves[1], leaves[2], step)
                    return torch.autograd.grad(out, leaves, grad)
                cuda_fwd()
                return ext.ms_deform_attn_backward(value, shapes_t, starts_t, loc, attn,
                                                   grad.contiguous(), step)

            found["cuda"] = {"fwd": cuda_fwd, "fwd+bwd": cuda_fwd_bwd}

    if "msda-triton" in impls:
        peer, note = peers.msda_triton(shape.levels, inputs, leaves)
        if peer is None:
            notes.append(str(note))
        else:
            found["msda-triton"] = peer

    if "api" in impls:
        api, note = _load_api()
        if note:
            notes.append(note)
        else:
            def api_fwd():
                with torch.no_grad():
                    return api(value, shape.levels, None, loc, attn, backend="triton")

            def api_fwd_bwd(deterministic=False):
                out = api(leaves[0], shape.levels, None, leaves[1], leaves[2], backend="triton",
                          deterministic=deterministic)
                return torch.autograd.grad(out, leaves, grad)

            found["ours"] = {"fwd": api_fwd, "fwd+bwd": api_fwd_bwd}
            found["ours-det"] = {"fwd+bwd": lambda: api_fwd_bwd(True)}
    return found, notes


def errors_against_float64(shape: BenchShape, inputs, found) -> dict:
    """impl -> {mode: relative L2 error} against float64 grid_sample (+ autograd)."""
    import torch

    from nkilib_msda.reference.grid_sample import msda_grid_sample_with_grads

    value, loc, attn, grad = inputs
    ref = msda_grid_sample_with_grads(value.double(), shape.levels, loc.double(), attn.double(),
                                      grad.double())
    errs: dict[str, dict[str, float | tuple[float, ...]]] = {}
    for name, modes in found.items():
        errs[name] = {}
        for mode, fn in modes.items():
            result = fn()
            if mode == "fwd":
                out = result[0] if isinstance(result, (tuple, list)) else result
                errs[name][mode] = _relative_l2(out, ref[0])
            else:
                grads = list(result)  # (grad_value, grad_loc, grad_attn) for every impl
                errs[name][mode] = tuple(_relative_l2(g, r) for g, r in zip(grads, ref[1:]))
    del ref
    torch.cuda.empty_cache()
    return errs


def host_time_us(fn, calls: int = 30) -> float:
    """Host time per call: wall time of ``calls`` back-to-back calls, no synchronisation
    inside (the GPU queue absorbs the launches), so this is the Python + launch cost."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def time_fn(fn, graph: bool, warmup: int, rep: int) -> float:
    import torch
    import triton.testing

    fn()
    torch.cuda.synchronize()
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def run_benchmark(shapes, dtypes, modes, impls, warmup, rep, copy_bw, with_errors=True,
                  log=print) -> list[Row]:
    import torch

    rows: list[Row] = []
    printed_notes: set[str] = set()
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            inputs = make_inputs(shape, dtype)
            found, notes = implementations(shape, dtype_name, inputs, impls)
            for note in notes:
                if note not in printed_notes:
                    log(note)
                    printed_notes.add(note)
            errs = errors_against_float64(shape, inputs, found) if with_errors else {}
            fwd_bytes = compulsory_bytes(shape, dtype_name)
            assert fwd_bytes == sum(t.numel() * t.element_size() for t in inputs)
            for name, fns in found.items():
                for mode, fn in fns.items():
                    if mode not in modes:
                        continue
                    nbytes = fwd_bytes * (1 if mode == "fwd" else 2)
                    graph_ok = (name in ("ours", "triton", "cuda", "msda-triton")
                                or (shape.decoder and name != "ref"))
                    methods = ["do_bench"] + (["graph"] if graph_ok else [])
                    for method in methods:
                        try:
                            us = time_fn(fn, method == "graph", warmup, rep)
                        except Exception as exc:  # report, keep going
                            log(f"{shape_name} {name} {dtype_name} {mode} {method}: failed ({exc})")
                            continue
                        err = errs.get(name, {}).get(mode)
                        detail = "/".join(f"{e:.1e}" for e in err) if isinstance(err, tuple) else ""
                        err = max(err) if isinstance(err, tuple) else err
                        host = (host_time_us(fn) if method == "do_bench" and name != "ref"
                                else None)
                        row = Row(shape_name, name, dtype_name, mode, method, us, err, nbytes,
                                  nbytes / copy_bw * 1e6, detail, host)
                        rows.append(row)
                        log(format_row(row))
            del inputs, found
            torch.cuda.empty_cache()
    return rows


FWD_SWEEP = ((16, 2), (32, 4), (32, 8), (64, 8))
SAMPLES_SWEEP = ((2, 2), (4, 2), (8, 4))
BWD_SWEEP = ((8, 2), (16, 4))


def _sweep_variants(dtype_name: str):
    """(label, plan changes, backward compute or None for the forward)."""
    from nkilib_msda.backends.triton import backend as tb

    everything = (True, True, True)
    for slowest in (True, False):
        order = "head-slowest" if slowest else "head-fastest"
        for bq, warps in FWD_SWEEP:
            yield (f"fwd points  {order} block_q={bq:3d} warps={warps}",
                   dict(forward=tb.KernelConfig(bq, warps), forward_kernel="points",
                        head_slowest=slowest), None)
        for bq, warps in BWD_SWEEP:
            yield (f"bwd         {order} block_q={bq:3d} warps={warps}",
                   dict(backward=tb.KernelConfig(bq, warps), head_slowest=slowest), everything)
    for bq, warps in SAMPLES_SWEEP:
        yield (f"fwd samples head-slowest block_q={bq:3d} warps={warps}",
               dict(forward=tb.KernelConfig(bq, warps), forward_kernel="samples"), None)
    yield "bwd default grad_value only", {}, (True, False, False)
    yield "bwd default loc+attn only", {}, (False, True, True)
    if dtype_name != "float32":
        yield "bwd default native-dtype atomics", dict(grad_value_accumulator="native"), everything


def sweep(shapes, dtypes, warmup, rep, shard=(0, 1), compile_only=False, only="", log=print) -> None:
    """Time tile configurations / program orders of our kernels (tuning aid).

    ``shard=(i, n)`` runs every n-th task from i; ``compile_only`` runs each variant once
    (fills Triton's cache from parallel processes before a timing run).
    """
    import torch

    from nkilib_msda.backends.triton import backend as tb
    from nkilib_msda.validation.msda import validate_msda_args

    task = -1
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        for dtype_name in dtypes:
            inputs = make_inputs(shape, getattr(torch, dtype_name))
            value, loc, attn, grad = inputs
            problem = validate_msda_args(value, shape.levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
            base = tb.plan_launch(problem, dtype_name)
            log(f"\nsweep {shape_name} {dtype_name} (default: {base})")
            reference_out = tb.msda_forward(value, problem, loc, attn, plan=tb.with_configs(
                base, forward_kernel="points"))
            for label, changes, compute in _sweep_variants(dtype_name):
                if only not in label:
                    continue
                task += 1
                if task % shard[1] != shard[0]:
                    continue
                plan = tb.with_configs(base, **changes)
                if compute is None:
                    fn = lambda: tb.msda_forward(value, problem, loc, attn, plan=plan)  # noqa: E731
                else:
                    fn = lambda: tb.msda_backward(grad, value, problem, loc, attn,  # noqa: E731
                                                  compute=compute, deterministic=False, plan=plan)
                if compile_only:
                    fn()
                    continue
                us = time_fn(fn, shape.decoder, warmup, rep)
                same = ""
                if compute is None and changes.get("forward_kernel") == "points":
                    same = " (bitwise = default)" if torch.equal(fn(), reference_out) else " (DIFFERS)"
                log(f"  {label}: {us:8.1f} µs{same}")
            default_fwd = time_fn(lambda: tb.msda_forward(value, problem, loc, attn),
                                  shape.decoder, warmup, rep) if not compile_only else 0.0
            log(f"  default forward: {default_fwd:.1f} µs")
            del inputs
            torch.cuda.empty_cache()
    torch.cuda.synchronize()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench_gpu", description="MSDA GPU benchmark (markdown table + PNG)")
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help=f"comma list from {list(SHAPES)} (older names {sorted(PRESET_ALIASES)} too)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma list: float32,bfloat16,float16")
    p.add_argument("--modes", default=",".join(MODES), help="comma list: fwd,fwd+bwd")
    p.add_argument("--impls", default="triton,ref,cuda,api",
                   help="comma list: triton (kernels called directly), ref, cuda, msda-triton, api "
                        "(the public function through autograd: rows 'ours' and 'ours-det')")
    p.add_argument("--out", default="bench_out", help="directory for results.md/json and the PNG")
    p.add_argument("--warmup", type=int, default=50, help="do_bench warmup (ms)")
    p.add_argument("--rep", type=int, default=300, help="do_bench repetition time (ms)")
    p.add_argument("--no-errors", action="store_true", help="skip the float64 error column")
    p.add_argument("--cuda-op-dir", default="", metavar="DIR",
                   help="Deformable-DETR's models/ops folder with the extension built in place: "
                        "'cuda' rows, fwd+bwd through its autograd.Function")
    p.add_argument("--peer-dir", default="", metavar="DIR",
                   help="folder holding roulbac/msda-triton's msda_triton package: "
                        "'msda-triton' rows (fp32 grad_value accumulation)")
    p.add_argument("--accepted", default=os.path.join("benchmarks", "accepted_floor.json"),
                   metavar="FILE", help="the last accepted time over the floor per shape "
                                        "(printed beside this run's)")
    p.add_argument("--accept", default="", metavar="RUN",
                   help="record this run's times over the floor in --accepted, labelled RUN")
    p.add_argument("--sweep", action="store_true", help="time tile configurations instead")
    p.add_argument("--shard", default="0/1", help="sweep: run tasks i, i+n, ... given as i/n")
    p.add_argument("--compile-only", action="store_true", help="sweep: only compile (no timing)")
    p.add_argument("--only", default="", help="sweep: only variants whose label contains this")
    p.add_argument("--tables-from", default="", metavar="LOG",
                   help="no GPU work: re-render the summary, targets and PNG from a run's log")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Entry point of ``nkilib-msda bench`` and ``benchmarks/bench_gpu.py``."""
    args = parse_args(argv)
    add_cuda_op_dir(args.cuda_op_dir)
    peers.add_peer_dir(args.peer_dir)
    if args.tables_from:
        with open(args.tables_from) as f:
            rows = rows_from_log(f.read())
        os.makedirs(args.out, exist_ok=True)
        print(summary_table(rows) + "\n\n" + peers_table(rows) + "\n\n"
              + floor_table(rows, load_accepted(args.accepted)) + "\n\n" + targets_table(rows))
        try:
            write_plot(results_dict(rows, f"rows of {args.tables_from}", "see the log"),
                       os.path.join(args.out, "bench_gpu.png"))
        except ImportError as exc:
            print(f"plot skipped: matplotlib not importable ({exc})")
        return 0
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"bench: needs torch and triton ({exc})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench: needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    shapes, dtypes = [canonical_shape(s) for s in split(args.shapes)], split(args.dtypes)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"bench: unknown shapes {unknown}; expected some of {list(SHAPES)}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.sweep:
        shard = tuple(int(x) for x in args.shard.split("/"))
        sweep(shapes, dtypes, args.warmup, args.rep, shard=shard, compile_only=args.compile_only,
              only=args.only)
        return 0
    os.makedirs(args.out, exist_ok=True)
    copy_bw = measure_copy_bandwidth()
    device = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
              f"measured copy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print(device)
    print(TABLE_HEADER)
    rows = run_benchmark(shapes, dtypes, split(args.modes), split(args.impls), args.warmup, args.rep,
                         copy_bw, with_errors=not args.no_errors)
    command = "python benchmarks/bench_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = "\n".join([TABLE_HEADER] + [format_row(r) for r in rows])
    summary, targets = summary_table(rows), targets_table(rows)
    judged = (f"## Ours against the best accurate peer\n\n{peers_table(rows)}\n\n"
              f"## Time over the bytes floor against the accepted run\n\n"
              f"{floor_table(rows, load_accepted(args.accepted))}")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(f"Command: `{command}`\n\nDevice: {device}\n\n## Summary (µs)\n\n{summary}\n\n"
                f"{judged}\n\n## Targets\n\n{targets}\n\n## All rows\n\n{table}\n")
    if args.accept:
        write_accepted(args.accepted, rows, args.accept)
    results = results_dict(rows, device, command)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    try:
        write_plot(results, os.path.join(args.out, "bench_gpu.png"))
    except ImportError as exc:
        print(f"plot skipped: matplotlib not importable ({exc})")
    print("\n" + table)
    print("\n" + summary + "\n\n" + judged + "\n\n" + targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
