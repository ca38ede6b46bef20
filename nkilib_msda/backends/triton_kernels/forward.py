"""MSDA forward: query-block tiling.

One program = BLOCK_Q consecutive queries of one (batch, head). Per (level, point) it loads
one location pair and one weight per query, gathers four (BLOCK_Q x C_h) corner tiles (each
row a contiguous head vector), accumulates in fp32 registers and stores once. Programs are
ordered head-fastest so concurrently running programs touch the same pixel rows (L2 reuse).
"""

import triton
import triton.language as tl

from nkilib_msda.backends.triton_kernels.sampling import axis_setup


@triton.jit
def msda_forward_kernel(
    value_ptr, loc_ptr, attn_ptr, out_ptr, shapes_ptr, starts_ptr,
    num_queries, total_pixels, num_query_blocks,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """value (B,L,N_h,C_h)|(B,N_h,L,C_h); loc (B,N_q,N_h,N_l,N_p,2)|(B,2,N_q,N_h,N_l,N_p);
    attn (B,N_q,N_h,N_l,N_p); out (B,N_q,N_h*C_h); shapes int32 (N_l,2); starts int32 (N_l,)."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    EVEN_C: tl.constexpr = BLOCK_C == HEAD_DIM
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    head = pid % NUM_HEADS
    rest = pid // NUM_HEADS
    q_block = rest % num_query_blocks
    batch = rest // num_query_blocks

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
            if EVEN_C:
                v00 = tl.load(p00)
                v01 = tl.load(p01)
                v10 = tl.load(p10)
                v11 = tl.load(p11)
            else:
                v00 = tl.load(p00, mask=c_mask[None, :], other=0.0)
                v01 = tl.load(p01, mask=c_mask[None, :], other=0.0)
                v10 = tl.load(p10, mask=c_mask[None, :], other=0.0)
                v11 = tl.load(p11, mask=c_mask[None, :], other=0.0)
            acc += w00[:, None] * v00.to(tl.float32)
            acc += w01[:, None] * v01.to(tl.float32)
            acc += w10[:, None] * v10.to(tl.float32)
            acc += w11[:, None] * v11.to(tl.float32)

    out_ptrs = out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_mask[:, None] & c_mask[None, :])
