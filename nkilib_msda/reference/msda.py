"""NumPy float64 reference for multi-scale deformable attention (the oracle).

Semantics are those of docs/math.md (and docs/api.md): ``loc[..., 0]`` is x along W,
``loc[..., 1]`` is y along H; pixel coordinate ``x = u*W - 0.5`` (``align_corners=False``) or
``x = u*(W - 1)`` (``True``); corners (y0,x0), (y0,x1), (y1,x0), (y1,x1); padding "zeros",
"border" or "reflection" exactly as ``torch.nn.functional.grid_sample``. The backward gives
exact derivatives of the forward. A NaN coordinate (or a non-finite one in reflection mode,
whose reflection is undefined) contributes nothing and gets zero gradient; no coordinate can
cause an out-of-range index. A corner outside the map contributes exactly nothing (to the
output and every gradient) even when the pixel its index was clamped to holds inf or NaN,
or its attention weight is infinite (the weight is folded into each in-map corner's
coefficient; docs/math.md, "Non-finite inputs"); an in-map corner that reads inf/NaN still
propagates it. NumPy floating-point warnings
never escape the public functions (also under ``np.seterr(all="raise")``).

Everything is vectorized over samples; work is chunked over queries to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nkilib_msda.validation.arrays import as_float64
from nkilib_msda.validation.layouts import permutation
from nkilib_msda.validation.msda import MSDAProblem, validate_msda_args

# Gathered value elements (float64) held at once: 2**22 elements = 32 MiB per chunk.
_GATHER_ELEMENTS_PER_CHUNK = 1 << 22
# Scatter entries collected before one bincount pass over the channels of grad_value.
_SCATTER_ENTRIES_PER_FLUSH = 1 << 22


# --------------------------------------------------------------------------- inputs


def _locations_bqhlp2(sampling_locations: np.ndarray, layout: str) -> np.ndarray:
    """View of the locations as (B, N_q, N_h, N_l, N_p, 2)."""
    return sampling_locations.transpose(permutation(layout, "BQHLP2"))


def _to_location_layout(grad_bqhlp2: np.ndarray, layout: str) -> np.ndarray:
    if layout == "BQHLP2":
        return grad_bqhlp2
    return np.ascontiguousarray(grad_bqhlp2.transpose(permutation("BQHLP2", layout)))


# ------------------------------------------------------------ coordinates per axis


@dataclass(frozen=True)
class _AxisCorners:
    """Bilinear data along one axis (x or y) of one level; arrays are shaped like the samples.

    ``index0``/``index1`` are the lower/upper corner indices clamped into [0, size-1] (always
    safe to gather); ``valid0``/``valid1`` say whether the unclamped corner is inside the map
    (and the sample usable); ``frac`` is p - floor(p); ``scale`` is d p / d(normalized
    coordinate), 0 where the coordinate is clipped or unusable, negative where reflected.
    """

    index0: np.ndarray
    index1: np.ndarray
    valid0: np.ndarray
    valid1: np.ndarray
    frac: np.ndarray
    scale: np.ndarray


def _reflect(px: np.ndarray, size: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray]:
    """grid_sample reflection of pixel coordinates, over any number of periods.

    Mirrors about 0 and size-1 (align_corners) or -0.5 and size-0.5 (not). Returns the
    reflected coordinate and its derivative (+1 or -1). ``px`` must be finite.
    """
    low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    span = high - low
    if span == 0.0:  # a single pixel with align_corners: every coordinate maps to 0
        return np.zeros_like(px), np.zeros_like(px)
    offset = px - low
    sign = np.where(offset < 0, -1.0, 1.0)
    folded = np.fmod(np.abs(offset), 2.0 * span)  # exact in floating point, unlike floor(x / span)
    mirrored = folded >= span
    reflected = np.where(mirrored, 2.0 * span - folded, folded) + low
    return reflected, np.where(mirrored, -sign, sign)


def _clip_to_map(px: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Clip to [0, size-1]; derivative 0 on and beyond the borders (grid_sample's convention)."""
    inside = (px > 0) & (px < size - 1)
    return np.clip(px, 0.0, size - 1.0), inside.astype(np.float64)


def _pixel_coordinate(u: np.ndarray, size: int, align_corners: bool, padding_mode: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixel coordinate of normalized ``u`` after padding, d px / d u, and sample usability.

    The returned coordinate is finite and within [-2, size+1], so floor() converts safely.
    """
    scale = float(size - 1 if align_corners else size)
    with np.errstate(invalid="ignore", over="ignore"):
        if scale == 0.0:  # align_corners on a 1-pixel axis: constant coordinate 0
            px = np.where(np.isnan(u), np.nan, 0.0)
        else:
            px = u * scale - (0.0 if align_corners else 0.5)
    # Reflection of an infinite coordinate is undefined: such samples count as unusable, like NaN.
    usable = np.isfinite(px) if padding_mode == "reflection" else ~np.isnan(px)
    px = np.where(usable, px, 0.0)
    deriv = np.where(usable, scale, 0.0)
    if padding_mode == "zeros":
        # Beyond [-2, size+1] both corners are outside anyway; the clamp only bounds the indices.
        px = np.clip(px, -2.0, size + 1.0)
    elif padding_mode == "border":
        px, inside = _clip_to_map(px, size)
        deriv = deriv * inside
    elif padding_mode == "reflection":
        px, sign = _reflect(px, size, align_corners)
        px, inside = _clip_to_map(px, size)
        deriv = deriv * sign * inside
    else:  # validated before reaching here
        raise ValueError(f"padding_mode: expected 'zeros', 'border' or 'reflection', got {padding_mode!r}")
    return px, deriv, usable


def _axis_corners(u: np.ndarray, size: int, align_corners: bool, padding_mode: str) -> _AxisCorners:
    px, deriv, usable = _pixel_coordinate(u, size, align_corners, padding_mode)
    lower = np.floor(px)
    index0 = lower.astype(np.int64)
    index1 = index0 + 1
    valid0 = usable & (index0 >= 0) & (index0 < size)
    valid1 = usable & (index1 >= 0) & (index1 < size)
    return _AxisCorners(
        index0=np.clip(index0, 0, size - 1), index1=np.clip(index1, 0, size - 1),
        valid0=valid0, valid1=valid1, frac=px - lower, scale=deriv)


# ----------------------------------------------------------- bilinear terms per chunk


@dataclass(frozen=True)
class _BilinearTerms:
    """Per sample and corner, arrays of shape (B, Q, N_h, N_l, N_p, 4).

    ``rows`` index the value viewed as 2-D (rows, C_h) in its own layout (clamped, so always
    safe to gather); ``valid`` says whether the corner is inside the map (and the sample
    usable): an invalid corner contributes exactly nothing, even if its clamped pixel holds
    inf or NaN; ``weights`` are the masked bilinear weights m_c*w_c;
    ``d_weights_du``/``d_weights_dv`` their derivatives with respect to the normalized x / y
    coordinate (None unless requested).
    """

    rows: np.ndarray
    valid: np.ndarray
    weights: np.ndarray
    d_weights_du: np.ndarray | None
    d_weights_dv: np.ndarray | None


def _value_rows(problem: MSDAProblem, pixel: np.ndarray) -> np.ndarray:
    """Row of value.reshape(-1, C_h) for pixel indices of shape (B, Q, N_h, N_p)."""
    batch = np.arange(problem.batch).reshape(-1, 1, 1, 1)
    head = np.arange(problem.num_heads).reshape(1, 1, -1, 1)
    if problem.value_layout == "BLNC":
        return (batch * problem.total_pixels + pixel) * problem.num_heads + head
    return (batch * problem.num_heads + head) * problem.total_pixels + pixel


def _bilinear_terms(problem: MSDAProblem, locations: np.ndarray, with_derivatives: bool
                    ) -> _BilinearTerms:
    """Corner rows, weights (and weight derivatives) for locations (B, Q, N_h, N_l, N_p, 2)."""
    shape = (*locations.shape[:-1], 4)
    rows = np.empty(shape, np.int64)
    valid = np.empty(shape, bool)
    weights = np.empty(shape)
    d_du = np.empty(shape) if with_derivatives else None
    d_dv = np.empty(shape) if with_derivatives else None
    for level, ((height, width), start) in enumerate(
            zip(problem.spatial_shapes, problem.level_start_index)):
        xs = _axis_corners(locations[:, :, :, level, :, 0], width, problem.align_corners,
                           problem.padding_mode)
        ys = _axis_corners(locations[:, :, :, level, :, 1], height, problem.align_corners,
                           problem.padding_mode)
        x_corners = ((xs.index0, xs.valid0, 1.0 - xs.frac, -1.0), (xs.index1, xs.valid1, xs.frac, 1.0))
        y_corners = ((ys.index0, ys.valid0, 1.0 - ys.frac, -1.0), (ys.index1, ys.valid1, ys.frac, 1.0))
        corner = 0
        for y_index, y_valid, y_weight, y_sign in y_corners:  # corner order (y0,x0),(y0,x1),(y1,x0),(y1,x1)
            for x_index, x_valid, x_weight, x_sign in x_corners:
                inside = x_valid & y_valid
                mask = inside.astype(np.float64)
                valid[:, :, :, level, :, corner] = inside
                rows[:, :, :, level, :, corner] = _value_rows(problem, start + y_index * width + x_index)
                weights[:, :, :, level, :, corner] = mask * x_weight * y_weight
                if with_derivatives:
                    assert d_du is not None and d_dv is not None  # allocated when with_derivatives
                    d_du[:, :, :, level, :, corner] = mask * x_sign * y_weight * xs.scale
                    d_dv[:, :, :, level, :, corner] = mask * x_weight * y_sign * ys.scale
                corner += 1
    return _BilinearTerms(rows=rows, valid=valid, weights=weights, d_weights_du=d_du,
                          d_weights_dv=d_dv)


def _gather_valid(value_rows: np.ndarray, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """value_rows[rows] with the rows of invalid corners replaced by exact zeros: a masked
    weight times a non-finite clamped pixel (0 * inf) must not turn into NaN."""
    return np.where(valid[..., None], value_rows[rows], 0.0)


# ------------------------------------------------------------------------ chunking


def _query_chunks(problem: MSDAProblem) -> list[slice]:
    """Query ranges whose gathered corner values fit _GATHER_ELEMENTS_PER_CHUNK."""
    per_query = (problem.batch * problem.num_heads * problem.num_levels * problem.num_points
                 * 4 * problem.head_dim)
    step = max(1, _GATHER_ELEMENTS_PER_CHUNK // per_query)
    return [slice(q, min(q + step, problem.num_queries)) for q in range(0, problem.num_queries, step)]


class _RowScatter:
    """Accumulates grad_value[row, :] += weight * g for many (row, weight, g) entries.

    Entries are collected and flushed with one weighted ``np.bincount`` per channel, which
    is far faster than ``np.add.at`` on 2-D data.
    """

    def __init__(self, num_rows: int, channels: int):
        self._sums = np.zeros((channels, num_rows))
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_entries = 0

    def add(self, rows: np.ndarray, weights: np.ndarray, grad: np.ndarray,
            valid: np.ndarray) -> None:
        """rows, weights, valid: (M, K) entries for M output vectors; grad: (M, C). Entries
        with ``valid`` False add exactly nothing (even where grad is non-finite)."""
        self._pending.append((rows, weights, grad, valid))
        self._pending_entries += rows.size
        if self._pending_entries >= _SCATTER_ENTRIES_PER_FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = np.concatenate([r for r, _, _, _ in self._pending]).ravel()
        weights = np.concatenate([w for _, w, _, _ in self._pending])
        grad = np.concatenate([g for _, _, g, _ in self._pending])
        valid = np.concatenate([v for _, _, _, v in self._pending])
        num_rows = self._sums.shape[1]
        for channel in range(self._sums.shape[0]):
            entry_values = np.where(valid, weights * grad[:, channel, None], 0.0).ravel()
            self._sums[channel] += np.bincount(rows, weights=entry_values, minlength=num_rows)
        self._pending, self._pending_entries = [], 0

    def result(self) -> np.ndarray:
        """(rows, C) accumulated sums."""
        self._flush()
        return np.ascontiguousarray(self._sums.T)


# ----------------------------------------------------------------------- public API


def ms_deformable_attention_ref(
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
) -> np.ndarray:
    """MSDA forward in float64.

    value (B, L, N_h, C_h) "BLNC" or (B, N_h, L, C_h) "BNLC"; sampling_locations
    (B, N_q, N_h, N_l, N_p, 2) "BQHLP2" or (B, 2, N_q, N_h, N_l, N_p) "B2QHLP";
    attention_weights (B, N_q, N_h, N_l, N_p). Returns (B, N_q, N_h*C_h) float64.
    Floating-point warnings (0 * inf inside a real dependence, overflow) never escape.
    """
    problem = validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                 value_layout, sampling_locations_layout, align_corners, padding_mode)
    with np.errstate(all="ignore"):
        return _forward(problem, value, sampling_locations, attention_weights)


def _forward(problem: MSDAProblem, value: Any, sampling_locations: Any, attention_weights: Any) -> np.ndarray:
    value_rows = as_float64(value).reshape(-1, problem.head_dim)
    locations = _locations_bqhlp2(as_float64(sampling_locations), problem.sampling_locations_layout)
    attention = as_float64(attention_weights)
    b, n_h, c_h = problem.batch, problem.num_heads, problem.head_dim
    out = np.empty((b, problem.num_queries, n_h, c_h))
    for queries in _query_chunks(problem):
        terms = _bilinear_terms(problem, locations[:, queries], with_derivatives=False)
        # 0, not a * 0, for a corner outside the map: an infinite attention weight adds nothing
        coefficients = np.where(terms.valid, terms.weights * attention[:, queries, ..., None], 0.0)
        n_q = coefficients.shape[1]
        gathered = _gather_valid(value_rows, terms.rows.reshape(b * n_q * n_h, -1),
                                 terms.valid.reshape(b * n_q * n_h, -1))  # (M, K, C)
        out[:, queries] = np.matmul(coefficients.reshape(b * n_q * n_h, 1, -1), gathered
                                    ).reshape(b, n_q, n_h, c_h)
    return out.reshape(problem.output_shape)


def ms_deformable_attention_bwd_ref(
    grad_output: Any,
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact gradients of :func:`ms_deformable_attention_ref` for grad_output (B, N_q, N_h*C_h).

    Returns float64 (grad_value, grad_sampling_locations, grad_attention_weights) in the
    input layouts: value's shape, the locations' shape, and (B, N_q, N_h, N_l, N_p).
    Floating-point warnings never escape.
    """
    problem = validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                 value_layout, sampling_locations_layout, align_corners, padding_mode,
                                 grad_output=grad_output)
    with np.errstate(all="ignore"):
        return _backward(problem, grad_output, value, sampling_locations, attention_weights)


def _backward(problem: MSDAProblem, grad_output: Any, value: Any, sampling_locations: Any,
              attention_weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    value_rows = as_float64(value).reshape(-1, problem.head_dim)
    locations = _locations_bqhlp2(as_float64(sampling_locations), problem.sampling_locations_layout)
    attention = as_float64(attention_weights)
    b, n_h, c_h = problem.batch, problem.num_heads, problem.head_dim
    grad_out = as_float64(grad_output).reshape(b, problem.num_queries, n_h, c_h)

    grad_locations = np.empty(locations.shape)
    grad_attention = np.empty(problem.attention_weights_shape)
    scatter = _RowScatter(value_rows.shape[0], c_h)
    for queries in _query_chunks(problem):
        terms = _bilinear_terms(problem, locations[:, queries], with_derivatives=True)
        a = attention[:, queries]
        n_q = a.shape[1]
        m = b * n_q * n_h
        g = grad_out[:, queries].reshape(m, c_h)
        rows = terms.rows.reshape(m, -1)
        valid = terms.valid.reshape(m, -1)
        # dc[s, c] = <g, V[row of corner c]>: the upstream gradient seen by each corner
        # (exactly 0 for a corner outside the map, whatever its clamped pixel or g holds).
        dots = np.matmul(value_rows[rows], g[:, :, None])[..., 0]
        corner_dots = np.where(valid, dots, 0.0).reshape(terms.weights.shape)
        grad_attention[:, queries] = np.sum(terms.weights * corner_dots, axis=-1)
        grad_locations[:, queries, ..., 0] = a * np.sum(terms.d_weights_du * corner_dots, axis=-1)
        grad_locations[:, queries, ..., 1] = a * np.sum(terms.d_weights_dv * corner_dots, axis=-1)
        scatter.add(rows, (terms.weights * a[..., None]).reshape(m, -1), g, valid)
    grad_value = scatter.result().reshape(problem.value_shape)
    return (grad_value, _to_location_layout(grad_locations, problem.sampling_locations_layout),
            grad_attention)
