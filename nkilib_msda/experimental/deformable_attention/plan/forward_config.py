"""Frozen tiling plan of the MSDA forward kernel, computed before any instruction is emitted.

The forward kernel (``ms_deformable_attention.py``) puts queries on the 128 SBUF partitions.
One *tile* is up to 128 partitions; each partition holds ``q_pack`` consecutive queries, so a
tile's per-partition work is ``S = q_pack * N_h`` *slots* (query, head) times ``N_l * N_p``
samples times 4 bilinear corners.  Column ``k`` of a tile's index/weight tiles is
``((slot * N_l + level) * N_p + point) * 4 + corner``.

Everything the kernel allocates is described here, so the SBUF budget can be checked (and
unit-tested) in plain Python:

- coordinate scratch (single-buffered): ``COORD_SCRATCH_WORDS * n`` 4-byte words, ``n`` =
  samples per partition;
- per-tile buffers (``tile_bufs`` copies): fp32 corner weights and int32 corner bits
  (``4 n`` words each), the fp32 accumulator ``(S, C_h)``, and the row indices: uint32
  ``4 n`` words on the copy path; on the transpose path the indices of every DMA block of
  the tile, already in the order the indirect transposes read them (``index_words``), while
  the natural-order row indices are single-buffered scratch;
- gather buffers (``gather_bufs`` copies): the gathered rows (copy path: ``(group_cols, C_h)``
  in the value dtype, one per reduce group; transpose path: one
  ``(stack * C_t, dma_cols / stack * 128)`` transposed block per channel tile, one per DMA
  block) and the fp32 weighted product ``(group_cols, C_h)`` that one ``tensor_reduce``
  folds into the accumulator;

*Pipelining* (``tile_bufs >= 2``): the kernel prepares tile i + 1 (parameter loads,
coordinates, row indices) before it gathers and reduces tile i, and rotates the gather
buffers per DMA block, so that the gathers (software DGE on GpSimd, then the DMA engines)
of one block overlap the Tensor/Vector work of the previous one and the next tile's
coordinate math; the engines run their instructions in program order, so this order is
what lets them overlap.
- PSUM (transpose path): ``psum_bufs`` bank-sized blocks of ``psum_cols`` un-transposed
  columns ``(128, psum_cols, C_h)`` in the value dtype.

*Stacking* (transpose path, C_h <= 64): ``stack = 128 // C_h`` index columns share one
Tensor-engine transpose. A DMA block of ``dma_cols`` columns is gathered by ``stack``
indirect transposes (column ``d0 + i * stack + j`` by transpose ``j`` into partitions
``[j * C_h, (j + 1) * C_h)``), so one ``nc_transpose`` of ``(stack * C_h, 128)`` yields
``stack`` consecutive columns ``(128, stack * C_h)`` in PSUM: 4x fewer PE instructions at
C_h = 32 with the same descriptors.

A *reduce group* is either several whole slots (``group_cols = g * 4 N_l N_p``) or a piece of
one slot (pieces after the first add into the accumulator through a ``(128, C_h)`` scratch).
The search prefers big groups and DMA blocks (fewer instructions), then double buffering,
then the largest ``q_pack``; it raises a ValueError naming the SBUF limit when even the
smallest plan does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from nkilib_msda.hardware import (
    DMA_TRANSPOSE_MAX_FREE, FP32_EXACT_INT_MAX, INDEX_TILE_ALIGN_WORDS, PARTITIONS,
    PLANNER_SBUF_BUDGET, PSUM_BANK_BYTES, PSUM_BYTES)
from nkilib_msda.hardware import DTYPE_BYTES as _ALL_DTYPE_BYTES
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (build_sbuf_bytes,
                                                                          corner_block_supported)
from nkilib_msda.hardware import KERNEL_DTYPES, TWO_BYTE_FLOAT_DTYPES
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES, MSDAProblem

__all__ = [
    "ForwardConfig", "QueryTile", "ReduceGroup", "plan_forward", "TRN2_SBUF_BUDGET",
    "FP32_EXACT_INT_MAX", "PARTITIONS", "COORD_SCRATCH_WORDS", "DEFAULT_DMA_COLS",
    "MAX_Q_PACK", "PSUM_BANK_BYTES", "PSUM_BYTES", "TRANSPOSE_MAX_CHANNELS",
]

# The planners' one SBUF budget (nkilib_msda.hardware): trn2 usable SBUF minus the reserve.
TRN2_SBUF_BUDGET = PLANNER_SBUF_BUDGET["trn2"]
TRANSPOSE_MAX_CHANNELS = DMA_TRANSPOSE_MAX_FREE  # indirect dma_transpose: src.shape[-1] <= 128
# Index columns per indirect dma_transpose (1,024 indices). Smaller instructions start the
# DMA engines sooner after a tile's indices are ready (the software DGE builds one
# instruction's descriptors before its transfer starts); below 8 the per-instruction DGE
# cost makes GpSimd the bottleneck (modelled: docs/performance.md, issue 21 levers).
DEFAULT_DMA_COLS = 8
MAX_Q_PACK = 8
PROD_TARGET_BYTES = 32 * 1024     # preferred fp32 product block per reduce group
# Coordinate-phase scratch, in 4-byte words per sample: locations (2), attention (1), NaN
# mask (2), pixel coords (2), float floor (2), fraction (2), clamped corners (4), corner
# validity (4), corner factors (4).
COORD_SCRATCH_WORDS = 23
# The value dtypes the forward accepts, with their sizes.
DTYPE_BYTES = {name: _ALL_DTYPE_BYTES[name] for name in KERNEL_DTYPES}


@dataclass(frozen=True)
class QueryTile:
    """Queries [q_start, q_start + partitions * q_pack) on ``partitions`` partitions."""

    q_start: int
    partitions: int
    q_pack: int

    @property
    def num_queries(self) -> int:
        return self.partitions * self.q_pack


@dataclass(frozen=True)
class ReduceGroup:
    """Columns [col0, col0 + cols) of slots [slot0, slot0 + slots), reduced by one
    tensor_reduce; ``slots == 1`` and ``cols < cols_per_slot`` is a piece of one slot."""

    slot0: int
    slots: int
    col0: int
    cols: int
    first_piece: bool


@dataclass(frozen=True)
class ForwardConfig:
    """Tiling plan for one forward call (plain Python values only)."""

    problem: MSDAProblem
    value_dtype: str
    lnc: int
    gather_method: str            # resolved: "transpose" or "copy"
    q_pack: int                   # queries per partition in full tiles
    dma_cols: int                 # index columns per DMA block (copy path: 1)
    stack: int                    # columns per PE transpose (1 for copy or C_h > 64)
    group_cols_max: int           # columns per reduce group (whole slots or a slot piece)
    psum_cols: int                # columns per PSUM block (transpose path)
    channel_tiles: tuple[tuple[int, int], ...]
    tile_bufs: int
    gather_bufs: int
    psum_bufs: int
    corner_blocks: bool = False   # corner-block value layout (plan/corner_plan.py)

    # -- derived sizes ---------------------------------------------------------------------
    @property
    def dma_cols_per_instruction(self) -> int:
        """Index columns (of 128 indices) consumed by one indirect DMA instruction."""
        return -(-self.dma_cols // self.stack)

    @property
    def cols_per_slot(self) -> int:
        """4 * N_l * N_p index columns per (query, head)."""
        return 4 * self.problem.num_levels * self.problem.num_points

    def slots(self, q_pack: int) -> int:
        return q_pack * self.problem.num_heads

    def samples(self, q_pack: int) -> int:
        """Samples per partition: q_pack * N_h * N_l * N_p."""
        return self.slots(q_pack) * self.problem.num_levels * self.problem.num_points

    @property
    def value_bytes(self) -> int:
        return DTYPE_BYTES[self.value_dtype]

    # -- query tiling ----------------------------------------------------------------------
    def core_range(self, core: int) -> tuple[int, int]:
        """Queries [lo, hi) of logical core ``core``: ceil(N_q / lnc) per core."""
        per_core = -(-self.problem.num_queries // self.lnc)
        lo = min(core * per_core, self.problem.num_queries)
        return lo, min(lo + per_core, self.problem.num_queries)

    def tiles(self, q_lo: int, q_hi: int) -> tuple[QueryTile, ...]:
        """Packed tiles over [q_lo, q_hi) then the < q_pack leftover queries with q_pack 1."""
        out = []
        count = q_hi - q_lo
        qp = self.q_pack
        packs = count // qp
        q = q_lo
        while packs > 0:
            parts = min(PARTITIONS, packs)
            out.append(QueryTile(q, parts, qp))
            q += parts * qp
            packs -= parts
        if q < q_hi:
            out.append(QueryTile(q, q_hi - q, 1))
        return tuple(out)

    # -- gather plan -----------------------------------------------------------------------
    def reduce_groups(self, q_pack: int) -> tuple[ReduceGroup, ...]:
        cps = self.cols_per_slot
        num_slots = self.slots(q_pack)
        groups = []
        if self.group_cols_max >= cps:
            per = self.group_cols_max // cps
            for s in range(0, num_slots, per):
                n = min(per, num_slots - s)
                groups.append(ReduceGroup(s, n, s * cps, n * cps, True))
        else:
            for s in range(num_slots):
                for c in range(0, cps, self.group_cols_max):
                    n = min(self.group_cols_max, cps - c)
                    groups.append(ReduceGroup(s, 1, s * cps + c, n, c == 0))
        return tuple(groups)

    @staticmethod
    def blocks(col0: int, cols: int, block: int) -> tuple[tuple[int, int], ...]:
        """Split columns [col0, col0 + cols) into (start, count) blocks of <= block."""
        return tuple((c, min(block, col0 + cols - c)) for c in range(col0, col0 + cols, block))

    def dma_blocks(self, q_pack: int) -> tuple[tuple[int, int], ...]:
        """Every DMA block ``(d0, dn)`` of a tile, group by group in column order; block ``i``
        keeps its transposed indices at ``i * index_region`` of the tile's index tile."""
        return tuple(blk for grp in self.reduce_groups(q_pack)
                     for blk in self.blocks(grp.col0, grp.cols, self.dma_cols))

    @property
    def index_stride(self) -> int:
        """uint32 words between the index tiles of consecutive transposes of a DMA block:
        ``dma_cols_per_instruction`` rounded up to INDEX_TILE_ALIGN_WORDS, so every multi-column
        index tile starts 16-byte aligned (as AWS allocates its batched index tiles); one
        column per transpose needs no padding (AWS addresses single columns at any offset)."""
        m = self.dma_cols_per_instruction
        return m if m == 1 else -(-m // INDEX_TILE_ALIGN_WORDS) * INDEX_TILE_ALIGN_WORDS

    @property
    def index_region(self) -> int:
        """uint32 words of one DMA block's transposed indices: ``stack`` ``[128,
        dma_cols_per_instruction]`` index tiles, ``index_stride`` words apart."""
        return self.stack * self.index_stride

    def index_words(self, q_pack: int) -> int:
        """uint32 words per partition of a tile's transposed indices (transpose path):
        ``len(dma_blocks(q_pack)) * index_region``, counted without listing the blocks."""
        def blocks(cols: int) -> int:
            return -(-cols // self.dma_cols)

        cps, slots, group = self.cols_per_slot, self.slots(q_pack), self.group_cols_max
        if group >= cps:
            full, rest = divmod(slots, group // cps)
            count = full * blocks(group // cps * cps) + (blocks(rest * cps) if rest else 0)
        else:
            full, rest = divmod(cps, group)
            count = slots * (full * blocks(group) + (blocks(rest) if rest else 0))
        return count * self.index_region

    @property
    def pipelined(self) -> bool:
        """Whether the kernel prepares tile i + 1 (coordinates, indices) before it gathers and
        reduces tile i: needs two copies of the per-tile buffers."""
        return self.tile_bufs >= 2

    # -- budgets ---------------------------------------------------------------------------
    def sbuf_buffers(self) -> dict[str, tuple[int, int]]:
        """name -> (bytes per partition of one copy, copies) for every SBUF allocation."""
        p = self.problem
        n = self.samples(self.q_pack)
        c = p.head_dim
        out = {
            "coord_scratch": (COORD_SCRATCH_WORDS * n * 4, 1),
            "head_offsets": (self.slots(self.q_pack) * 8, 1),
            "padding_marks": (8, 1),
            # Transpose path: the row indices are read only while preparing the tile (into
            # the per-tile transposed index tile), so one copy serves every tile.
            "indices": (4 * n * 4, self.tile_bufs if self.gather_method == "copy" else 1),
            "weights": (4 * n * 4, self.tile_bufs),
            "corner_bits": (4 * n * 4, self.tile_bufs),
            "accumulator": (self.slots(self.q_pack) * c * 4, self.tile_bufs),
            "product": (self.group_cols_max * c * 4, self.gather_bufs),
            "piece_sum": (c * 4 if self.group_cols_max < self.cols_per_slot else 0, 1),
        }
        if self.gather_method == "copy":
            out["gathered"] = (self.group_cols_max * c * self.value_bytes, self.gather_bufs)
        else:
            out["gathered_t"] = (len(self.channel_tiles) * self.dma_cols_per_instruction
                                 * PARTITIONS * self.value_bytes, self.gather_bufs)
            out["transpose_indices"] = (self.index_words(self.q_pack) * 4, self.tile_bufs)
        if self.corner_blocks:
            out["corner_build"] = (build_sbuf_bytes(p, self.value_dtype), 1)
        return out

    @property
    def sbuf_bytes(self) -> int:
        """Peak SBUF bytes per partition of everything the kernel allocates."""
        return sum(size * copies for size, copies in self.sbuf_buffers().values())

    @property
    def psum_bytes(self) -> int:
        if self.gather_method == "copy":
            return 0
        return self.psum_bufs * PSUM_BANK_BYTES

    def describe(self) -> str:
        return (f"ForwardConfig(gather={self.gather_method}, q_pack={self.q_pack}, "
                f"dma_cols={self.dma_cols}, stack={self.stack}, "
                f"group_cols={self.group_cols_max}, "
                f"psum_cols={self.psum_cols}, channel_tiles={len(self.channel_tiles)}, "
                f"bufs tile/gather/psum={self.tile_bufs}/{self.gather_bufs}/{self.psum_bufs}, "
                f"sbuf={self.sbuf_bytes} B/partition of {TRN2_SBUF_BUDGET})")


def _resolve_gather_method(gather_method: str, value_dtype: str, head_dim: int) -> str:
    if gather_method not in ("transpose", "copy"):
        raise ValueError(f"gather_method: expected 'transpose' or 'copy', got {gather_method!r}")
    if value_dtype not in DTYPE_BYTES:
        raise TypeError(f"value: expected dtype bfloat16, float16 or float32, got {value_dtype}")
    if gather_method == "transpose" and value_dtype not in TWO_BYTE_FLOAT_DTYPES:
        return "copy"  # the indirect dma_transpose moves 2-byte elements only
    if gather_method == "transpose" and head_dim * DTYPE_BYTES[value_dtype] > PSUM_BANK_BYTES:
        raise ValueError(
            f"gather_method='transpose': C_h * dtype bytes must fit one 2 KiB PSUM bank "
            f"(C_h <= {PSUM_BANK_BYTES // DTYPE_BYTES[value_dtype]}), got C_h={head_dim}; "
            "use gather_method='copy'")
    return gather_method


def _plan_maker(problem: MSDAProblem, value_dtype: str, lnc: int, method: str,
                corner_blocks: bool = False) -> Callable[[int, int, int, int, int], ForwardConfig]:
    """``make(q_pack, group, dma, tile_bufs, gather_bufs)``: one candidate forward plan."""
    c = problem.head_dim
    vbytes = DTYPE_BYTES[value_dtype]
    stack = PARTITIONS // c if method == "transpose" and 2 * c <= PARTITIONS else 1
    psum_cols = 1
    if method == "transpose":
        psum_cols = max(1, PSUM_BANK_BYTES // (c * vbytes) // stack) * stack
    base: dict[str, Any] = dict(problem=problem, value_dtype=value_dtype, lnc=lnc, gather_method=method,
                channel_tiles=_channel_tiles(c) if method == "transpose" else ((0, c),),
                psum_bufs=2 if method == "transpose" else 0, corner_blocks=corner_blocks)

    def make(q_pack: int, group: int, dma: int, tile_bufs: int, gather_bufs: int) -> ForwardConfig:
        dma_cols = 1 if method == "copy" else min(dma * stack, group)
        return ForwardConfig(q_pack=q_pack, dma_cols=dma_cols, stack=stack, group_cols_max=group,
                             psum_cols=min(psum_cols, group), tile_bufs=tile_bufs,
                             gather_bufs=gather_bufs, **base)

    return make


def _largest_fitting_head_dim(problem: MSDAProblem, value_dtype: str, lnc: int, method: str,
                              sbuf_budget: int) -> int:
    """The largest C_h below ``problem.head_dim`` whose smallest ``method`` plan fits
    ``sbuf_budget`` (0: none), by bisection (the need grows with C_h); for error messages."""
    def fits(head_dim: int) -> bool:
        smaller = replace(problem, head_dim=head_dim)
        return _plan_maker(smaller, value_dtype, lnc, method)(1, 1, 1, 1, 1).sbuf_bytes <= sbuf_budget

    lo, hi = 0, problem.head_dim - 1  # the answer lies in [lo, hi]; 0 means none fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _channel_tiles(head_dim: int) -> tuple[tuple[int, int], ...]:
    return tuple((c, min(c + TRANSPOSE_MAX_CHANNELS, head_dim))
                 for c in range(0, head_dim, TRANSPOSE_MAX_CHANNELS))


def _group_candidates(cols_per_slot: int, num_slots: int, head_dim: int) -> list[int]:
    """Reduce-group sizes in columns, largest first: whole-slot multiples, then slot pieces."""
    target = max(1, PROD_TARGET_BYTES // (head_dim * 4))
    cands = []
    g = num_slots
    while g >= 1:
        if g * cols_per_slot <= max(target, cols_per_slot):
            cands.append(g * cols_per_slot)
        g //= 2
    piece = cols_per_slot // 2
    while piece >= 1:
        cands.append(piece)
        piece //= 2
    if cols_per_slot * head_dim * 4 > PROD_TARGET_BYTES:  # big slots: start from the target
        cands = [c for c in cands if c <= max(target, 1)] or [1]
    return sorted(set(cands), reverse=True)


def plan_forward(problem: MSDAProblem, value_dtype: str, lnc: int = 1,
                 gather_method: str = "transpose",
                 max_indices_per_indirect: Optional[int] = None,
                 sbuf_budget: int = TRN2_SBUF_BUDGET,
                 max_q_pack: int = MAX_Q_PACK, corner_blocks: bool = False) -> ForwardConfig:
    """Choose the forward tiling for ``problem`` (see the module docstring). ``corner_blocks``:
    plan the corner-block gather (resolved by ``corner_plan.resolve_gather_layout``): its
    build tiles are reserved and every DMA block holds whole samples (4 columns)."""
    if lnc not in (1, 2):
        raise ValueError(f"lnc: expected 1 or 2 logical cores, got {lnc}")
    if problem.padding_mode not in KERNEL_PADDING_MODES:
        raise ValueError(f"padding_mode: expected 'zeros' or 'border' for the NKI kernel, "
                         f"got {problem.padding_mode!r}")
    rows = problem.total_pixels * problem.num_heads
    if rows >= FP32_EXACT_INT_MAX:
        raise ValueError(
            f"value: row indices L * N_h = {problem.total_pixels} * {problem.num_heads} = {rows} "
            f"must stay below 2^24 = {FP32_EXACT_INT_MAX} (fp32-exact index arithmetic)")
    method = _resolve_gather_method(gather_method, value_dtype, problem.head_dim)
    cps = 4 * problem.num_levels * problem.num_points
    # `== None`, not `is None`: NKI 0.3-0.6 rejects `is` in code that kernels call.
    if max_indices_per_indirect != None:  # noqa: E711
        cap = max_indices_per_indirect
        if not isinstance(cap, int) or isinstance(cap, bool):
            raise TypeError(f"max_indices_per_indirect: expected an int or None, "
                            f"got {max_indices_per_indirect!r}")
        if max_indices_per_indirect < PARTITIONS:
            raise ValueError(f"max_indices_per_indirect: expected >= {PARTITIONS} (one index "
                             f"column of 128 partitions), got {max_indices_per_indirect}")
    dma_cap = (DEFAULT_DMA_COLS if max_indices_per_indirect == None  # noqa: E711
               else max_indices_per_indirect // PARTITIONS)
    c = problem.head_dim
    if corner_blocks and (method != "transpose" or not corner_block_supported(problem, value_dtype)):
        raise ValueError(f"corner_blocks: expected the transpose gather of a supported shape "
                         f"(corner_plan.corner_block_supported), got gather {method!r}, value "
                         f"dtype {value_dtype}, C_h={c}")
    make = _plan_maker(problem, value_dtype, lnc, method, corner_blocks)
    groups = [g for g in _group_candidates(cps, problem.num_heads, c)
              if not corner_blocks or g % 4 == 0]

    chosen = None
    for tile_bufs, gather_bufs in ((2, 2), (1, 2), (1, 1)):
        for group in groups:
            dma = dma_cap
            while dma >= 1:
                cfg = make(1, group, dma, tile_bufs, gather_bufs)
                if cfg.sbuf_bytes <= sbuf_budget:
                    chosen = cfg
                    break
                dma //= 2
            if chosen:
                break
        if chosen:
            break
    if not chosen:
        smallest = make(1, 1, 1, 1, 1)
        samples = problem.num_heads * problem.num_levels * problem.num_points
        largest = _largest_fitting_head_dim(problem, value_dtype, lnc, method, sbuf_budget)
        advice = (f"the largest C_h that fits with these samples is {largest}" if largest
                  else "reduce N_h, N_l or N_p")
        raise ValueError(
            f"MSDA forward does not fit SBUF: even the smallest plan needs "
            f"{smallest.sbuf_bytes:,} B per partition > budget {sbuf_budget:,} B "
            f"(N_h * N_l * N_p = {samples} samples per query, C_h = {c}); {advice}")
    # Grow q_pack while it fits and every core still fills whole 128-partition tiles.
    local_q = -(-problem.num_queries // lnc)
    q_pack = 1
    while (q_pack * 2 <= max_q_pack and local_q >= q_pack * 2 * PARTITIONS):
        bigger = make(q_pack * 2, chosen.group_cols_max, chosen.dma_cols_per_instruction,
                      chosen.tile_bufs,
                      chosen.gather_bufs)
        if bigger.sbuf_bytes > sbuf_budget:
            break
        q_pack *= 2
        chosen = bigger
    return chosen
