"""A/B timing of the Triton kernels against a baseline copy of ``backends/triton/kernels``, in one run.

    python benchmarks/kernel_ab.py --baseline DIR [--shapes ddetr-decoder,ddetr-encoder,bevformer-sca]
        [--dtypes float32,bfloat16] [--rounds 3] [--compile-only | --sass]

DIR holds the baseline's ``sampling.py``, ``forward.py`` and ``backward.py`` (for example
``git show REV:nkilib_msda/backends/triton/kernels/forward.py > DIR/forward.py``); they are
loaded as their own package, so both versions run in one process on the same inputs (the
benchmark shapes of ``bench_gpu.py``). For each (shape, dtype) it times the default launch
plan's forward kernel, its fast-mode backward kernel and the deterministic-mode backward
kernel (entries only, without the host sort), each through the backend's own launcher:
``triton.testing.do_bench`` medians (L2 flushed before each call), new and baseline
alternating for ``--rounds`` rounds; the spread of a version's round medians is its noise.
Outputs are compared first: bitwise for the forward, grad_loc, grad_attn and the
deterministic entries; relative L2 for the atomically accumulated grad_value.
``--compile-only`` launches each kernel once (fills Triton's cache, e.g. in parallel shards).
``--sass`` needs no GPU: it compiles both versions of each kernel for sm_90 with the installed
Triton (as ``reduction_sass.py``) and compares their SASS: identical, identical but for
register numbers, or the number of changed lines and the per-opcode count differences.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import tempfile
from pathlib import Path

_KERNEL_FILES = ("sampling", "forward", "backward")


def load_baseline(directory: str):
    """The baseline's kernel modules {name: module}, imported from a private package whose
    absolute imports of the repository's kernels are rewritten to the baseline's own files."""
    package = "_baseline_triton_kernels"
    tmp = Path(tempfile.mkdtemp(prefix="kernel_ab_")) / package
    tmp.mkdir()
    (tmp / "__init__.py").write_text("")
    for name in _KERNEL_FILES:
        source = (Path(directory) / f"{name}.py").read_text()
        source = re.sub(r"nkilib_msda\.backends\.triton\.kernels\.", f"{package}.", source)
        (tmp / f"{name}.py").write_text(source)
    sys.path.insert(0, str(tmp.parent))
    modules = {}
    for name in _KERNEL_FILES:
        spec = importlib.util.spec_from_file_location(f"{package}.{name}", tmp / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules


def _baseline_kernel(baseline: dict, kernel):
    name = kernel.fn.__name__
    for module in baseline.values():
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"baseline: no kernel named {name!r}")


def launches(problem, inputs):
    """[(label, (kernel, grid, scalars, kwargs), make_tensors, compared output indices)]."""
    import torch

    from nkilib_msda.backends.triton import backend as tb

    value, loc, attn, grad = inputs
    plan = tb.plan_launch(problem, str(value.dtype).replace("torch.", ""))
    shapes, starts = tb._level_tables(problem.spatial_shapes, problem.level_start_index,
                                      value.device)
    entries = problem.num_samples * 4
    key_dtype = torch.int64 if plan.index64 else torch.int32

    def fwd_tensors():
        return (value, loc, attn, torch.empty(problem.output_shape, dtype=value.dtype,
                                              device=value.device), shapes, starts)

    def bwd_tensors(deterministic):
        def make():
            tensors = (grad, value, loc, attn, shapes, starts,
                       torch.zeros(value.shape, dtype=torch.float32, device=value.device),
                       torch.empty_like(loc), torch.empty_like(attn))
            if deterministic or not tb.uses_samples_backward(plan, False):
                tensors += (torch.empty(entries, dtype=key_dtype, device=value.device),
                            torch.empty(entries, dtype=torch.float32, device=value.device))
            return tensors
        return make

    compute = (True, True, True)
    fast_outputs = (6, 7, 8)
    return [
        (f"fwd-{plan.forward_kernel}", tb._forward_launch(problem, plan), fwd_tensors, (3,)),
        (f"bwd-{plan.backward_kernel}", tb._backward_launch(problem, plan, compute, False),
         bwd_tensors(False), fast_outputs),
        ("bwd-deterministic", tb._backward_launch(problem, plan, compute, True),
         bwd_tensors(True), (7, 8, 9, 10)),
    ]


def compare(new, old, indices) -> str:
    """'bitwise' when every compared output is equal, else each differing output's relative L2
    (the atomically accumulated grad_value, index 6, may differ in rounding)."""
    import torch

    diffs = []
    for i in indices:
        a, b = new[i].double(), old[i].double()
        if not torch.equal(a, b):
            diffs.append(f"#{i} rel-L2 {float((a - b).norm() / b.norm().clamp_min(1e-30)):.1e}")
    return ", ".join(diffs) or "bitwise"


def _sass_lines(kernel, kwargs, io_type) -> list:
    from reduction_sass import compile_for_sm90, sass_of

    text = sass_of(compile_for_sm90(kernel, kwargs, io_type))
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", text)]


def compare_sass(args) -> int:
    """Old vs new SASS of every kernel variant the default plans launch, without a GPU."""
    import difflib
    from collections import Counter

    import torch

    from nkilib_msda.backends.triton import backend as tb
    from bench_gpu import SHAPES, shape_name
    from nkilib_msda.validation.msda import validate_msda_args

    baseline = load_baseline(args.baseline)
    differ = 0
    for name in args.shapes.split(","):
        shape = SHAPES[shape_name(name)]
        dims = (shape.batch, shape.num_queries, shape.heads, len(shape.levels), shape.points)
        value = torch.empty(shape.batch, shape.pixels, shape.heads, shape.channels, device="meta")
        problem = validate_msda_args(value, shape.levels, None,
                                     torch.empty(*dims, 2, device="meta"),
                                     torch.empty(*dims, device="meta"), "BLNC", "BQHLP2", False, "zeros")
        for dtype_name in args.dtypes.split(","):
            plan = tb.plan_launch(problem, dtype_name)
            variants = [(f"fwd-{k}", tb._forward_launch(problem, tb.with_configs(
                plan, forward_kernel=k))) for k in ("points", "samples")]
            variants += [(f"bwd-{k}", tb._backward_launch(problem, tb.with_configs(
                plan, backward_kernel=k), (True, True, True), False)) for k in ("samples", "points")]
            variants.append(("bwd-deterministic",
                             tb._backward_launch(problem, plan, (True, True, True), True)))
            io_type = "fp32" if dtype_name == "float32" else "bf16"
            for label, (kernel, _grid, _scalars, kwargs) in variants:
                new = _sass_lines(kernel, kwargs, io_type)
                old = _sass_lines(_baseline_kernel(baseline, kernel), kwargs, io_type)
                registers = re.compile(r"\bU?R\d+\b|\bU?P\d\b")
                if new == old:
                    verdict = "identical"
                elif [registers.sub("R", x) for x in new] == [registers.sub("R", x) for x in old]:
                    verdict = "identical but for register numbers"
                else:
                    changed = sum(1 for x in difflib.unified_diff(old, new, n=0)
                                  if x[:1] in "+-" and x[:3] not in ("+++", "---"))
                    count_new = Counter(x.split()[0] for x in new)
                    count_old = Counter(x.split()[0] for x in old)
                    delta = {k: count_new[k] - count_old[k] for k in count_new | count_old
                             if count_new[k] != count_old[k]}
                    verdict = f"{changed} lines changed, opcode counts {delta or 'equal'}"
                    differ += 1
                print(f"| {shape.name} | {dtype_name} | {label} | {len(old)} | {len(new)} | "
                      f"{verdict} |", flush=True)
    print(f"kernels whose SASS differs beyond register numbers: {differ}")
    return 0


def run(args) -> int:
    import torch
    import triton.testing

    from nkilib_msda.backends.triton import backend as tb
    from bench_gpu import SHAPES, make_inputs, shape_name
    from nkilib_msda.validation.msda import validate_msda_args

    baseline = load_baseline(args.baseline)
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[shape_name(name)]
        for dtype_name in args.dtypes.split(","):
            inputs = make_inputs(shape, getattr(torch, dtype_name), seed=0)
            problem = validate_msda_args(inputs[0], shape.levels, None, inputs[1], inputs[2], "BLNC", "BQHLP2", False, "zeros")
            for label, (kernel, grid, scalars, kwargs), make, outputs in launches(problem, inputs):
                versions = {"new": tb._Launcher(kernel, grid, scalars, kwargs),
                            "base": tb._Launcher(_baseline_kernel(baseline, kernel), grid,
                                                 scalars, kwargs)}
                results = {}
                for name, launch in versions.items():
                    results[name] = make()
                    launch(*results[name])
                torch.cuda.synchronize()
                if args.compile_only:
                    print(f"compiled {shape.name} {dtype_name} {label}", flush=True)
                    continue
                agreement = compare(results["new"], results["base"], outputs)
                medians: dict = {"new": [], "base": []}
                for round_index in range(args.rounds):
                    order = ("new", "base") if round_index % 2 == 0 else ("base", "new")
                    for name in order:
                        tensors, launch = results[name], versions[name]
                        medians[name].append(1e3 * triton.testing.do_bench(
                            lambda: launch(*tensors), warmup=args.warmup, rep=args.rep,
                            return_mode="median"))
                row = (shape.name, dtype_name, label, medians["base"], medians["new"], agreement)
                rows.append(row)
                print(format_row(row), flush=True)
    if rows:
        print("\n| shape | dtype | kernel | baseline µs (spread) | new µs (spread) | new/base | "
              "outputs |\n|---|---|---|---|---|---|---|")
        for row in rows:
            print(format_row(row))
    return 0


def format_row(row) -> str:
    shape, dtype, label, base, new, agreement = row
    b, n = statistics.median(base), statistics.median(new)
    return (f"| {shape} | {dtype} | {label} | {b:.1f} ({max(base) - min(base):.1f}) | "
            f"{n:.1f} ({max(new) - min(new):.1f}) | {n / b:.3f} | {agreement} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="folder with the baseline's kernels")
    parser.add_argument("--shapes", default="ddetr-decoder,ddetr-encoder,bevformer-sca")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--sass", action="store_true", help="compare sm_90 SASS (no GPU)")
    args = parser.parse_args(argv)
    return compare_sass(args) if args.sass else run(args)


if __name__ == "__main__":
    sys.exit(main())
