"""Fast-mode MSDA backward with the channel axis split into CHANNEL_TILES tiles.

``msda_backward_split_kernel`` computes what ``msda_backward_samples_kernel`` computes (same
contract, same math; the channel sums of the corner dots are taken in another order), with the
corner tiles shaped (BLOCK_Q, BLOCK_S, CHANNEL_TILES, BLOCK_C / CHANNEL_TILES) instead of
(BLOCK_Q, BLOCK_S, BLOCK_C). Why: Triton lays a tile out with one 16-byte vector per thread
along its contiguous last axis and spreads threads over that axis first, so with
(BLOCK_S, BLOCK_C) tiles BLOCK_C / 4 threads (fp32) share each sample and every one of them
repeats the sample's bilinear setup, its grad_loc / grad_attn arithmetic and a shuffle
reduction per corner. With the channels as (CHANNEL_TILES, BLOCK_C / CHANNEL_TILES), the
split axis comes after the sample axis in Triton's thread order (equal contiguity, later
axes first), so it stays inside each thread: CHANNEL_TILES times fewer threads share a sample,
each holding CHANNEL_TILES 16-byte vectors of it. Every reduction still covers a 32-byte
sector per pair of threads, so the grad_value reductions touch the same sectors as before.
"""

import triton
import triton.language as tl

from nkilib_msda.backends.triton.kernels.backward import _location_gradients, _row_scales
from nkilib_msda.backends.triton.kernels.sampling import (
    bilinear_corners, sample_block, value_row_base)


@triton.jit
def _spread(x):
    """A (BLOCK_Q, BLOCK_S) tile as (BLOCK_Q, BLOCK_S, 1, 1)."""
    return tl.expand_dims(tl.expand_dims(x, 2), 3)


@triton.jit
def _split_dot(value_base, rows, valid, g, chan, c_mask, ROW_STRIDE: tl.constexpr):
    """<g, V[rows]> per sample: rows, valid (BLOCK_Q, BLOCK_S); g (BLOCK_Q, 1, K, CK); chan,
    c_mask (1, K, 1, CK). Masked corners load 0."""
    ptrs = value_base + _spread(rows * ROW_STRIDE) + chan
    vals = tl.load(ptrs, mask=_spread(valid) & c_mask, other=0.0).to(tl.float32)
    return tl.sum(tl.sum(vals * g, axis=3), axis=2)


@triton.jit
def _split_scatter(grad_value_base, rows, coef, valid, g, chan, c_mask, ROW_STRIDE: tl.constexpr):
    """grad_value[rows, :] += coef * g for valid corners (relaxed atomics), shapes as
    ``_split_dot``; coef (BLOCK_Q, BLOCK_S)."""
    ptrs = grad_value_base + _spread(rows * ROW_STRIDE) + chan
    contrib = (_spread(coef) * g).to(grad_value_base.dtype.element_ty)
    tl.atomic_add(ptrs, contrib, mask=_spread(valid) & c_mask, sem="relaxed")


@triton.jit
def msda_backward_split_kernel(
    grad_out_ptr, value_ptr, loc_ptr, attn_ptr, shapes_ptr, starts_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    COMPUTE_VALUE: tl.constexpr, COMPUTE_LOC: tl.constexpr, COMPUTE_ATTN: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, GRID_3D: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, CHANNEL_TILES: tl.constexpr,
):
    """Same contract as ``msda_backward_samples_kernel``; CHANNEL_TILES divides BLOCK_C."""
    NEED_DOTS: tl.constexpr = COMPUTE_LOC or COMPUTE_ATTN
    CK: tl.constexpr = BLOCK_C // CHANNEL_TILES
    (batch, head, row, q_mask, ch, c_mask, s_mask, height, width, start, sample, loc_x, loc_y,
     u, v, a) = sample_block(loc_ptr, attn_ptr, shapes_ptr, starts_ptr, num_queries,
                             num_query_blocks, batch_size, NUM_HEADS, HEAD_DIM, NUM_LEVELS,
                             NUM_POINTS, LOC_B2QHLP, INDEX64, HEAD_SLOWEST, GRID_3D, BLOCK_Q, BLOCK_C,
                             BLOCK_S)
    store_mask = q_mask[:, None] & s_mask[None, :]
    a = tl.where(store_mask, a, 0.0)  # tail queries and padded samples contribute nothing
    row_key_base = value_row_base(batch, head, total_pixels, NUM_HEADS, VALUE_BNLC)
    ROW_STRIDE: tl.constexpr = (1 if VALUE_BNLC else NUM_HEADS) * HEAD_DIM
    value_base = value_ptr + row_key_base * HEAD_DIM
    grad_value_base = grad_value_ptr + row_key_base * HEAD_DIM

    # Channel k * CK + c at (k, c) of the split axes: (1, 1, CHANNEL_TILES, CK).
    chan = (tl.arange(0, CHANNEL_TILES)[None, None, :, None] * CK
            + tl.arange(0, CK)[None, None, None, :])
    cm = chan < HEAD_DIM
    g = tl.load(grad_out_ptr + (row * HEAD_DIM)[:, None, None, None] + chan, mask=cm,
                other=0.0).to(tl.float32)  # (BLOCK_Q, 1, CHANNEL_TILES, CK)

    rows, masks, w, fx, fy, sx, sy = bilinear_corners(
        u, v, width[None, :], height[None, :], start[None, :], 1.0, store_mask, ALIGN_CORNERS,
        BORDER, INDEX64, True)  # tail queries and padded samples: every corner masked

    if NEED_DOTS:
        # Per-query scales (see _row_scales), from the max over the CK axis then the split axis.
        down, up = _row_scales(tl.max(tl.abs(g), axis=3), 2)  # (BLOCK_Q, 1, K) -> (BLOCK_Q, 1)
        g_dots = g * tl.expand_dims(tl.expand_dims(down, 2), 3)
        d = (_split_dot(value_base, rows[0], masks[0], g_dots, chan, cm, ROW_STRIDE),
             _split_dot(value_base, rows[1], masks[1], g_dots, chan, cm, ROW_STRIDE),
             _split_dot(value_base, rows[2], masks[2], g_dots, chan, cm, ROW_STRIDE),
             _split_dot(value_base, rows[3], masks[3], g_dots, chan, cm, ROW_STRIDE))
        if COMPUTE_ATTN:
            ga = (w[0] * d[0] + w[1] * d[1] + w[2] * d[2] + w[3] * d[3]) * up
            tl.store(grad_attn_ptr + sample, ga.to(grad_attn_ptr.dtype.element_ty),
                     mask=store_mask)
        if COMPUTE_LOC:
            gx, gy = _location_gradients(d, fx, fy)
            out_ty = grad_loc_ptr.dtype.element_ty
            tl.store(grad_loc_ptr + loc_x, (a * sx * gx * up).to(out_ty), mask=store_mask)
            tl.store(grad_loc_ptr + loc_y, (a * sy * gy * up).to(out_ty), mask=store_mask)

    if COMPUTE_VALUE:
        for c in tl.static_range(4):
            _split_scatter(grad_value_base, rows[c], a * w[c], masks[c], g, chan, cm, ROW_STRIDE)
