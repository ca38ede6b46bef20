"""Where the host time of a call goes: a cProfile of N calls, grouped by who spends it.

    from host_profile import host_profile
    print(host_profile(fn, calls=500, label="ours fp32"))

Used by ``host_overhead_gpu.py --profile N`` (an H200, ours and Deformable-DETR's CUDA op) and
runnable on CPU (``python benchmarks/host_profile.py``: the stub backend of
``host_overhead.py`` on the decoder shape, so only the torch layer and autograd are left).

Each row is a group's *own* time (cProfile ``tottime``) per call, so the rows add up to the
profiled per-call time. cProfile slows Python code more than C code, so the table gives the
shares; the un-instrumented per-call time is printed beside it. Groups, by the file a
function lives in:

- ``autograd engine (C++)``: ``run_backward`` itself, i.e. the engine and the C++ parts of the
  backward nodes (allocations and launches made from Python inside a node are counted where
  they are made);
- ``torch Python``: torch's own Python (``torch/autograd/__init__.py``'s ``grad``, custom
  ``Function.apply``, ``torch/_*`` helpers);
- ``torch C ops``: ``{built-in method ...}`` and tensor methods (allocations, ``contiguous``,
  kernel launches of torch ops);
- ``nkilib_msda torch layer``: ``nkilib_msda/pytorch``, validation, dispatch;
- ``nkilib_msda backends``: ``nkilib_msda/backends`` (the Triton wrapper: contexts, launchers);
- ``triton``: Triton's Python and its C launcher;
- ``other``: everything else (the benchmark's own lambda, builtins).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from typing import Callable

GROUPS = ("autograd engine (C++)", "torch Python", "torch C ops", "nkilib_msda torch layer",
          "nkilib_msda backends", "triton", "other")


def group_of(filename: str, function: str) -> str:
    """The group of a cProfile entry (``filename`` is ``~`` for built-ins)."""
    path = filename.replace("\\", "/")
    if "run_backward" in function:
        return "autograd engine (C++)"
    if "nkilib_msda/backends" in path:  # before Triton's own files: backends/triton/ is ours
        return "nkilib_msda backends"
    if "/triton/" in path or "triton" in function.lower() and path == "~":
        return "triton"
    if "nkilib_msda/" in path:
        return "nkilib_msda torch layer"
    if "/torch/" in path:
        return "torch Python"
    if path == "~" and ("torch" in function or "Tensor" in function or "apply" in function):
        return "torch C ops"
    return "other"


def per_call_us(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Best of 3 rounds of ``calls`` back-to-back calls, µs per call."""
    best = float("inf")
    for _ in range(3):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    sync()
    return best


def host_profile(fn: Callable[[], object], calls: int, label: str, *, top: int = 12,
                 sync: Callable[[], None] = lambda: None) -> str:
    """A markdown block: per-call time, the groups' own time per call and the ``top``
    functions by own time, for ``calls`` calls of ``fn`` (warmed up first)."""
    for _ in range(20):
        fn()
    plain = per_call_us(fn, calls, sync)
    profiler = cProfile.Profile()
    sync()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    sync()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    groups = dict.fromkeys(GROUPS, 0.0)
    rows = []
    for (filename, line, function), (_cc, ncalls, tottime, _cum, _callers) in stats.items():
        groups[group_of(filename, function)] += tottime
        where = function if filename == "~" else f"{filename.rsplit('/', 2)[-2:][-1]}:{line}({function})"
        rows.append((tottime, ncalls, where))
    total = sum(groups.values())
    lines = [f"### {label}: {plain:.1f} µs per call un-instrumented, "
             f"{total / calls * 1e6:.1f} µs under cProfile ({calls} calls)", "",
             "| group | own µs per call (profiled) | share |", "|---|---:|---:|"]
    for name, seconds in groups.items():
        lines.append(f"| {name} | {seconds / calls * 1e6:.1f} | {seconds / total:.0%} |")
    lines += ["", "| function | calls per call | own µs per call (profiled) |", "|---|---:|---:|"]
    for tottime, ncalls, where in sorted(rows, reverse=True)[:top]:
        lines.append(f"| `{where}` | {ncalls / calls:g} | {tottime / calls * 1e6:.1f} |")
    return "\n".join(lines)


def _cpu_demo() -> None:
    """The decoder shape on CPU with the stub backend: the torch layer and autograd alone."""
    import torch

    import host_overhead
    import nkilib_msda
    from nkilib_msda.workloads import DDETR_LEVELS

    host_overhead._install_stub_backend()
    torch.manual_seed(0)
    levels = DDETR_LEVELS
    batch, queries, heads, channels, points = 2, 300, 8, 32, 4
    pixels = sum(h * w for h, w in levels)
    leaves = [torch.randn(batch, pixels, heads, channels),
              torch.rand(batch, queries, heads, len(levels), points, 2),
              torch.rand(batch, queries, heads, len(levels), points)]
    leaves = [t.requires_grad_(True) for t in leaves]
    grad = torch.randn(batch, queries, heads * channels)

    def fwd_bwd():
        out = nkilib_msda.multi_scale_deformable_attention(leaves[0], levels, None, leaves[1],
                                                           leaves[2], backend="reference")
        return torch.autograd.grad(out, leaves, grad)

    print(host_profile(fwd_bwd, 300, "functional fwd+bwd, stub backend, CPU"))


if __name__ == "__main__":
    _cpu_demo()
