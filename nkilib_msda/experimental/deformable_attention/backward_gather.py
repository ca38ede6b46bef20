"""Corner gathers of the MSDA backward kernel: value rows of every (point, corner) of a
super-tile and their per-corner dot products with the grad_output rows, in fp32.

Transpose path (2-byte values): indirect ``dma_transpose`` of <= 128-channel chunks, index
columns spread over partition bands (``backward_tiling.gather_split``), PE transposes back
through PSUM; copy path: indirect ``dma_copy`` of one row per index, or of the (x0, x1)
corner pair with ``gather_pairs``; corner blocks (``cfg.corner_blocks``, transpose path): one
``4 * C_h`` run of the corner-block scratch per sample (``backward_corner_blocks``), whose PE
transpose is the sample's four corner columns. Layouts: ``backward_tiles``.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention.backward_corner_blocks import cell_rows
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import gather_split
from nkilib_msda.experimental.kernel_commons import PARTITIONS
from nkilib_msda.hardware import INDEX_TILE_ALIGN_WORDS

__all__ = ["CornerGather"]


class CornerGather:
    """Gathers and dot products of one program; ``value2d`` is value viewed as (B*R, C_h) rows.

    The transposed gather tiles are taken round robin (the one field the methods update): two
    of them, or every transpose of a super-tile when the plan pipelines super-tiles.
    """

    def __init__(self, cfg, tiles, value2d, live) -> None:
        self.cfg, self.p, self.t = cfg, cfg.problem, tiles
        self.value2d = value2d
        self.live = live  # backward_live_rows.LiveRows: 128-partition copy gathers
        self.transpose_count = 0
        self.aligned_count = 0
        self.cells2d: Any = None  # corner-block scratch rows (B * cells * N_h, 4 * C_h)
        self.cell_rows_per_batch = 0

    def use_corner_blocks(self, cells2d, rows_per_batch: int) -> None:
        """Gather from the corner-block scratch (``corner_blocks.build_corner_blocks``)."""
        self.cells2d, self.cell_rows_per_batch = cells2d, rows_per_batch

    def block(self, b: int, n: int, blk: int, c0: int, width: int, issued=None) -> None:
        """gathered[0:n, col, 0:width] = channels [c0, c0 + width) of the value rows of the
        block's 4*N_p columns (or x-pairs; with corner blocks, one cell per point fills its
        four columns). ``issued``: the block's transposes from :meth:`issue` (pipelined
        super-tiles), else they are issued here, each followed by its PE transposes."""
        cfg, p, t = self.cfg, self.p, self.t
        cols = cfg.columns_per_block
        base = b * cfg.rows_per_batch * p.head_dim + c0
        gathered = t.gathered
        if cfg.gather_method == "transpose":
            place = self._placer(n)
            units = issued if issued != None else self._transpose_units(b, blk, c0, width)  # noqa: E711
            for unit in units:
                self._transpose_back(unit, place)
            return
        # with pairs, a column is (point, a): one index moves the (x0, x1) corner pair
        pattern = cfg.row_pattern(width, cfg.gather_pairs)
        slots = 2 if cfg.gather_pairs else 1
        per_block = cols // slots
        block_idx = t.gidx[0:PARTITIONS, blk * per_block:(blk + 1) * per_block]
        for ci, _ in enumerate(self.live.chunks("gather", n)):
            idx, oob = self.live.index("gather", block_idx, n, ci)
            for k in range(per_block):
                src = self.value2d.ap(pattern, offset=base, vector_offset=idx[:, k:k + 1])
                nisa.dma_copy(dst=gathered[0:PARTITIONS, slots * k:slots * (k + 1), 0:width], src=src,
                              oob_mode=oob)

    def issue(self, b: int, blk: int, c0: int, width: int) -> list:
        """Issue every transpose of block ``blk`` now (transpose path); returns them for
        :meth:`block` (the pipelined kernel gathers super-tile i + 1 before scattering i)."""
        return list(self._transpose_units(b, blk, c0, width))

    def _placer(self, n: int):
        """place(k0, k1, t0, c): PSUM columns [0, k1 - k0) of channels [t0, t0 + c) -> index
        columns [k0, k1) of the block in ``gathered`` (with corner blocks: cells -> corner columns)."""
        t, c_h = self.t, self.p.head_dim
        gathered = t.gathered
        if self.cfg.corner_blocks:
            # sample s's cell -> its corner columns [4s, 4s + 4) of every channel (C_t = C_h)
            def place_cells(s0: int, s1: int, t0: int, c: int) -> None:
                nisa.tensor_copy(dst=gathered[0:n, 4 * s0:4 * s1, 0:c_h].reshape_dim(1, (s1 - s0, 4)),
                                 src=t.psum[0:n, 0:s1 - s0, 0:c].reshape_dim(2, (4, c_h)))
            return place_cells

        def place(k0: int, k1: int, t0: int, c: int) -> None:
            nisa.tensor_copy(dst=gathered[0:n, k0:k1, t0:t0 + c], src=t.psum[0:n, 0:k1 - k0, 0:c])
        return place

    def _transpose_units(self, b: int, blk: int, c0: int, width: int):
        """Indirect transposes of the block's index columns (``gidx[blk * cols:]``), M_g
        columns per gather and <= 128 channels per chunk (a corner block: one 4*C_h chunk):
        yields (tile, g0, t0, c, band, m) per gather after issuing its DMAs (a generator, so
        :meth:`block` transposes each back before the next is issued)."""
        cfg, p, t = self.cfg, self.p, self.t
        c_h = p.head_dim
        if cfg.corner_blocks:
            rows2d, base, cols = self.cells2d, b * self.cell_rows_per_batch * 4 * c_h, p.num_points
            chunks = ((0, 4 * c_h),)
        else:
            rows2d, base, cols = self.value2d, b * cfg.rows_per_batch * c_h + c0, cfg.columns_per_block
            chunks = cfg.transpose_chunks(width)
        row = rows2d.shape[1]
        mg = cfg.gather_columns
        for g0 in range(0, cols, mg):
            col0 = blk * cols + g0
            for t0, c in chunks:
                # Columns split over partition bands (all DMA engines), transposed tiles
                # rotated (the next gather overlaps these PE transposes): gather_split.
                band, m = gather_split(mg, c)
                tr = t.transposed[self.transpose_count % len(t.transposed)]
                self.transpose_count += 1
                for j in range(PARTITIONS // band):
                    k0, kn = j * m, min(m, mg - j * m)
                    if kn <= 0:
                        break
                    src = rows2d.ap([[row, kn * PARTITIONS], [1, c]], offset=base + t0,
                                    vector_offset=self._index_tile(col0 + k0, kn))
                    nisa.dma_transpose(dst=tr[j * band:j * band + c, 0:kn * PARTITIONS], src=src,
                                       axes=(1, 0))
                yield tr, g0, t0, c, band, m

    def _transpose_back(self, unit, place) -> None:
        """PE transposes of one gather's tile into PSUM, one ``place`` per PSUM bank."""
        cfg, t = self.cfg, self.t
        tr, g0, t0, c, band, m = unit
        mg = cfg.gather_columns
        for k0 in range(0, mg, cfg.psum_columns):
            k1 = min(mg, k0 + cfg.psum_columns)
            for k in range(k0, k1):
                j, i = divmod(k, m)
                nisa.nc_transpose(dst=t.psum[0:PARTITIONS, k - k0, 0:c],
                                  data=tr[j * band:j * band + c, i * PARTITIONS:(i + 1) * PARTITIONS],
                                  engine=nisa.engine.tensor)
            place(g0 + k0, g0 + k1, t0, c)

    def _index_tile(self, start: int, k: int):
        """gidx columns [start, start + k) as a transpose's index tile: a tile of several
        columns must start 16-byte aligned (hardware.INDEX_TILE_ALIGN_BYTES, as AWS allocates
        its batched index tiles), so a misaligned one is first copied to an aligned scratch."""
        gidx = self.t.gidx
        if k == 1 or start % INDEX_TILE_ALIGN_WORDS == 0:
            return gidx[0:PARTITIONS, start:start + k]
        dst = self.t.gidx_aligned[0:PARTITIONS, self.aligned_count % 2, 0:k]
        self.aligned_count += 1
        nisa.tensor_copy(dst=dst, src=gidx[0:PARTITIONS, start:start + k])
        return dst

    def prepare_indices(self, n: int, f: int) -> None:
        """gidx of the super-tile: one cell row per sample (corner blocks), the x-pair rows or
        the four corner rows (from ``sample_terms``)."""
        cfg, t = self.cfg, self.t
        if cfg.corner_blocks:
            nisa.tensor_copy(dst=t.gidx[0:n, 0:f], src=cell_rows(cfg, t, n, f))
        elif cfg.gather_pairs:
            nisa.tensor_copy(dst=t.gidx[0:n, 0:2 * f], src=t.pair_rows[0:n, 0:f, :])
        else:
            nisa.tensor_copy(dst=t.gidx[0:n, 0:4 * f], src=t.rows[0:n, 0:f, :])

    def dots(self, b: int, n: int, blocks: int, c0: int, width: int, first: bool, issued=None) -> None:
        """Per-corner dot products <grad_output row * 2^-k(j), value row> over channels
        [c0, c0 + width), in fp32 (k from the kernel's ``_grad_scales``): written by the first channel
        tile, added by the others (into ``dc``, or into ``prod4`` per pair slot)."""
        cfg, p, t = self.cfg, self.p, self.t
        f = blocks * p.num_points
        cols = cfg.columns_per_block
        dots = t.prod4 if cfg.gather_pairs else t.dc
        row_scale = t.grad_scale[0:n, 0:1]
        if first and issued == None:  # noqa: E711  (pipelined: prepared and issued earlier)
            self.prepare_indices(n, f)
        for blk in range(blocks):
            self.block(b, n, blk, c0, width, None if issued == None else issued[blk])  # noqa: E711
            work = t.work[0:n, :, 0:width]
            g = t.grad[0:n, blk:blk + 1, 0:width].broadcast(1, cols)
            nisa.scalar_tensor_tensor(dst=work, data=g, op0=nl.multiply, operand0=row_scale,
                                      op1=nl.multiply, operand1=t.gathered[0:n, :, 0:width])
            dst = dots[0:n, blk * p.num_points:(blk + 1) * p.num_points, :]
            part = dst if first else t.dot_part[0:n, :, :]
            nisa.tensor_reduce(dst=part, op=nl.add, data=work.reshape_dim(1, (p.num_points, 4)), axis=3)
            if not first:
                nisa.tensor_tensor(dst=dst, data1=dst, data2=part, op=nl.add)

    def finish(self, n: int, f: int) -> None:
        """dc[j, sample, corner]: the pair slot selected per corner, out-of-map corners zeroed."""
        cfg, t = self.cfg, self.t
        if cfg.gather_pairs:  # dc_ab = D_a,slot(b): a bitwise select of the pair slot of corner b
            # (not (1 - sel) * D_a0 + sel * D_a1: the pair's other pixel need not be a corner,
            # and 0 * inf there would be NaN; a large value there would also cancel D_a1)
            d = t.prod4[0:n, 0:f, :].reshape_dim(2, (2, 2))
            dc = t.dc[0:n, 0:f, :].reshape_dim(2, (2, 2))
            other = t.pair_tmp[0:n, 0:f, :].reshape_dim(2, (2, 2))
            masks = t.pair_masks[0:n, :, 0:f, :]
            for slot, dst in ((0, dc), (1, other)):
                crd.mask_bits(dst, d[:, :, :, slot:slot + 1].broadcast(3, 2),
                              masks[:, slot].expand_dim(2).broadcast(2, 2))
            nisa.tensor_tensor(dst=crd.int32_bits(dc), data1=crd.int32_bits(dc), data2=crd.int32_bits(other),
                               op=nl.bitwise_or)
        # A corner outside the map read its clamped pixel: its dot product is exactly 0.
        dc = t.dc[0:n, 0:f, :]
        crd.mask_bits(dc, dc, t.vbits[0:n, 0:f, :])
