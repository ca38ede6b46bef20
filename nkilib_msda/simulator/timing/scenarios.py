"""Scenarios: the timing model's structural and parametric unknowns as named alternatives
(docs/timing.md, "Scenarios").

A scenario is ``"<structure>/<parameters>"``:

- structure — which DMA engines a transfer may use, for the transfers whose mapping no
  document states (the recorded graph is re-mapped, the kernel is not re-run):
  - ``nominal``: the recorder's rules (engine ``j`` serves SBUF partitions ``8j..8j+7``;
    HBM->HBM: one engine per contiguous run, at most 16);
  - ``spread``: every indirect or software-DGE DMA, every ``dma_transpose`` and every
    HBM->HBM DMA uses all 16 DMA engines, whatever its partitions or run count (direct copies
    with an SBUF side keep the documented partition rule);
  - ``serial``: every software-DGE DMA of a core goes through one DMA engine (engine 0), so a
    core's software-DGE transfers run one after another;
- parameters — values pinned inside the documented ranges (the others stay free and make the
  band):
  - ``nominal``: none pinned;
  - ``swdge-bound``: software-DGE descriptor generation at the top of its range
    (``swdge_descriptor_ns``, ``swdge_fixed_ns``), the indirect DMA descriptor at the bottom
    (``dma_indirect_descriptor_ns``);
  - ``descriptor-bound``: the reverse.

A transfer moved from ``e`` engines to ``e'`` has its per-engine bytes and descriptors scaled
by ``e / e'``; its total work is unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator, Mapping, TypeVar

import numpy as np

from nkilib_msda.simulator.timing.constants import params_for
from nkilib_msda.simulator.timing.graph import NODE_TRANSFER, TimingGraph

__all__ = ["STRUCTURES", "PARAMETER_SETS", "SCENARIOS", "NOMINAL", "restructure",
           "pinned_params", "split_name", "Scenarios", "robust_ratio"]

STRUCTURES = ("nominal", "spread", "serial")
PARAMETER_SETS = ("nominal", "swdge-bound", "descriptor-bound")
SCENARIOS = tuple(f"{s}/{p}" for s in STRUCTURES for p in PARAMETER_SETS)
NOMINAL = "nominal/nominal"
_SWDGE = ("swdge_descriptor_ns", "swdge_fixed_ns")
_INDIRECT = ("dma_indirect_descriptor_ns",)


def split_name(name: str) -> tuple[str, str]:
    """(structure, parameters) of a scenario name; ValueError for another name."""
    if name not in SCENARIOS:
        raise ValueError(f"timing scenario: expected one of {list(SCENARIOS)}, got {name!r}")
    structure, parameters = name.split("/")
    return structure, parameters


def pinned_params(target: str, parameters: str) -> dict[str, float]:
    """The parameter values a parameter set pins (by name)."""
    if parameters not in PARAMETER_SETS:
        raise ValueError(f"timing scenario parameters: expected one of {list(PARAMETER_SETS)}, "
                         f"got {parameters!r}")
    if parameters == "nominal":
        return {}
    ranges = {p.name: p for p in params_for(target)}
    top, bottom = (_SWDGE, _INDIRECT) if parameters == "swdge-bound" else (_INDIRECT, _SWDGE)
    return {**{n: ranges[n].high for n in top}, **{n: ranges[n].low for n in bottom}}


def restructure(graph: TimingGraph, structure: str) -> TimingGraph:
    """``graph`` with its transfers re-mapped to the DMA engines of ``structure``."""
    if structure not in STRUCTURES:
        raise ValueError(f"timing scenario structure: expected one of {list(STRUCTURES)}, got "
                         f"{structure!r}")
    if structure == "nominal" or graph.num_nodes == 0:
        return graph
    per_core = len(graph.core_names)
    engines = graph.dma_engines
    lane0 = {name.split(":", 1)[0]: k for k, name in enumerate(graph.core_names)
             if name.endswith(":dma0")}
    transfer = graph.kind == NODE_TRANSFER
    if structure == "spread":
        move = transfer & (graph.dma_flags != 0)
        new_lo, new_hi = 0, engines
    else:  # serial
        move = transfer & np.array([q == "swdge" for q in graph.queues], dtype=bool)
        new_lo, new_hi = 0, 1
    if not move.any():
        return graph
    res_lo, res_hi = graph.res_lo.copy(), graph.res_hi.copy()
    const, coef = graph.const.copy(), graph.coef.copy()
    for i in np.flatnonzero(move).tolist():
        base = int(graph.core[i]) * per_core + lane0[graph.queues[i]]
        width = int(res_hi[i] - res_lo[i])
        scale = width / (new_hi - new_lo)
        res_lo[i], res_hi[i] = base + new_lo, base + new_hi
        const[i] *= scale
        coef[i] *= scale
    return replace(graph, res_lo=res_lo, res_hi=res_hi, const=const, coef=coef)


_T = TypeVar("_T")


class Scenarios(Mapping[str, _T]):
    """``report.timing.scenarios``: scenario name -> timing, each built on first access by
    ``make(graph, pinned, name)`` from the recorded graph re-mapped to its structure."""

    def __init__(self, graph: TimingGraph,
                 make: Callable[[TimingGraph, Mapping[str, float], str], _T]) -> None:
        self._graph = graph
        self._make = make
        self._graphs: dict[str, TimingGraph] = {}
        self._built: dict[str, _T] = {}

    def __getitem__(self, name: str) -> _T:
        if name not in self._built:
            try:
                structure, parameters = split_name(name)
            except ValueError as exc:
                raise KeyError(str(exc)) from None
            if structure not in self._graphs:
                self._graphs[structure] = restructure(self._graph, structure)
            self._built[name] = self._make(self._graphs[structure],
                                           pinned_params(self._graph.target, parameters), name)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(SCENARIOS)

    def __len__(self) -> int:
        return len(SCENARIOS)


_CORNERS = (("low", "low_us"), ("nominal", "estimate_us"), ("high", "high_us"))


def robust_ratio(ours: Mapping[str, Mapping[str, float]], theirs: Mapping[str, Mapping[str, float]]
                 ) -> tuple[float, str, str] | None:
    """The worst paired ratio ``ours / theirs`` over every scenario both have and every band
    corner (low, nominal, high), each taken with both kernels at the same scenario and
    corner: ``(ratio, scenario, corner)``; None when they share no scenario. The inputs map
    scenario names to ``{"estimate_us", "low_us", "high_us"}`` (``Timing.scenarios`` as
    cached data)."""
    worst: tuple[float, str, str] | None = None
    for name in SCENARIOS:
        if name not in ours or name not in theirs:
            continue
        for corner, key in _CORNERS:
            ratio = float(ours[name][key]) / float(theirs[name][key])
            if worst is None or ratio > worst[0]:
                worst = (ratio, name, corner)
    return worst
