"""MSDA backward kernels.

``msda_backward_kernel``: one program = BLOCK_Q queries of one (batch, head), like the forward.
It recomputes the bilinear setup, reads grad_out once, and per (level, point):
- grad_attention_weights and grad_sampling_locations from the corner dots
  dc_c = <g, V[row_c]> (plain stores, one writer per element);
- grad_value either by relaxed atomic adds of a*m_c*w_c*g into an fp32 (or value-dtype)
  accumulator (fast default), or, when DETERMINISTIC, by writing one (row key, coefficient)
  entry per sample corner; the host sorts the keys stably and
  ``msda_grad_value_rows_kernel`` sums each row's entries in sorted order (bitwise reproducible).

``msda_backward_samples_kernel`` (the fast-mode default): the same math with all N_l*N_p
samples of the block at once, so locations and weights are read, and grad_loc / grad_attn
written, as coalesced (BLOCK_Q, BLOCK_S) tiles rather than one strided element per (level,
point); with one query per program it is 19-20 % faster on encoder-sized problems. The
grad_value reductions set the floor (L2 throughput ~94 % in Nsight Compute); they compile to
16-byte ``REDG.E.ADD.F32x4`` (checked in the SASS of Triton 3.6, benchmarks/reduction_sass.py).

Entry index of sample (b, q, h, l, p), corner c: ((((b*N_q + q)*N_h + h)*N_l + l)*N_p + p)*4 + c.
Row key of a corner: its row in the value tensor viewed as (-1, C_h); invalid corners get
``key_sentinel`` (= the row count) so they sort last and belong to no row.
"""

import triton
import triton.language as tl

from nkilib_msda.backends.triton_kernels.sampling import axis_setup, program_coordinates


@triton.jit
def _corner_dot(value_base, rows, valid, g, ch, c_mask, ROW_STRIDE: tl.constexpr):
    """<g[q, :], V[rows[q], :]> for each query of the block (fp32); 0 for masked corners
    (loaded as 0, so a clamped pixel holding inf/NaN cannot leak through a zero weight)."""
    ptrs = value_base + (rows * ROW_STRIDE)[:, None] + ch[None, :]
    vals = tl.load(ptrs, mask=valid[:, None] & c_mask[None, :], other=0.0)
    return tl.sum(vals.to(tl.float32) * g, axis=1)


@triton.jit
def _scatter_corner(grad_value_base, rows, coef, valid, g, ch, c_mask, ROW_STRIDE: tl.constexpr):
    """grad_value[rows[q], :] += coef[q] * g[q, :] for valid corners (relaxed atomics)."""
    ptrs = grad_value_base + (rows * ROW_STRIDE)[:, None] + ch[None, :]
    contrib = (coef[:, None] * g).to(grad_value_base.dtype.element_ty)
    tl.atomic_add(ptrs, contrib, mask=valid[:, None] & c_mask[None, :], sem="relaxed")


@triton.jit
def _write_entry(key_ptr, coef_ptr, entry, row_key_base, rows, coef, valid, q_mask, key_sentinel,
                 ROW_KEY_STRIDE: tl.constexpr):
    """Deterministic mode: record one (row key, coefficient) entry per query of the block."""
    keys = tl.where(valid, row_key_base + rows * ROW_KEY_STRIDE, key_sentinel)
    tl.store(key_ptr + entry, keys.to(key_ptr.dtype.element_ty), mask=q_mask)
    tl.store(coef_ptr + entry, coef, mask=q_mask)


@triton.jit
def msda_backward_kernel(
    grad_out_ptr, value_ptr, loc_ptr, attn_ptr, shapes_ptr, starts_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr, key_ptr, coef_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size, key_sentinel,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    COMPUTE_VALUE: tl.constexpr, COMPUTE_LOC: tl.constexpr, COMPUTE_ATTN: tl.constexpr,
    DETERMINISTIC: tl.constexpr, HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Shapes as the forward; grad_value in value's layout, grad_loc in loc's layout,
    grad_attn (B,N_q,N_h,N_l,N_p). key/coef (num_samples*4,) are used only when DETERMINISTIC."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    NEED_DOTS: tl.constexpr = COMPUTE_LOC or COMPUTE_ATTN
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

    row = (batch * num_queries + q) * NUM_HEADS + head
    sample = row * LP
    if LOC_B2QHLP:
        loc_offset = sample + batch * num_queries * NUM_HEADS * LP
        y_offset = num_queries * NUM_HEADS * LP
        LOC_STEP: tl.constexpr = 1
    else:
        loc_offset = sample * 2
        y_offset = 1
        LOC_STEP: tl.constexpr = 2
    if VALUE_BNLC:
        row_key_base = (batch * NUM_HEADS + head) * total_pixels
        ROW_KEY_STRIDE: tl.constexpr = 1
    else:
        row_key_base = batch * total_pixels * NUM_HEADS + head
        ROW_KEY_STRIDE: tl.constexpr = NUM_HEADS
    ROW_STRIDE: tl.constexpr = ROW_KEY_STRIDE * HEAD_DIM
    value_base = value_ptr + row_key_base * HEAD_DIM
    grad_value_base = grad_value_ptr + row_key_base * HEAD_DIM

    g = tl.load(grad_out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :],
                mask=c_mask[None, :], other=0.0).to(tl.float32)
    g = tl.where(q_mask[:, None], g, 0.0)

    for level in tl.static_range(NUM_LEVELS):
        height = tl.load(shapes_ptr + 2 * level)
        width = tl.load(shapes_ptr + 2 * level + 1)
        start = tl.load(starts_ptr + level)
        for point in tl.static_range(NUM_POINTS):
            lp = level * NUM_POINTS + point
            u = tl.load(loc_ptr + loc_offset + lp * LOC_STEP).to(tl.float32)
            v = tl.load(loc_ptr + loc_offset + y_offset + lp * LOC_STEP).to(tl.float32)
            a = tl.load(attn_ptr + sample + lp).to(tl.float32)
            x0, x1, fx, vx0, vx1, sx = axis_setup(u, width, ALIGN_CORNERS, BORDER)
            y0, y1, fy, vy0, vy1, sy = axis_setup(v, height, ALIGN_CORNERS, BORDER)
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
            m00 = vx0 & vy0
            m01 = vx1 & vy0
            m10 = vx0 & vy1
            m11 = vx1 & vy1
            w00 = tl.where(m00, (1.0 - fx) * (1.0 - fy), 0.0)
            w01 = tl.where(m01, fx * (1.0 - fy), 0.0)
            w10 = tl.where(m10, (1.0 - fx) * fy, 0.0)
            w11 = tl.where(m11, fx * fy, 0.0)

            if NEED_DOTS:
                d00 = _corner_dot(value_base, r00, m00, g, ch, c_mask, ROW_STRIDE)
                d01 = _corner_dot(value_base, r01, m01, g, ch, c_mask, ROW_STRIDE)
                d10 = _corner_dot(value_base, r10, m10, g, ch, c_mask, ROW_STRIDE)
                d11 = _corner_dot(value_base, r11, m11, g, ch, c_mask, ROW_STRIDE)
                if COMPUTE_ATTN:
                    ga = w00 * d00 + w01 * d01 + w10 * d10 + w11 * d11
                    tl.store(grad_attn_ptr + sample + lp, ga.to(grad_attn_ptr.dtype.element_ty),
                             mask=q_mask)
                if COMPUTE_LOC:
                    e00 = tl.where(m00, d00, 0.0)
                    e01 = tl.where(m01, d01, 0.0)
                    e10 = tl.where(m10, d10, 0.0)
                    e11 = tl.where(m11, d11, 0.0)
                    gx = (1.0 - fy) * (e01 - e00) + fy * (e11 - e10)
                    gy = (1.0 - fx) * (e10 - e00) + fx * (e11 - e01)
                    out_ty = grad_loc_ptr.dtype.element_ty
                    tl.store(grad_loc_ptr + loc_offset + lp * LOC_STEP, (a * sx * gx).to(out_ty),
                             mask=q_mask)
                    tl.store(grad_loc_ptr + loc_offset + y_offset + lp * LOC_STEP,
                             (a * sy * gy).to(out_ty), mask=q_mask)

            if COMPUTE_VALUE:
                if DETERMINISTIC:
                    entry = (sample + lp) * 4
                    _write_entry(key_ptr, coef_ptr, entry, row_key_base, r00, a * w00, m00 & q_mask,
                                 q_mask, key_sentinel, ROW_KEY_STRIDE)
                    _write_entry(key_ptr, coef_ptr, entry + 1, row_key_base, r01, a * w01,
                                 m01 & q_mask, q_mask, key_sentinel, ROW_KEY_STRIDE)
                    _write_entry(key_ptr, coef_ptr, entry + 2, row_key_base, r10, a * w10,
                                 m10 & q_mask, q_mask, key_sentinel, ROW_KEY_STRIDE)
                    _write_entry(key_ptr, coef_ptr, entry + 3, row_key_base, r11, a * w11,
                                 m11 & q_mask, q_mask, key_sentinel, ROW_KEY_STRIDE)
                else:
                    _scatter_corner(grad_value_base, r00, a * w00, m00 & q_mask, g, ch, c_mask,
                                    ROW_STRIDE)
                    _scatter_corner(grad_value_base, r01, a * w01, m01 & q_mask, g, ch, c_mask,
                                    ROW_STRIDE)
                    _scatter_corner(grad_value_base, r10, a * w10, m10 & q_mask, g, ch, c_mask,
                                    ROW_STRIDE)
                    _scatter_corner(grad_value_base, r11, a * w11, m11 & q_mask, g, ch, c_mask,
                                    ROW_STRIDE)


@triton.jit
def msda_grad_value_rows_kernel(
    grad_out_ptr, perm_ptr, coef_ptr, row_start_ptr, grad_value_ptr,
    total_pixels, num_rows,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, LP: tl.constexpr,
    VALUE_BNLC: tl.constexpr, INDEX64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Deterministic grad_value: BLOCK_R value rows per program, each the ordered sum of its
    sorted entries coef[e] * grad_out[b, q(e), h, :]. perm: entry ids sorted by (key, id);
    row_start (num_rows + 1,): first sorted position of each row key."""
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = rows < num_rows
    rows = tl.minimum(rows, num_rows - 1)
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < HEAD_DIM
    if VALUE_BNLC:
        head = (rows // total_pixels) % NUM_HEADS
    else:
        head = rows % NUM_HEADS
    first = tl.load(row_start_ptr + rows)
    count = tl.where(r_mask, tl.load(row_start_ptr + rows + 1) - first, 0)
    longest = tl.max(count, axis=0)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for i in range(0, longest):
        active = i < count
        entry = tl.load(perm_ptr + first + i, mask=active, other=0)
        coef = tl.load(coef_ptr + entry, mask=active, other=0.0)
        bq = entry // (4 * LP * NUM_HEADS)  # b * N_q + q
        g_ptrs = grad_out_ptr + ((bq * NUM_HEADS + head) * HEAD_DIM)[:, None] + ch[None, :]
        g = tl.load(g_ptrs, mask=active[:, None] & c_mask[None, :], other=0.0).to(tl.float32)
        acc += coef[:, None] * g
    out_ptrs = grad_value_ptr + (rows * HEAD_DIM)[:, None] + ch[None, :]
    tl.store(out_ptrs, acc.to(grad_value_ptr.dtype.element_ty),
             mask=r_mask[:, None] & c_mask[None, :])


@triton.jit
def msda_backward_samples_kernel(
    grad_out_ptr, value_ptr, loc_ptr, attn_ptr, shapes_ptr, starts_ptr,
    grad_value_ptr, grad_loc_ptr, grad_attn_ptr,
    num_queries, total_pixels, num_query_blocks, batch_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr, VALUE_BNLC: tl.constexpr, LOC_B2QHLP: tl.constexpr,
    ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr, INDEX64: tl.constexpr,
    COMPUTE_VALUE: tl.constexpr, COMPUTE_LOC: tl.constexpr, COMPUTE_ATTN: tl.constexpr,
    HEAD_SLOWEST: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Fast-mode backward with all N_l*N_p samples of the query block at once: locations and
    weights are read, and grad_loc / grad_attn written, as (BLOCK_Q, BLOCK_S) tiles (each
    query's samples are contiguous, so these accesses are coalesced instead of one strided
    element per (level, point)); corners are (BLOCK_Q, BLOCK_S, BLOCK_C) tiles. Same contract
    as ``msda_backward_kernel`` without DETERMINISTIC."""
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    NEED_DOTS: tl.constexpr = COMPUTE_LOC or COMPUTE_ATTN
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
    s = tl.minimum(s, LP - 1)  # padded samples re-read the last one; all their corners masked
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
    store_mask = q_mask[:, None] & s_mask[None, :]
    a = tl.where(store_mask, a, 0.0)  # tail queries and padded samples contribute nothing
    if VALUE_BNLC:
        row_key_base = (batch * NUM_HEADS + head) * total_pixels
        ROW_STRIDE: tl.constexpr = HEAD_DIM
    else:
        row_key_base = batch * total_pixels * NUM_HEADS + head
        ROW_STRIDE: tl.constexpr = NUM_HEADS * HEAD_DIM
    value_base = value_ptr + row_key_base * HEAD_DIM
    grad_value_base = grad_value_ptr + row_key_base * HEAD_DIM

    g = tl.load(grad_out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :],
                mask=c_mask[None, :], other=0.0).to(tl.float32)
    g3 = g[:, None, :]

    x0, x1, fx, vx0, vx1, sx = axis_setup(u, width[None, :], ALIGN_CORNERS, BORDER)
    y0, y1, fy, vy0, vy1, sy = axis_setup(v, height[None, :], ALIGN_CORNERS, BORDER)
    vx0 = vx0 & store_mask
    vx1 = vx1 & store_mask
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
    m00 = vx0 & vy0
    m01 = vx1 & vy0
    m10 = vx0 & vy1
    m11 = vx1 & vy1
    w00 = tl.where(m00, (1.0 - fx) * (1.0 - fy), 0.0)
    w01 = tl.where(m01, fx * (1.0 - fy), 0.0)
    w10 = tl.where(m10, (1.0 - fx) * fy, 0.0)
    w11 = tl.where(m11, fx * fy, 0.0)
    chan = ch[None, None, :]
    cm = c_mask[None, None, :]

    if NEED_DOTS:
        # Masked corners load 0 (a clamped pixel holding inf/NaN cannot leak through a 0 weight).
        d00 = tl.sum(tl.load(value_base + (r00 * ROW_STRIDE)[:, :, None] + chan,
                             mask=m00[:, :, None] & cm, other=0.0).to(tl.float32) * g3, axis=2)
        d01 = tl.sum(tl.load(value_base + (r01 * ROW_STRIDE)[:, :, None] + chan,
                             mask=m01[:, :, None] & cm, other=0.0).to(tl.float32) * g3, axis=2)
        d10 = tl.sum(tl.load(value_base + (r10 * ROW_STRIDE)[:, :, None] + chan,
                             mask=m10[:, :, None] & cm, other=0.0).to(tl.float32) * g3, axis=2)
        d11 = tl.sum(tl.load(value_base + (r11 * ROW_STRIDE)[:, :, None] + chan,
                             mask=m11[:, :, None] & cm, other=0.0).to(tl.float32) * g3, axis=2)
        if COMPUTE_ATTN:
            ga = w00 * d00 + w01 * d01 + w10 * d10 + w11 * d11
            tl.store(grad_attn_ptr + sample, ga.to(grad_attn_ptr.dtype.element_ty),
                     mask=store_mask)
        if COMPUTE_LOC:
            gx = (1.0 - fy) * (d01 - d00) + fy * (d11 - d10)
            gy = (1.0 - fx) * (d10 - d00) + fx * (d11 - d01)
            out_ty = grad_loc_ptr.dtype.element_ty
            tl.store(grad_loc_ptr + loc_x, (a * sx * gx).to(out_ty), mask=store_mask)
            tl.store(grad_loc_ptr + loc_y, (a * sy * gy).to(out_ty), mask=store_mask)

    if COMPUTE_VALUE:
        acc_ty = grad_value_base.dtype.element_ty
        tl.atomic_add(grad_value_base + (r00 * ROW_STRIDE)[:, :, None] + chan,
                      ((a * w00)[:, :, None] * g3).to(acc_ty), mask=m00[:, :, None] & cm,
                      sem="relaxed")
        tl.atomic_add(grad_value_base + (r01 * ROW_STRIDE)[:, :, None] + chan,
                      ((a * w01)[:, :, None] * g3).to(acc_ty), mask=m01[:, :, None] & cm,
                      sem="relaxed")
        tl.atomic_add(grad_value_base + (r10 * ROW_STRIDE)[:, :, None] + chan,
                      ((a * w10)[:, :, None] * g3).to(acc_ty), mask=m10[:, :, None] & cm,
                      sem="relaxed")
        tl.atomic_add(grad_value_base + (r11 * ROW_STRIDE)[:, :, None] + chan,
                      ((a * w11)[:, :, None] * g3).to(acc_ty), mask=m11[:, :, None] & cm,
                      sem="relaxed")
