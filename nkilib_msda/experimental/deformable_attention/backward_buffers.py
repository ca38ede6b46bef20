"""The K replicated fp32 grad_value buffers: zeroing, scatter-RMW, fixed-order reduction.

One buffer set is a shared_hbm fp32 tensor viewed as (B*lnc*K*R, C_h) rows; batch b, core s,
buffer k start at row ((b*lnc + s)*K + k)*R (the batch/core part goes into the access-pattern
offset, k*R into the index, see backward_config for the uniqueness proof).
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention.plan.backward_config import PARTITIONS
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import MAX_DMA_COMPUTE_SOURCES
from nkilib_msda.experimental.deformable_attention.plan.backward_tiling import REDUCE_FREE_ELEMENTS


def flat_chunks(start: int, stop: int, width: int = REDUCE_FREE_ELEMENTS):
    """Cover flat elements [start, stop) with (offset, partitions, width) rectangles."""
    pos = start
    while pos < stop:
        rest = stop - pos
        if rest >= width:
            parts = min(PARTITIONS, rest // width)
            yield pos, parts, width
            pos += parts * width
        else:
            yield pos, 1, rest
            pos += rest


def _rect(flat_tensor, offset: int, parts: int, width: int):
    return flat_tensor.ap([[width, parts], [1, width]], offset=offset)


def zero_own_buffers(cfg, buffer_sets, core: int, zero_tile) -> None:
    """Zero this core's K buffers of every batch in every set (HBM writes from an SBUF zero tile)."""
    region = cfg.num_buffers * cfg.rows_per_batch * cfg.problem.head_dim
    nisa.memset(dst=zero_tile, value=0.0)
    for buf in buffer_sets:
        flat = buf.reshape((buf.shape[0] * buf.shape[1],))
        for b in range(cfg.problem.batch):
            base = (b * cfg.lnc + core) * region
            for off, parts, width in flat_chunks(base, base + region):
                # hardware DGE on the Scalar queue: the super-tiles' loads (Sync queue) need
                # not wait behind the zero-fill, which only the first scatters wait for
                nisa.dma_copy(dst=_rect(flat, off, parts, width), src=zero_tile[0:parts, 0:width],
                              dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)


def scatter_add(buf, batch: int, core: int, cfg, index_col, data, pair: bool,
                c0: int, width: int, oob) -> None:
    """buf[k*R + row, c0:c0 + width] += data on all 128 partitions (one row, or an x-pair of
    rows; ``width`` channels of one channel tile); rows whose index is out of range are
    skipped when ``oob`` is oob_mode.skip (backward_live_rows)."""
    c_h = cfg.problem.head_dim
    offset = (batch * cfg.lnc + core) * cfg.num_buffers * cfg.rows_per_batch * c_h + c0
    dst = buf.ap(cfg.row_pattern(width, pair), offset=offset, vector_offset=index_col)
    nisa.dma_compute(dst=dst, srcs=[dst, data], reduce_op=nl.add, unique_indices=True,
                     oob_mode=oob)


def reduce_and_store(cfg, buffer_sets, core: int, tiles, grad_value, prev_reduced, reduced_out) -> None:
    """grad_value = sum of all lnc*K buffers of every set (fixed order) - prev, cast once.

    Core s reduces its band of every batch; <= 16 sources per dma_compute, extra sources are
    added 15 at a time onto the running fp32 SBUF sum (two SBUF tiles in turn, so no
    dma_compute writes one of its own sources).
    """
    p = cfg.problem
    per_batch = cfg.rows_per_batch * p.head_dim
    region = per_batch  # one buffer
    flats = [buf.reshape((buf.shape[0] * buf.shape[1],)) for buf in buffer_sets]
    gv_flat = grad_value.reshape((p.batch * per_batch,))
    prev_flat = None if prev_reduced == None else prev_reduced.reshape((p.batch * per_batch,))  # noqa: E711
    red_flat = None if reduced_out == None else reduced_out.reshape((p.batch * per_batch,))  # noqa: E711
    same_dtype = str(grad_value.dtype) == str(nl.float32)
    e0, e1 = cfg.reduce_bands(core)
    for b in range(p.batch):
        first = b * cfg.total_buffers * region
        for off, parts, width in flat_chunks(e0, e1):
            turns = (tiles.red, tiles.red_alt)
            acc = tiles.red[0:parts, 0:width]
            srcs = [_rect(flat, first + k * region + off, parts, width)
                    for flat in flats for k in range(cfg.total_buffers)]
            nisa.dma_compute(dst=acc, srcs=srcs[:MAX_DMA_COMPUTE_SOURCES], reduce_op=nl.add)
            rest = srcs[MAX_DMA_COMPUTE_SOURCES:]
            turn = 0
            while rest:
                # ping-pong: a non-indirect dma_compute's dst never aliases a source (aliasing
                # is documented only for the read-modify-write modes)
                step = MAX_DMA_COMPUTE_SOURCES - 1
                turn = 1 - turn
                nxt = turns[turn][0:parts, 0:width]
                nisa.dma_compute(dst=nxt, srcs=[acc] + rest[:step], reduce_op=nl.add)
                acc = nxt
                rest = rest[step:]
            out_off = b * per_batch + off
            if red_flat != None:  # noqa: E711
                nisa.dma_copy(dst=_rect(red_flat, out_off, parts, width), src=acc)
            if prev_flat != None:  # noqa: E711
                prev = tiles.red_prev[0:parts, 0:width]
                nisa.dma_copy(dst=prev, src=_rect(prev_flat, out_off, parts, width))
                nisa.tensor_tensor(dst=acc, data1=acc, data2=prev, op=nl.subtract)
            if same_dtype:
                nisa.dma_copy(dst=_rect(gv_flat, out_off, parts, width), src=acc)
            else:
                out = tiles.red_out[0:parts, 0:width]
                nisa.tensor_copy(dst=out, src=acc)
                nisa.dma_copy(dst=_rect(gv_flat, out_off, parts, width), src=out)
