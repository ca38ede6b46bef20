"""Shared ``@triton.jit`` helpers: bilinear sampling setup along one axis.

Semantics (the sampling conventions of docs/math.md, as the NumPy reference implements them):
pixel coordinate ``u*size - 0.5`` (align_corners=False) or ``u*(size - 1)`` (True), fp32
throughout; zeros padding masks corners outside the map, border padding clips the coordinate
into [0, size-1] first (then a corner at ``size`` is outside and masked, and the derivative is
0 on and beyond the border, as grid_sample's); NaN contributes nothing; indices are always
clamped into the map so no access can leave the tensors. Kernels must load masked corners as
0 (never multiply a clamped pixel by a zero weight: 0 * inf is NaN). Also the
program-to-work mapping.
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
def program_coordinates(pid, num_query_blocks, batch_size, NUM_HEADS: tl.constexpr,
                        HEAD_SLOWEST: tl.constexpr):
    """(head, batch, query block) of a program.

    HEAD_SLOWEST: consecutive programs (those resident together) share one (head, batch), so
    each SM's L1 holds a single head's value slice (the small levels then hit in L1).
    Otherwise heads vary fastest.
    """
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
