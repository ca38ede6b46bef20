"""Every indirect DMA of the MSDA backward kernel on all 128 partitions from partition 0.

AWS's MSDA kernels issue every indirect ``dma_copy`` / ``dma_compute`` on 128 partitions from
partition 0 ("padded to P_MAX to avoid a DMA abort", nki-library
``ms_deformable_attention_bwd.py``). The backward splits the partitions of a super-tile
into *chunks* ``[j0, j1)``: ``gather_partitions`` (copy gathers under a
``max_gather_indices_per_indirect`` cap < 128) or ``scatter_partitions`` (P_s, which the
scatter-uniqueness proof needs, ``backward_config``), the last chunk ending at the
super-tile's ``n`` live partitions. A chunk's DMA still covers partitions [0, 128): its index
column is the super-tile's, with every row outside ``[j0, j1)`` raised to an out-of-range row
(``padding_row`` of the receiver, a power of two, exact in fp32 and in uint32) and
``oob_mode.skip``, which the dma_copy and dma_compute pages document ("Silently skip the
runtime out-of-bounds access"; dma_compute has ``oob_mode`` since NKI 0.5,
https://awsdocs-neuron.readthedocs-hosted.com/en/v2.31.0/nki/api/generated/nki.isa.dma_compute.html).
A skipped row writes nothing, so the per-instruction uniqueness proof is unchanged; AWS's
index-0 padding would instead put duplicate row-0 targets into a ``unique_indices`` scatter.

The raise is ``max(index, pad)``: ``pad`` (one fp32 column per chunk) is the out-of-range row
outside the chunk and 0 inside, and every real index is below it. The pad columns of every
(kind, live partitions, chunk) the program meets are built once per kernel (``build``).
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention._sampling import padding_row
from nkilib_msda.experimental.deformable_attention.backward_sampling import C_J
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import live_chunks
from nkilib_msda.experimental.kernel_commons import PARTITIONS

__all__ = ["LiveRows"]


class LiveRows:
    """Pad columns and chunk index views of one program (see the module docstring).

    ``tiles.live_pad`` (128, pad_columns) fp32 holds the pad columns, ``tiles.live_tmp`` is a
    (128, 1) fp32 scratch; the masked index columns go to ``tiles.gidx_live`` / ``sidx_live``
    (rotating (2, columns) tiles)."""

    def __init__(self, cfg, tiles, core: int) -> None:
        self.cfg, self.t = cfg, tiles
        # the folded scatter (backward_scatter_fold) masks only the rows past n
        scatter = ("fold", PARTITIONS) if cfg.scatter_fold > 1 else ("scatter", cfg.scatter_partitions)
        self.steps = {"gather": cfg.gather_partitions, scatter[0]: scatter[1]}
        p = cfg.problem
        scatter_oob = padding_row(p.batch * cfg.total_buffers * cfg.rows_per_batch)
        self.oob = {"gather": padding_row(p.batch * cfg.rows_per_batch), "scatter": scatter_oob,
                    "fold": scatter_oob}
        self.columns: dict[tuple[str, int, int], int] = {}
        counts = sorted({parts for _, _, parts in cfg.super_tiles(core)})
        for kind in self.steps:
            for n in counts:
                for ci, chunk in enumerate(live_chunks(n, self.steps[kind])):
                    if chunk != (0, PARTITIONS):
                        self.columns[(kind, n, ci)] = len(self.columns)
        self.turn = {kind: 0 for kind in self.steps}

    def build(self) -> None:
        """pad[:, col] = out-of-range row outside the chunk, 0 inside (3 Vector ops each)."""
        t = self.t
        j = t.consts[:, C_J:C_J + 1]          # the partition index (fp32)
        for (kind, n, ci), col in self.columns.items():
            j0, j1 = live_chunks(n, self.steps[kind])[ci]
            pad = t.live_pad[:, col:col + 1]
            nisa.tensor_scalar(dst=t.live_tmp, data=j, op0=nl.greater_equal, operand0=float(j1))
            nisa.scalar_tensor_tensor(dst=pad, data=j, op0=nl.less, operand0=float(j0),
                                      op1=nl.maximum, operand1=t.live_tmp)
            nisa.tensor_scalar(dst=pad, data=pad, op0=nl.multiply, operand0=self.oob[kind])

    def pad_column(self, kind: str, n: int, ci: int):
        """The (128, 1) pad column of chunk ``ci`` of ``n`` live partitions, or None when the
        chunk is all 128 partitions."""
        if (kind, n, ci) not in self.columns:
            return None
        col = self.columns[(kind, n, ci)]
        return self.t.live_pad[:, col:col + 1]

    def chunks(self, kind: str, n: int) -> list[tuple[int, int]]:
        return live_chunks(n, self.steps[kind])

    def index(self, kind: str, columns, n: int, ci: int):
        """(index columns of chunk ``ci``, oob_mode): ``columns`` (128, k) as they are when
        the chunk is all 128 partitions, else a masked copy in the rotating scratch."""
        if (kind, n, ci) not in self.columns:
            return columns, nisa.oob_mode.error
        t = self.t
        scratch = t.gidx_live if kind == "gather" else t.sidx_live
        turn = self.turn[kind]
        self.turn[kind] = turn + 1
        k = columns.shape[1]
        dst = scratch[:, turn % 2, 0:k]
        col = self.columns[(kind, n, ci)]
        nisa.tensor_scalar(dst=dst, data=columns, op0=nl.maximum,
                           operand0=t.live_pad[:, col:col + 1])
        return dst, nisa.oob_mode.skip
