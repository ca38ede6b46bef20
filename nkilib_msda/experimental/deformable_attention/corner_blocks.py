"""Corner-block forward of the MSDA kernel (issue 30, item 4): the build pass and the gather.

docs/kernels.md, "Corner-block value layout", has the picture and the model. Layout: a
shared-HBM scratch ``(B * cells * N_h, 4 * C_h)`` in the value dtype; row
``(cs_l + (y + 1)(W + 1) + x + 1) * N_h + h`` of batch b (batch in the access-pattern offset)
holds the corners ``v(x, y), v(x+1, y), v(x, y+1), v(x+1, y+1)`` of head h, out-of-map corners
stored as zeros; the last cell of each batch is all zeros. A sample whose floor lies outside
``[-1, W-1] x [-1, H-1]`` (or whose coordinate is NaN) reads the zero cell.

- **Build** (after the first tile's coordinates, before any gather): a *strip* is up to 128
  cell rows ``y`` (partitions, from y = -1) by ``xw`` cells; the strips of one row band stack
  on the partitions (each from a whole DMA engine, ``strip_stride``). Per chunk, two DMAs per
  strip bring image rows ``y`` and ``y + 1`` of every head as long runs (``(xw + 1) * N_h *
  C_h`` elements; the tile is zeroed first where a strip reaches outside the map), four
  on-chip copies (Vector and GpSimd, bit-accurate for equal dtypes) interleave every strip
  into ``(xw, N_h, 4, C_h)`` cells, one DMA per strip stores one run per partition. Loads and
  stores use hardware DGE on different queues (Sync, Scalar); two buffer sets alternate and
  the next chunk is loaded before the current one is assembled (program order). LNC 2: the
  cores take alternate chunks, then ``core_barrier`` (both cores read every cell).
- **Gather**: per DMA block of whole samples, ``128 // (4 * C_h)`` indirect ``dma_transpose``
  instructions, each moving one ``4 * C_h`` run per index into partitions ``[j * 4 C_h, (j+1) *
  4 C_h)``; that is the partition layout of today's ``stack`` per-corner transposes, so the PE
  transposes, PSUM blocks, weight multiply and reduce are the forward's. The corner validity
  bits are ANDed into the 4 weights per sample when the tile is prepared, so the products are
  not masked (an invalid corner reads a stored 0 with weight +0.0).

NKI forms (Neuron docs): indirect ``dma_transpose`` with a 2-D uint32 ``[128, m]`` index tile,
2-byte data, <= 128 source elements, ``oob_mode.skip`` for the padded rows
(<https://awsdocs-neuron.readthedocs-hosted.com/en/v2.30.0/nki/api/generated/nki.isa.dma_transpose.html>);
direct ``dma_copy`` with access patterns
(<https://awsdocs-neuron.readthedocs-hosted.com/general/nki/api/generated/nki.isa.dma_copy.html>);
``dma_copy`` ``dge_mode=hwdge`` with ``engine`` selecting the Sync or Scalar queue (same page);
``tensor_copy`` on Vector or GpSimd, bit-accurate for equal dtypes
(<https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/nki/api/generated/nki.isa.tensor_copy.html>);
``memset``, ``tensor_scalar``, ``tensor_tensor`` as in the rest of the kernel.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention import _sampling as smp
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (
    BUILD_BUFFER_SETS, build_chunk_cells, cell_starts, corner_cells)
from nkilib_msda.experimental.kernel_commons import PARTITIONS, core_barrier
from nkilib_msda.hardware import PARTITIONS_PER_DMA_ENGINE
from nkilib_msda.validation.msda import dtype_name

__all__ = ["strip_stride", "build_chunks", "scratch_rows_per_batch", "build_corner_blocks",
           "build_head_offsets", "prepare_corner_tile", "gather_corner_blocks"]


def strip_stride(rows: int) -> int:
    """Partitions between stacked strips: ``rows`` rounded up to whole DMA engines (8
    partitions), so the strips' loads and stores never share an engine's in-order lane."""
    return min(PARTITIONS, -(-rows // PARTITIONS_PER_DMA_ENGINE) * PARTITIONS_PER_DMA_ENGINE)


def build_chunks(p: Any, xw: int) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
    """(batch, level, first cell row y0, rows, strip starts x0) of every build chunk. A strip
    is cell rows [y0, y0 + rows) x cells [x0, min(x0 + xw, W)) (y0, x0 from -1); a chunk stacks
    ``128 // strip_stride(rows)`` strips of one row band on the partitions (strip i from
    partition ``i * strip_stride(rows)``), so small maps still use most of the 128 partitions
    (and of the 16 DMA engines)."""
    out = []
    for b in range(p.batch):
        for level, (height, width) in enumerate(p.spatial_shapes):
            for y0 in range(-1, height, PARTITIONS):
                rows = min(PARTITIONS, height - y0)
                strips = tuple(range(-1, width, xw))
                per = PARTITIONS // strip_stride(rows)
                for i in range(0, len(strips), per):
                    out.append((b, level, y0, rows, strips[i:i + per]))
    return out


def scratch_rows_per_batch(p: Any) -> int:
    """Rows of ``4 * C_h`` elements of one batch of the scratch: cells * N_h."""
    return corner_cells(p) * p.num_heads


def _strip_edges(p: Any, level: int, r0: int, rows: int, x0: int, xw: int) -> bool:
    """Whether the strip's tile of image rows [r0, r0 + rows) and pixels [x0, x0 + xw] reaches
    outside the map (then the tile is zeroed before the load)."""
    height, width = p.spatial_shapes[level]
    return r0 < 0 or r0 + rows > height or x0 < 0 or x0 + xw > width - 1


def _load_rows(tile: Any, value: Any, p: Any, b: int, level: int, r0: int, rows: int, x0: int,
               xw: int, part0: int) -> None:
    """tile[part0 + q] = image row r0 + q (q < rows) of pixels [x0, x0 + xw] of every head
    where inside the map (the caller zeroes the rest; r0 >= -1: only the first partition can
    lie above the map). BLNC tile layout (xw + 1, N_h, C_h); BNLC (N_h, xw + 1, C_h). Loads
    use the hardware DGE of the Sync queue, so they never wait behind the stores (Scalar
    queue)."""
    height, width = p.spatial_shapes[level]
    c, n_h = p.head_dim, p.num_heads
    q0 = max(0, -r0)                                  # first partition inside the map
    valid_rows = max(0, min(r0 + rows, height) - max(r0, 0))
    px0, px1 = max(x0, 0), min(x0 + xw, width - 1)
    j0, nv = px0 - x0, px1 - px0 + 1
    if valid_rows == 0 or nv <= 0:
        return
    start = p.level_start_index[level] + (r0 + q0) * width + px0
    flat = value.reshape((p.batch * p.total_pixels * n_h * c,))
    if p.value_layout == "BLNC":
        src = flat.ap([[width * n_h * c, valid_rows], [1, nv * n_h * c]],
                      offset=((b * p.total_pixels + start) * n_h) * c)
        dst = smp.tile_view(tile, [[1, nv * n_h * c]], offset=j0 * n_h * c, parts=valid_rows,
                            first_partition=part0 + q0)
    else:
        src = flat.ap([[width * c, valid_rows], [p.total_pixels * c, n_h], [1, nv * c]],
                      offset=(b * n_h * p.total_pixels + start) * c)
        dst = smp.tile_view(tile, [[(xw + 1) * c, n_h], [1, nv * c]], offset=j0 * c,
                            parts=valid_rows, first_partition=part0 + q0)
    nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge)


def build_corner_blocks(value: Any, cfg: Any, core: int) -> Any:
    """Write the corner-block scratch of ``value`` (this core's chunks), then the LNC barrier;
    return the scratch as ``(B * cells * N_h, 4 * C_h)`` rows. ``cfg``: the forward's or the
    backward's plan (only ``problem`` and ``lnc`` are read)."""
    p, lnc = cfg.problem, cfg.lnc
    c, n_h = p.head_dim, p.num_heads
    cells_total = corner_cells(p)
    starts = cell_starts(p)
    vdt = value.dtype
    xw = build_chunk_cells(p, dtype_name(vdt))
    scratch = nl.ndarray((p.batch * cells_total * n_h, 4 * c), dtype=vdt, buffer=nl.shared_hbm,
                         name="corner_blocks")
    flat = scratch.reshape((p.batch * cells_total * n_h * 4 * c,))
    sets = [(nl.ndarray((PARTITIONS, (xw + 1) * n_h * c), dtype=vdt, buffer=nl.sbuf, name=f"cb_top{i}"),
             nl.ndarray((PARTITIONS, (xw + 1) * n_h * c), dtype=vdt, buffer=nl.sbuf, name=f"cb_bot{i}"),
             nl.ndarray((PARTITIONS, xw * n_h * 4 * c), dtype=vdt, buffer=nl.sbuf, name=f"cb_out{i}"))
            for i in range(BUILD_BUFFER_SETS)]
    cell_run = n_h * 4 * c
    if core == 0:  # the zero cell of every batch
        zero = sets[0][2]
        nisa.memset(smp.tile_view(zero, [[1, cell_run]], parts=1), 0.0)
        for b in range(p.batch):
            nisa.dma_copy(dst=flat.ap([[cell_run, 1], [1, cell_run]],
                                      offset=(b * cells_total + cells_total - 1) * cell_run),
                          src=smp.tile_view(zero, [[1, cell_run]], parts=1))
    engines = (nisa.engine.vector, nisa.engine.gpsimd)
    if p.value_layout == "BLNC":
        sj, sh = n_h * c, c           # tile strides of a pixel and a head
    else:
        sj, sh = c, (xw + 1) * c
    chunks = build_chunks(p, xw)[core::lnc]

    def parts_of(rows: int, strips: tuple[int, ...]) -> int:
        return strip_stride(rows) * (len(strips) - 1) + rows

    def load(k: int) -> None:
        b, level, y0, rows, strips = chunks[k]
        top, bot, _ = sets[k % BUILD_BUFFER_SETS]
        for tile, r0 in ((top, y0), (bot, y0 + 1)):
            if any(_strip_edges(p, level, r0, rows, x0, xw) for x0 in strips):
                nisa.memset(smp.tile_view(tile, [[1, (xw + 1) * n_h * c]],
                                          parts=parts_of(rows, strips)), 0.0)
            for i, x0 in enumerate(strips):
                _load_rows(tile, value, p, b, level, r0, rows, x0, xw, i * strip_stride(rows))

    def assemble_and_store(k: int) -> None:
        b, level, y0, rows, strips = chunks[k]
        top, bot, out = sets[k % BUILD_BUFFER_SETS]
        width = p.spatial_shapes[level][1]
        parts = parts_of(rows, strips)  # partitions between strips hold stale (initialised) rows
        for corner in range(4):  # every strip at once: xw cells (a short last strip stores fewer)
            dy, dx = divmod(corner, 2)
            nisa.tensor_copy(
                dst=smp.tile_view(out, [[cell_run, xw], [4 * c, n_h], [1, c]], offset=corner * c,
                                  parts=parts),
                src=smp.tile_view(bot if dy else top, [[sj, xw], [sh, n_h], [1, c]],
                                  offset=dx * sj, parts=parts),
                engine=engines[corner % 2])
        for i, x0 in enumerate(strips):
            cells = min(xw, width - x0)
            first = (b * cells_total + starts[level] + (y0 + 1) * (width + 1) + x0 + 1) * cell_run
            nisa.dma_copy(dst=flat.ap([[(width + 1) * cell_run, rows], [1, cells * cell_run]],
                                      offset=first),
                          src=smp.tile_view(out, [[1, cells * cell_run]], parts=rows,
                                            first_partition=i * strip_stride(rows)),
                          dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)

    # The gaps between stacked strips are copied but never loaded or stored: zero the row
    # tiles once so that every partition a copy reads is initialised.
    for top, bot, _ in sets:
        for tile in (top, bot):
            nisa.memset(smp.tile_view(tile, [[1, (xw + 1) * n_h * c]]), 0.0, engine=nisa.engine.gpsimd)

    # Software pipelined in program order: chunk k + 1 is zeroed and loaded before chunk k is
    # assembled, so the loads overlap the previous chunk's copies and store.
    if chunks:
        load(0)
    for k in range(len(chunks)):
        if k + 1 < len(chunks):
            load(k + 1)
        assemble_and_store(k)
    core_barrier(scratch, lnc)
    return scratch


def build_head_offsets(buf: Any, p: Any, q_pack: int) -> None:
    """head_off[slot] = h: the scratch is cell-major with the head inside, whatever the value
    layout."""
    smp.build_head_offsets(buf.head_off, buf.head_ints, replace(p, value_layout="BLNC"), q_pack)


def _cell_rows(rows: Any, buf: Any, p: Any, slots: int) -> None:
    """rows[sample] (uint32, n) = scratch row of the sample's cell, or the zero cell's row
    ``(cells - 1) * N_h`` when the floor lies outside [-1, W-1] x [-1, H-1] or the coordinate is
    NaN. Uses ``buf.corners`` (4n words) as scratch; reads ``buf.floor`` and ``buf.mask``."""
    nl_, np_ = p.num_levels, p.num_points
    n, lp = slots * nl_ * np_, nl_ * np_
    n_h = float(p.num_heads)
    zero_row = float((corner_cells(p) - 1) * p.num_heads)
    fl, sc = buf.floor, buf.corners
    for level, ((height, width), cs) in enumerate(zip(p.spatial_shapes, cell_starts(p))):
        for axis, size in ((0, width), (1, height)):
            per = [[lp, slots], [1, np_]]
            f = smp.tile_view(fl, per, offset=axis * n + level * np_)
            t = smp.tile_view(sc, per, offset=axis * n + level * np_)
            ok = smp.tile_view(sc, per, offset=(2 + axis) * n + level * np_)
            nisa.tensor_scalar(dst=t, data=f, op0=nl.maximum, operand0=-1.0, op1=nl.minimum,
                               operand1=float(size - 1))
            nisa.tensor_tensor(dst=ok, data1=t, data2=f, op=nl.equal)
        ty = smp.tile_view(sc, [[lp, slots], [1, np_]], offset=n + level * np_)
        # (cs + (y + 1)(W + 1) + x + 1) * N_h + h = y (W + 1) N_h + (cs + W + 2) N_h + x N_h + h
        nisa.tensor_scalar(dst=ty, data=ty, op0=nl.multiply, operand0=float(width + 1) * n_h,
                           op1=nl.add, operand1=float(cs + width + 2) * n_h,
                           engine=nisa.engine.scalar)
    tx = smp.tile_view(sc, [[lp, slots], [1, lp]])
    nisa.scalar_tensor_tensor(dst=tx, data=tx, op0=nl.multiply, operand0=n_h, op1=nl.add,
                              operand1=smp.tile_view(buf.head_off, [[1, slots], [0, lp]]))
    nisa.tensor_tensor(dst=smp.tile_view(sc, [[1, n]]), data1=smp.tile_view(sc, [[1, n]]),
                       data2=smp.tile_view(sc, [[1, n]], offset=n), op=nl.add)
    planar = [[n, 2], [1, n]]
    crd.apply_mask(smp.tile_view(sc, planar, offset=2 * n),
                   smp.tile_view(buf.mask, planar, dtype=nl.int32))
    okx = smp.tile_view(sc, [[1, n]], offset=2 * n)
    nisa.tensor_tensor(dst=okx, data1=okx, data2=smp.tile_view(sc, [[1, n]], offset=3 * n),
                       op=nl.multiply)
    # (1 - ok) * zero_row, then the larger of it and the cell row (max returns one operand
    # exactly; every real row is below zero_row)
    nisa.tensor_scalar(dst=okx, data=okx, op0=nl.multiply, operand0=-zero_row, op1=nl.add,
                       operand1=zero_row)
    nisa.tensor_tensor(dst=smp.tile_view(rows, [[1, n]]), data1=smp.tile_view(sc, [[1, n]]),
                       data2=okx, op=nl.maximum)


def prepare_corner_tile(buf: Any, cfg: Any, index: int, b: int, tile: Any, locations: Any,
                        attention_weights: Any, oob_row: float) -> None:
    """Tile ``index``'s masked corner weights (n, 4) and transposed cell-row indices."""
    p = cfg.problem
    slot = index % cfg.tile_bufs
    slots = cfg.slots(tile.q_pack)
    n = cfg.samples(tile.q_pack)
    weights, bits, rows = buf.weights[slot], buf.bits[slot], buf.rows[0]
    smp.tile_corner_factors(buf, bits, cfg, locations, attention_weights, b, tile)
    smp.corner_weights(weights, buf.factors, buf.att, n)
    w = smp.tile_view(weights, [[1, 4 * n]])
    crd.mask_bits(w, w, smp.tile_view(bits, [[1, 4 * n]], dtype=nl.int32))
    _cell_rows(rows, buf, p, slots)
    if tile.partitions < PARTITIONS:
        smp.mark_padded_rows(rows, buf.pad, buf.pad_ints, tile.partitions, n, oob_row)
    blocks = tuple((d0 // 4, dn // 4) for d0, dn in cfg.dma_blocks(tile.q_pack))
    smp.transpose_tile_indices(buf.tidx[slot], rows, blocks, cfg.stack // 4,
                               cfg.dma_cols_per_instruction, cfg.index_stride)


def gather_corner_blocks(buf: Any, tidx: Any, prod: Any, weights: Any, cfg: Any, cell_rows: Any,
                         batch_offset: int, grp: Any, counters: dict, oob: Any) -> None:
    """prod[(k - col0), :] = weight[k] * corner value[k] for the group's columns: per DMA block
    ``stack // 4`` indirect transposes of whole cells, then the forward's PE transposes and
    one multiply per PSUM block (no product mask; see the module docstring)."""
    c = cfg.problem.head_dim
    per = cfg.stack // 4
    stride = cfg.index_stride  # 16-byte-aligned index tiles (docs/kernels.md, "Indirect DMAs")
    for d0, dn in cfg.blocks(grp.col0, grp.cols, cfg.dma_cols):
        gbuf, region = smp.next_gather_block(counters, cfg, per * stride)
        samples = dn // 4
        for j in range(min(per, samples)):
            m = (samples - j + per - 1) // per
            src = cell_rows.ap([[4 * c, m * PARTITIONS], [1, 4 * c]], offset=batch_offset,
                               vector_offset=smp.tile_view(tidx, [[1, m]], offset=region + j * stride))
            dst = smp.tile_view(buf.gathered_t[gbuf][0], [[1, m * PARTITIONS]], parts=4 * c,
                                first_partition=j * 4 * c)
            nisa.dma_transpose(dst=dst, src=src, axes=(1, 0), oob_mode=oob)
        smp.weigh_psum_blocks(buf.gathered_t[gbuf], prod, weights, None, cfg, d0, dn, grp.col0,
                              buf.psum, counters)
