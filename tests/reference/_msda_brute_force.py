"""Independent brute-force MSDA (plain Python loops) for testing the NumPy reference.

Written directly from the operator definition in docs/math.md and grid_sample's documented padding rules, one
sample and one corner at a time. Canonical layouts only: value (B, L, N_h, C_h), locations
(B, N_q, N_h, N_l, N_p, 2); finite coordinates only (reflection loops until inside).
"""

from __future__ import annotations

import math

import numpy as np


def source_coordinate(u: float, size: int, align_corners: bool, padding_mode: str) -> tuple[float, float]:
    """Pixel coordinate of normalized ``u`` after padding, and its derivative d p / d u."""
    if align_corners:
        p, dp = u * (size - 1), float(size - 1)
    else:
        p, dp = u * size - 0.5, float(size)
    if padding_mode == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if low == high:
            return 0.0, 0.0
        while p < low or p > high:  # mirror step by step
            if p < low:
                p, dp = 2 * low - p, -dp
            if p > high:
                p, dp = 2 * high - p, -dp
    if padding_mode in ("border", "reflection"):
        if p <= 0:
            p, dp = 0.0, 0.0
        elif p >= size - 1:
            p, dp = float(size - 1), 0.0
    return p, dp


def brute_force_msda(value, spatial_shapes, locations, attention, align_corners, padding_mode,
                     grad_output=None):
    """Forward output (B, N_q, N_h*C_h), and with ``grad_output`` also the three gradients."""
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = locations.shape
    out = np.zeros((batch, queries, heads, channels))
    grad_value = np.zeros(value.shape)
    grad_locations = np.zeros(locations.shape)
    grad_attention = np.zeros(attention.shape)
    g = None if grad_output is None else grad_output.reshape(batch, queries, heads, channels)
    for b in range(batch):
        for q in range(queries):
            for h in range(heads):
                start = 0
                for level in range(levels):
                    height, width = spatial_shapes[level]
                    for p in range(points):
                        u, v = locations[b, q, h, level, p]
                        a = attention[b, q, h, level, p]
                        x, dx_du = source_coordinate(u, width, align_corners, padding_mode)
                        y, dy_dv = source_coordinate(v, height, align_corners, padding_mode)
                        x0, y0 = math.floor(x), math.floor(y)
                        fx, fy = x - x0, y - y0
                        for cy in (0, 1):
                            for cx in (0, 1):
                                xi, yi = x0 + cx, y0 + cy
                                if not (0 <= xi < width and 0 <= yi < height):
                                    continue
                                wx = fx if cx else 1 - fx
                                wy = fy if cy else 1 - fy
                                dwx = 1.0 if cx else -1.0  # d wx / d x
                                dwy = 1.0 if cy else -1.0
                                pixel = start + yi * width + xi
                                corner_value = value[b, pixel, h]
                                out[b, q, h] += a * wx * wy * corner_value
                                if g is None:
                                    continue
                                dot = float(np.dot(g[b, q, h], corner_value))
                                grad_attention[b, q, h, level, p] += wx * wy * dot
                                grad_value[b, pixel, h] += a * wx * wy * g[b, q, h]
                                grad_locations[b, q, h, level, p, 0] += a * dwx * wy * dx_du * dot
                                grad_locations[b, q, h, level, p, 1] += a * wx * dwy * dy_dv * dot
                    start += height * width
    out = out.reshape(batch, queries, heads * channels)
    if g is None:
        return out
    return out, grad_value, grad_locations, grad_attention
