"""GPU time of several source trees of this package side by side, in one process (a bisect).

    python benchmarks/version_ab.py --versions LABEL=DIR[@NAME=VALUE...],... [--shapes bevformer-tsa]
        [--dtypes float32,bfloat16] [--rounds 5] [--replays 20] [--deterministic LABEL,...]
        [--tile-shapes ddetr-encoder,...] [--tiles 1x2,4x2,...] [--local] [--compile-only]

Each DIR holds a copy of the package (``DIR/nkilib_msda``, e.g. ``git archive REV nkilib_msda |
tar -x -C DIR``); ``@NAME=VALUE`` after DIR sets an environment variable for that version's
calls alone (a switch read when a launch is planned: one tree timed with and without it, e.g.
``default=.,grid3d=.@NKILIB_MSDA_TRITON_GRID=3d``). The versions are imported one after the other into this process (the modules
of the previous one are dropped from ``sys.modules`` first; its functions stay alive in the
closures), so every version runs on the same input tensors. For each version, shape and dtype
it times the Triton backend's functions called directly, as the benchmark's ``triton`` rows do:
forward then fast-mode backward ("fwd+bwd"), and for the versions named by ``--deterministic``
the deterministic backward too. For the last version only and the ``--tile-shapes``:
``--tiles BQxW,...`` times the fast-mode backward alone ("bwd") with the all-samples kernel's
tiles replaced (BLOCK_Q queries, W warps), next to its default plan, and ``--local`` times
fwd+bwd on inputs whose locations sit near each query's own pixel (reference point + N(0, 2 px)
offsets, as trained encoders sample).

Timing: each case is captured once in a CUDA graph; a round replays every case's graph
``--replays`` times between two CUDA events (the per-replay mean is the round's value), the
cases interleaved within a round; the table shows the median over ``--rounds`` rounds and the
spread (max - min) of the round values, which is the noise to compare differences with.
Results are checked first: each case's output and gradients against the first version's on the
same inputs (relative L2; the fast-mode grad_value order of additions varies between runs).
``--compile-only`` runs every case once and exits (fills Triton's on-disk cache; run one
process per version in parallel before the timed process).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

from nkilib_msda.workloads import PRESETS  # this checkout's, read before any version is loaded

# (batch, queries, levels, points, heads, channels) of the workloads timed here.
SHAPES = {name: (c.batch, c.num_queries, tuple(c.spatial_shapes), c.num_points, c.num_heads,
                 c.head_dim)
          for name, c in PRESETS.items()
          if name in ("ddetr-encoder", "bevformer-sca", "bevformer-tsa")}


@dataclass
class Case:
    label: str  # version [variant]
    shape: str
    dtype: str
    mode: str
    fn: Callable[[], Any]
    graph: Any = None
    rounds: list | None = None


def _package_modules() -> list[str]:
    return [m for m in sys.modules if m == "nkilib_msda" or m.startswith("nkilib_msda.")]


def load_version(directory: str):
    """(triton_backend, validate_msda_args, modules) of the package under ``directory``;
    ``modules`` are its entries of ``sys.modules``, which :func:`in_version` puts back around
    each call (the backends import kernel modules lazily, by absolute name)."""
    for name in _package_modules():
        del sys.modules[name]
    sys.path.insert(0, directory)
    try:
        try:
            tb = importlib.import_module("nkilib_msda.backends.triton.backend")
        except ImportError:  # before the backends became subpackages
            tb = importlib.import_module("nkilib_msda.backends.triton_backend")
        try:
            validate = importlib.import_module("nkilib_msda.validation.msda").validate_msda_args
        except ImportError:
            validate = importlib.import_module("nkilib_msda.validation").validate_msda_args
    finally:
        sys.path.remove(directory)
    return tb, validate, {name: sys.modules[name] for name in _package_modules()}


def in_version(modules: dict, fn: Callable[[], Any], env: dict | None = None
               ) -> Callable[[], Any]:
    """``fn`` run with ``modules`` (one version's package) in ``sys.modules`` and ``env`` set in
    ``os.environ`` (restored afterwards); modules it imports on the way join that version's."""
    env = env or {}

    def run():
        saved = {name: sys.modules.pop(name) for name in _package_modules()}
        sys.modules.update(modules)
        saved_env = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            return fn()
        finally:
            for name, old in saved_env.items():
                if old is None:
                    del os.environ[name]
                else:
                    os.environ[name] = old
            for name in _package_modules():
                modules[name] = sys.modules.pop(name)
            sys.modules.update(saved)
    return run


def parse_version(spec: str) -> tuple[str, str, dict]:
    """``LABEL=DIR[@NAME=VALUE...]`` -> (label, directory, environment)."""
    label, rest = spec.split("=", 1)
    directory, *assignments = rest.split("@")
    env = dict(a.split("=", 1) for a in assignments)
    return label, directory, env


def make_inputs(shape: str, dtype: str, local: bool, seed: int = 0):
    """value ~ N(0,1) (B, S, N_h, C_h); locations ~ U[0,1) (B, Q, N_h, N_l, N_p, 2), or near each
    query's own pixel with ``local``; weights ~ U[0,1) normalised over (N_l, N_p); grad_output
    ~ N(0,1); all in ``dtype`` (the benchmark's inputs)."""
    import torch

    batch, q, levels, points, heads, channels = SHAPES[shape]
    pixels = sum(h * w for h, w in levels)
    nl = len(levels)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", generator=gen)
    value = torch.randn(batch, pixels, heads, channels, **kw)
    if local:
        # Query i's reference point: the centre of pixel i of the level pyramid (encoders) or of
        # the first level (TSA: one query per BEV cell), in normalised coordinates.
        idx = torch.arange(q, device="cuda") % pixels
        ref = torch.empty(q, 2, device="cuda")
        from nkilib_msda.validation.layouts import level_starts  # this checkout's, before any version

        for (h, w), start in zip(levels, level_starts(levels)):
            inside = (idx >= start) & (idx < start + h * w)
            local_i = idx[inside] - start
            ref[inside, 0] = (local_i % w + 0.5) / w
            ref[inside, 1] = (local_i // w + 0.5) / h
        sizes = torch.tensor([[w, h] for h, w in levels], dtype=torch.float32, device="cuda")
        offsets = torch.randn(batch, q, heads, nl, points, 2, **kw) * 2.0 / sizes[:, None, :]
        loc = ref[None, :, None, None, None, :] + offsets
    else:
        loc = torch.rand(batch, q, heads, nl, points, 2, **kw)
    attn = torch.rand(batch, q, heads, nl, points, **kw)
    attn = attn / attn.sum((-1, -2), keepdim=True)
    grad = torch.randn(batch, q, heads * channels, **kw)
    to = getattr(torch, dtype)
    return levels, value.to(to), loc.to(to), attn.to(to), grad.to(to)


def _fwd_bwd(tb, problem, value, loc, attn, grad, det: bool):
    def run():
        out = tb.msda_forward(value, problem, loc, attn)
        return (out, *tb.msda_backward(grad, value, problem, loc, attn, deterministic=det))
    return run


def version_cases(label: str, tb, validate, inputs: dict, shapes, dtypes, deterministic: bool,
                  tile_shapes=(), tiles=(), local: bool = False) -> list[Case]:
    """The cases of one version: fwd+bwd (and deterministic fwd+bwd) on ``shapes``; the tile
    sweep and the local-locations fwd+bwd on ``tile_shapes``."""
    cases = []
    for shape in dict.fromkeys([*shapes, *tile_shapes]):
        for dtype in dtypes:
            levels, value, loc, attn, grad = inputs[(shape, dtype, False)]
            problem = validate(value, levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
            if shape in shapes:
                cases.append(Case(label, shape, dtype, "fwd+bwd",
                                  _fwd_bwd(tb, problem, value, loc, attn, grad, False)))
                if deterministic:
                    cases.append(Case(label, shape, dtype, "fwd+bwd det",
                                      _fwd_bwd(tb, problem, value, loc, attn, grad, True)))
            if shape not in tile_shapes:
                continue
            default = tb.plan_launch(problem, dtype)
            for bq, warps in tiles:
                plan = tb.with_configs(default, samples_backward=tb.KernelConfig(bq, warps))

                def bwd(plan=plan, value=value, loc=loc, attn=attn, grad=grad, problem=problem):
                    return tb.msda_backward(grad, value, problem, loc, attn, deterministic=False,
                                            plan=plan)

                mark = ", default" if plan == default else ""
                cases.append(Case(f"{label} [{bq} q, {warps} warps{mark}]", shape, dtype, "bwd", bwd))
            if local:
                levels, value, loc, attn, grad = inputs[(shape, dtype, True)]
                problem = validate(value, levels, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
                cases.append(Case(label, shape, dtype, "fwd+bwd, local locations",
                                  _fwd_bwd(tb, problem, value, loc, attn, grad, False)))
    return cases


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def capture(case: Case) -> None:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            case.fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        case.fn()
    case.graph = graph


def time_rounds(cases: list[Case], rounds: int, replays: int) -> None:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for case in cases:
        case.rounds = []
        case.graph.replay()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for case in cases:
            start.record()
            for _ in range(replays):
                case.graph.replay()
            end.record()
            end.synchronize()
            case.rounds.append(start.elapsed_time(end) * 1e3 / replays)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", required=True, help="LABEL=DIR,... (DIR/nkilib_msda)")
    p.add_argument("--shapes", default="bevformer-tsa")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--deterministic", default="", help="LABEL,...: also their deterministic backward")
    p.add_argument("--tile-shapes", default="", help="shapes of the last version's sweeps")
    p.add_argument("--tiles", default="", help="BQxW,...: all-samples backward tiles (last version)")
    p.add_argument("--local", action="store_true", help="fwd+bwd with local locations (last version)")
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--decide", default="", metavar="FILE",
                   help="write the environment of the version that beats the first on every "
                        "group beyond the noise (see decide) to FILE")
    args = p.parse_args(argv)

    import torch

    def split(text: str) -> list[str]:
        return [x for x in text.split(",") if x]

    versions = [parse_version(v) for v in split(args.versions)]
    shapes, tile_shapes, dtypes = split(args.shapes), split(args.tile_shapes), split(args.dtypes)
    tiles = [tuple(int(x) for x in t.split("x")) for t in split(args.tiles)]
    inputs = {(s, d, False): make_inputs(s, d, False) for s in {*shapes, *tile_shapes} for d in dtypes}
    if args.local:
        inputs.update({(s, d, True): make_inputs(s, d, True) for s in tile_shapes for d in dtypes})
    cases: list[Case] = []
    for i, (label, directory, env) in enumerate(versions):
        last = i == len(versions) - 1
        tb, validate, modules = load_version(directory)
        new = version_cases(label, tb, validate, inputs, shapes, dtypes,
                            label in split(args.deterministic),
                            tile_shapes if last else (), tiles, args.local)
        for case in new:
            case.fn = in_version(modules, case.fn, env)
        cases += new
    if args.compile_only:
        for case in cases:
            case.fn()
        torch.cuda.synchronize()
        print(f"compiled {len(cases)} cases")
        return 0

    first: dict = {}
    print("| version | shape | dtype | mode | rel L2 vs the group's first row: out, grad value/loc/attn |")
    print("|---|---|---|---|---|")
    for case in cases:
        got = case.fn()
        key = (case.shape, case.dtype, case.mode)
        if key not in first:
            first[key] = [t.clone() for t in got]
            continue
        diffs = ", ".join(f"{rel_l2(a, b):.1e}" for a, b in zip(got, first[key]))
        print(f"| {case.label} | {case.shape} | {case.dtype} | {case.mode} | {diffs} |")
    for case in cases:
        capture(case)
    time_rounds(cases, args.rounds, args.replays)
    print(f"\nCUDA-graph replay, µs per call: median of {args.rounds} interleaved rounds of "
          f"{args.replays} replays (spread = max - min of the round values)\n")
    print("| shape | dtype | mode | version | µs | spread | ratio to the group's first row |")
    print("|---|---|---|---|---|---|---|")
    groups: dict = {}
    for case in cases:
        groups.setdefault((case.shape, case.dtype, case.mode), []).append(case)
    for (shape, dtype, mode), members in groups.items():
        base = statistics.median(members[0].rounds)
        for case in members:
            med = statistics.median(case.rounds)
            spread = max(case.rounds) - min(case.rounds)
            print(f"| {shape} | {dtype} | {mode} | {case.label} | {med:.1f} | {spread:.1f} | "
                  f"{med / base:.3f} |")
    if args.decide:
        decide(groups, {label: env for label, _, env in versions}, args.decide)
    return 0


def decide(groups: dict, envs: dict, path: str) -> str | None:
    """Which version beats the group's first (the default) on every group by more than the
    noise: the larger of the two spreads and of the difference between the first and any other
    version with the first's environment (the same code timed twice). Prints each version's
    verdict and writes ``export NAME=VALUE`` lines of the winner with the lowest mean ratio
    (nothing when none wins) to ``path``; returns its label."""
    labels = list(dict.fromkeys(c.label for members in groups.values() for c in members))
    first = labels[0]
    twins = [x for x in labels[1:] if envs.get(x) == envs.get(first)]
    verdicts: dict = {}
    for label in labels[1:]:
        if label in twins:
            continue
        wins, ratios = [], []
        for members in groups.values():
            by = {c.label: c for c in members}
            base, other = by[first], by[label]
            noise = max(max(base.rounds) - min(base.rounds), max(other.rounds) - min(other.rounds),
                        *(abs(statistics.median(by[t].rounds) - statistics.median(base.rounds))
                          for t in twins))
            gain = statistics.median(base.rounds) - statistics.median(other.rounds)
            wins.append(gain > noise)
            ratios.append(statistics.median(other.rounds) / statistics.median(base.rounds))
        verdicts[label] = (all(wins), sum(wins), statistics.mean(ratios))
        print(f"{label}: beats {first} beyond the noise on {sum(wins)} of {len(wins)} groups, "
              f"mean ratio {statistics.mean(ratios):.3f}")
    winners = [x for x, (every, _, _) in verdicts.items() if every]
    best = min(winners, key=lambda x: verdicts[x][2]) if winners else None
    with open(path, "w") as f:
        for name, value in (envs[best] if best else {}).items():
            f.write(f"export {name}={value}\n")
    print(f"decision: {best or first + ' (no version wins on every group)'}")
    return best


if __name__ == "__main__":
    sys.exit(main())
