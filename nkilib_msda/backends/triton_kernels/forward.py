"""MSDA forward: query-block tiling.

One program = BLOCK_Q consecutive queries of one (batch, head). Per (level, point) it loads
one location pair and one weight per query, gathers four (BLOCK_Q x C_h) corner tiles (each
row a contiguous head vector), accumulates in fp32 registers and stores once. Programs are
ordered head-fastest so concurrently running programs touch the same pixel rows (L2 reuse).
"""

import triton
import triton.language as tl

from nkilib_msda.backends.triton_kernels.sampling import axis_setup, program_coordinates


@triton.jit
def msda_forward_kernel(
    value_ptr, loc_ptr, attn_ptr, out_ptr, shapes_ptr, starts_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """value (B,L,N_h,C_h)|(B,N_h,L,C_h); loc (B,N_q,N_h,N_l,N_p,2)|(B,2,N_q,N_h,N_l,N_p);
    attn (B,N_q,N_h,N_l,N_p); out (B,N_q,N_h*C_h); shapes int32 (N_l,2); starts int32 (N_l,)."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    head, batch, q_block = program_coordinates(pid, num_query_blocks, batch_size, NUM_HEADS,
                                               HEAD_SLOWEST)

    q = q_block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    q = tl.minimum(q, num_queries - 1)  # tail queries re-read the last query; only stores are masked
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < HEAD_DIM

    row = (batch * num_queries + q) * NUM_HEADS + head  # (b, q, h) row of out / grad_out
    sample = row * LP  # flat (b, q, h, l=0, p=0) sample index
    if LOC_B2QHLP:
        loc_x = loc_ptr + sample + batch * num_queries * NUM_HEADS * LP
        loc_y = loc_x + num_queries * NUM_HEADS * LP
        LOC_STEP: tl.constexpr = 1
    else:
        loc_x = loc_ptr + sample * 2
        loc_y = loc_x + 1
        LOC_STEP: tl.constexpr = 2
    if VALUE_BNLC:
        value_base = value_ptr + (batch * NUM_HEADS + head) * total_pixels * HEAD_DIM
        ROW_STRIDE: tl.constexpr = HEAD_DIM
    else:
        value_base = value_ptr + (batch * total_pixels * NUM_HEADS + head) * HEAD_DIM
        ROW_STRIDE: tl.constexpr = NUM_HEADS * HEAD_DIM

    acc = tl.zeros([BLOCK_Q, BLOCK_C], dtype=tl.float32)
    for level in tl.static_range(NUM_LEVELS):
        height = tl.load(shapes_ptr + 2 * level)
        width = tl.load(shapes_ptr + 2 * level + 1)
        start = tl.load(starts_ptr + level)
        for point in tl.static_range(NUM_POINTS):
            lp = level * NUM_POINTS + point
            u = tl.load(loc_x + lp * LOC_STEP).to(tl.float32)
            v = tl.load(loc_y + lp * LOC_STEP).to(tl.float32)
            a = tl.load(attn_ptr + sample + lp).to(tl.float32)
            x0, x1, fx, vx0, vx1, _sx = axis_setup(u, width, ALIGN_CORNERS, BORDER)
            y0, y1, fy, vy0, vy1, _sy = axis_setup(v, height, ALIGN_CORNERS, BORDER)
            top = start + y0 * width
            bottom = start + y1 * width
            r00 = top + x0
            r01 = top + x1
            r10 = bottom + x0
            r11 = bottom + x1
            if INDEX64:
                r00 = r00.to(tl.int64)
                r01 = r01.to(tl.int64)
                r10 = r10.to(tl.int64)
                r11 = r11.to(tl.int64)
            w00 = tl.where(vx0 & vy0, a * (1.0 - fx) * (1.0 - fy), 0.0)
            w01 = tl.where(vx1 & vy0, a * fx * (1.0 - fy), 0.0)
            w10 = tl.where(vx0 & vy1, a * (1.0 - fx) * fy, 0.0)
            w11 = tl.where(vx1 & vy1, a * fx * fy, 0.0)
            p00 = value_base + (r00 * ROW_STRIDE)[:, None] + ch[None, :]
            p01 = value_base + (r01 * ROW_STRIDE)[:, None] + ch[None, :]
            p10 = value_base + (r10 * ROW_STRIDE)[:, None] + ch[None, :]
            p11 = value_base + (r11 * ROW_STRIDE)[:, None] + ch[None, :]
            # Masked corners load 0 (not the clamped pixel): 0 * inf would leak NaN.
            cm = c_mask[None, :]
            v00 = tl.load(p00, mask=(vx0 & vy0)[:, None] & cm, other=0.0)
            v01 = tl.load(p01, mask=(vx1 & vy0)[:, None] & cm, other=0.0)
            v10 = tl.load(p10, mask=(vx0 & vy1)[:, None] & cm, other=0.0)
            v11 = tl.load(p11, mask=(vx1 & vy1)[:, None] & cm, other=0.0)
            acc += w00[:, None] * v00.to(tl.float32)
            acc += w01[:, None] * v01.to(tl.float32)
            acc += w10[:, None] * v10.to(tl.float32)
            acc += w11[:, None] * v11.to(tl.float32)

    out_ptrs = out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])


@triton.jit
def msda_forward_samples_kernel(
    value_ptr, loc_ptr, attn_ptr, out_ptr, shapes_ptr, starts_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Same contract as ``msda_forward_kernel``, but all N_l*N_p samples of the query block are
    set up and gathered at once as (BLOCK_Q, BLOCK_S, BLOCK_C) tiles (BLOCK_S = next power of
    two >= N_l*N_p), so every corner load of the block is in flight together."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    head, batch, q_block = program_coordinates(pid, num_query_blocks, batch_size, NUM_HEADS,
                                               HEAD_SLOWEST)

    q = q_block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    q = tl.minimum(q, num_queries - 1)
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < HEAD_DIM
    s = tl.arange(0, BLOCK_S)
    s_mask = s < LP
    s = tl.minimum(s, LP - 1)  # padded samples re-read the last one with weight 0
    level = s // NUM_POINTS
    height = tl.load(shapes_ptr + 2 * level)
    width = tl.load(shapes_ptr + 2 * level + 1)
    start = tl.load(starts_ptr + level)

    row = (batch * num_queries + q) * NUM_HEADS + head
    sample = row[:, None] * LP + s[None, :]  # (BLOCK_Q, BLOCK_S) flat sample index
    if LOC_B2QHLP:
        loc_x = sample + batch * num_queries * NUM_HEADS * LP
        loc_y = loc_x + num_queries * NUM_HEADS * LP
    else:
        loc_x = sample * 2
        loc_y = loc_x + 1
    u = tl.load(loc_ptr + loc_x).to(tl.float32)
    v = tl.load(loc_ptr + loc_y).to(tl.float32)
    a = tl.load(attn_ptr + sample).to(tl.float32)
    a = tl.where(s_mask[None, :], a, 0.0)
    if VALUE_BNLC:
        value_base = value_ptr + (batch * NUM_HEADS + head) * total_pixels * HEAD_DIM
        ROW_STRIDE: tl.constexpr = HEAD_DIM
    else:
        value_base = value_ptr + (batch * total_pixels * NUM_HEADS + head) * HEAD_DIM
        ROW_STRIDE: tl.constexpr = NUM_HEADS * HEAD_DIM

    x0, x1, fx, vx0, vx1, _sx = axis_setup(u, width[None, :], ALIGN_CORNERS, BORDER)
    y0, y1, fy, vy0, vy1, _sy = axis_setup(v, height[None, :], ALIGN_CORNERS, BORDER)
    vx0 = vx0 & s_mask[None, :]  # padded samples: every corner masked
    vx1 = vx1 & s_mask[None, :]
    top = start[None, :] + y0 * width[None, :]
    bottom = start[None, :] + y1 * width[None, :]
    r00 = top + x0
    r01 = top + x1
    r10 = bottom + x0
    r11 = bottom + x1
    if INDEX64:
        r00 = r00.to(tl.int64)
        r01 = r01.to(tl.int64)
        r10 = r10.to(tl.int64)
        r11 = r11.to(tl.int64)
    w00 = tl.where(vx0 & vy0, a * (1.0 - fx) * (1.0 - fy), 0.0)
    w01 = tl.where(vx1 & vy0, a * fx * (1.0 - fy), 0.0)
    w10 = tl.where(vx0 & vy1, a * (1.0 - fx) * fy, 0.0)
    w11 = tl.where(vx1 & vy1, a * fx * fy, 0.0)
    chan = ch[None, None, :]
    p00 = value_base + (r00 * ROW_STRIDE)[:, :, None] + chan
    p01 = value_base + (r01 * ROW_STRIDE)[:, :, None] + chan
    p10 = value_base + (r10 * ROW_STRIDE)[:, :, None] + chan
    p11 = value_base + (r11 * ROW_STRIDE)[:, :, None] + chan
    cm = c_mask[None, None, :]  # masked corners load 0 (0 * inf would leak NaN)
    v00 = tl.load(p00, mask=(vx0 & vy0)[:, :, None] & cm, other=0.0)
    v01 = tl.load(p01, mask=(vx1 & vy0)[:, :, None] & cm, other=0.0)
    v10 = tl.load(p10, mask=(vx0 & vy1)[:, :, None] & cm, other=0.0)
    v11 = tl.load(p11, mask=(vx1 & vy1)[:, :, None] & cm, other=0.0)
    total = w00[:, :, None] * v00.to(tl.float32)
    total += w01[:, :, None] * v01.to(tl.float32)
    total += w10[:, :, None] * v10.to(tl.float32)
    total += w11[:, :, None] * v11.to(tl.float32)
    acc = tl.sum(total, axis=1)

    out_ptrs = out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])
