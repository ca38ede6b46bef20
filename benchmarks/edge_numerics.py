"""Numerics at the edges: every backend must give the documented answer (docs/math.md,
"Non-finite inputs") for

1. infinite attention weights, on samples with corners outside the map (and inside it);
2. grad_output near the float32 maximum, where the exact gradients overflow float32.

Each check runs one backend through the public torch function
(``multi_scale_deformable_attention`` + ``torch.autograd.grad``) on fresh random inputs and
compares the forward and all three gradients with the float64 NumPy reference on the same
float32 inputs. Returns a list of mismatch descriptions (empty = pass). Used by the reference
and nki tests (CPU), by the Triton interpreter cases and by the Triton GPU test
(``check_edge_numerics("triton", "cuda")``).
"""

from __future__ import annotations

import numpy as np
import torch

import nkilib_msda
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.validation.arrays import as_float64

# Power-of-two sizes and locations on a 1/256 grid: the pixel coordinates are exact in float32
# and float64 alike, so a bilinear weight is 0 in both or in neither (an infinite weight times
# 0 is NaN: the pattern must not depend on rounding).
SHAPES = ((4, 8), (2, 4))
HEADS, CHANNELS, POINTS, QUERIES = 2, 8, 3, 24
FLOAT32_MAX = float(np.finfo(np.float32).max)
NAMES = ("output", "grad_value", "grad_sampling_locations", "grad_attention_weights")


def _inputs(device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    pixels = sum(h * w for h, w in SHAPES)
    value = torch.randn(1, pixels, HEADS, CHANNELS, generator=gen)
    # x, y in [-0.5, 1.5): about half of the samples have corners outside the map
    loc = (torch.randint(-128, 384, (1, QUERIES, HEADS, len(SHAPES), POINTS, 2), generator=gen)
           / 256.0)
    attn = torch.rand(1, QUERIES, HEADS, len(SHAPES), POINTS, generator=gen)
    grad = torch.randn(1, QUERIES, HEADS * CHANNELS, generator=gen)
    return tuple(t.to(device) for t in (value, loc, attn, grad))


def _run(backend: str, value, loc, attn, grad, padding_mode: str, value_layout: str
         ) -> list[np.ndarray]:
    """Output and gradients in BLNC (value given as BLNC, passed in ``value_layout``)."""
    if value_layout == "BNLC":
        value = value.transpose(1, 2).contiguous()
    tensors = [t.clone().requires_grad_() for t in (value, loc, attn)]
    out = nkilib_msda.multi_scale_deformable_attention(
        tensors[0], SHAPES, None, tensors[1], tensors[2], value_layout=value_layout,
        padding_mode=padding_mode, backend=backend)
    grads = list(torch.autograd.grad(out, tensors, grad))
    if value_layout == "BNLC":
        grads[0] = grads[0].transpose(1, 2)
    return [as_float64(t) for t in (out, *grads)]


def _reference(value, loc, attn, grad, padding_mode: str) -> list[np.ndarray]:
    v, l, a, g = (as_float64(t) for t in (value, loc, attn, grad))
    out = ms_deformable_attention_ref(v, SHAPES, None, l, a, padding_mode=padding_mode)
    return [out, *ms_deformable_attention_bwd_ref(g, v, SHAPES, None, l, a,
                                                  padding_mode=padding_mode)]


def _wholly_outside(loc: torch.Tensor) -> torch.Tensor:
    """Samples (B, N_q, N_h, N_l, N_p) none of whose four corners lies inside the map
    (align_corners=False: pixel = u * size - 0.5, corners floor(pixel) and floor(pixel) + 1)."""
    sizes = torch.tensor([[w, h] for h, w in SHAPES], dtype=loc.dtype).view(len(SHAPES), 1, 2)
    pixel = loc * sizes - 0.5
    axis_out = (pixel < -1) | (pixel >= sizes)
    return axis_out.any(-1)


def _same_non_finite(name: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    problems = []
    for kind, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        differ = int((test(got) != test(want)).sum())
        if differ:
            problems.append(f"{name}: {differ} elements differ in being {kind} "
                            f"(got {int(test(got).sum())}, reference {int(test(want).sum())})")
    finite = np.isfinite(got) & np.isfinite(want)
    scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    err = float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale
    if err > 1e-5:
        problems.append(f"{name}: finite elements differ by {err:.1e} of the largest")
    return problems


def infinite_weight_mismatches(backend: str, device: str = "cpu", padding_mode: str = "zeros",
                               value_layout: str = "BLNC", seed: int = 0) -> list[str]:
    """+-inf attention weights on one sample in six (inside, partly and wholly outside the
    map): same NaN / +inf / -inf elements as the reference in the output and every gradient."""
    value, loc, attn, grad = _inputs(device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    pick = torch.randint(0, 12, attn.shape, generator=gen).to(device)
    attn = torch.where(pick == 0, float("inf"), torch.where(pick == 1, -float("inf"), attn))
    got = _run(backend, value, loc, attn, grad, padding_mode, value_layout)
    want = _reference(value, loc, attn, grad, padding_mode)
    problems = [p for name, g, w in zip(NAMES, got, want) for p in _same_non_finite(name, g, w)]
    if padding_mode == "zeros":  # the rule itself: a sample with no corner inside the map
        outside = _wholly_outside(loc.cpu()).to(device)  # adds nothing, whatever its weight
        quiet = _reference(value, loc, torch.where(outside, 0.0, attn), grad, padding_mode)[0]
        problems += _same_non_finite("output (wholly outside samples weighted 0)", got[0], quiet)
    if not (np.isnan(want[0]).any() and np.isinf(want[0]).any() and np.isfinite(want[0]).any()):
        problems.append("inputs do not exercise NaN, inf and finite outputs")
    return problems


def huge_grad_mismatches(backend: str, device: str = "cpu", padding_mode: str = "zeros",
                         value_layout: str = "BLNC", seed: int = 0) -> list[str]:
    """grad_output rows scaled to 1e30 ... 3e38 (all finite). Location and weight gradients:
    no NaN; the infinity of the exact value's sign where that lies beyond the float32 range;
    finite and close where it lies well inside. grad_value sums many terms in float32 (on nki
    in several partial buffers), so a running sum may overflow first: it is checked only where
    its exact value is below 1 % of the float32 maximum, and beyond the float32 range for
    being finite (a running sum of terms of both signs may overflow in either direction before
    later terms would bring it back, so the sign of its infinity depends on the order of the
    sum, which float atomics do not fix)."""
    value, loc, attn, grad = _inputs(device, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    row_scale = torch.tensor([1e30, 1e37, 1e38, 3e38])[
        torch.randint(0, 4, grad.shape[:2] + (HEADS, 1), generator=gen)]
    grad = (grad.cpu().view(*grad.shape[:2], HEADS, CHANNELS).clamp(-1, 1) * row_scale
            ).view(grad.shape).to(device)
    got = _run(backend, value, loc, attn, grad, padding_mode, value_layout)
    want = _reference(value, loc, attn, grad, padding_mode)
    problems = []
    for name, g, w in zip(NAMES[1:], got[1:], want[1:]):
        checked = np.abs(w) < (0.01 if name == "grad_value" else np.inf) * FLOAT32_MAX
        nan = int(np.isnan(g[checked]).sum())
        if nan:
            problems.append(f"{name}: {nan} NaN (the reference has none)")
        beyond = np.abs(w) >= 1.001 * FLOAT32_MAX
        if name == "grad_value":  # a running sum may overflow either way first (any order)
            right, what = ~np.isfinite(g), "not finite"
        else:
            right, what = g == np.where(w > 0, np.inf, -np.inf), "the infinity of the exact value's sign"
        missed = int((~right[beyond]).sum())
        if missed:
            problems.append(f"{name}: {missed} of {int(beyond.sum())} overflowing elements are not {what}")
        inside = checked & (np.abs(w) <= 0.999 * FLOAT32_MAX)
        inf_inside = int(np.isinf(g[inside]).sum())
        if inf_inside:
            problems.append(f"{name}: {inf_inside} infinities where the exact value is finite")
        finite = inside & np.isfinite(g)
        err = float(np.abs(g[finite] - w[finite]).max(initial=0.0))
        if err > 1e-5 * float(np.abs(w[finite]).max(initial=1.0)):
            problems.append(f"{name}: finite elements differ by {err:.1e}")
    if not any((np.abs(w) >= 1.001 * FLOAT32_MAX).any() for w in want[2:]):
        problems.append("inputs do not make any location or weight gradient overflow")
    return problems


def check_edge_numerics(backend: str = "triton", device: str = "cuda") -> list[str]:
    """Both checks, both padding modes, both value layouts; mismatches prefixed with the case."""
    problems = []
    for padding_mode, value_layout in (("zeros", "BLNC"), ("border", "BNLC")):
        for check in (infinite_weight_mismatches, huge_grad_mismatches):
            problems += [f"{check.__name__} {padding_mode} {value_layout}: {p}"
                         for p in check(backend, device, padding_mode, value_layout)]
    return problems
