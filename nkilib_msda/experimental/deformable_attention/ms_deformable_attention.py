"""NKI forward kernel of multi-scale deformable attention (NKI 0.7+, ``@nki.jit``).

See docs/kernels.md ("Forward", "Coordinate math", "LNC sharding and the barrier").

Design (numbers for the default N_h=8, N_l=4, N_p=8, C_h=32 bf16 shape):

- **Queries on partitions.** A tile is <= 128 partitions x ``q_pack`` consecutive queries, all
  heads at once, so parameter loads and the output store are one contiguous run per partition
  (each parameter and the output cross HBM exactly once). LNC: core ``s`` takes queries
  ``[s * ceil(N_q / lnc), ...)``; cores share nothing but the output, so no barrier is
  needed (an LNC=2 kernel is specialized per physical core, and the two tile lists may
  differ by one ragged tile). The degree and core come from ``nl.num_programs()`` /
  ``nl.program_id(0)`` (kernel_commons.core_info), so env-var LNC, bracket launch and LNC 1
  all shard correctly.
- **Coordinates** (``_sampling.py`` on the shared ``coordinates.py``): fp32 via DMA casts;
  NaN removed with a bit mask; pixel coordinates clamped before the float->int cast; real
  floor; corner indices clamped into the map with 0/1 validity factors. About 20 + 8 * N_l
  Vector/Scalar instructions per tile, independent of C_h.
- **Non-finite values**: every weighted product is ANDed with an int32 corner mask, so an
  out-of-map corner adds exactly +0.0 even when its clamped pixel holds inf or NaN.
- **Row indices, not element offsets.** ``vector_offset`` scales an index by the receiver's
  dim-0 stride, so gathers run on the 2-D ``(B * rows, C_h)`` view of ``value`` with the
  batch in the AP offset: exact while ``L * N_h < 2^24`` (checked up front) instead of
  ``L * N_h * C_h < 2^24`` for element offsets.
- **Gather, "transpose"** (2-byte values): indirect ``dma_transpose`` of up to
  ``dma_cols / stack`` index columns (x 128 indices) and <= 128 channels each brings the rows
  to SBUF transposed, ``(channels, columns * 128)``. With C_h <= 64, ``stack = 128 // C_h``
  such transposes fill disjoint partition ranges so that one Tensor-engine ``nc_transpose`` of
  ``(stack * C_h, 128)`` un-transposes ``stack`` columns at once (256 instead of 1,024 PE
  instructions per 128 queries at C_h = 32) into a bank-sized PSUM block; one
  ``tensor_tensor`` multiplies the PSUM block by the (broadcast) corner weights into an fp32
  product, and one ``tensor_reduce`` per reduce group adds the columns of each (query, head)
  into the fp32 accumulator. C_h > 128 uses several channel tiles (144 = 128 + 16).
- **Gather, "copy"** (any dtype; fp32 values always use it): one indirect ``dma_copy`` per
  index column ``(rows, C_h)`` (multi-column index tiles are documented for dma_transpose
  only), then the same multiply + reduce straight from SBUF (real rows only).
- Every indirect DMA (transpose or copy) covers all 128 partitions from partition 0, as AWS
  issues them. Every corner of every sample is exactly one descriptor of ``C_h * dtype``
  bytes per channel tile; no pixel is gathered twice. Padded partitions of a ragged tile
  compute with zero coordinates and weights (no uninitialised reads) and are not stored; they
  gather nothing: their indices are set out of bounds (``padding_row``) and the tile's
  indirect DMAs use ``oob_mode.skip`` (the DGE still walks their index rows).
- Accumulation is fp32; the store DMA casts once to the value dtype.
- **Pipelined order** (two copies of the per-tile buffers): tile i + 1 is prepared (loads,
  coordinates, row indices, and on the transpose path its transposed index tile, one ScalarE
  copy) before tile i is gathered and reduced, and the gather buffers rotate per DMA block.
  Every engine runs in program order, so this order is what lets the software DGE (GpSimd)
  and the DMA engines gather one block while Tensor/Vector work on the previous one.

Tiling (q_pack, block sizes, buffer counts, SBUF budget) comes from
:func:`forward_config.plan_forward` before any instruction is emitted.
"""

from __future__ import annotations

from typing import Any, Optional

from nkilib_msda._nki import nki, nisa, nl
from nkilib_msda.experimental.deformable_attention import _sampling as smp
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention import corner_blocks as cb
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import resolve_gather_layout
from nkilib_msda.experimental.kernel_commons import core_info, explain_argument_errors
from nkilib_msda.experimental.deformable_attention.plan.forward_config import (
    COORD_SCRATCH_WORDS, PARTITIONS, ForwardConfig, plan_forward)
from nkilib_msda.hardware import KERNEL_DTYPES
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES, MSDAProblem, dtype_name, validate_msda_args

__all__ = ["ms_deformable_attention", "plan_forward_from_args"]

def plan_forward_from_args(value: Any, spatial_shapes: Any, level_start_index: Any,
                       sampling_locations: Any, attention_weights: Any,
                       value_layout: str = "BLNC", sampling_locations_layout: str = "BQHLP2",
                       align_corners: bool = False, padding_mode: str = "zeros",
                       max_indices_per_indirect: Optional[int] = None,
                       gather_method: str = "transpose", lnc: int = 1,
                       gather_layout: str = "auto") -> ForwardConfig:
    """Validate the arguments and return the kernel's tiling plan (plain Python; no NKI)."""
    problem = validate_msda_args(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        value_layout, sampling_locations_layout, align_corners, padding_mode,
        padding_modes=KERNEL_PADDING_MODES)
    for name, t in (("value", value), ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if dtype_name(t.dtype) not in KERNEL_DTYPES:
            raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16 for the NKI "
                            f"kernel, got {dtype_name(t.dtype)}")
    vdt = dtype_name(value.dtype)
    return plan_forward(problem, vdt, lnc=lnc, gather_method=gather_method,
                        max_indices_per_indirect=max_indices_per_indirect,
                        corner_blocks=resolve_gather_layout(gather_layout, problem, vdt, lnc,
                                                            gather_method))


class _Buffers:
    """Every SBUF/PSUM allocation of the kernel, sized by the config (see sbuf_buffers())."""

    def __init__(self, cfg: ForwardConfig, value_dtype: Any):
        n = cfg.samples(cfg.q_pack)
        slots = cfg.slots(cfg.q_pack)
        c = cfg.problem.head_dim
        f32, i32 = nl.float32, nl.int32
        sb = nl.sbuf
        words = {"loc": 2 * n, "att": n, "mask": 2 * n, "xp": 2 * n, "floor": 2 * n,
                 "frac": 2 * n, "corners": 4 * n, "valid": 4 * n, "factors": 4 * n}
        assert sum(words.values()) == COORD_SCRATCH_WORDS * n
        self.loc = nl.ndarray((PARTITIONS, words["loc"]), dtype=f32, buffer=sb, name="loc")
        self.att = nl.ndarray((PARTITIONS, n), dtype=f32, buffer=sb, name="att")
        self.mask = nl.ndarray((PARTITIONS, 2 * n), dtype=i32, buffer=sb, name="mask")
        self.xp = nl.ndarray((PARTITIONS, 2 * n), dtype=f32, buffer=sb, name="xp")
        self.floor = nl.ndarray((PARTITIONS, 2 * n), dtype=f32, buffer=sb, name="floor")
        self.frac = nl.ndarray((PARTITIONS, 2 * n), dtype=f32, buffer=sb, name="frac")
        self.corners = nl.ndarray((PARTITIONS, 4 * n), dtype=f32, buffer=sb, name="corners")
        self.valid = nl.ndarray((PARTITIONS, 4 * n), dtype=f32, buffer=sb, name="valid")
        self.factors = nl.ndarray((PARTITIONS, 4 * n), dtype=f32, buffer=sb, name="factors")
        self.head_off = nl.ndarray((PARTITIONS, slots), dtype=f32, buffer=sb, name="head_off")
        self.head_ints = nl.ndarray((PARTITIONS, slots), dtype=i32, buffer=sb, name="head_ints")
        row_copies = cfg.tile_bufs if cfg.gather_method == "copy" else 1
        self.rows = [nl.ndarray((PARTITIONS, 4 * n), dtype=nl.uint32, buffer=sb, name=f"rows{i}")
                     for i in range(row_copies)]
        self.weights = [nl.ndarray((PARTITIONS, 4 * n), dtype=f32, buffer=sb, name=f"wts{i}")
                        for i in range(cfg.tile_bufs)]
        self.bits = [nl.ndarray((PARTITIONS, 4 * n), dtype=i32, buffer=sb, name=f"bits{i}")
                     for i in range(cfg.tile_bufs)]
        self.acc = [nl.ndarray((PARTITIONS, slots * c), dtype=f32, buffer=sb, name=f"acc{i}")
                    for i in range(cfg.tile_bufs)]
        group = cfg.group_cols_max
        self.prod = [nl.ndarray((PARTITIONS, group * c), dtype=f32, buffer=sb, name=f"prod{i}")
                     for i in range(cfg.gather_bufs)]
        self.piece_sum = (nl.ndarray((PARTITIONS, c), dtype=f32, buffer=sb, name="piece_sum")
                          if group < cfg.cols_per_slot else None)
        if cfg.gather_method == "copy":
            self.gathered = [nl.ndarray((PARTITIONS, group * c), dtype=value_dtype, buffer=sb,
                                        name=f"gathered{i}") for i in range(cfg.gather_bufs)]
        else:
            self.gathered_t = [
                [nl.ndarray((cfg.stack * (c1 - c0), cfg.dma_cols_per_instruction * PARTITIONS),
                            dtype=value_dtype, buffer=sb, name=f"gathered_t{i}_{t}")
                 for t, (c0, c1) in enumerate(cfg.channel_tiles)]
                for i in range(cfg.gather_bufs)]
            self.psum = [nl.ndarray((PARTITIONS, cfg.psum_cols * c), dtype=value_dtype,
                                    buffer=nl.psum, name=f"untransposed{i}")
                         for i in range(cfg.psum_bufs)]
            self.tidx = [nl.ndarray((PARTITIONS, cfg.index_words(cfg.q_pack)),
                                    dtype=nl.uint32, buffer=sb, name=f"tidx{i}")
                         for i in range(cfg.tile_bufs)]
        self.pad = nl.ndarray((PARTITIONS, 1), dtype=f32, buffer=sb, name="pad")
        self.pad_ints = nl.ndarray((PARTITIONS, 1), dtype=i32, buffer=sb, name="pad_ints")


def _coordinate_phase(buf: _Buffers, rows: Any, weights: Any, bits: Any, cfg: ForwardConfig,
                      locations: Any, attention_weights: Any, b: int, tile: Any) -> None:
    """Fill ``rows`` (uint32 row indices), ``weights`` (fp32 a * m_c * w_c) and ``bits``
    (int32 all ones for a valid corner), (n, 4) each."""
    slots = cfg.slots(tile.q_pack)
    n = cfg.samples(tile.q_pack)
    smp.tile_corner_factors(buf, bits, cfg, locations, attention_weights, b, tile)
    smp.corner_rows(rows, buf.corners, buf.head_off, cfg.problem, slots)
    smp.corner_weights(weights, buf.factors, buf.att, n)


def _gather_transpose(buf: _Buffers, tidx: Any, prod: Any, weights: Any, bits: Any,
                      cfg: ForwardConfig, value_rows: Any, batch_offset: int, grp: Any,
                      counters: dict, oob: Any) -> None:
    """prod[(k - col0), :] = weight[k] * value_row[k] for the group's columns (transpose path).

    Per DMA block [d0, d0 + dn) and channel tile: ``stack`` indirect transposes, transpose j
    gathering columns d0 + j, d0 + j + stack, ... into partitions [j * C_t, (j + 1) * C_t);
    then one PE transpose per ``stack`` consecutive columns into a PSUM block, and one
    multiply by the broadcast corner weights per PSUM block, then the bitwise corner mask
    (an invalid corner contributes +0.0 whatever its clamped pixel holds). ``oob``:
    oob_mode.skip for ragged tiles, whose padded rows hold an out-of-range index (see
    mark_padded_rows). ``tidx``: the tile's transposed indices, DMA block ``i`` of the tile
    at ``i * index_region`` (transpose_tile_indices). ``counters``: the running DMA-block and
    PSUM-block counts that rotate the gather and PSUM buffers (per block, across groups and
    tiles, so a block's gather never waits for the previous block's buffer).
    """
    c = cfg.problem.head_dim
    stack = cfg.stack
    for d0, dn in cfg.blocks(grp.col0, grp.cols, cfg.dma_cols):
        gbuf, region = smp.next_gather_block(counters, cfg, cfg.index_region)
        for t, (c0, c1) in enumerate(cfg.channel_tiles):
            ct = c1 - c0
            for j in range(min(stack, dn)):
                m = (dn - j + stack - 1) // stack
                src = value_rows.ap([[c, m * PARTITIONS], [1, ct]], offset=batch_offset + c0,
                                    vector_offset=smp.tile_view(
                                        tidx, [[1, m]], offset=region + j * cfg.index_stride))
                dst = smp.tile_view(buf.gathered_t[gbuf][t], [[1, m * PARTITIONS]], parts=ct,
                                    first_partition=j * ct)
                nisa.dma_transpose(dst=dst, src=src, axes=(1, 0), oob_mode=oob)
        smp.weigh_psum_blocks(buf.gathered_t[gbuf], prod, weights, bits, cfg, d0, dn, grp.col0,
                              buf.psum, counters)


def _gather_copy(buf: _Buffers, gbuf: int, prod: Any, rows: Any, weights: Any, bits: Any,
                 cfg: ForwardConfig, value_rows: Any, batch_offset: int, grp: Any,
                 parts: int, oob: Any) -> None:
    """prod[(k - col0), :] = weight[k] * value_row[k] for the group's columns (copy path).

    Every indirect copy runs on all 128 partitions from partition 0 (as AWS issues them); a
    ragged tile's padded rows hold an out-of-range index (mark_padded_rows) and ``oob`` is
    oob_mode.skip, so they gather nothing. Only the ``parts`` real partitions are weighted.
    """
    c = cfg.problem.head_dim
    gathered = buf.gathered[gbuf]
    for k in range(grp.col0, grp.col0 + grp.cols):
        src = value_rows.ap([[c, PARTITIONS], [1, c]], offset=batch_offset,
                            vector_offset=smp.tile_view(rows, [[1, 1]], offset=k))
        nisa.dma_copy(dst=smp.tile_view(gathered, [[1, c]], offset=(k - grp.col0) * c),
                      src=src, oob_mode=oob)
    dst = smp.tile_view(prod, [[c, grp.cols], [1, c]], parts=parts)
    nisa.tensor_tensor(dst=dst,
                       data1=smp.tile_view(gathered, [[c, grp.cols], [1, c]], parts=parts),
                       data2=smp.tile_view(weights, [[1, grp.cols], [0, c]], offset=grp.col0,
                                           parts=parts),
                       op=nl.multiply)
    crd.mask_bits(dst, dst, smp.tile_view(bits, [[1, grp.cols], [0, c]], offset=grp.col0,
                                          parts=parts))


def _reduce_group(buf: _Buffers, prod: Any, acc: Any, cfg: ForwardConfig, grp: Any,
                  parts: int) -> None:
    """acc[slot] (+)= sum over the group's columns of prod (fp32), on ``parts`` partitions."""
    c = cfg.problem.head_dim
    per_slot = grp.cols // grp.slots
    data = smp.tile_view(prod, [[per_slot * c, grp.slots], [1, c], [c, per_slot]], parts=parts)
    target = smp.tile_view(acc, [[c, grp.slots], [1, c]], offset=grp.slot0 * c, parts=parts)
    if grp.first_piece:
        nisa.tensor_reduce(dst=target, op=nl.add, data=data, axis=3)
        return
    piece = smp.tile_view(buf.piece_sum, [[c, 1], [1, c]], parts=parts)
    nisa.tensor_reduce(dst=piece, op=nl.add, data=data, axis=3)
    nisa.tensor_tensor(dst=target, data1=target, data2=piece, op=nl.add)


def _prepare_tile(buf: _Buffers, cfg: ForwardConfig, index: int, b: int, tile: Any,
                  locations: Any, attention_weights: Any, oob_row: float) -> None:
    """Tile ``index``'s corner weights, bits and row indices into its per-tile buffers; on the
    transpose path the indices end in the order the gathers read them (tidx)."""
    if cfg.corner_blocks:
        cb.prepare_corner_tile(buf, cfg, index, b, tile, locations, attention_weights, oob_row)
        return
    slot = index % cfg.tile_bufs
    rows = buf.rows[slot % len(buf.rows)]
    _coordinate_phase(buf, rows, buf.weights[slot], buf.bits[slot], cfg, locations,
                      attention_weights, b, tile)
    # Every indirect DMA covers 128 partitions from partition 0, so a ragged tile marks its
    # padded rows out of bounds and its gathers skip them (oob_mode.skip).
    if tile.partitions < PARTITIONS:
        smp.mark_padded_rows(rows, buf.pad, buf.pad_ints, tile.partitions,
                             4 * cfg.samples(tile.q_pack), oob_row)
    if cfg.gather_method != "transpose":
        return
    smp.transpose_tile_indices(buf.tidx[slot], rows, cfg.dma_blocks(tile.q_pack), cfg.stack,
                               cfg.dma_cols_per_instruction, cfg.index_stride)


def _gather_and_reduce(buf: _Buffers, cfg: ForwardConfig, index: int, b: int, tile: Any,
                       value_rows: Any, rows_per_batch: int, counters: dict, out: Any) -> None:
    """Gather, weight and sum the corners of prepared tile ``index``; store its output rows."""
    p = cfg.problem
    slot = index % cfg.tile_bufs
    weights, bits, acc = buf.weights[slot], buf.bits[slot], buf.acc[slot]
    batch_offset = b * rows_per_batch * p.head_dim
    transpose = cfg.gather_method == "transpose"
    # The copy path weights and sums only the real partitions.
    parts = PARTITIONS if transpose else tile.partitions
    oob = nisa.oob_mode.skip if tile.partitions < PARTITIONS else nisa.oob_mode.error
    counters["tile_block"] = 0
    for gi, grp in enumerate(cfg.reduce_groups(tile.q_pack)):
        gbuf = gi % cfg.gather_bufs
        prod = buf.prod[gbuf]
        if cfg.corner_blocks:
            cb.gather_corner_blocks(buf, buf.tidx[slot], prod, weights, cfg, value_rows,
                                    b * rows_per_batch * 4 * p.head_dim, grp, counters, oob)
        elif transpose:
            _gather_transpose(buf, buf.tidx[slot], prod, weights, bits, cfg, value_rows,
                              batch_offset, grp, counters, oob)
        else:
            _gather_copy(buf, gbuf, prod, buf.rows[slot % len(buf.rows)], weights, bits, cfg,
                         value_rows, batch_offset, grp, parts, oob)
        _reduce_group(buf, prod, acc, cfg, grp, parts)
    smp.store_rows(out, acc, p, b, tile.q_start, tile.partitions, tile.q_pack)


@nki.jit
def ms_deformable_attention(value, spatial_shapes, level_start_index, sampling_locations,
                            attention_weights, value_layout="BLNC",
                            sampling_locations_layout="BQHLP2", align_corners=False,
                            padding_mode="zeros", max_indices_per_indirect=None,
                            gather_method="transpose", gather_layout="auto"):
    """Multi-scale deformable attention forward: bilinear samples of every level, weighted and
    summed per (query, head).

    Dimensions:
        B: batch.
        N_q: queries.
        N_h: heads; C_h: channels per head (any size; > 128 is split into channel tiles).
        N_l: levels, level i of H_i x W_i pixels; L = sum_i H_i * W_i.
        N_p: sampling points per (query, head, level).
        Limits: L * N_h < 2^24 (row indices are formed in fp32), SBUF fits the plan's tiles.

    Args:
        value (HBM tensor): "BLNC" (B, L, N_h, C_h) or "BNLC" (B, N_h, L, C_h); bfloat16,
            float16 or float32. Levels are stacked along L, level i starting at
            ``level_start_index[i]``.
        spatial_shapes (tuple of (int, int)): (H_i, W_i) per level, a compile-time constant.
        level_start_index (tuple of int): first pixel of each level in L; must be the running
            sum of H_i * W_i.
        sampling_locations (HBM tensor): "BQHLP2" (B, N_q, N_h, N_l, N_p, 2) or "B2QHLP"
            (B, 2, N_q, N_h, N_l, N_p); (x, y) normalized to [0, 1] across each level's map;
            any float dtype; any value (NaN, inf, far out of the map) is safe.
        attention_weights (HBM tensor): (B, N_q, N_h, N_l, N_p), any float dtype.
        value_layout (str): "BLNC" (default) or "BNLC".
        sampling_locations_layout (str): "BQHLP2" (default) or "B2QHLP".
        align_corners (bool): False (default): pixel x = loc_x * W - 0.5; True: loc_x * (W - 1).
        padding_mode (str): "zeros" (default: out-of-map corners add nothing) or "border"
            (coordinates clamped into the map).
        max_indices_per_indirect (int | None): cap on indices per indirect DMA (>= 128); on
            the transpose path ``cap // 128`` index columns per ``dma_transpose``.
        gather_method (str): "transpose" (default; 2-byte values, float32 values fall back to
            "copy") or "copy".
        gather_layout (str): "auto" (default: corner blocks where supported and there are
            >= 2 samples per cell and head, else four corners; ``plan/corner_plan.py``),
            "four-corner" (one descriptor per corner) or "corner-block" (build a scratch of 2x2
            corner cells first, ~4x value bytes of shared HBM, then one descriptor per sample;
            transpose gather, 2-byte values, C_h <= 32). docs/kernels.md, "Corner-block value
            layout".

    Returns:
        HBM tensor (B, N_q, N_h * C_h) in value's dtype (shared HBM): per (query, head), the
        C_h channels of sum over levels and points of weight * bilinear sample.

    Notes:
        - Coordinates, corner weights and accumulation are float32 whatever value's dtype; the
          output is cast once at the store.
        - An out-of-map corner (or a NaN coordinate) contributes exactly +0.0: its product is
          masked bitwise, so inf/NaN at the clamped pixel never leaks.
        - Each corner of each sample is one gather descriptor of C_h values; no pixel is read
          twice for one sample, and padded partitions of a ragged tile gather nothing.
        - LNC=2: the two cores take halves of the queries and share nothing but the output (no
          barrier). The tiling plan comes from ``forward_config.plan_forward`` (plain Python)
          before any instruction is emitted.

    Pseudocode:
        plan = plan_forward(problem, lnc)                # q_pack, groups, buffer counts
        for b in range(B):
            for tile in plan.tiles(this_core_queries):   # <= 128 partitions x q_pack queries
                loc, w = load(sampling_locations[b, tile], attention_weights[b, tile])
                x, y = to_pixels(loc)                    # fp32, NaN masked, clamped
                x0, y0 = floor(x), floor(y)
                for corner in ((x0, y0), (x0+1, y0), (x0, y0+1), (x0+1, y0+1)):
                    rows[corner] = value_row(clamp_into_map(corner), head)  # uint32
                    weight[corner] = w * bilinear(corner) * inside_map(corner)
                acc = zeros((128, q_pack * N_h, C_h), fp32)
                for group in plan.reduce_groups(tile):
                    gathered = gather(value[b], rows[group])              # (128, cols, C_h)
                    acc[slot(group)] += sum_cols(gathered * weight[group])
                store(out[b, tile], cast(acc, value.dtype))
    """
    lnc, core = core_info()
    cfg = plan_forward_from_args(value, spatial_shapes, level_start_index, sampling_locations,
                             attention_weights, value_layout, sampling_locations_layout,
                             align_corners, padding_mode, max_indices_per_indirect,
                             gather_method, lnc, gather_layout)
    p: MSDAProblem = cfg.problem
    out = nl.ndarray(p.output_shape, dtype=value.dtype, buffer=nl.shared_hbm, name="msda_out")
    rows_per_batch = p.total_pixels * p.num_heads
    value_rows = value.reshape((p.batch * rows_per_batch, p.head_dim))
    buf = _Buffers(cfg, value.dtype)
    if cfg.corner_blocks:  # gathers read the corner-block scratch: (B * cells * N_h, 4 C_h)
        rows_per_batch = cb.scratch_rows_per_batch(p)
        cb.build_head_offsets(buf, p, cfg.q_pack)
    else:
        smp.build_head_offsets(buf.head_off, buf.head_ints, p, cfg.q_pack)
    q_lo, q_hi = cfg.core_range(core)
    transpose = cfg.gather_method == "transpose"
    if transpose and any(t.partitions < PARTITIONS for t in cfg.tiles(q_lo, q_hi)):
        # Skipped (padded) rows leave the gather buffers unchanged: make that defined data.
        for per_channel_tile in buf.gathered_t:
            for gt in per_channel_tile:
                nisa.memset(gt, 0.0)
    oob_row = smp.padding_row(p.batch * rows_per_batch)
    work = [(b, tile) for b in range(p.batch) for tile in cfg.tiles(q_lo, q_hi)]
    counters = {"block": 0, "psum": 0, "tile_block": 0}
    # Pipelined: tile i + 1 is prepared before tile i is gathered (see forward_config).
    ahead = 1 if cfg.pipelined else 0
    for i in range(min(ahead, len(work))):
        _prepare_tile(buf, cfg, i, *work[i], sampling_locations, attention_weights, oob_row)
    if cfg.corner_blocks:  # after the first tile's coordinates, which do not read the scratch
        value_rows = cb.build_corner_blocks(value, cfg, core)
    for i, (b, tile) in enumerate(work):
        if i + ahead < len(work):
            _prepare_tile(buf, cfg, i + ahead, *work[i + ahead], sampling_locations,
                          attention_weights, oob_row)
        _gather_and_reduce(buf, cfg, i, b, tile, value_rows, rows_per_batch, counters, out)
    return out


def _check_arguments(value: Any, spatial_shapes: Any, level_start_index: Any,
                     sampling_locations: Any, attention_weights: Any, value_layout: str = "BLNC",
                     sampling_locations_layout: str = "BQHLP2", align_corners: bool = False,
                     padding_mode: str = "zeros", **tuning: Any) -> None:
    """The kernel's argument validation on the caller's arrays (explain_argument_errors)."""
    validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations,
                       attention_weights, value_layout, sampling_locations_layout, align_corners,
                       padding_mode, padding_modes=KERNEL_PADDING_MODES)


explain_argument_errors(ms_deformable_attention, _check_arguments)
