"""Shared ``@triton.jit`` helpers: bilinear sampling setup along one axis.

Semantics (the sampling conventions of docs/math.md, as the NumPy reference implements them):
pixel coordinate ``u*size - 0.5`` (align_corners=False) or ``u*(size - 1)`` (True), fp32
throughout; zeros padding masks corners outside the map, border padding clips the coordinate
into [0, size-1] first (then a corner at ``size`` is outside and masked, and the derivative is
0 on and beyond the border, as grid_sample's); NaN contributes nothing; indices are always
clamped into the map so no access can leave the tensors. Kernels must load masked corners as
0 (never multiply a clamped pixel by a zero weight: 0 * inf is NaN). Also the
program-to-work mapping.

Corner order everywhere: 00, 01, 10, 11 = (top, left), (top, right), (bottom, left),
(bottom, right). Helpers take blocks of any shape S (one sample per query, or queries x
samples) and append the channel axis last; ``chan`` and ``c_mask`` (channel offsets and mask)
come shaped (1, ..., BLOCK_C) with the rank of S x BLOCK_C.
"""

import triton
import triton.language as tl


@triton.jit
def axis_setup(u, size, ALIGN_CORNERS: tl.constexpr, BORDER: tl.constexpr):
    """Bilinear setup of normalized coordinates ``u`` (fp32 block) along an axis of ``size`` pixels.

    Returns (i0, i1, frac, valid0, valid1, scale): the clamped integer corner indices, the
    fractional weight of corner 1, the corner validity masks (zeros padding / NaN), and
    d(pixel)/du (0 where border padding clipped the coordinate or u is NaN).
    """
    size_f = size.to(tl.float32)
    if ALIGN_CORNERS:
        scale = size_f - 1.0
        x = u * scale
    else:
        scale = size_f
        x = u * size_f - 0.5
    finite = x == x  # False only for NaN; +-inf are clamped below
    # Replace NaN explicitly: min/max NaN semantics differ between the GPU and the interpreter.
    x = tl.where(finite, x, -2.0)
    if BORDER:
        inside = (x > 0.0) & (x < size_f - 1.0)
        x = tl.minimum(tl.maximum(x, 0.0), size_f - 1.0)
        d_scale = tl.where(inside & finite, scale, 0.0)
    else:
        # [-2, size + 1] keeps every corner's validity and weight unchanged.
        x = tl.minimum(tl.maximum(x, -2.0), size_f + 1.0)
        d_scale = tl.where(finite, scale, 0.0)
    x0 = tl.floor(x)
    frac = x - x0
    i0 = x0.to(tl.int32)
    i1 = i0 + 1
    valid0 = finite & (i0 >= 0) & (i0 < size)
    valid1 = finite & (i1 >= 0) & (i1 < size)
    i0 = tl.minimum(tl.maximum(i0, 0), size - 1)
    i1 = tl.minimum(tl.maximum(i1, 0), size - 1)
    return i0, i1, frac, valid0, valid1, d_scale


@triton.jit
def bilinear_corners(u, v, width, height, start, weight, keep, ALIGN_CORNERS: tl.constexpr,
                     BORDER: tl.constexpr, INDEX64: tl.constexpr, MASKS_FIRST: tl.constexpr):
    """The four bilinear corners of samples at normalized (u, v) (fp32 blocks of shape S) in a
    level of ``height`` x ``width`` pixels whose first pixel is value row ``start`` (all three
    broadcastable to S); ``keep`` (bool, broadcastable) masks whole samples.

    Returns ((r00, r01, r10, r11), (m00, m01, m10, m11), (w00, w01, w10, w11), fx, fy, sx, sy):
    the corners' value rows (clamped into the level; int64 when INDEX64), their masks (inside
    the map and kept), ``weight`` times their bilinear weights (0 where masked; the backward
    passes 1.0), the fractional offsets and d(pixel)/du, d(pixel)/dv (see ``axis_setup``).

    MASKS_FIRST changes only the instruction order, which ptxas schedules from: each kernel
    keeps the order its pre-helper version had, measured no slower (benchmarks/RESULTS.md,
    "One bilinear-corner helper"). With masks first the bf16 points forward compiles to 24
    more instructions (14 predicate spills, Triton 3.6, sm_90); with masks interleaved the
    bf16 all-samples backward is reordered and measured 1.4 % slower on the encoder shape.
    """
    x0, x1, fx, vx0, vx1, sx = axis_setup(u, width, ALIGN_CORNERS, BORDER)
    y0, y1, fy, vy0, vy1, sy = axis_setup(v, height, ALIGN_CORNERS, BORDER)
    vx0 = vx0 & keep
    vx1 = vx1 & keep
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
    # Same values either way; the order is what ptxas schedules from (see the docstring).
    if MASKS_FIRST:
        m00 = vx0 & vy0
        m01 = vx1 & vy0
        m10 = vx0 & vy1
        m11 = vx1 & vy1
        w00 = tl.where(m00, weight * (1.0 - fx) * (1.0 - fy), 0.0)
        w01 = tl.where(m01, weight * fx * (1.0 - fy), 0.0)
        w10 = tl.where(m10, weight * (1.0 - fx) * fy, 0.0)
        w11 = tl.where(m11, weight * fx * fy, 0.0)
    else:
        m00 = vx0 & vy0
        w00 = tl.where(m00, weight * (1.0 - fx) * (1.0 - fy), 0.0)
        m01 = vx1 & vy0
        w01 = tl.where(m01, weight * fx * (1.0 - fy), 0.0)
        m10 = vx0 & vy1
        w10 = tl.where(m10, weight * (1.0 - fx) * fy, 0.0)
        m11 = vx1 & vy1
        w11 = tl.where(m11, weight * fx * fy, 0.0)
    return (r00, r01, r10, r11), (m00, m01, m10, m11), (w00, w01, w10, w11), fx, fy, sx, sy


@triton.jit
def load_corner(value_base, rows, valid, chan, c_mask, ROW_STRIDE: tl.constexpr):
    """Value rows ``rows`` (block S) as an fp32 block S x BLOCK_C. Masked corners load 0, never
    the clamped pixel: a pixel holding inf/NaN would leak through a zero weight (0 * inf)."""
    ptrs = value_base + tl.expand_dims(rows * ROW_STRIDE, -1) + chan
    vals = tl.load(ptrs, mask=tl.expand_dims(valid, -1) & c_mask, other=0.0)
    return vals.to(tl.float32)


@triton.jit
def load_corners(value_base, rows, masks, chan, c_mask, ROW_STRIDE: tl.constexpr):
    """The four corners' value rows (``rows``, ``masks`` as ``bilinear_corners`` returns them)
    as blocks S x BLOCK_C in value's dtype (masked corners 0); every address is formed before
    the first load, and the caller converts at use, as the unrolled original did (ptxas
    schedules the gathers from this order)."""
    p00 = value_base + tl.expand_dims(rows[0] * ROW_STRIDE, -1) + chan
    p01 = value_base + tl.expand_dims(rows[1] * ROW_STRIDE, -1) + chan
    p10 = value_base + tl.expand_dims(rows[2] * ROW_STRIDE, -1) + chan
    p11 = value_base + tl.expand_dims(rows[3] * ROW_STRIDE, -1) + chan
    return (tl.load(p00, mask=tl.expand_dims(masks[0], -1) & c_mask, other=0.0),
            tl.load(p01, mask=tl.expand_dims(masks[1], -1) & c_mask, other=0.0),
            tl.load(p10, mask=tl.expand_dims(masks[2], -1) & c_mask, other=0.0),
            tl.load(p11, mask=tl.expand_dims(masks[3], -1) & c_mask, other=0.0))


@triton.jit
def program_coordinates(num_query_blocks, batch_size, NUM_HEADS: tl.constexpr,
                        INDEX64: tl.constexpr, HEAD_SLOWEST: tl.constexpr):
    """(head, batch, query block) of this program (int64 when INDEX64).

    HEAD_SLOWEST: consecutive programs (those resident together) share one (head, batch), so
    each SM's L1 holds a single head's value slice (the small levels then hit in L1).
    Otherwise heads vary fastest. (A (query blocks, batch, heads) grid, which saves the two
    integer divisions, was measured within noise on an H200 and removed: docs/triton.md.)
    """
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    if HEAD_SLOWEST:
        q_block = pid % num_query_blocks
        rest = pid // num_query_blocks
        batch = rest % batch_size
        head = rest // batch_size
    else:
        head = pid % NUM_HEADS
        rest = pid // NUM_HEADS
        q_block = rest % num_query_blocks
        batch = rest // num_query_blocks
    return head, batch, q_block


@triton.jit
def level_geometry(shapes_ptr, starts_ptr, level):
    """(height, width, first value row) of ``level`` (a scalar or a block of level indices)."""
    height = tl.load(shapes_ptr + 2 * level)
    width = tl.load(shapes_ptr + 2 * level + 1)
    start = tl.load(starts_ptr + level)
    return height, width, start


@triton.jit
def query_block(num_queries, num_query_blocks, batch_size, NUM_HEADS: tl.constexpr,
                HEAD_DIM: tl.constexpr, INDEX64: tl.constexpr, HEAD_SLOWEST: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's BLOCK_Q consecutive queries of one (batch, head).

    Returns (batch, head, row, q_mask, ch, c_mask): row (BLOCK_Q,) the queries' (b, q, h) rows
    of out / grad_out (tail queries re-read the last query; only their stores are masked by
    q_mask), ch and c_mask the channel offsets and mask (BLOCK_C,). int64 when INDEX64.
    """
    head, batch, q_block = program_coordinates(num_query_blocks, batch_size, NUM_HEADS, INDEX64,
                                               HEAD_SLOWEST)
    q = q_block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    q = tl.minimum(q, num_queries - 1)
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < HEAD_DIM
    row = (batch * num_queries + q) * NUM_HEADS + head
    return batch, head, row, q_mask, ch, c_mask


@triton.jit
def sample_tiles(loc_ptr, attn_ptr, shapes_ptr, starts_ptr, row, batch, num_queries,
                 NUM_HEADS: tl.constexpr, NUM_LEVELS: tl.constexpr, NUM_POINTS: tl.constexpr,
                 LOC_B2QHLP: tl.constexpr, BLOCK_S: tl.constexpr):
    """All N_l*N_p samples of the rows ``row`` (BLOCK_Q,) as coalesced (BLOCK_Q, BLOCK_S) tiles
    (each query's samples are contiguous, level-major).

    Returns (s_mask, height, width, start, sample, loc_x, loc_y, u, v, a): s_mask (BLOCK_S,)
    the real samples (padded ones re-read the last sample), each sample's level size and first
    value row (BLOCK_S,), the flat sample index, the element offsets of x and y in loc's layout,
    and the locations and weight in fp32.
    """
    LP: tl.constexpr = NUM_LEVELS * NUM_POINTS
    s = tl.arange(0, BLOCK_S)
    s_mask = s < LP
    s = tl.minimum(s, LP - 1)
    height, width, start = level_geometry(shapes_ptr, starts_ptr, s // NUM_POINTS)
    sample = row[:, None] * LP + s[None, :]
    if LOC_B2QHLP:
        loc_x = sample + batch * num_queries * NUM_HEADS * LP
        loc_y = loc_x + num_queries * NUM_HEADS * LP
    else:
        loc_x = sample * 2
        loc_y = loc_x + 1
    u = tl.load(loc_ptr + loc_x).to(tl.float32)
    v = tl.load(loc_ptr + loc_y).to(tl.float32)
    a = tl.load(attn_ptr + sample).to(tl.float32)
    return s_mask, height, width, start, sample, loc_x, loc_y, u, v, a


@triton.jit
def sample_block(loc_ptr, attn_ptr, shapes_ptr, starts_ptr, num_queries, num_query_blocks,
                 batch_size, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 NUM_LEVELS: tl.constexpr, NUM_POINTS: tl.constexpr, LOC_B2QHLP: tl.constexpr,
                 INDEX64: tl.constexpr, HEAD_SLOWEST: tl.constexpr,
                 BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """The prologue of the samples kernels: this program's query block (:func:`query_block`)
    and all its samples as (BLOCK_Q, BLOCK_S) tiles (:func:`sample_tiles`).

    Returns (batch, head, row, q_mask, ch, c_mask, s_mask, height, width, start, sample, loc_x,
    loc_y, u, v, a), as those two helpers return them.
    """
    batch, head, row, q_mask, ch, c_mask = query_block(
        num_queries, num_query_blocks, batch_size, NUM_HEADS, HEAD_DIM, INDEX64, HEAD_SLOWEST,
        BLOCK_Q, BLOCK_C)
    s_mask, height, width, start, sample, loc_x, loc_y, u, v, a = sample_tiles(
        loc_ptr, attn_ptr, shapes_ptr, starts_ptr, row, batch, num_queries, NUM_HEADS,
        NUM_LEVELS, NUM_POINTS, LOC_B2QHLP, BLOCK_S)
    return batch, head, row, q_mask, ch, c_mask, s_mask, height, width, start, sample, loc_x, loc_y, u, v, a


@triton.jit
def value_row_base(batch, head, total_pixels, NUM_HEADS: tl.constexpr, VALUE_BNLC: tl.constexpr):
    """Row of the (batch, head) slice's first pixel in value viewed as (-1, C_h) rows; its
    pixels are 1 (BNLC) or N_h (BLNC) rows apart."""
    if VALUE_BNLC:
        base = (batch * NUM_HEADS + head) * total_pixels
    else:
        base = batch * total_pixels * NUM_HEADS + head
    return base
