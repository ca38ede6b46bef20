"""The grad_value scatter of the MSDA backward kernel: per-corner (or per pair slot)
coefficients w * bilinear weight, data = coefficient * grad_output row with invalid corners
masked bitwise to +0.0, and the scatter-RMW of P_s partitions at a time into the K replicated
fp32 buffers (``backward_buffers.scatter_add``; uniqueness proof in ``backward_config``), each
instruction on all 128 partitions with the others skipped (``backward_live_rows``).
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention import backward_buffers as bufs
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention.backward_scatter_fold import FoldedScatter
from nkilib_msda.experimental.kernel_commons import PARTITIONS

__all__ = ["GradValueScatter"]


class GradValueScatter:
    """Scatters of one program (logical core ``core``) into ``buffer_sets``, which successive
    scatter DMAs take round robin (the one field the methods update)."""

    def __init__(self, cfg, tiles, core: int, buffer_sets, live) -> None:
        self.cfg, self.p, self.t = cfg, cfg.problem, tiles
        self.core, self.buffer_sets = core, buffer_sets
        self.live = live  # backward_live_rows.LiveRows: 128-partition scatters
        self.dma_count = 0
        # per-block scatter data, taken in turn: the Vector engine writes block i + 1's while
        # the scatter DMAs of block i still read theirs (plan: scatter_work_bufs); pipelined
        # super-tiles keep ``work`` for the next super-tile's dot products
        self.work_ring = ([] if cfg.pipelined else [tiles.work]) + list(tiles.swork or [])
        self.block_count = 0
        self.fold = FoldedScatter(cfg, tiles, live, live.oob["fold"]) if cfg.scatter_fold > 1 else None

    def terms(self, n: int, f: int):
        """Per-corner (or per pair slot) scatter coefficients, validity bits and indices of
        the super-tile; returns the (coef, bits) views that every channel tile's scatter reads."""
        cfg, t = self.cfg, self.t
        coef = t.coef[0:n, 0:f, :]
        attn = t.attn[0:n, 0:f]
        nisa.tensor_tensor(dst=coef, data1=t.weights[0:n, 0:f, :], data2=attn.expand_dim(2).broadcast(2, 4),
                           op=nl.multiply)
        kscale = t.kscale_f[0:n, 0:1]
        sidx = t.sidx
        if cfg.scatter_pairs:
            # an invalid corner's coef is a * 0 (NaN for an infinite a): zero it bitwise before
            # it is mixed into the pair slots below
            crd.mask_bits(coef, coef, t.vbits[0:n, 0:f, :])
            # slot coefficients of the pair: S_s = sum_b coef_ab where corner b sits in slot s,
            # selected bitwise (not sel_b * coef_ab: 0 * inf would be NaN for an infinite
            # weight; not sum - S1, which would cancel a small coef_a0 against a large coef_a1)
            c4 = coef.reshape_dim(2, (2, 2))
            tmp = t.pair_tmp[0:n, 0:f, :].reshape_dim(2, (2, 2))
            pc = t.pair_coef[0:n, 0:f, :].reshape_dim(2, (2, 2))
            masks = t.pair_masks[0:n, :, 0:f, :]
            for slot in range(2):
                crd.mask_bits(tmp, c4, masks[:, slot].expand_dim(2).broadcast(2, 2))
                nisa.tensor_reduce(dst=pc[:, :, :, slot], op=nl.add, data=tmp, axis=3)
            coef = t.pair_coef[0:n, 0:f, :]
            # pair slot (a, s) is written by some valid corner: OR_b (in slot s)_b & valid_ab
            vb = t.vbits[0:n, 0:f, :].reshape_dim(2, (2, 2))
            tmp_i = crd.int32_bits(tmp)
            pb = t.pair_bits[0:n, 0:f, :].reshape_dim(2, (2, 2))
            for slot in range(2):
                nisa.tensor_tensor(dst=tmp_i, data1=masks[:, slot].expand_dim(2).broadcast(2, 2), data2=vb,
                                   op=nl.bitwise_and)
                nisa.tensor_tensor(dst=pb[:, :, :, slot], data1=tmp_i[:, :, :, 0], data2=tmp_i[:, :, :, 1],
                                   op=nl.bitwise_or)
            bits = t.pair_bits[0:n, 0:f, :]
            nisa.tensor_scalar(dst=sidx[0:n, 0:2 * f], data=t.pair_rows[0:n, 0:f, :], op0=nl.add,
                               operand0=kscale)
        elif self.fold != None:  # noqa: E711
            self.fold.indices(n, f)
            bits = t.vbits[0:n, 0:f, :]
        else:
            nisa.tensor_scalar(dst=sidx[0:n, 0:4 * f], data=t.rows[0:n, 0:f, :], op0=nl.add, operand0=kscale)
            bits = t.vbits[0:n, 0:f, :]
        return coef, bits

    def tile(self, b: int, n: int, blocks: int, c0: int, width: int, coef, bits, grad=None, sidx=None) -> None:
        """Scatter-add coef * grad over channels [c0, c0 + width) of every block into the buffers
        (``grad`` / ``sidx``: the super-tile's grad_output rows and index tile, default the
        tiles' current ones)."""
        cfg, p, t = self.cfg, self.p, self.t
        grad = t.grad if grad == None else grad  # noqa: E711
        sidx = t.sidx if sidx == None else sidx  # noqa: E711
        cols = cfg.columns_per_block
        for blk in range(blocks):
            work_tile = self.work_ring[self.block_count % len(self.work_ring)]
            self.block_count += 1
            work = work_tile[0:n, :, 0:width]
            points = slice(blk * p.num_points, (blk + 1) * p.num_points)
            cb = coef[:, points, :]
            work4 = work.reshape_dim(1, (p.num_points, 4)) if self.fold == None else self.fold.work_view(n, width)  # noqa: E711
            nisa.tensor_tensor(dst=work4,
                               data1=cb.expand_dim(3).broadcast(3, width),
                               data2=grad[0:n, blk:blk + 1, 0:width].broadcast(1, p.num_points)
                               .expand_dim(2).broadcast(2, 4),
                               op=nl.multiply)
            # rows of invalid corners (and unused pair slots) get +0.0, even for inf grad_output
            crd.mask_bits(work4, work4, bits[:, points, :].expand_dim(3).broadcast(3, width))
            if self.fold != None:  # noqa: E711
                for index_col, data in self.fold.block(blk, n, width):
                    self._one(b, index_col, data, False, c0, width, nisa.oob_mode.skip)
                continue
            per_block = cols // 2 if cfg.scatter_pairs else cols
            slots = 2 if cfg.scatter_pairs else 1
            block_idx = sidx[0:PARTITIONS, blk * per_block:(blk + 1) * per_block]
            for ci, _ in enumerate(self.live.chunks("scatter", n)):
                idx, oob = self.live.index("scatter", block_idx, n, ci)
                for k in range(per_block):
                    self._one(b, idx[:, k:k + 1], work_tile[0:PARTITIONS, slots * k:slots * (k + 1), 0:width],
                              cfg.scatter_pairs, c0, width, oob)

    def _one(self, b, index_col, data, pair, c0, width, oob) -> None:
        buf = self.buffer_sets[self.dma_count % len(self.buffer_sets)]
        self.dma_count += 1
        bufs.scatter_add(buf, b, self.core, self.cfg, index_col, data, pair, c0, width, oob)
