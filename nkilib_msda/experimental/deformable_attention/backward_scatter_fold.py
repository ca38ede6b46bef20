"""Folded grad_value scatter: D = 128 // P_s corners of a P_s-partition slice per dma_compute.

When the plan scatters P_s < 128 partitions at a time (decoders: few queries over a large map,
so fewer replicated buffers win, ``backward_scatter_plan``), each 128-partition scatter of the
unfolded kernel carries P_s live rows and 128 - P_s skipped ones, and every (point, corner)
column of every slice is its own software-DGE instruction. Folded (``cfg.scatter_fold`` = D,
P_s = 32 or 64): partition ``d*P_s + r`` of one instruction carries corner ``g*D + d`` of
sample row ``ci*P_s + r`` (slice ``ci``, point ``p``, corner group ``g``), so one instruction
moves D corners of a whole slice with every partition live: D times fewer instructions and
descriptors, the same (P, 1) index-column form (docs/conformance.md).

Uniqueness per instruction (the proof of ``backward_config`` extended to corners): two entries
of one instruction either come from different rows r != r' of the slice, whose targets differ
by that proof (different buffer k, or the same k and different (h, l)), or from the same row r
and two different corners of one sample, which are different pixels of the same (h, l) when
both are inside the map. A corner outside the map (whose clamped row could equal another
corner's) gets an out-of-range index and is skipped (``oob_mode.skip``), like rows past the
super-tile's live partitions. Brute-forced in
``tests/experimental/deformable_attention/test_backward_scatter_fold.py``.

Data movement: the index columns are permuted once per super-tile and each block's scatter data
once per block, by SBUF-to-SBUF hardware-DGE copies (Sync and Scalar queues in turn, no GpSimd
time), D * D copies each (slice ci, corner offset d).
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.kernel_commons import PARTITIONS

__all__ = ["FoldedScatter"]


class FoldedScatter:
    """Index and data permutation of the folded scatter of one program (module docstring).

    Tiles: ``fold_pad`` (128, 4f) fp32 scratch, ``fidx`` (128, 4f) int32 permuted index columns
    laid out (slice ci, group g, sample s), ``fwork`` (2 copies of (128, 4 N_p, C_t) fp32)
    permuted scatter data of one block laid out (slice ci, group g, point p)."""

    def __init__(self, cfg, tiles, live, oob_row: int) -> None:
        self.cfg, self.t, self.live = cfg, tiles, live
        self.d = cfg.scatter_fold
        self.ps = cfg.scatter_partitions
        self.oob_row = float(oob_row)
        self.f = 0         # samples per partition of the current super-tile (``indices``)
        self.turn = 0      # fwork copy in use
        self.queue = 0     # hwdge queue of the next copy

    def _copy(self, dst, src) -> None:
        self.queue += 1
        if self.queue % 2:  # hardware DGE on the Sync queue (the default) or the Scalar queue
            nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge)
        else:
            nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)

    def slices(self, n: int) -> range:
        """Slices ci with at least one live partition (ci * P_s < n)."""
        return range(-(-n // self.ps))

    def indices(self, n: int, f: int) -> None:
        """fidx[d*P_s + r, (ci, g, s)] = row index of corner g*D + d of sample s of partition
        ci*P_s + r (sample s = block * N_p + point), raised out of range where the corner is
        outside the map or the partition is not live. ``sidx`` and ``fold_pad`` hold the
        columns corner-major ((4, f)) so that each copy moves runs of f indices."""
        t, d_fold, ps = self.t, self.d, self.ps
        self.f = f
        cols = 4 * f
        pad = t.fold_pad[0:n, 0:cols].reshape_dim(1, (4, f)).permute((0, 2, 1))
        # vbits is -1 (all ones) for a valid corner, 0 otherwise: pad = oob * (1 + vbits)
        nisa.tensor_scalar(dst=pad, data=t.vbits[0:n, 0:f, :], op0=nl.multiply, operand0=self.oob_row,
                           op1=nl.add, operand1=self.oob_row)
        sidx = t.sidx[0:n, 0:cols].reshape_dim(1, (4, f)).permute((0, 2, 1))
        nisa.scalar_tensor_tensor(dst=sidx, data=t.rows[0:n, 0:f, :], op0=nl.add, operand0=t.kscale_f[0:n, 0:1],
                                  op1=nl.maximum, operand1=pad)
        live = self.live.pad_column("fold", n, 0)
        if live != None:  # noqa: E711  (rows past the n live partitions: out of range, in place)
            full = t.sidx[0:PARTITIONS, 0:cols]
            nisa.tensor_scalar(dst=full, data=full, op0=nl.maximum, operand0=live)
        groups = 4 // d_fold
        for ci in self.slices(n):
            src = t.sidx[ci * ps:(ci + 1) * ps, 0:cols].reshape_dim(1, (groups, d_fold, f))
            for d in range(d_fold):
                dst = t.fidx[d * ps:(d + 1) * ps, ci * groups * f:(ci + 1) * groups * f]
                self._copy(dst.reshape_dim(1, (groups, f)), src[:, :, d, :])

    def work_view(self, n: int, width: int):
        """(n, N_p, 4, width) view of ``work`` stored corner-major ((4, N_p, width) per
        partition), the layout ``block`` copies from in runs of N_p * width."""
        n_p = self.cfg.problem.num_points
        return self.t.work[0:n, :, 0:width].reshape_dim(1, (4, n_p)).permute((0, 2, 1, 3))

    def block(self, blk: int, n: int, width: int):
        """Permute block ``blk``'s scatter data (``work``, corner-major, see ``work_view``)
        into a ``fwork`` copy; returns [(index column, data)] of the block's D-corner scatters."""
        t, d_fold, ps = self.t, self.d, self.ps
        n_p = self.cfg.problem.num_points
        groups = 4 // d_fold
        fwork = t.fwork[self.turn % 2]
        self.turn += 1
        per_slice = groups * n_p
        for ci in self.slices(n):
            rows = min(ps, n - ci * ps)  # live rows only (the others are skipped by their index)
            src = t.work[ci * ps:ci * ps + rows, :, 0:width].reshape_dim(1, (groups, d_fold, n_p))
            for d in range(d_fold):
                dst = fwork[d * ps:d * ps + rows, ci * per_slice:(ci + 1) * per_slice, 0:width]
                self._copy(dst.reshape_dim(1, (groups, n_p)), src[:, :, d, :, :])
        out = []
        for ci in self.slices(n):
            for k in range(per_slice):  # k = g * N_p + p
                g, point = divmod(k, n_p)
                col = (ci * groups + g) * self.f + blk * n_p + point
                data = fwork[0:PARTITIONS, ci * per_slice + k:ci * per_slice + k + 1, 0:width]
                out.append((t.fidx[0:PARTITIONS, col:col + 1], data))
        return out
