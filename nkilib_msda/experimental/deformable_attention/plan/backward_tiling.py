"""Channel tiling and the SBUF tile list of the MSDA backward plan (plain Python, no NKI).

grad_output rows, the per-block products and the gathered rows hold ``C_t`` channels: the
whole C_h whenever that fits the SBUF budget with some T (the plan of an untiled kernel),
otherwise the widest ``C_t = ceil(C_h / n)`` that fits (rounded up to a multiple of 128 on the
transpose path), then the most blocks T at that width (:func:`fit_sbuf`). Each super-tile then
makes one gather/dot/scatter pass per channel tile; the per-corner dot products of the passes
are added in fp32. Only N_p stays bounded (the per-sample tiles).

Transpose gathers move <= 128 channels per ``dma_transpose`` (:func:`transpose_chunks`) and
batch M_g index columns per DMA (documented), capped by upstream's packet limit 64 // r
(:func:`transpose_gather_columns`); :func:`gather_split` spreads those columns over partition
bands. The tile list (:func:`sbuf_tiles`) is the one the kernel allocates
(``backward_tiles.allocate_tiles``), so the budget check counts exactly what runs.
"""

from __future__ import annotations

import math
from typing import Callable

from nkilib_msda.hardware import (DMA_COMPUTE_MAX_SOURCES, DMA_TRANSPOSE_MAX_FREE, DTYPE_BYTES,
                                  INDEX_TILE_ALIGN_WORDS, PARTITIONS)
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["CONSTS", "CONSTS_CORNER_BLOCKS", "GATHER_TRANSPOSE_BUFS", "MAX_BLOCKS_PER_TILE", "REDUCE_FREE_ELEMENTS",
           "TRANSPOSE_PACKET_COLUMNS", "SbufTiles", "channel_tile_widths", "fit_sbuf", "gather_band",
           "gather_split", "sbuf_bytes", "sbuf_tiles", "transpose_chunks", "transpose_gather_columns"]

MAX_BLOCKS_PER_TILE = 16
REDUCE_FREE_ELEMENTS = 2048  # fp32 elements per partition in one zero / reduce tile
# Upstream's DMA-transpose packet limit: at most 64 // r index columns per transpose, r = 128 / min(C_h, 128).
TRANSPOSE_PACKET_COLUMNS = 64
# Transpose gathers: copies of the transposed tile, so the gather of the next index columns
# overlaps the PE transposes of the previous ones.
GATHER_TRANSPOSE_BUFS = 2
# Per-partition fp32 constants (backward_sampling's C_* columns); corner-block gathers add two.
CONSTS = 16
CONSTS_CORNER_BLOCKS = 18

SbufTiles = tuple[tuple[str, tuple[int, ...], str], ...]  # (name, free shape, dtype) per tile


def gather_band(channels: int) -> int:
    """Partitions per band of a transpose gather of ``channels`` channels: the gather's index
    columns are split over ``128 // band`` indirect transposes into partitions [j * band,
    j * band + channels), so they use the DMA engines of all 128 partitions (engine e serves
    partitions 8e..8e+7) instead of those of the first ``channels``. Bands start at 0/32/64/96
    (<= 32 partitions) or 0/64 (<= 64): the starts the PE transpose may read from."""
    return 32 if channels <= 32 else 64 if channels <= 64 else PARTITIONS


def gather_split(gather_columns: int, channels: int) -> tuple[int, int]:
    """(band, m): transpose j of a gather takes index columns [j * m, min(M_g, (j + 1) * m))
    into partitions [j * band, j * band + channels); m = ceil(M_g / (128 // band))."""
    band = gather_band(channels)
    return band, -(-gather_columns // (PARTITIONS // band))


MAX_DMA_COMPUTE_SOURCES = DMA_COMPUTE_MAX_SOURCES


def live_chunks(n: int, step: int) -> list[tuple[int, int]]:
    """Partition chunks [j0, j1) of ``step`` partitions covering the live partitions [0, n)."""
    return [(j0, min(n, j0 + step)) for j0 in range(0, n, step)]


def pad_columns(gather_step: int, scatter_step: int) -> int:
    """Live-row pad columns (backward_live_rows) one program needs at most: two live-partition counts (full blocks and the
    ragged tail) x the chunks of both kinds."""
    return 2 * (-(-PARTITIONS // gather_step) + -(-PARTITIONS // scatter_step))


def _largest_divisor_at_most(n: int, cap: int) -> int:
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def _tile_bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = math.prod(shape) * DTYPE_BYTES[dtype]
    return -(-n // 4) * 4


def sbuf_tiles(problem: MSDAProblem, value_dtype: str, blocks: int, width: int, tiled: bool,
               gather_method: str, gather_columns: int, want_value: bool, want_gather: bool,
               pairs: bool, live_pad_columns: int = 0, reduce_sources: int = 1, fold: int = 1,
               corner_blocks: bool = False, scatter_work_copies: int = 0, pipelined: bool = False) -> SbufTiles:
    """Every SBUF tile the kernel allocates: (name, free shape, dtype); dim 0 is 128.

    Per-sample tiles have f = T*N_p samples per partition; corner tiles are (f, 2, 2)
    = (sample, y-corner a, x-corner b); per-block tiles hold the 4*N_p columns of one block.
    Channel tiles of ``width`` channels size grad, work and gathered; ``tiled`` (more than
    one channel tile) adds the per-block partial dot products summed over the tiles.
    ``live_pad_columns``: the live-row pad columns of backward_live_rows (128-partition DMAs).
    ``reduce_sources``: buffers summed per reduced element (sets * lnc * K); above 16 the
    reduce ping-pongs between two fp32 tiles (``red_alt``).
    ``fold`` > 1 (backward_scatter_fold): its index scratch, permuted index columns and two
    copies of the permuted scatter data.
    ``corner_blocks`` (corner-block gathers, ``backward_corner_blocks``): two more per-partition
    constants (the cell-row terms) and transposed tiles of ``4 * C_h`` channels per index.
    ``scatter_work_copies``: per-block scatter data tiles besides ``work`` (``swork``; the
    unfolded scatter takes ``work`` and these in turn, so the Vector engine writes the next
    block's data while the scatters of the previous block still read theirs).
    ``pipelined`` (transpose gathers, unfolded scatter): super-tile i + 1 is prepared and
    gathered before super-tile i scatters, so every transpose of a super-tile has its own
    transposed tile, and grad, vbits and sidx get a second copy (``*_alt``) for the next
    super-tile; ``swork`` is then the whole scatter data ring (``work`` stays the dot products'
    scratch).
    """
    n_p, c_h = problem.num_points, width
    f = blocks * n_p
    cols = 4 * n_p
    tiles = [
        ("consts", (CONSTS_CORNER_BLOCKS if corner_blocks else CONSTS,), "float32"),
        ("kscale", (1,), "int32"),
        ("kscale_f", (1,), "float32"),
        ("loc", (f, 2), "float32"),
        ("attn", (f,), "float32"),
        ("okmask", (2, f), "int32"),
        ("xy", (2, f), "float32"),
        ("xy_int", (2, f), "int32"),
        ("xy_tmp", (2, f), "float32"),
        ("frac", (2, f), "float32"),
        ("scale_a", (2, f), "float32"),
        ("corner", (2, 2, f), "float32"),
        ("corner_c", (2, 2, f), "float32"),
        ("valid", (2, 2, f), "float32"),
        ("fw", (2, 2, f), "float32"),
        ("xterm", (2, f), "float32"),
        ("rows", (f, 4), "float32"),
        ("weights", (f, 4), "float32"),
        ("vbits", (f, 4), "int32"),
        ("grad", (blocks, c_h), "float32"),
        ("work", (cols, c_h), "float32"),
        ("live_pad", (max(live_pad_columns, 1),), "float32"),
        ("live_tmp", (1,), "float32"),
    ]
    if pairs:
        tiles += [("pair_rows", (f, 2), "float32"), ("pair_sel", (f, 2), "float32"),
                  ("pair_masks", (2, f, 2), "int32"), ("pair_tmp", (f, 4), "float32"),
                  ("pair_coef", (f, 4), "float32"), ("pair_bits", (f, 4), "int32")]
    if want_gather:
        tiles += [
            ("gidx", (f * 4,), "uint32" if gather_method == "transpose" else "int32"),
            ("dc", (f, 4), "float32"),
            ("dwx", (f, 4), "float32"),
            ("dwy", (f, 4), "float32"),
            ("prod4", (f, 4), "float32"),
            ("gathered", (cols, c_h), value_dtype),
            ("gaw", (f,), "float32"),
            ("gaw_out", (f,), value_dtype),
            ("gsl", (f, 2), "float32"),
            ("grad_scale", (3,), "float32"),
        ]
        if tiled:
            tiles.append(("dot_part", (n_p, 4), "float32"))
        if gather_method == "transpose":  # bands of channels x m*128 gathered rows, 2 copies
            chunks = ((0, 4 * c_h),) if corner_blocks else transpose_chunks(width)
            m = max(gather_split(gather_columns, c)[1] for _, c in chunks)
            copies = GATHER_TRANSPOSE_BUFS
            if pipelined:
                index_cols = n_p if corner_blocks else cols
                copies = blocks * -(-index_cols // gather_columns) * len(chunks)
            tiles.append(("transposed", (copies, m * PARTITIONS), value_dtype))
            # a 16-byte-aligned copy of a multi-column index tile that starts misaligned
            tiles.append(("gidx_aligned", (2, -(-m // INDEX_TILE_ALIGN_WORDS) * INDEX_TILE_ALIGN_WORDS), "uint32"))
        else:  # masked index columns of a chunk (backward_live_rows), 2 in turn
            tiles.append(("gidx_live", (2, cols), "int32"))
    if want_value:
        tiles += [("sidx", (f * 4,), "int32"), ("coef", (f, 4), "float32"),
                  ("sidx_live", (2, cols), "int32")]
        if fold > 1:
            tiles += [("fold_pad", (f * 4,), "float32"), ("fidx", (f * 4,), "int32"),
                      ("fwork", (2, cols, c_h), "float32")]
        elif scatter_work_copies > 0:
            tiles.append(("swork", (scatter_work_copies, cols, c_h), "float32"))
        if pipelined:
            tiles += [("grad_alt", (blocks, c_h), "float32"), ("vbits_alt", (f, 4), "int32"),
                      ("sidx_alt", (f * 4,), "int32")]
    tiles += [
        ("red", (REDUCE_FREE_ELEMENTS,), "float32"),
        ("red_prev", (REDUCE_FREE_ELEMENTS,), "float32"),
        ("red_out", (REDUCE_FREE_ELEMENTS,), value_dtype),
    ]
    if want_value and reduce_sources > MAX_DMA_COMPUTE_SOURCES:
        tiles.append(("red_alt", (REDUCE_FREE_ELEMENTS,), "float32"))
    return tuple(tiles)


def transpose_gather_columns(cols: int, channels: int, cap: int | None) -> int:
    """M_g: index columns per transpose gather of ``channels`` (<= 128 used) channels; no cap
    means as many as upstream's packet limit allows."""
    limit = min(cols, TRANSPOSE_PACKET_COLUMNS // (PARTITIONS // min(channels, PARTITIONS)))
    if cap != None:  # noqa: E711
        limit = min(limit, cap // PARTITIONS)
    return _largest_divisor_at_most(cols, max(limit, 1))


def sbuf_bytes(tiles: SbufTiles) -> int:
    """Bytes per partition of ``tiles`` (each rounded up to 4 bytes)."""
    return sum(_tile_bytes(shape, dtype) for _, shape, dtype in tiles)


def transpose_chunks(width: int) -> tuple[tuple[int, int], ...]:
    """(offset, channels) <= 128 channels per dma_transpose within a channel tile of ``width``."""
    return tuple((c0, min(DMA_TRANSPOSE_MAX_FREE, width - c0)) for c0 in range(0, width, DMA_TRANSPOSE_MAX_FREE))


def channel_tile_widths(head_dim: int, gather_method: str) -> list[int]:
    """Candidate channel-tile widths C_t, widest first: C_h, then ceil(C_h / n) for n = 2, 3, ...

    The transpose gather rounds a width above 128 up to a multiple of 128, so every tile but
    the last splits into whole 128-channel transposes.
    """
    widths: list[int] = []
    for n in range(1, head_dim + 1):
        width = -(-head_dim // n)
        if gather_method == "transpose" and width > DMA_TRANSPOSE_MAX_FREE:
            width = min(head_dim, -(-width // DMA_TRANSPOSE_MAX_FREE) * DMA_TRANSPOSE_MAX_FREE)
        if not widths or width < widths[-1]:
            widths.append(width)
        if width == 1:
            break
    return widths


def fit_sbuf(tiles_for: Callable[[int, int], SbufTiles], widths: list[int], budget: int) -> tuple[int, int]:
    """(C_t, T): the widest channel tile that fits ``budget`` with some blocks per super-tile,
    then the most blocks (a power of two <= 16) at that width; T = 0 when nothing fits.

    The full width is tried first (one channel tile: the kernel as without tiling); the bytes
    grow with the width, so the narrower widths are bisected.
    """
    def fits(width: int, blocks: int) -> bool:
        return sbuf_bytes(tiles_for(blocks, width)) <= budget

    if fits(widths[0], 1):
        width = widths[0]
    else:
        narrower = widths[1:]
        lo, hi = 0, len(narrower)  # the first fitting index lies in [lo, hi]; len = none
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(narrower[mid], 1):
                hi = mid
            else:
                lo = mid + 1
        if lo == len(narrower):
            return widths[-1], 0
        width = narrower[lo]
    blocks = MAX_BLOCKS_PER_TILE
    while blocks > 1 and not fits(width, blocks):
        blocks //= 2
    return width, blocks


