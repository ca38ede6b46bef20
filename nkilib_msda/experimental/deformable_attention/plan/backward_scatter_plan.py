"""The grad_value scatter width of the MSDA backward plan (plain Python, no NKI).

With no ``max_scatter_indices_per_indirect`` cap the plan picks P_s (the partitions of one
scatter-RMW, a power of two <= 128) and with it K = ceil(P_s / G) replicated fp32 buffers,
trading the buffers' zero + reduce bytes against the scatter's serial read-modify-writes
(:func:`scatter_dma_cost`); the uniqueness proof is in ``backward_config``.
"""

from __future__ import annotations

from nkilib_msda.hardware import DMA_ENGINES, PARTITIONS
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["FOLD_SCATTER_PARTITIONS", "SCATTER_DESCRIPTOR_OVERHEAD_BYTES", "default_scatter_partitions",
           "plan_scatter_fold", "scatter_dma_cost"]

# P_s whose slices the folded scatter stacks D = 128 // P_s at a time (backward_scatter_fold)
FOLD_SCATTER_PARTITIONS = (32, 64)

# Assumed DMA cost of one scatter descriptor beyond its bytes, in bytes an engine streams in
# that time: unpublished. The timing model's nominal per-descriptor cost of small indirect
# rows (40 ns) at one engine's 23 B/ns (nki-dma-bandwidth-guide.html) is about 920 B.
SCATTER_DESCRIPTOR_OVERHEAD_BYTES = 1024


def plan_scatter_fold(scatter_partitions: int, cap: int | None, pairs: bool, want_value: bool) -> int:
    """D = 128 // P_s corners per scatter instruction (backward_scatter_fold) for P_s = 32 or
    64 chosen by the plan (no ``max_scatter_indices_per_indirect`` cap), without x-pairs; else 1."""
    if not want_value or pairs or cap != None or scatter_partitions not in FOLD_SCATTER_PARTITIONS:  # noqa: E711
        return 1
    return PARTITIONS // scatter_partitions


def scatter_dma_cost(problem: MSDAProblem, lnc: int, sets: int, groups: int,
                     scatter_partitions: int, fold: int = 1) -> float:
    """Estimated DMA-engine work of the grad_value path of one core, in bytes streamed by one
    DMA engine (lower is faster): zeroing and reducing the K = ceil(P_s / G) buffers of each
    set, spread over all DMA engines, plus the scatter. Every scatter read-modify-write runs on
    all 128 partitions (backward_live_rows) with P_s live rows; the other 128 - P_s rows are
    skipped but still cost their descriptor (docs/timing.md, "Skipped rows"), so one live
    descriptor carries 128 / P_s descriptors of overhead, spread over the 16 DMA engines;
    ``fold`` slices per instruction (backward_scatter_fold) divide that by ``fold``.

    Buffers: 2 * 4 B * sets * K * B * L * N_h * C_h (zero, then read once). Scatter: 4
    descriptors of 4 * C_h bytes per sample (x-pairs are two runs), B*N_q*N_h*N_l*N_p / lnc
    samples, each read and written, plus SCATTER_DESCRIPTOR_OVERHEAD_BYTES per descriptor
    issued (live or skipped).
    """
    p = problem
    k = -(-scatter_partitions // groups)
    rows = p.batch * p.total_pixels * p.num_heads
    buffers = 2 * 4 * sets * k * rows * p.head_dim / DMA_ENGINES
    descriptors = 4 * p.batch * p.num_queries * p.num_heads * p.num_levels * p.num_points / lnc
    issued = PARTITIONS / (scatter_partitions * fold)
    scatter = descriptors * (2 * 4 * p.head_dim + SCATTER_DESCRIPTOR_OVERHEAD_BYTES * issued) / DMA_ENGINES
    return buffers + scatter


def default_scatter_partitions(problem: MSDAProblem, lnc: int, sets: int, groups: int,
                               pairs: bool = True) -> int:
    """P_s with no cap: the power of two <= 128 of least :func:`scatter_dma_cost` (the larger
    on a tie). Few queries on a large map (decoders) take fewer partitions and buffers than
    128 (e.g. P_s = 64, K = 8 for a 900-query decoder on a 150x150 map, N_h = 8); the encoder
    shapes take 128. Where that leaves partitions idle (P_s < 128) and there are no x-pairs
    (``pairs`` False), P_s is chosen again below 128 with P_s = 32 and 64 priced folded
    (:func:`plan_scatter_fold`): the fold removes the idle rows' descriptors. Encoders keep
    P_s = 128 unfolded: there the fold would only trade buffer traffic for its SBUF copies,
    which loses where descriptors are dear (docs/kernels.md, "Folded scatter").
    """
    best = _least_cost(problem, lnc, sets, groups, PARTITIONS, False)
    if best < PARTITIONS and not pairs:
        best = _least_cost(problem, lnc, sets, groups, PARTITIONS // 2, True)
    return best


def _least_cost(problem: MSDAProblem, lnc: int, sets: int, groups: int, top: int, folded: bool) -> int:
    # A plain loop: torch.compile traces the planners (no min(..., key=...) there).
    best, best_cost = top, -1.0
    ps = top
    while ps >= 1:
        fold = plan_scatter_fold(ps, None, False, True) if folded else 1
        cost = scatter_dma_cost(problem, lnc, sets, groups, ps, fold)
        if best_cost < 0 or cost < best_cost:
            best, best_cost = ps, cost
        ps //= 2
    return best
