"""Vectorized PyTorch MSDA with an analytic backward (the "reference" backend).

Runs on any device and dtype, supports every layout and the three padding modes, and follows
the conventions of docs/math.md exactly: ``loc[..., 0]`` is x along W, pixel x = u*W - 0.5
(``align_corners=False``) or u*(W-1) (``True``), corners (y0,x0), (y0,x1), (y1,x0), (y1,x1),
grid_sample's padding rules, and exact derivatives (0 where a coordinate is clipped). A NaN
coordinate (any non-finite one in reflection mode) contributes nothing and gets zero gradient.
A corner outside the map contributes nothing to the output or to any gradient, even when the
pixel its index was clamped to holds inf/NaN or its attention weight is infinite (its gathered
value and coefficient are masked, not multiplied by a zero weight); an in-map corner that reads
inf/NaN propagates it. Location and weight gradients use power-of-two scaled grad_output rows
(:mod:`._grad_scale`), so grad_output near the float maximum overflows to the right infinity.

The backward is analytic (gather + ``index_add_``): autograd is off inside custom-op
implementations, so it may not rely on ``torch.autograd``. Coordinates and accumulation are
float64 for float64 inputs and float32 otherwise.

CPU tensors take :mod:`._cpu_sampling` instead (the same results from weighted row lookups:
``embedding_bag`` forward, a sorted segmented sum for grad_value; docs/performance.md, "CPU");
the general path below runs on every other device, and on CPU recomputes a forward whose
output is not finite (the one case where the two formulations could differ).

This module also holds the Block AttnRes reference (closed-form torch, see
docs/block_attn_res.md), registered for both operator families in :mod:`nkilib_msda.backends`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from nkilib_msda.backends.reference import _cpu_sampling
from nkilib_msda.backends.reference._cpu_workers import call_serial
from nkilib_msda.backends.reference._bilinear import LevelTables, axis, level_tables
from nkilib_msda.backends.reference._grad_scale import row_scales
from nkilib_msda.backends.protocol import ANY_DEVICE, Capabilities
from nkilib_msda.validation.layouts import location_axis, permutation
from nkilib_msda.validation.msda import FLOAT_DTYPE_NAMES, PADDING_MODES, MSDAProblem

__all__ = ["NAME", "CAPABILITIES", "is_available", "unsupported_reason",
           "backward_unsupported_reason", "msda_forward", "msda_backward",
           "block_attn_res_unsupported_reason", "block_attn_res_forward", "block_attn_res_backward"]

NAME = "reference"
CAPABILITIES = Capabilities(
    device_types=ANY_DEVICE, default_for=(), dtypes=FLOAT_DTYPE_NAMES, padding_modes=PADDING_MODES,
    # index_add_ on CUDA accumulates with atomics: reproducible only on request (below).
    always_deterministic=False, block_attn_res_dtypes=FLOAT_DTYPE_NAMES)

# Gathered corner values held at once (B * q * N_h * N_l * N_p * 4 * C_h elements): queries are
# processed in chunks below this, so memory stays bounded for encoder-size problems.
_GATHER_ELEMENTS_PER_CHUNK = 1 << 22
# CPU tensors take the embedding_bag formulation of _cpu_sampling (same results, faster).
_CPU_PATH = True


def is_available() -> bool:
    """The reference backend works wherever torch does."""
    return True


def unsupported_reason(problem: MSDAProblem, value: torch.Tensor,
                       sampling_locations: torch.Tensor) -> str | None:
    """The reference backend supports every problem, layout, padding mode and dtype."""
    return None


def backward_unsupported_reason(problem: MSDAProblem, value: torch.Tensor,
                                sampling_locations: torch.Tensor) -> str | None:
    """Its backward has no limits of its own either."""
    return None


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# ------------------------------------------------------------------ layouts


def _value_rows(value: torch.Tensor, problem: MSDAProblem, dtype: torch.dtype) -> torch.Tensor:
    """Value as (B*N_h*L, C_h) rows ordered (b, h, pixel)."""
    v = value.to(dtype).permute(*permutation(problem.value_layout, "BNLC"))
    return v.reshape(-1, problem.head_dim)


def _rows_to_value_layout(rows: torch.Tensor, problem: MSDAProblem) -> torch.Tensor:
    """Inverse of :func:`_value_rows`: (B*N_h*L, C_h) back to the value layout."""
    p = problem
    v = rows.view(p.batch, p.num_heads, p.total_pixels, p.head_dim)
    return v.permute(*permutation("BNLC", p.value_layout)).contiguous()


def _locations_xy(sampling_locations: torch.Tensor, problem: MSDAProblem, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized (u, v), each (B, N_q, N_h, N_l, N_p)."""
    loc = sampling_locations.to(dtype)
    xy = location_axis(problem.sampling_locations_layout, "2")
    return loc.select(xy, 0), loc.select(xy, 1)


def _to_location_layout(grad_u: torch.Tensor, grad_v: torch.Tensor, problem: MSDAProblem
                        ) -> torch.Tensor:
    return torch.stack((grad_u, grad_v), dim=location_axis(problem.sampling_locations_layout, "2"))


# ------------------------------------------------------- bilinear sampling terms


@dataclass(frozen=True)
class _Terms:
    """Per sample and corner, (B, N_q, N_h, N_l, N_p, 4): rows into the (B*N_h*L, C_h) view,
    whether the corner is inside the map (bool), masked bilinear weights m_c*w_c and their
    derivatives with respect to normalized u and v."""

    rows: torch.Tensor
    inside: torch.Tensor
    weights: torch.Tensor
    d_du: torch.Tensor
    d_dv: torch.Tensor


def _terms(problem: MSDAProblem, levels: LevelTables, u: torch.Tensor, v: torch.Tensor) -> _Terms:
    """Bilinear terms for normalized coordinates ``u``, ``v`` of shape (B, q, N_h, N_l, N_p)."""
    p = problem
    device, dtype = u.device, u.dtype
    heights, widths, starts = levels.heights, levels.widths, levels.starts
    ax = axis(u, widths, p.align_corners, p.padding_mode)
    ay = axis(v, heights, p.align_corners, p.padding_mode)

    def corners(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.stack((a, b, c, d), dim=-1)

    dx, dy = ax.frac, ay.frac
    inside = corners(ay.valid0 & ax.valid0, ay.valid0 & ax.valid1,
                     ay.valid1 & ax.valid0, ay.valid1 & ax.valid1)
    valid = inside.to(dtype)
    weights = corners((1 - dx) * (1 - dy), dx * (1 - dy), (1 - dx) * dy, dx * dy) * valid
    gx = corners(-(1 - dy), (1 - dy), -dy, dy) * valid
    gy = corners(-(1 - dx), -dx, (1 - dx), dx) * valid
    w_int = widths.to(torch.int64)
    pixel = corners(ay.index0 * w_int + ax.index0, ay.index0 * w_int + ax.index1,
                    ay.index1 * w_int + ax.index0, ay.index1 * w_int + ax.index1) + starts[..., None]
    batch_head = (torch.arange(p.batch, device=device)[:, None] * p.num_heads
                  + torch.arange(p.num_heads, device=device)[None, :])  # (B, N_h)
    rows = pixel + (batch_head * p.total_pixels)[:, None, :, None, None, None]
    return _Terms(rows=rows, inside=inside, weights=weights,
                  d_du=gx * ax.deriv[..., None], d_dv=gy * ay.deriv[..., None])


def _use_cpu_path(value: torch.Tensor) -> bool:
    """The embedding_bag formulation (:mod:`._cpu_sampling`) on CPU tensors, unless switched off
    (``_CPU_PATH = False``, which the tests use to compare it with the general path)."""
    return _CPU_PATH and value.device.type == "cpu"


def _query_chunks(problem: MSDAProblem, elements_per_corner: int | None = None) -> list[slice]:
    """Query ranges whose corners hold below ``_GATHER_ELEMENTS_PER_CHUNK`` elements: C_h
    gathered values each (general path) or ``elements_per_corner``."""
    p = problem
    per_corner = p.head_dim if elements_per_corner is None else elements_per_corner
    per_query = p.batch * p.num_heads * p.num_levels * p.num_points * 4 * per_corner
    step = max(1, _GATHER_ELEMENTS_PER_CHUNK // per_query)
    return [slice(q0, min(q0 + step, p.num_queries)) for q0 in range(0, p.num_queries, step)]


def _cpu_chunks(problem: MSDAProblem) -> list[slice]:
    return _query_chunks(problem, _cpu_sampling.ELEMENTS_PER_CORNER)


def _gather(value_rows: torch.Tensor, terms: _Terms) -> torch.Tensor:
    """(…, 4) corners -> (…, 4, C_h) value rows, zero for corners outside the map (the row they
    were clamped to may hold inf/NaN, which a zero weight would turn into NaN)."""
    rows = terms.rows
    sampled = value_rows.index_select(0, rows.reshape(-1)).view(*rows.shape, value_rows.shape[-1])
    return torch.where(terms.inside[..., None], sampled, torch.zeros((), dtype=sampled.dtype,
                                                                      device=sampled.device))


# ---------------------------------------------- CPU path (run by _cpu_workers.call_serial)


def _cpu_forward(value: torch.Tensor, problem: MSDAProblem, sampling_locations: torch.Tensor,
                 attention_weights: torch.Tensor) -> torch.Tensor | None:
    """:func:`msda_forward` by :mod:`._cpu_sampling`; None if the output is not finite (a
    clamped out-of-map corner may have read inf/NaN: the general path recomputes it)."""
    p = problem
    dtype = _compute_dtype(value, sampling_locations, attention_weights)
    u, v = _locations_xy(sampling_locations, p, dtype)
    out = torch.empty(p.batch, p.num_queries, p.num_heads, p.head_dim, dtype=dtype,
                      device=value.device)
    if not _cpu_sampling.forward(_cpu_sampling.value_matrix(value, dtype), p,
                                 level_tables(p, dtype, u.device), u, v,
                                 attention_weights.to(dtype), out, _cpu_chunks(p)):
        return None
    return out.reshape(p.output_shape).to(value.dtype)


def _cpu_backward(grad_output: torch.Tensor, value: torch.Tensor, problem: MSDAProblem,
                  sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                  compute: tuple[bool, bool, bool]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`msda_backward` by :mod:`._cpu_sampling`."""
    p = problem
    dtype = _compute_dtype(value, sampling_locations, attention_weights, grad_output)
    u, v = _locations_xy(sampling_locations, p, dtype)
    grad = grad_output.to(dtype).reshape(p.batch, p.num_queries, p.num_heads, p.head_dim)
    grad_rows, grad_u, grad_v, grad_attn = _cpu_sampling.backward(
        grad, _cpu_sampling.value_matrix(value, dtype), p, level_tables(p, dtype, u.device), u, v,
        attention_weights.to(dtype), compute, _cpu_chunks(p))
    grad_loc = (_to_location_layout(grad_u, grad_v, p) if compute[1]
                else torch.zeros(p.sampling_locations_shape, dtype=dtype, device=value.device))
    return grad_rows.view(p.value_shape), grad_loc, grad_attn


# ----------------------------------------------------------------- public entry points


def msda_forward(value: torch.Tensor, problem: MSDAProblem, sampling_locations: torch.Tensor,
                 attention_weights: torch.Tensor) -> torch.Tensor:
    """Output (B, N_q, N_h*C_h) in value's dtype."""
    p = problem
    if _use_cpu_path(value):
        result = call_serial(lambda: _cpu_forward(value, p, sampling_locations, attention_weights))
        if result is not None:
            return result
    dtype = _compute_dtype(value, sampling_locations, attention_weights)
    u, v = _locations_xy(sampling_locations, p, dtype)
    attn = attention_weights.to(dtype)
    out = torch.empty(p.batch, p.num_queries, p.num_heads, p.head_dim, dtype=dtype,
                      device=value.device)
    levels = level_tables(p, dtype, u.device)
    value_rows = _value_rows(value, p, dtype)
    for qs in _query_chunks(p):
        terms = _terms(p, levels, u[:, qs], v[:, qs])
        # 0, not a * 0, outside the map: an infinite attention weight adds nothing there
        coef = torch.where(terms.inside, terms.weights * attn[:, qs, ..., None],
                           torch.zeros((), dtype=dtype, device=value.device))  # (B, q, H, Nl, P, 4)
        sampled = _gather(value_rows, terms)  # (B, q, H, Nl, P, 4, C)
        out[:, qs] = torch.einsum("bqhlpc,bqhlpcd->bqhd", coef, sampled)
    return out.reshape(p.output_shape).to(value.dtype)


def msda_backward(grad_output: torch.Tensor, value: torch.Tensor, problem: MSDAProblem,
                  sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                  compute: tuple[bool, bool, bool] = (True, True, True),
                  deterministic: bool | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_value, grad_sampling_locations, grad_attention_weights) in the input layouts.

    Gradients come back in the compute dtype (float32, or float64 for float64 inputs);
    those not requested in ``compute`` are zeros. On CPU the grad_value sum runs in a fixed
    order (bitwise reproducible, whatever the thread count); on CUDA the ``index_add_`` scatter
    is made deterministic for ``deterministic=True`` by PyTorch's deterministic-algorithms mode
    (otherwise it follows the global setting).
    """
    p = problem
    if _use_cpu_path(value):
        return call_serial(lambda: _cpu_backward(grad_output, value, p, sampling_locations,
                                                 attention_weights, compute))
    want_value, want_loc, want_attn = compute
    dtype = _compute_dtype(value, sampling_locations, attention_weights, grad_output)
    u, v = _locations_xy(sampling_locations, p, dtype)
    attn = attention_weights.to(dtype)
    grad = grad_output.to(dtype).reshape(p.batch, p.num_queries, p.num_heads, p.head_dim)
    levels = level_tables(p, dtype, u.device)
    value_rows = _value_rows(value, p, dtype)
    grad_value = torch.zeros_like(value_rows)
    grad_u = torch.zeros(p.attention_weights_shape, dtype=dtype, device=value.device)
    grad_v = torch.zeros_like(grad_u)
    grad_attn = torch.zeros_like(grad_u)
    for qs in _query_chunks(p):
        terms = _terms(p, levels, u[:, qs], v[:, qs])
        g = grad[:, qs]
        if want_value:
            coef = terms.weights * attn[:, qs, ..., None]
            contrib = torch.where(terms.inside[..., None],
                                  coef[..., None] * g[:, :, :, None, None, None, :],
                                  torch.zeros((), dtype=dtype, device=coef.device))
            with _deterministic_scatter(deterministic and grad_value.device.type != "cpu"):
                grad_value.index_add_(0, terms.rows.reshape(-1), contrib.reshape(-1, p.head_dim))
        if want_loc or want_attn:
            sampled = _gather(value_rows, terms)
            scale, unscale = row_scales(g)
            unscale = unscale[..., None]  # (B, q, H, 1, 1)
            dots = torch.einsum("bqhlpcd,bqhd->bqhlpc", sampled, g * scale)  # <g, V[row_c]> 2^-k
            # 0, not 0 * g, outside the map: an inf/NaN grad_output row of a query that reads
            # nothing leaves its own gradients at 0 (as in the NumPy reference).
            dots = torch.where(terms.inside, dots, torch.zeros((), dtype=dtype, device=dots.device))
            if want_attn:
                grad_attn[:, qs] = (terms.weights * dots).sum(-1) * unscale
            if want_loc:
                grad_u[:, qs] = attn[:, qs] * (terms.d_du * dots).sum(-1) * unscale
                grad_v[:, qs] = attn[:, qs] * (terms.d_dv * dots).sum(-1) * unscale
    grad_loc = (_to_location_layout(grad_u, grad_v, p) if want_loc
                else torch.zeros(p.sampling_locations_shape, dtype=dtype, device=value.device))
    return _rows_to_value_layout(grad_value, p), grad_loc, grad_attn


@contextlib.contextmanager
def _deterministic_scatter(enable: bool | None) -> Iterator[None]:
    """Turn on torch's deterministic algorithms for the enclosed ops (restored afterwards)."""
    if not enable or torch.are_deterministic_algorithms_enabled():
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


# ------------------------------------------------------------------ Block AttnRes


def block_attn_res_unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """The reference runs Block AttnRes on every device and float dtype."""
    return None


def _block_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _block_query(w: torch.Tensor, gamma: torch.Tensor | None, scale: float, enable_rmsnorm: bool,
                 cd: torch.dtype) -> torch.Tensor:
    u = scale * w.to(cd)
    return u * gamma.to(cd) if enable_rmsnorm and gamma is not None else u


def block_attn_res_forward(values: torch.Tensor, w: torch.Tensor, gamma: torch.Tensor | None,
                           scale: float, eps: float, enable_rmsnorm: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """values [L, B, T, D] -> (h [B, T, D] in values' dtype, rms [B, T, L, 1] or empty, alpha
    [B, T, L]); caches in fp32 (fp64 for fp64 inputs)."""
    cd = _block_compute_dtype(values.dtype)
    v = values.to(cd)  # [L, B, T, D]
    u = _block_query(w, gamma, scale, enable_rmsnorm, cd)
    if enable_rmsnorm:
        # Scale rows by m = max(max|v|, 1) before squaring: v^2 overflows fp32 for |v| > 1.8e19
        # (docs/block_attn_res.md, "Numerical range"). r = m * sqrt(mean (v/m)^2 + eps/m^2).
        m = v.abs().amax(-1, keepdim=True).clamp(min=1.0)
        vs = v / m
        r_m = torch.sqrt(vs.square().mean(-1) + eps / m.squeeze(-1).square())  # r / m, [L, B, T]
        z = (torch.einsum("lbtd,d->lbt", vs, u) / r_m).permute(1, 2, 0)
        rms = (m.squeeze(-1) * r_m).permute(1, 2, 0).unsqueeze(-1).contiguous()  # [B, T, L, 1]
    else:
        z = torch.einsum("lbtd,d->btl", v, u)
        rms = values.new_empty((0,), dtype=cd)
    alpha = torch.softmax(z, dim=-1)
    h = torch.einsum("btl,lbtd->btd", alpha, v).to(values.dtype).contiguous()
    return h, rms, alpha.contiguous()


def block_attn_res_backward(grad_h: torch.Tensor, values: torch.Tensor, w: torch.Tensor,
                            alpha: torch.Tensor, gamma: torch.Tensor | None,
                            rms: torch.Tensor | None, scale: float, enable_rmsnorm: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] (empty without RMSNorm))."""
    cd = _block_compute_dtype(values.dtype)
    v, dh, a = values.to(cd), grad_h.to(cd), alpha.to(cd)
    u = _block_query(w, gamma, scale, enable_rmsnorm, cd)
    d_alpha = torch.einsum("btd,lbtd->btl", dh, v)
    g = a * (d_alpha - (a * d_alpha).sum(-1, keepdim=True))  # dLoss/dz
    rms_on = enable_rmsnorm and gamma is not None and rms is not None
    coef_b = None
    if rms_on:
        assert rms is not None
        r = rms.to(cd)[..., 0]
        z = torch.einsum("lbtd,d->btl", v, u) / r  # recomputed (caches fix z only up to a constant)
        coef_a = g / r
        coef_b = -coef_a * z / (values.shape[-1] * r)
    else:
        coef_a = g
    dv = a.permute(2, 0, 1)[..., None] * dh + coef_a.permute(2, 0, 1)[..., None] * u
    if coef_b is not None:
        dv = dv + coef_b.permute(2, 0, 1)[..., None] * v
    beta = torch.einsum("btl,lbtd->d", coef_a, v)
    if rms_on and gamma is not None:
        grad_w = (scale * gamma.to(cd) * beta).to(w.dtype)
        grad_gamma = (scale * w.to(cd) * beta).to(gamma.dtype)
    else:
        grad_w = (scale * beta).to(w.dtype)
        grad_gamma = w.new_empty((0,))
    return dv.to(values.dtype).contiguous(), grad_w, grad_gamma
