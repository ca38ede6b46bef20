"""The recorded instruction graph: the typed hand-over from the recorder to the scheduler.

:class:`TimingGraph` is frozen: the recorder (recorder.py) builds it once per simulation,
the scheduler (schedule.py) and the scenarios (scenarios.py) only read it or derive new
graphs from it. Node ``i`` (in execution order, a topological order) runs on resources
``res_lo[i]:res_hi[i]`` and lasts ``const[i] + coef[i] @ params`` ns (parameters in
``constants.PARAM_NAMES`` order). Resources are numbered ``core * len(core_names) + k`` for
the ``k``-th name of :func:`core_resources`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TimingGraph", "COMPUTE_ENGINES", "ISSUE_QUEUES", "DMA_QUEUES", "core_resources",
           "NODE_COMPUTE", "NODE_ISSUE", "NODE_TRANSFER", "NODE_BARRIER",
           "DMA_INDIRECT", "DMA_TRANSPOSE", "DMA_NO_CHIP", "csr"]

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")
ISSUE_QUEUES = ("queue_sync", "queue_act")  # hardware-DGE / trigger issue resources
# DMA queues: each has its own in-order lane on every DMA engine (see core_resources)
DMA_QUEUES = ("static", "sync", "act", "swdge")
NODE_COMPUTE, NODE_ISSUE, NODE_TRANSFER, NODE_BARRIER = 0, 1, 2, 3
# Transfer facts whose DMA-engine mapping no document states (scenarios.py varies them):
DMA_INDIRECT = 1  # indirect (gather/scatter/transpose) or software-DGE
DMA_TRANSPOSE = 2  # dma_transpose (direct or indirect)
DMA_NO_CHIP = 4  # no SBUF/PSUM side (HBM->HBM): engines from the run count


def core_resources(dma_engines: int) -> tuple[str, ...]:
    """Resource names of one core: compute engines, issue queues, and one in-order lane per
    (DMA queue, DMA engine) named ``"<queue>:dma<j>"``. Transfers of one queue follow each
    other on an engine; transfers of different queues do not block each other (the engines
    serve their queues round-robin); their shared bandwidth is bounded by ``Timing``."""
    return COMPUTE_ENGINES + ISSUE_QUEUES + tuple(f"{q}:dma{j}" for q in DMA_QUEUES
                                                  for j in range(dma_engines))


def csr(lists: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Row pointers and indices of a list of index tuples."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    if lists:
        ptr[1:] = np.cumsum([len(p) for p in lists])
    idx = np.fromiter((j for p in lists for j in p), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx


@dataclass(frozen=True, eq=False)
class TimingGraph:
    """One simulation's recorded graph (all cores of an LNC 2 run).

    Per node (arrays of length ``num_nodes``): ``kind`` (``NODE_*``), ``core`` (-1: a
    barrier of all cores), resources ``res_lo``/``res_hi``, duration ``const`` (ns) and
    ``coef`` (ns per parameter unit, ``num_nodes x len(PARAM_NAMES)``), ``lat`` (index of
    the latency parameter added after its predecessors, -1 none), ``dma_flags``
    (``DMA_*`` bits of a transfer, 0 otherwise), ``names`` (opcode), ``queues`` (DMA queue
    or ""). Edges in CSR form: ``pred_ptr``/``pred_idx`` (waited for, plus the latency),
    ``order_ptr``/``order_idx`` (waited for without latency: earlier transfers of the same
    DMA queue). ``hbm_bytes``: the launch's HBM traffic.
    """

    target: str
    num_programs: int
    core_names: tuple[str, ...]
    dma_engines: int
    kind: np.ndarray
    core: np.ndarray
    res_lo: np.ndarray
    res_hi: np.ndarray
    const: np.ndarray
    coef: np.ndarray
    lat: np.ndarray
    dma_flags: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    order_ptr: np.ndarray
    order_idx: np.ndarray
    names: tuple[str, ...]
    queues: tuple[str, ...]
    hbm_bytes: int

    def __post_init__(self) -> None:
        n = int(self.kind.size)
        for name in ("core", "res_lo", "res_hi", "const", "lat", "dma_flags"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"TimingGraph: {name} must have shape ({n},), got "
                                 f"{getattr(self, name).shape}")
        if self.coef.shape[0] != n or self.pred_ptr.size != n + 1 or self.order_ptr.size != n + 1:
            raise ValueError(f"TimingGraph: coef rows and edge pointers must match {n} nodes, got "
                             f"{self.coef.shape[0]}, {self.pred_ptr.size - 1}, "
                             f"{self.order_ptr.size - 1}")
        for arr in (self.kind, self.core, self.res_lo, self.res_hi, self.const, self.coef,
                    self.lat, self.dma_flags, self.pred_ptr, self.pred_idx, self.order_ptr,
                    self.order_idx):
            arr.flags.writeable = False

    @property
    def num_nodes(self) -> int:
        return int(self.kind.size)

    @property
    def num_resources(self) -> int:
        return len(self.core_names) * self.num_programs
