"""Coordinate math shared by the MSDA forward and backward kernels (NKI, traced inline).

Each helper takes on-chip views of equal shape (the caller picks the layout) and emits the
same instruction sequence in both kernels; scalars may be Python floats or per-partition
``(P, 1)`` views. All math is fp32. The order is always:

1. :func:`remove_nan`: NaN -> 0 with a bitwise AND against an all-ones/zero int32 mask (no
   reliance on how max/min treat NaN); the mask also invalidates the sample's corners.
2. :func:`pixel_transform`: ``clamp(clamp(u, -3, 4) * scale + shift, lo, hi)``. The first
   clamp makes +-inf finite (so a 0 scale never meets inf) without changing the result: for
   every size >= 2 (or any size without align_corners) it maps beyond the second clamp's
   range. :func:`pixel_range` is the one documented range: zeros ``[-2, size + 1]`` (beyond
   it both corners are outside the map, so the clamp cannot change a result), border
   ``[0, size - 1]`` (the padding itself).
3. :func:`floor_and_fraction`: real floor (round-to-nearest-even cast, then subtract
   ``float(i) > x``; NKI float->int casts round, they do not truncate) and ``x - floor``.
4. :func:`corner_validity`: a corner is valid iff clamping it into ``[0, size - 1]`` did not
   move it and the sample is not NaN (:func:`apply_mask`). Invalid corners still gather the
   clamped (in-range) pixel, so their contribution is removed bitwise with
   :func:`corner_bits` / :func:`mask_bits`: ``0 * inf`` would otherwise turn a sample that
   reads nothing into NaN.

See docs/kernels.md, "Coordinate math".
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nisa, nl

__all__ = ["NORMALIZED_BOUND", "int32_bits", "pixel_scale", "pixel_range", "remove_nan", "pixel_transform",
           "floor_and_fraction", "clamp_corner", "corner_validity", "apply_mask",
           "corner_bits", "mask_bits"]

# Normalized coordinates are clamped to [-3, 4] first: finite, and mapped outside the pixel
# range for every scale >= 1 (-3 s - 0.5 <= -2 and 4 s - 0.5 >= s + 1 for s >= 1; with
# align_corners s = size - 1 >= 1 for size >= 2; size 1 with align_corners has s = 0).
NORMALIZED_BOUND = (-3.0, 4.0)


def int32_bits(view: Any) -> Any:
    """The int32 reinterpretation of a 4-byte (fp32) view of any strides, same shape.

    Built with ``.ap(view.get_pattern(), dtype=nl.int32)``: ``NkiTensor.view(dtype)`` requires
    a contiguous last dimension ("The last dimension must be contiguous in memory", NkiTensor
    page, NKI 0.7), which the strided coordinate views (BQHLP2 x/y interleave, the backward's
    u/v) and the stride-0 broadcasts of the pair select do not have; ``ap``'s ``dtype``
    reinterprets any pattern (docs/conformance.md, "Views")."""
    return view.ap(view.get_pattern(), dtype=nl.int32)


def pixel_scale(size: int, align_corners: bool) -> tuple[float, float]:
    """(scale, shift) with pixel = u * scale + shift."""
    if align_corners:
        return float(size - 1), 0.0
    return float(size), -0.5


def pixel_range(size: int, padding_mode: str) -> tuple[float, float]:
    """The clamp range of a pixel coordinate: zeros [-2, size + 1], border [0, size - 1]."""
    if padding_mode == "zeros":
        return -2.0, float(size + 1)
    return 0.0, float(size - 1)


def remove_nan(dst: Any, src: Any, mask: Any) -> None:
    """dst = src with NaN replaced by +0.0; mask (int32 view, same shape) = -1 (all ones)
    where src is a number, 0 where it is NaN. ``dst`` may alias ``src``."""
    nisa.tensor_tensor(dst=mask, data1=src, data2=src, op=nl.equal)
    nisa.tensor_scalar(dst=mask, data=mask, op0=nl.multiply, operand0=-1.0)  # 1 -> 0xFFFFFFFF
    nisa.tensor_tensor(dst=int32_bits(dst), data1=int32_bits(src), data2=mask,
                       op=nl.bitwise_and)


def pixel_transform(dst: Any, src: Any, scale: Any, shift: float, lo: Any, hi: Any,
                    scale_engine: Any = None) -> None:
    """dst = clamp(clamp(src, -3, 4) * scale + shift, lo, hi); src must be NaN-free."""
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.maximum, operand0=NORMALIZED_BOUND[0],
                       op1=nl.minimum, operand1=NORMALIZED_BOUND[1])
    if scale_engine == None:  # noqa: E711
        nisa.tensor_scalar(dst=dst, data=dst, op0=nl.multiply, operand0=scale, op1=nl.add,
                           operand1=shift)
    else:
        nisa.tensor_scalar(dst=dst, data=dst, op0=nl.multiply, operand0=scale, op1=nl.add,
                           operand1=shift, engine=scale_engine)
    nisa.tensor_scalar(dst=dst, data=dst, op0=nl.maximum, operand0=lo, op1=nl.minimum,
                       operand1=hi)


def floor_and_fraction(floor_dst: Any, frac_dst: Any, x: Any, ints: Any) -> None:
    """floor_dst = floor(x), frac_dst = x - floor(x) in [0, 1) (fp32, |x| < 2^23).

    ``ints`` is an int32 scratch view of x's shape; ``frac_dst`` doubles as the comparison
    scratch, so it must not alias ``x``."""
    nisa.tensor_copy(dst=ints, src=x)                                   # round to nearest even
    nisa.tensor_copy(dst=floor_dst, src=ints, engine=nisa.engine.scalar)  # back to fp32
    nisa.tensor_tensor(dst=frac_dst, data1=floor_dst, data2=x, op=nl.greater)
    nisa.tensor_tensor(dst=floor_dst, data1=floor_dst, data2=frac_dst, op=nl.subtract)
    nisa.tensor_tensor(dst=frac_dst, data1=x, data2=floor_dst, op=nl.subtract)


def clamp_corner(dst: Any, src: Any, size_minus_1: Any) -> None:
    """dst = clamp(src, 0, size - 1): the in-range index every corner gathers from."""
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.maximum, operand0=0.0, op1=nl.minimum,
                       operand1=size_minus_1)


def corner_validity(valid: Any, clamped: Any, unclamped: Any) -> None:
    """valid = 1.0 where the clamped corner equals the unclamped one, else 0.0 (fp32)."""
    nisa.tensor_tensor(dst=valid, data1=clamped, data2=unclamped, op=nl.equal)


def apply_mask(valid: Any, mask: Any) -> None:
    """valid &= mask (bitwise on int32 views): 1.0 stays 1.0 where the mask is all ones."""
    nisa.tensor_tensor(dst=int32_bits(valid), data1=int32_bits(valid), data2=mask,
                       op=nl.bitwise_and)


def corner_bits(bits: Any, valid_a: Any, valid_b: Any) -> None:
    """bits (int32) = -(valid_a * valid_b): all ones for a valid corner, 0 otherwise."""
    nisa.scalar_tensor_tensor(dst=bits, data=valid_a, op0=nl.multiply, operand0=-1.0,
                              op1=nl.multiply, operand1=valid_b)


def mask_bits(dst: Any, data: Any, bits: Any) -> None:
    """dst = data where bits is all ones, +0.0 where it is 0 (bitwise, so inf/NaN in data
    survive only where the corner is valid). dst/data: fp32 views; bits: int32 view."""
    nisa.tensor_tensor(dst=int32_bits(dst), data1=int32_bits(data), data2=bits,
                       op=nl.bitwise_and)
