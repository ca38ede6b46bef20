"""Plain-Python tiling, scatter and SBUF plan of the MSDA backward kernel.

Everything the backward kernel (``ms_deformable_attention_bwd.py``) needs to know before it
emits an instruction is computed here, in a frozen :class:`BackwardConfig`, so that it can be
unit-tested without NKI.

Partition layout ("sample rows")
--------------------------------
The kernel puts one *sample row* ``(q, h, l)`` on each partition: the flat row
``r = (q*N_h + h)*N_l + l`` of sampling_locations viewed as (B, N_q*N_h*N_l, N_p[, 2]); the
N_p points (and 4 corners) of that row live in the free dims. A *block* is
``Q_t = 128 // G`` whole queries (G = N_h*N_l), i.e. ``P_t = Q_t*G <= 128`` partitions, so
partition j of every block has the same (h, l) = divmod(j mod G, N_l): per-level constants
(W, H, level start) are per-partition columns computed once. ``blocks_per_tile`` (T) blocks
are processed together in the free dims ("super-tile") so the coordinate math runs once per
T*N_p samples per partition. Loads and stores are contiguous runs of sample rows.

Channel tiles
-------------
grad_output rows, the per-block products and the gathered rows hold ``C_t`` channels (C_h
whenever that fits SBUF, else one pass per channel tile): ``backward_tiling`` plans them and
lists the SBUF tiles. Only N_p stays bounded (the per-sample tiles); the error says how many
points fit.

Gathers and scatters work on 128-row (rows, C_h) views of value / the K buffers, in ROW units
(BLNC row = pix*N_h + h, BNLC row = h*L + pix; the batch goes into the access-pattern
offset), so indices are exact fp32 integers as long as K*L*N_h < 2^24 (checked; beyond it the
scatter partitions per DMA shrink, and L*N_h >= 2^24 raises ValueError).

Scatter uniqueness (K replicated fp32 buffers)
----------------------------------------------
One ``dma_compute`` scatter-RMW covers a partition slice [j0, j0+P_s) (P_s a power of two
dividing 128: ``max_scatter_indices_per_indirect`` <= 128 sets it) of one block, one index
per partition. Partition j adds into buffer ``k(j) = floor((j - j0)/G)``, so
``K = ceil(P_s/G)`` (P_s = 128: N_h=8, N_l=4 gives K=4; N_h=4, N_l=4 gives K=8, as upstream).
With no cap, P_s is the power of two whose estimated DMA work (buffers' zero + reduce
bytes against the scatter's serial read-modify-writes, :func:`scatter_dma_cost`) is
least (``backward_scatter_plan``; e.g. P_s = 64, K = 8 for a 900-query decoder on a 150x150
map, N_h = 8), or the K of a given ``grad_value_buffers_in``. Proof that the
targets ``k*R + row`` (``0 <= row < R = L*N_h``) of one instruction are distinct: equal k
means floor((j1-j0)/G) = floor((j2-j0)/G), so 0 < |j1 - j2| < G and the two partitions carry
different (h, l) (blocks start at multiples of G). Different h: BLNC rows differ mod N_h,
BNLC rows lie in disjoint bands [h*L, (h+1)*L). Same h, different l: the clamped pixel of
level l lies in [ls_l, ls_l + H_l*W_l), and those ranges are disjoint. Hence the rows differ.
Every scatter instruction covers all 128 partitions from partition 0; the partitions outside
its slice (and beyond a partial block's n live ones) carry an out-of-range index and are
skipped (``oob_mode.skip``, ``backward_live_rows``), so they write nothing and add no
duplicate targets. The emulator re-checks uniqueness on every instruction.

Batching (> 128 indices per DMA): a (P, M) multi-column index tile is documented only for
``dma_transpose`` (docs/kernels.md, "Backward"), so scatters and copy-gathers batch along the free dims
instead: with no cap or a cap >= 256, one index moves the x-corner pair (x0, x1) of one
(point, y-corner). By default only where the pair is one contiguous ``2*C_h`` run ``[[C_h, P],
[1, 2*C_h]]`` (BNLC with one channel tile), the form AWS uses; ``strided_pairs=True`` also
plans the two-run form ``[[C_h, P], [d*C_h, 2], [1, C_t]]`` (d = N_h in BLNC), a three-level
indirect pattern no NKI page documents (``BackwardConfig.row_pattern``). The pair starts at ``min(x0c, W-2)`` so both
runs stay inside the level's image row; each corner goes to slot ``x_c - start`` (0 or 1),
slot coefficients are summed per slot, and corners of weight 0 may add 0.0 to the other slot.
The two rows of a pair are distinct and belong to the partition's own (h, l), so the proof
above still holds and K does not grow. Levels of width 1 disable pairs. Transpose gathers
batch M_g index columns per DMA (documented), capped by upstream's packet limit 64 // r.

Buffers are fp32 (never the value dtype: every RMW would round the running sum), laid out
per set as (B, lnc*K, R, C_h) with rows in the value layout's order; core s owns
[s*K, (s+1)*K). Per-batch regions make B > 1 exact without cumulative-sum subtraction. They
are zeroed once per call (unless ``grad_value_buffers_in`` is given), reduced in a fixed
order with ``dma_compute`` (<= 16 sources, scales 1.0) into fp32 SBUF tiles, then
``prev_reduced_grad_value`` is subtracted on the Vector engine and the result cast once to
the value dtype. With LNC=2 a ``core_barrier`` separates the scatters from the row-banded
reduction (core s reduces band s of every batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nkilib_msda.experimental.deformable_attention.plan.backward_scatter_plan import (default_scatter_partitions,
                                                                                      plan_scatter_fold)
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (build_sbuf_bytes,
                                                                           resolve_gather_layout)
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import (
    SbufTiles, channel_tile_widths, fit_sbuf, pad_columns, sbuf_bytes, sbuf_tiles,
    transpose_chunks,
    transpose_gather_columns)
from nkilib_msda.hardware import (DTYPE_BYTES, FP32_EXACT_INT_MAX, KERNEL_DTYPES, PARTITIONS,
                                  PLANNER_SBUF_BUDGET, PSUM_BANK_BYTES)
from nkilib_msda.validation.arguments import check_positive_int
from nkilib_msda.validation.msda import MSDAProblem

MAX_SCATTER_BUFFER_SETS = 8
# AWS's backward asserts num_scatter_buffers <= 2 when C_h > 256: "the Step 17 reduce races
# the still-draining indirect scatters" (nki-library ms_deformable_attention_bwd.py, config).
# No page documents the DMA ordering that would rule this out for us, so the same cap applies.
MAX_WIDE_SCATTER_SETS = 2
WIDE_SCATTER_HEAD_DIM = 256
# The planners' one SBUF budget (nkilib_msda.hardware); the kernel passes its target's.
TRN2_SBUF_BUDGET = PLANNER_SBUF_BUDGET["trn2"]
GATHER_METHODS = ("transpose", "copy")
# Per-block scatter data tiles of the unfolded scatter, where the SBUF left by the fitted
# tiles holds them (never at the cost of blocks or channels): with one tile the Vector
# engine's next block waits for the previous block's last scatter DMA (write-after-read),
# which serialises the Vector and GpSimd work of every block (docs/kernels.md, "Pipelining the backward").
SCATTER_WORK_BUFS = 2
PAIR_MIN_INDICES = 2 * PARTITIONS  # a cap of >= 256 indices lets one index move an (x0, x1) pair


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def _check_cap(name: str, cap: int | None) -> None:
    if cap == None:  # noqa: E711
        return
    check_positive_int(name, cap)


@dataclass(frozen=True)
class BackwardConfig:
    """Static plan of one backward call (see the module docstring for the meaning)."""

    problem: MSDAProblem
    lnc: int
    value_itemsize: int
    # partition layout
    groups: int                      # G = N_h*N_l sample rows per query
    queries_per_block: int           # Q_t
    partitions_per_block: int        # P_t = Q_t*G
    blocks_per_tile: int             # T
    # gather
    gather_method: str               # effective method ("copy" for 4-byte values)
    gather_partitions: int           # P_g: partitions per gather DMA (copy path may be < 128)
    gather_columns: int              # M_g: index columns per transpose gather DMA
    gather_pairs: bool               # copy path: one index fetches the (x0, x1) corner pair
    channel_tiles: tuple[tuple[int, int], ...]  # (c0, c): one gather/scatter pass per channel tile
    psum_columns: int                # transposed columns per PSUM bank
    # scatter
    scatter_partitions: int          # P_s
    scatter_pairs: bool              # one index writes the (x0, x1) corner pair
    k_base: int
    num_buffers: int                 # K per core
    scatter_sets: int                # S (round robin over DMAs)
    # flags
    compute_grad_value: bool
    compute_grad_sampling_locations: bool
    compute_grad_attention_weights: bool
    # memory plan
    sbuf_budget: int
    sbuf_tiles: SbufTiles = field(repr=False)
    # D = 128 // P_s corners of a P_s-partition slice per scatter instruction (1: one column of
    # 128 partitions per instruction; backward_scatter_fold)
    scatter_fold: int = 1
    # gathers read the corner-block scratch: one 4*C_h run per sample (backward_corner_blocks)
    corner_blocks: bool = False
    # per-block scatter data tiles the unfolded scatter takes in turn (``work`` and the
    # ``swork`` copies; pipelined: the ``swork`` copies, 2..T): the next block's data is
    # written while the last blocks' scatters read theirs
    scatter_work_bufs: int = 1
    # super-tile i + 1's loads, coordinates and gathers are emitted before super-tile i's
    # scatter data and scatters (docs/kernels.md, "Pipelining the backward")
    pipelined: bool = False

    # ----------------------------------------------------------------- derived sizes
    @property
    def rows_per_batch(self) -> int:
        """R = L*N_h rows of C_h in one batch of value / one buffer."""
        return self.problem.total_pixels * self.problem.num_heads

    @property
    def columns_per_block(self) -> int:
        """4*N_p gather/scatter columns (point, corner) per sample row."""
        return 4 * self.problem.num_points

    @property
    def gather_index_columns(self) -> int:
        """Gather index columns per sample row and block: N_p cells (corner blocks) or the
        4*N_p corners."""
        return self.problem.num_points if self.corner_blocks else self.columns_per_block

    @property
    def gather_channels(self) -> int:
        """Channels of the widest transpose of one gathered index: 4*C_h (a corner block) or
        <= 128 of a channel tile."""
        if self.corner_blocks:
            return 4 * self.problem.head_dim
        return max(c for _, c in transpose_chunks(self.channel_tile_width))

    @property
    def channel_tile_width(self) -> int:
        """C_t: channels of the widest channel tile (the free size of grad, work, gathered)."""
        return max(c for _, c in self.channel_tiles)

    @staticmethod
    def transpose_chunks(width: int) -> tuple[tuple[int, int], ...]:
        """(offset, channels) <= 128 channels per dma_transpose within a channel tile of ``width``."""
        return transpose_chunks(width)

    @property
    def needs_gather(self) -> bool:
        return self.compute_grad_sampling_locations or self.compute_grad_attention_weights

    @property
    def total_buffers(self) -> int:
        """lnc*K buffers per batch and per set."""
        return self.lnc * self.num_buffers

    @property
    def buffer_shape(self) -> tuple[int, int, int, int]:
        """One buffer set: (B, lnc*K, R, C_h) fp32."""
        return (self.problem.batch, self.total_buffers, self.rows_per_batch, self.problem.head_dim)

    @property
    def iota_k_scale_shape(self) -> tuple[int, int]:
        """(128, 1) int32: row offset k(j)*R of the buffer partition j of a block scatters into."""
        return (PARTITIONS, 1)

    def row_pattern(self, width: int, pair: bool) -> list[list[int]]:
        """Access pattern (row units of the (rows, C_h) view, 128 partitions) of one indirect
        gather/scatter row of ``width`` channels, or of an x-corner pair: one contiguous
        ``2*C_h`` run when the pair rows are adjacent (BNLC) and the tile is all C_h channels,
        else the three-level form that only ``strided_pairs`` plans."""
        c_h = self.problem.head_dim
        if not pair:
            return [[c_h, PARTITIONS], [1, width]]
        step = self.problem.num_heads if self.problem.value_layout == "BLNC" else 1
        if step == 1 and width == c_h:
            return [[c_h, PARTITIONS], [1, 2 * c_h]]
        return [[c_h, PARTITIONS], [step * c_h, 2], [1, width]]

    @property
    def pair_mode(self) -> bool:
        return self.gather_pairs or self.scatter_pairs

    @property
    def max_scatter_index(self) -> int:
        return self.num_buffers * self.rows_per_batch - 1

    @property
    def queries_per_core(self) -> int:
        return -(-self.problem.num_queries // self.lnc)

    def core_queries(self, core: int) -> tuple[int, int]:
        """[start, stop) queries of each batch handled by ``core``."""
        start = min(core * self.queries_per_core, self.problem.num_queries)
        return start, min(start + self.queries_per_core, self.problem.num_queries)

    def super_tiles(self, core: int) -> list[tuple[int, int, int]]:
        """(first query, blocks, partitions) of each super-tile of one batch on ``core``.

        Full blocks are grouped T at a time; a trailing partial block is its own tile.
        """
        q0, q1 = self.core_queries(core)
        tiles = []
        full_blocks, rest = divmod(q1 - q0, self.queries_per_block)
        for first in range(0, full_blocks, self.blocks_per_tile):
            blocks = min(self.blocks_per_tile, full_blocks - first)
            tiles.append((q0 + first * self.queries_per_block, blocks, self.partitions_per_block))
        if rest:
            tiles.append((q0 + full_blocks * self.queries_per_block, 1, rest * self.groups))
        return tiles

    def reduce_bands(self, core: int) -> tuple[int, int]:
        """[start, stop) flat elements of one batch's (R, C_h) map reduced by ``core``."""
        total = self.rows_per_batch * self.problem.head_dim
        per_core = -(-total // self.lnc)
        start = min(core * per_core, total)
        return start, min(start + per_core, total)

    @property
    def sbuf_bytes_per_partition(self) -> int:
        return sbuf_bytes(self.sbuf_tiles)

    @property
    def scratch_hbm_bytes(self) -> int:
        """Bytes of the fp32 K-buffer sets (0 when grad_value is not computed)."""
        if not self.compute_grad_value:
            return 0
        b, kk, r, c = self.buffer_shape
        return self.scatter_sets * b * kk * r * c * 4

    def describe(self) -> dict:
        """Plain dict for reports."""
        return {
            "G": self.groups, "Q_t": self.queries_per_block, "P_t": self.partitions_per_block,
            "T": self.blocks_per_tile, "C_t": self.channel_tile_width,
            "channel_tiles": len(self.channel_tiles), "gather_method": self.gather_method,
            "P_g": self.gather_partitions, "M_g": self.gather_columns,
            "pairs_g": self.gather_pairs, "P_s": self.scatter_partitions,
            "pairs_s": self.scatter_pairs, "K_base": self.k_base,
            "K": self.num_buffers, "S": self.scatter_sets, "fold": self.scatter_fold, "lnc": self.lnc,
            "corner_blocks": self.corner_blocks,
            "sbuf_bytes_per_partition": self.sbuf_bytes_per_partition,
            "scratch_hbm_bytes": self.scratch_hbm_bytes,
        }




def plan_backward(
    problem: MSDAProblem,
    value_dtype: str,
    lnc: int = 1,
    gather_method: str = "transpose",
    max_gather_indices_per_indirect: int | None = None,
    max_scatter_indices_per_indirect: int | None = None,
    num_scatter_buffers: int | None = None,
    compute_grad_value: bool = True,
    compute_grad_sampling_locations: bool = True,
    compute_grad_attention_weights: bool = True,
    sbuf_budget: int = TRN2_SBUF_BUDGET,
    buffers_per_core: int | None = None,
    strided_pairs: bool = False,
    gather_layout: str = "auto",
) -> BackwardConfig:
    """Check the tuning knobs and plan one backward call; raises ValueError on bad knobs.

    ``buffers_per_core``: K of a given ``grad_value_buffers_in`` (with no scatter cap the
    plan then reuses that K instead of choosing one from the problem size).
    ``strided_pairs``: also use x-corner pairs whose two rows are not one contiguous run (BLNC,
    or a channel tile narrower than C_h): a three-level indirect pattern that no NKI page
    documents and AWS's kernels never use (docs/conformance.md), so off by default.
    ``gather_layout``: "auto", "four-corner" or "corner-block", the forward's choice
    (``corner_plan.resolve_gather_layout``) applied to the gathers; it changes nothing when no
    gather runs (only grad_value wanted) or where the C_h-wide tiles need channel tiles.
    """
    if lnc not in (1, 2):
        raise ValueError(f"lnc: expected 1 or 2 logical cores, got {lnc!r}")
    if gather_method not in GATHER_METHODS:
        raise ValueError(f"gather_method: expected one of {list(GATHER_METHODS)}, got {gather_method!r}")
    _check_cap("max_gather_indices_per_indirect", max_gather_indices_per_indirect)
    _check_cap("max_scatter_indices_per_indirect", max_scatter_indices_per_indirect)
    if num_scatter_buffers != None and (  # noqa: E711
            isinstance(num_scatter_buffers, bool) or not isinstance(num_scatter_buffers, int)
            or not 1 <= num_scatter_buffers <= MAX_SCATTER_BUFFER_SETS):
        raise ValueError(f"num_scatter_buffers: expected None or an int in [1, {MAX_SCATTER_BUFFER_SETS}], "
                         f"got {num_scatter_buffers!r}")
    if num_scatter_buffers != None and num_scatter_buffers > MAX_WIDE_SCATTER_SETS and (  # noqa: E711
            problem.head_dim > WIDE_SCATTER_HEAD_DIM):
        raise ValueError(f"num_scatter_buffers: expected at most {MAX_WIDE_SCATTER_SETS} buffer sets for "
                         f"C_h > {WIDE_SCATTER_HEAD_DIM} (AWS's cap: the reduce can race still-draining "
                         f"scatters), got {num_scatter_buffers} with C_h = {problem.head_dim}")
    flags = (compute_grad_value, compute_grad_sampling_locations, compute_grad_attention_weights)
    if not any(flags):
        raise ValueError("compute_grad_value, compute_grad_sampling_locations, compute_grad_attention_weights: "
                         "expected at least one True, got all False")
    if value_dtype not in KERNEL_DTYPES:
        raise ValueError(f"value: expected dtype float32, bfloat16 or float16, got {value_dtype}")
    itemsize = DTYPE_BYTES[value_dtype]

    n_h, n_l, n_p, c_h = problem.num_heads, problem.num_levels, problem.num_points, problem.head_dim
    groups = n_h * n_l
    if groups > PARTITIONS:
        raise ValueError(f"num_heads*num_levels: expected at most {PARTITIONS} (one query's sample rows must fit "
                         f"the partitions), got {n_h}*{n_l} = {groups}")
    rows = problem.total_pixels * n_h
    if rows >= FP32_EXACT_INT_MAX:
        raise ValueError(f"value: L*N_h = {rows} rows per batch exceeds the fp32-exact index limit 2^24 = "
                         f"{FP32_EXACT_INT_MAX} (L = {problem.total_pixels}, N_h = {n_h})")
    queries_per_block = PARTITIONS // groups
    cols = 4 * n_p
    # x-pairs only as one contiguous 2*C_h run (BNLC, one channel tile) unless strided_pairs
    pairs_possible = min(w for _, w in problem.spatial_shapes) >= 2 and (
        bool(strided_pairs) or problem.value_layout == "BNLC")

    # gather plan
    method = "copy" if itemsize == 4 else gather_method
    want_gather = compute_grad_sampling_locations or compute_grad_attention_weights
    corner_blocks = resolve_gather_layout(gather_layout, problem, value_dtype, lnc, method) and want_gather
    cap = max_gather_indices_per_indirect
    gather_partitions, gather_columns, gather_pairs = PARTITIONS, 1, False
    if cap != None and cap < PARTITIONS:  # noqa: E711
        if method == "transpose":
            raise ValueError(f"max_gather_indices_per_indirect: the transpose gather needs at least {PARTITIONS} "
                             f"indices per DMA, got {cap}; use gather_method='copy' for smaller caps")
        gather_partitions = _pow2_floor(cap)
    elif method == "transpose":
        gather_columns = transpose_gather_columns(cols, c_h, cap)
    else:
        gather_pairs = (cap == None or cap >= PAIR_MIN_INDICES) and pairs_possible  # noqa: E711
    # scatter plan
    cap = max_scatter_indices_per_indirect
    sets = 1 if num_scatter_buffers == None else num_scatter_buffers  # noqa: E711
    if cap == None:  # noqa: E711
        if buffers_per_core == None:  # noqa: E711
            scatter_partitions = default_scatter_partitions(problem, lnc, sets, groups,
                                                            pairs_possible or not compute_grad_value)
        else:  # the K of the given buffers
            scatter_partitions = PARTITIONS
            while scatter_partitions > 1 and -(-scatter_partitions // groups) > buffers_per_core:
                scatter_partitions //= 2
    else:
        scatter_partitions = _pow2_floor(min(cap, PARTITIONS))
    scatter_pairs = (cap == None or cap >= PAIR_MIN_INDICES) and pairs_possible  # noqa: E711
    k_base = -(-scatter_partitions // groups)
    while k_base * rows >= FP32_EXACT_INT_MAX and scatter_partitions > 1:
        scatter_partitions //= 2
        k_base = -(-scatter_partitions // groups)
    fold = plan_scatter_fold(scatter_partitions, cap, scatter_pairs, compute_grad_value)

    if corner_blocks:  # one index column per sample (cell); the build's SBUF is reserved
        gather_columns = transpose_gather_columns(n_p, 4 * c_h, max_gather_indices_per_indirect)
    budget = sbuf_budget - (build_sbuf_bytes(problem, value_dtype) if corner_blocks else 0)

    def tiles_for(blocks: int, width: int, points: int = n_p, work_copies: int = 0,
                  pipelined: bool = False) -> SbufTiles:
        shape = problem if points == n_p else replace(problem, num_points=points)
        return sbuf_tiles(shape, value_dtype, blocks, width, width < c_h, method, gather_columns,
                           compute_grad_value, want_gather,
                           gather_pairs or scatter_pairs, pad_columns(gather_partitions, scatter_partitions),
                           sets * lnc * k_base, fold, corner_blocks, work_copies, pipelined)

    width, blocks = fit_sbuf(tiles_for, channel_tile_widths(c_h, method), budget)
    if width < c_h and corner_blocks:  # a corner block is whole C_h rows: plan four corners
        corner_blocks, budget = False, sbuf_budget
        gather_columns = transpose_gather_columns(cols, c_h, max_gather_indices_per_indirect)
        width, blocks = fit_sbuf(tiles_for, channel_tile_widths(c_h, method), budget)
    if width < c_h and fold > 1:  # the folded scatter's tiles never cost a channel tile
        fold = 1
        width, blocks = fit_sbuf(tiles_for, channel_tile_widths(c_h, method), budget)
    if width < c_h and not strided_pairs and (gather_pairs or scatter_pairs):
        # channel tiles make a BNLC pair two runs: plan again without pairs
        gather_pairs = scatter_pairs = False
        width, blocks = fit_sbuf(tiles_for, channel_tile_widths(c_h, method), budget)
    if blocks == 0:
        used = sbuf_bytes(tiles_for(1, 1))
        fitting = next((k for k in range(n_p - 1, 0, -1)  # an error path: a plain scan will do
                        if sbuf_bytes(tiles_for(1, 1, k)) <= budget), 0)
        raise ValueError(
            f"SBUF: the backward tiles need {used:,} bytes per partition even with one block per "
            f"super-tile and one channel per channel tile, over the budget {budget:,} "
            f"(value dtype {value_dtype}, C_h = {c_h}); sampling_locations: N_p = {n_p} points set "
            f"the per-partition sample tiles, at most N_p = {fitting} fits")
    if method == "transpose" and width < min(c_h, PARTITIONS):  # narrower transposes: fewer columns
        gather_columns = transpose_gather_columns(cols, width, max_gather_indices_per_indirect)
    # pipelined super-tiles (transpose gathers, unfolded scatter, one channel tile), else a
    # second scatter data tile: each only in SBUF left over by the fitted tiles
    work_bufs, pipelined = 1, False
    if compute_grad_value and fold == 1:
        if want_gather and method == "transpose" and width == c_h:  # pipelined: T data tiles at most
            work_bufs = max((k for k in range(SCATTER_WORK_BUFS, blocks + 1)
                             if sbuf_bytes(tiles_for(blocks, width, n_p, k, True)) <= budget), default=1)
            pipelined = work_bufs > 1
        if not pipelined:
            work_bufs = max((k for k in range(1, SCATTER_WORK_BUFS + 1)
                             if sbuf_bytes(tiles_for(blocks, width, n_p, k - 1)) <= budget), default=1)
    tiles = tiles_for(blocks, width, n_p, work_bufs if pipelined else work_bufs - 1, pipelined)
    channel_tiles = tuple((c0, min(width, c_h - c0)) for c0 in range(0, c_h, width))
    if corner_blocks:  # PE transposes of whole 4*C_h cells
        psum_columns = max(1, min(n_p, PSUM_BANK_BYTES // (4 * c_h * itemsize)))
    else:
        psum_columns = max(1, min(cols, PSUM_BANK_BYTES // (min(width, PARTITIONS) * itemsize)))
    return BackwardConfig(
        problem=problem, lnc=lnc, value_itemsize=itemsize, groups=groups,
        queries_per_block=queries_per_block, partitions_per_block=queries_per_block * groups,
        blocks_per_tile=blocks, gather_method=method, gather_partitions=gather_partitions,
        gather_columns=gather_columns, gather_pairs=gather_pairs, channel_tiles=channel_tiles,
        psum_columns=psum_columns, scatter_partitions=scatter_partitions, scatter_pairs=scatter_pairs,
        k_base=k_base, num_buffers=k_base, scatter_sets=sets, compute_grad_value=compute_grad_value,
        compute_grad_sampling_locations=compute_grad_sampling_locations,
        compute_grad_attention_weights=compute_grad_attention_weights, sbuf_budget=sbuf_budget,
        sbuf_tiles=tiles, scatter_fold=fold, corner_blocks=corner_blocks, scatter_work_bufs=work_bufs,
        pipelined=pipelined)


def buffer_index(config: BackwardConfig, partition: int) -> int:
    """k(j)*R: row offset of the buffer partition j (within a block) scatters into."""
    local = partition % config.scatter_partitions
    return (local // config.groups) * config.rows_per_batch
