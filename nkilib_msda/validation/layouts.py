"""The MSDA tensor layouts and the level packing: each written once.

Layouts (the ``value_layout`` / ``sampling_locations_layout`` arguments), by dimension order:

- value: ``"BLNC"`` (B, L, N_h, C_h) or ``"BNLC"`` (B, N_h, L, C_h);
- sampling_locations: ``"BQHLP2"`` (B, N_q, N_h, N_l, N_p, 2) or ``"B2QHLP"``
  (B, 2, N_q, N_h, N_l, N_p); attention_weights are always (B, N_q, N_h, N_l, N_p).

L = sum(H_l * W_l) pixels: the levels are packed level after level, level l starting at
``level_starts(spatial_shapes)[l]`` (the ``level_start_index`` argument).

Plain Python (no NumPy, no torch): kernels read it while tracing, planners and the torch layer
on the host. Every shape or permutation of a layout is derived from the two tables here.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, Sequence

__all__ = ["VALUE_DIMS", "LOCATION_DIMS", "VALUE_LAYOUTS", "LOCATION_LAYOUTS", "dims_text",
           "location_axis", "arrange", "permutation", "level_starts"]

# Dimension names: B batch, L pixels of all levels, N_h heads, C_h head dim, N_q queries,
# N_l levels, N_p points per level, 2 the (x, y) pair.
VALUE_DIMS: dict[str, tuple[str, ...]] = {
    "BLNC": ("B", "L", "N_h", "C_h"),
    "BNLC": ("B", "N_h", "L", "C_h"),
}
LOCATION_DIMS: dict[str, tuple[str, ...]] = {
    "BQHLP2": ("B", "N_q", "N_h", "N_l", "N_p", "2"),
    "B2QHLP": ("B", "2", "N_q", "N_h", "N_l", "N_p"),
}
VALUE_LAYOUTS = tuple(VALUE_DIMS)
LOCATION_LAYOUTS = tuple(LOCATION_DIMS)


def _dims(layout: str) -> tuple[str, ...]:
    if layout in VALUE_DIMS:
        return VALUE_DIMS[layout]
    if layout in LOCATION_DIMS:
        return LOCATION_DIMS[layout]
    raise ValueError(f"layout: expected one of {[*VALUE_LAYOUTS, *LOCATION_LAYOUTS]}, got {layout!r}")


def dims_text(layout: str) -> str:
    """The layout's dimension order as written in messages, e.g. ``"(B, L, N_h, C_h)"``."""
    return "(" + ", ".join(_dims(layout)) + ")"


def location_axis(layout: str, dim: str) -> int:
    """The axis of ``dim`` ("B", "N_q", "N_h", "N_l", "N_p" or "2") in locations ``layout``."""
    if layout not in LOCATION_DIMS:
        raise ValueError(f"sampling_locations_layout: expected one of {list(LOCATION_LAYOUTS)}, "
                         f"got {layout!r}")
    return LOCATION_DIMS[layout].index(dim)


def arrange(layout: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of a tensor in ``layout`` whose dimension sizes are ``sizes`` (name -> size)."""
    return tuple(sizes[d] for d in _dims(layout))


@functools.lru_cache(maxsize=None)
def permutation(source: str, target: str) -> tuple[int, ...]:
    """Axes that take a tensor from layout ``source`` to layout ``target`` (both value layouts
    or both location layouts): ``x.transpose(perm)`` (NumPy) or ``x.permute(*perm)`` (torch)."""
    src, dst = _dims(source), _dims(target)
    if sorted(src) != sorted(dst):
        raise ValueError(f"target: expected a layout of the same tensor as {source!r}, got {target!r}")
    return tuple(src.index(d) for d in dst)


def level_starts(spatial_shapes: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """Where each level starts on the L axis: the cumulative H*W of the (H, W) pairs before it,
    ``((4, 5), (2, 3))`` -> ``(0, 20)``."""
    starts, total = [], 0
    for h, w in spatial_shapes:
        starts.append(total)
        total += h * w
    return tuple(starts)
