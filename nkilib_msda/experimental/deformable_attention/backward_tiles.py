"""Typed set of the MSDA backward kernel's on-chip tiles, allocated in one place.

:func:`allocate_tiles` creates every SBUF tile the plan lists (``BackwardConfig.sbuf_tiles``:
name, free shape, dtype; the same list sizes the SBUF budget) plus the PSUM transpose block,
and returns them as one :class:`BackwardTiles`. A tile the plan does not need for this call
(pairs, gathers, scatters) is ``None``. Layouts: see ``backward_sampling`` and
docs/kernels.md, "Backward".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from nkilib_msda._nki import nl
from nkilib_msda.experimental.kernel_commons import PARTITIONS

__all__ = ["BackwardTiles", "allocate_tiles"]


@dataclass
class BackwardTiles:
    """Every tile of one backward program; dim 0 of each SBUF tile is the 128 partitions."""

    # per-partition constants and the buffer offset of each partition
    consts: Any                # (16,) fp32 (18: corner blocks): per-level scales, bounds, row bases (C_*)
    kscale: Any                # (1,) int32: k(j) * R
    kscale_f: Any              # (1,) fp32 copy
    # loaded parameters
    loc: Any                   # (f, 2) fp32 (u, v)
    attn: Any                  # (f,) fp32
    grad: Any                  # (T, C_t) fp32 grad_output rows (one channel tile)
    # coordinate math (coordinates.py)
    okmask: Any                # (2, f) int32: all ones where the coordinate is not NaN
    xy: Any                    # (2, f) pixel coordinates
    xy_int: Any                # (2, f) int32 cast scratch
    xy_tmp: Any                # (2, f) scratch
    frac: Any                  # (2, f)
    scale_a: Any               # (2, f) a * d px / d u
    corner: Any                # (2, 2, f) unclamped corners
    corner_c: Any              # (2, 2, f) clamped corners
    valid: Any                 # (2, 2, f) 1.0 where the corner is inside the map
    fw: Any                    # (2, 2, f) masked 1-D weights
    xterm: Any                 # (2, f) x part of the row index
    rows: Any                  # (f, 4) row index per corner
    weights: Any               # (f, 4) bilinear weight per corner
    vbits: Any                 # (f, 4) int32 all ones for a valid corner
    work: Any                  # (4 N_p, C_t) fp32 per-block products
    live_pad: Any              # (pad columns,) fp32: out-of-range row outside a chunk (backward_live_rows)
    live_tmp: Any              # (1,) fp32 scratch
    red: Any                   # reduction tiles (fp32 / fp32 / value dtype)
    red_prev: Any
    red_out: Any
    # gathers (None unless grad_sampling_locations or grad_attention_weights is wanted)
    gidx: Any = None
    gidx_live: Any = None      # (2, 4 N_p) int32: a chunk's masked copy-gather index columns
    gidx_aligned: Any = None   # (2, m) uint32: 16-byte-aligned copy of a transpose index tile
    dc: Any = None
    dwx: Any = None
    dwy: Any = None
    prod4: Any = None
    gathered: Any = None       # (4 N_p, C_t) value rows of one block and channel tile
    gaw: Any = None
    gaw_out: Any = None
    gsl: Any = None
    dot_part: Any = None       # (N_p, 4) fp32: one block's dots over one channel tile (C_t < C_h)
    grad_scale: Any = None     # (3,) fp32: 2^-k, 2^k, running max|g| per partition (row scaling)
    transposed: Any = None     # list of GATHER_TRANSPOSE_BUFS (m*128,) tiles, used in turn
    psum: Any = None           # PSUM (psum_columns, gather_channels) in the value dtype
    # scatter (None unless grad_value is wanted)
    sidx: Any = None
    sidx_live: Any = None      # (2, 4 N_p) int32: a chunk's masked scatter index columns
    coef: Any = None
    red_alt: Any = None        # fp32 ping-pong partner of red (more than 16 buffers to sum)
    swork: Any = None          # list of (4 N_p, C_t) fp32 tiles: scatter data after ``work``, in turn
    # pipelined super-tiles: the next super-tile's copies (the kernel swaps them in turn)
    grad_alt: Any = None
    vbits_alt: Any = None
    sidx_alt: Any = None
    # folded scatter (backward_scatter_fold; None unless cfg.scatter_fold > 1)
    fold_pad: Any = None       # (4f,) fp32: out-of-range row where a corner is outside the map
    fidx: Any = None           # (4f,) int32: permuted index columns (slice, sample, group)
    fwork: Any = None          # list of 2 (4 N_p, C_t) fp32 tiles: permuted scatter data, in turn
    # (x0, x1) pair mode
    pair_rows: Any = None
    pair_sel: Any = None
    pair_masks: Any = None     # (2, f, 2) int32: corner b in pair slot 0 / 1
    pair_tmp: Any = None
    pair_coef: Any = None
    pair_bits: Any = None      # (f, 4) int32: pair slot used by a valid corner


_FIELDS = frozenset(f.name for f in fields(BackwardTiles))
# Tiles listed as (copies, ...) in the plan and allocated as that many separate tiles (the
# kernel uses them in turn; separate allocations keep their accesses independent).
_ROTATED = frozenset({"transposed", "fwork", "swork"})


def allocate_tiles(cfg: Any, value_dtype: Any) -> BackwardTiles:
    """Allocate the plan's tiles (and the PSUM block of the transpose gather)."""
    made: dict[str, Any] = {}
    for name, shape, dtype in cfg.sbuf_tiles:
        if name not in _FIELDS:
            raise ValueError(f"backward plan: tile {name!r} has no BackwardTiles field")
        if name in _ROTATED:
            made[name] = [nl.ndarray((PARTITIONS,) + tuple(shape[1:]), dtype=getattr(nl, dtype),
                                     buffer=nl.sbuf, name=f"{name}{i}") for i in range(shape[0])]
            continue
        made[name] = nl.ndarray((PARTITIONS,) + tuple(shape), dtype=getattr(nl, dtype),
                                buffer=nl.sbuf, name=name)
    if cfg.gather_method == "transpose" and cfg.needs_gather:
        made["psum"] = nl.ndarray((PARTITIONS, cfg.psum_columns, cfg.gather_channels), dtype=value_dtype,
                                  buffer=nl.psum, name="psum_transpose")
    return BackwardTiles(**made)
