"""Power-of-two row scaling of grad_output for the location and attention-weight gradients.

Those gradients are sums of corner dot products <g, V[row]>. With g near the float maximum a
single dot overflows, and a sum of overflowed dots of both signs is inf - inf = NaN, although
the exact gradient is finite or an infinity of one sign. Scaling each grad_output row by 2^-k
(its largest magnitude then lies in [1, 4); k <= 126 keeps 2^-k a normal float) before the
dots, and the finished gradients by 2^k last, overflows at most once, in the final multiply,
to the infinity of the right sign. The scaling is exact (only exponents move); rows whose
magnitudes are all below 2 are untouched. grad_value is not scaled: it sums the rows of many
queries, so no per-row scale applies (docs/math.md, "Non-finite inputs", says what that means).
"""

from __future__ import annotations

import math

import torch

__all__ = ["row_scales"]


def row_scales(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(2^-k, 2^k) for each row of ``grad`` (..., C), shaped (..., 1); k = 0 for rows whose
    largest magnitude is below 2 and for rows holding inf/NaN."""
    largest = grad.abs().amax(-1, keepdim=True)
    _, exponent = torch.frexp(largest)  # largest in [2^(e-1), 2^e)
    largest_k = math.frexp(torch.finfo(grad.dtype).max)[1] - 2  # 126 (fp32), 1022 (fp64)
    k = (exponent - 1).clamp(0, largest_k)
    one = torch.ones_like(largest)
    return torch.ldexp(one, -k), torch.ldexp(one, k)
