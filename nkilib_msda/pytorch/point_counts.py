"""Per-level point counts ``num_points=(P_0, ..., P_{L-1})`` on the uniform-point backends.

RT-DETRv2, D-FINE and DEIMv2 give level l its own number of points P_l and pack each head's
points level after level: sampling locations (B, N_q, N_h, sum(P), 2) ("BQHLP2"; "B2QHLP":
(B, 2, N_q, N_h, sum(P))) and attention weights (B, N_q, N_h, sum(P)). Every backend samples
the same number of points on every level, so :func:`pad_point_counts` spreads the packed points
to P_max = max(P_l) per level:

- a padded slot has weight 0 and location (NaN, NaN): every backend reads nothing for a NaN
  coordinate (README, "Layouts and conventions"), in every padding mode and for both
  ``align_corners``, so it adds exactly nothing and no value (not even inf/NaN at pixel
  (0, 0)) reaches the output through it. An off-map location such as (-1, -1) would not do:
  ``"border"`` clips it onto pixel (0, 0), and with ``align_corners=True`` a level of at most
  2x2 pixels has pixel 0 among its corners, each read with weight 0 (0 * inf = NaN);
- the spreading is slices and ``torch.cat`` (plain autograd ops, traced like any other), so the
  gradients of the padded slots are dropped by the concatenation's backward and never reach
  a real slot or the caller;
- equal counts are a reshape: nothing is padded.

The cost is the padding itself: the backends sample L * P_max points per head instead of
sum(P) (docs/torch.md, "Per-level point counts", has measurements).
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

from torch import SymInt, Tensor, cat

from nkilib_msda.validation.layouts import LOCATION_DIMS, location_axis

__all__ = ["check_num_points", "check_packed_points", "level_count", "pad_point_counts",
           "pack_point_gradients", "OFF_MAP_LOCATION"]

# A padded slot reads nothing at all (module docstring).
OFF_MAP_LOCATION = float("nan")


def check_num_points(num_points: Any, num_levels: int, name: str = "num_points"
                     ) -> tuple[int, ...]:
    """``num_points`` as a tuple of ``num_levels`` positive ints, else ValueError/TypeError
    naming the argument ``name``."""
    if isinstance(num_points, Tensor) or type(num_points).__name__ == "ndarray":
        num_points = num_points.tolist()
    if isinstance(num_points, (str, bytes)) or not isinstance(num_points, Sequence):
        raise TypeError(f"{name}: expected a sequence of positive ints (one per level), got "
                        f"{type(num_points).__name__}")
    counts = tuple(num_points)
    # any integer type (NumPy's too), not bool; symbolic ints (torch.compile) are ints
    if any(isinstance(p, bool) or not isinstance(p, (numbers.Integral, SymInt)) or p <= 0
           for p in counts):
        raise ValueError(f"{name}: expected positive ints, got {[_plain(p) for p in counts]!r}")
    counts = tuple(p if isinstance(p, SymInt) else int(p) for p in counts)
    if len(counts) != num_levels:
        raise ValueError(f"{name}: expected one count per level ({num_levels} levels), got "
                         f"{len(counts)}: {list(counts)!r}")
    return counts


def _plain(p: Any) -> Any:
    """A count as it reads in a message (NumPy scalars as Python numbers)."""
    return p.item() if hasattr(p, "item") and not isinstance(p, Tensor) else p


def level_count(spatial_shapes: Any) -> int:
    """How many levels ``spatial_shapes`` (pairs or an (N_l, 2) tensor) lists."""
    try:
        return len(spatial_shapes)
    except TypeError:
        raise TypeError(f"spatial_shapes: expected (H, W) pairs or an int tensor (N_l, 2), got "
                        f"{type(spatial_shapes).__name__}") from None


def _point_dim(sampling_locations_layout: str) -> int:
    """The packed point axis of the locations (BQHLP2: -2, B2QHLP: -1)."""
    # Packed, N_l and N_p are one axis: count it from the end of the 6-d layout.
    return location_axis(sampling_locations_layout, "N_p") - len(LOCATION_DIMS[sampling_locations_layout])


def check_packed_points(sampling_locations: Tensor, attention_weights: Tensor,
                        num_points: tuple[int, ...], sampling_locations_layout: str = "BQHLP2"
                        ) -> None:
    """Raise ValueError unless the locations and weights are packed for ``num_points``."""
    for name, x in (("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    total = sum(num_points)
    if sampling_locations_layout == "BQHLP2":
        want = "(B, N_q, N_h, sum(num_points), 2)"
        ok = sampling_locations.dim() == 5 and sampling_locations.shape[-1] == 2 \
            and sampling_locations.shape[-2] == total
    else:
        want = "(B, 2, N_q, N_h, sum(num_points))"
        ok = sampling_locations.dim() == 5 and sampling_locations.shape[1] == 2 \
            and sampling_locations.shape[-1] == total
    if not ok:
        raise ValueError(f"sampling_locations: expected {want} with sum(num_points) = {total} "
                         f"for num_points={list(num_points)} and layout "
                         f"{sampling_locations_layout!r}, got shape {tuple(sampling_locations.shape)}")
    if attention_weights.dim() != 4 or attention_weights.shape[-1] != total:
        raise ValueError(f"attention_weights: expected (B, N_q, N_h, sum(num_points)) with "
                         f"sum(num_points) = {total} for num_points={list(num_points)}, got shape "
                         f"{tuple(attention_weights.shape)}")


def _spread(x: Tensor, dim: int, counts: tuple[int, ...], width: int, fill: float) -> Tensor:
    """Level l's ``counts[l]`` packed entries along ``dim`` then ``width - counts[l]`` slots
    of ``fill``, for every level, as one tensor of ``len(counts) * width`` entries."""
    pieces = []
    start = 0
    for count in counts:
        pieces.append(x.narrow(dim, start, count))
        if count < width:
            shape = list(x.shape)
            shape[dim] = width - count
            pieces.append(x.new_full(shape, fill))
        start += count
    return cat(pieces, dim=dim)


def pad_point_counts(sampling_locations: Tensor, attention_weights: Tensor, num_points: Any,
                     num_levels: int, sampling_locations_layout: str = "BQHLP2"
                     ) -> tuple[Tensor, Tensor]:
    """Packed per-level points -> the uniform layout with P_max = max(num_points) points.

    Returns locations (B, N_q, N_h, L, P_max, 2) for "BQHLP2" ((B, 2, N_q, N_h, L, P_max) for
    "B2QHLP") and weights (B, N_q, N_h, L, P_max); padded slots as in the module docstring.
    Differentiable; the gradients of padded slots are discarded.
    """
    dim = _point_dim(sampling_locations_layout)
    counts = check_num_points(num_points, num_levels)
    check_packed_points(sampling_locations, attention_weights, counts, sampling_locations_layout)
    width = max(counts)
    if any(count != width for count in counts):
        sampling_locations = _spread(sampling_locations, dim, counts, width, OFF_MAP_LOCATION)
        attention_weights = _spread(attention_weights, -1, counts, width, 0.0)
    return (sampling_locations.unflatten(dim, (num_levels, width)),
            attention_weights.unflatten(-1, (num_levels, width)))


def _gather(x: Tensor, dim: int, counts: tuple[int, ...], width: int) -> Tensor:
    """The inverse of :func:`_spread`: level l's first ``counts[l]`` of its ``width`` slots."""
    if all(count == width for count in counts):
        return x
    return cat([x.narrow(dim, level * width, count) for level, count in enumerate(counts)],
               dim=dim)


def pack_point_gradients(grad_locations: Tensor, grad_weights: Tensor, num_points: Any,
                         sampling_locations_layout: str = "BQHLP2") -> tuple[Tensor, Tensor]:
    """The gradients of :func:`pad_point_counts`' outputs -> those of its packed inputs.

    ``grad_locations`` (B, N_q, N_h, L, P_max, 2) ("B2QHLP": (B, 2, N_q, N_h, L, P_max)) and
    ``grad_weights`` (B, N_q, N_h, L, P_max) become (B, N_q, N_h, sum(P), 2) and
    (B, N_q, N_h, sum(P)); the padded slots' entries are dropped.
    """
    dim = _point_dim(sampling_locations_layout)
    counts = tuple(num_points)
    width = max(counts)
    level_dim = dim - 1
    grad_locations = grad_locations.flatten(level_dim, dim)
    grad_weights = grad_weights.flatten(-2, -1)
    return (_gather(grad_locations, dim, counts, width),
            _gather(grad_weights, -1, counts, width))
