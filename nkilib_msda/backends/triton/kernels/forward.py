"""MSDA forward: query-block tiling.

One program = BLOCK_Q consecutive queries of one (batch, head). Per (level, point) it loads
one location pair and one weight per query, gathers four (BLOCK_Q x C_h) corner tiles (each
row a contiguous head vector), accumulates in fp32 registers and stores once. Programs are
ordered head-fastest so concurrently running programs touch the same pixel rows (L2 reuse).
"""

import triton
import triton.language as tl

from nkilib_msda.backends.triton.kernels.sampling import (
    bilinear_corners, level_geometry, load_corners, query_block, sample_block, value_row_base)


@triton.jit
def msda_forward_kernel(
    value_ptr, loc_ptr, attn_ptr, out_ptr, shapes_ptr, starts_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """value (B,L,N_h,C_h)|(B,N_h,L,C_h); loc (B,N_q,N_h,N_l,N_p,2)|(B,2,N_q,N_h,N_l,N_p);
    attn (B,N_q,N_h,N_l,N_p); out (B,N_q,N_h*C_h); shapes int32 (N_l,2); starts int32 (N_l,)."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    batch, head, row, q_mask, ch, c_mask = query_block(
        num_queries, num_query_blocks, batch_size, NUM_HEADS, HEAD_DIM, INDEX64, HEAD_SLOWEST,
        BLOCK_Q, BLOCK_C)

    sample = row * LP  # flat (b, q, h, l=0, p=0) sample index
    if LOC_B2QHLP:
        loc_x = loc_ptr + sample + batch * num_queries * NUM_HEADS * LP
        loc_y = loc_x + num_queries * NUM_HEADS * LP
        LOC_STEP: tl.constexpr = 1
    else:
        loc_x = loc_ptr + sample * 2
        loc_y = loc_x + 1
        LOC_STEP: tl.constexpr = 2
    value_base = value_ptr + value_row_base(batch, head, total_pixels, NUM_HEADS,
                                            VALUE_BNLC) * HEAD_DIM
    ROW_STRIDE: tl.constexpr = (1 if VALUE_BNLC else NUM_HEADS) * HEAD_DIM

    acc = tl.zeros([BLOCK_Q, BLOCK_C], dtype=tl.float32)
    for level in tl.static_range(NUM_LEVELS):
        height, width, start = level_geometry(shapes_ptr, starts_ptr, level)
        for point in tl.static_range(NUM_POINTS):
            lp = level * NUM_POINTS + point
            u = tl.load(loc_x + lp * LOC_STEP).to(tl.float32)
            v = tl.load(loc_y + lp * LOC_STEP).to(tl.float32)
            a = tl.load(attn_ptr + sample + lp).to(tl.float32)
            rows, masks, weights, _fx, _fy, _sx, _sy = bilinear_corners(
                u, v, width, height, start, a, True, ALIGN_CORNERS, BORDER, INDEX64, False)
            corners = load_corners(value_base, rows, masks, ch[None, :], c_mask[None, :],
                                   ROW_STRIDE)
            for c in tl.static_range(4):
                acc += weights[c][:, None] * corners[c].to(tl.float32)

    out_ptrs = out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])


@triton.jit
def msda_forward_samples_kernel(
    value_ptr, loc_ptr, attn_ptr, out_ptr, shapes_ptr, starts_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Same contract as ``msda_forward_kernel``, but all N_l*N_p samples of the query block are
    set up and gathered at once as (BLOCK_Q, BLOCK_S, BLOCK_C) tiles (BLOCK_S = next power of
    two >= N_l*N_p), so every corner load of the block is in flight together."""
    (batch, head, row, q_mask, ch, c_mask, s_mask, height, width, start, sample, _loc_x, _loc_y,
     u, v, a) = sample_block(loc_ptr, attn_ptr, shapes_ptr, starts_ptr, num_queries,
                             num_query_blocks, batch_size, NUM_HEADS, HEAD_DIM, NUM_LEVELS,
                             NUM_POINTS, LOC_B2QHLP, INDEX64, HEAD_SLOWEST, BLOCK_Q, BLOCK_C,
                             BLOCK_S)
    a = tl.where(s_mask[None, :], a, 0.0)  # padded samples: weight 0
    value_base = value_ptr + value_row_base(batch, head, total_pixels, NUM_HEADS,
                                            VALUE_BNLC) * HEAD_DIM
    ROW_STRIDE: tl.constexpr = (1 if VALUE_BNLC else NUM_HEADS) * HEAD_DIM

    rows, masks, weights, _fx, _fy, _sx, _sy = bilinear_corners(
        u, v, width[None, :], height[None, :], start[None, :], a, s_mask[None, :], ALIGN_CORNERS,
        BORDER, INDEX64, False)  # padded samples: every corner masked
    corners = load_corners(value_base, rows, masks, ch[None, None, :], c_mask[None, None, :],
                           ROW_STRIDE)
    total = weights[0][:, :, None] * corners[0].to(tl.float32)
    for c in tl.static_range(1, 4):
        total += weights[c][:, :, None] * corners[c].to(tl.float32)
    acc = tl.sum(total, axis=1)

    out_ptrs = out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])
