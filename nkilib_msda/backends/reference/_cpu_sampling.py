"""The reference backend's CPU path: MSDA as weighted row lookups (``embedding_bag``).

Same semantics as the general path in :mod:`.backend` (docs/math.md conventions, the
three padding modes, exact derivatives, NaN coordinates contribute nothing, corners outside
the map contribute nothing), computed differently:

* Value is read as a matrix of (C_h,) rows in its own layout (no permuted copy): row
  ``(b*L + pixel)*N_h + h`` for BLNC, ``(b*N_h + h)*L + pixel`` for BNLC.
* Forward: one bag of N_l*N_p*4 corner rows per (b, q, h), each with weight
  bilinear * attention (0 for a corner outside the map, whose index is clamped into it), summed
  by ``embedding_bag``. A zero weight on a clamped row that holds inf/NaN would give NaN, so
  the caller checks the output and recomputes non-finite results on the general path.
* Backward, grad_value: the in-map corners of a query chunk sorted (stably) by value row, then
  one bag per value row over the grad_output rows of the queries that read it
  (``embedding_bag`` again): a segmented sum in a fixed order, so bitwise reproducible.
  Corners outside the map are left out rather than weighted by 0.
* Backward, grad_sampling_locations / grad_attention_weights: per corner <grad_output, V[row]>
  from cache-sized gathers, 0 for corners outside the map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nkilib_msda.backends.reference._bilinear import LevelTables, axis
from nkilib_msda.backends.reference._cpu_workers import map_blocks
from nkilib_msda.backends.reference._grad_scale import row_scales
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["ELEMENTS_PER_CORNER", "value_matrix", "forward", "backward"]

# Memory per corner, counted in elements, for the caller's query chunking: the path holds
# indices, weights and a few per-corner temporaries, never gathered C_h-wide values (except in
# blocks of _GATHER_BYTES_PER_BLOCK). With the reference backend's budget of 2**22 elements a
# chunk is 2**21 corners: few enough chunks that the per-chunk costs stay small (the backward
# makes one full-size grad_value term per chunk), at about 100 MB of temporaries.
ELEMENTS_PER_CORNER = 2

# Bytes of value rows gathered at once (for <grad_output, V[row]> and the non-float32 forward):
# 8 MB blocks cost no more than 128 kB ones on one thread (cache-sized gathers beat one huge
# gather by 2x) and make 64x fewer parallel regions, which matters on a loaded machine.
_GATHER_BYTES_PER_BLOCK = 1 << 23

# Corners per block of queries: the unit of work of one pool thread (see _cpu_workers).
_CORNERS_PER_BLOCK = 1 << 16


def value_matrix(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Value as contiguous (B*L*N_h, C_h) (BLNC) or (B*N_h*L, C_h) (BNLC) rows; a view when
    value is contiguous and already in ``dtype``."""
    return value.to(dtype).reshape(-1, value.shape[-1])


@dataclass(frozen=True)
class _Corners:
    """Corner-major terms of the samples (B, q, N_h, N_l, N_p) of one query chunk.

    ``rows`` (2, 2, B, q, N_h, N_l, N_p) value rows of the corners (y0/y1, x0/x1), clamped into
    the map; ``inside`` whether each corner lies in the map (and the sample is usable);
    ``fy``/``fx`` (2, …) the per-axis bilinear factors (1 - frac, frac), unmasked; ``deriv_y``,
    ``deriv_x`` (…) d p / d u. Corner-major so that every elementwise op runs over contiguous
    sample-sized blocks.
    """

    rows: torch.Tensor
    inside: torch.Tensor
    fy: torch.Tensor
    fx: torch.Tensor
    deriv_y: torch.Tensor
    deriv_x: torch.Tensor

    def weights(self) -> torch.Tensor:
        """Bilinear weights (2, 2, …), 0 for corners outside the map."""
        w = self.fy[:, None] * self.fx[None, :]
        return torch.where(self.inside, w, torch.zeros((), dtype=w.dtype))


def _index_dtype(num_value_rows: int) -> torch.dtype:
    return torch.int32 if num_value_rows < 2**31 - 1 else torch.int64


def _corners(problem: MSDAProblem, levels: LevelTables, u: torch.Tensor, v: torch.Tensor,
             index_dtype: torch.dtype) -> _Corners:
    """Corner terms for normalized ``u``, ``v`` of shape (B, q, N_h, N_l, N_p); both axes go
    through :func:`axis` together (half the tensor ops)."""
    p = problem
    sizes = torch.stack((levels.widths, levels.heights)).view(2, 1, 1, 1, p.num_levels, 1)
    a = axis(torch.stack((u, v)), sizes, p.align_corners, p.padding_mode, index_dtype)
    heads = torch.arange(p.num_heads, dtype=index_dtype, device=u.device)
    batches = torch.arange(p.batch, dtype=index_dtype, device=u.device)[:, None]
    if p.value_layout == "BLNC":  # row = (b*L + pixel)*N_h + h
        pixel_stride = p.num_heads
        base = batches * (p.total_pixels * p.num_heads) + heads  # (B, N_h)
    else:  # BNLC: row = (b*N_h + h)*L + pixel
        pixel_stride = 1
        base = (batches * p.num_heads + heads) * p.total_pixels
    # Small (…, N_l, 1) tables: row of pixel (y, x) = y * line_stride + line_base + x * pixel_stride.
    line_stride = levels.widths.to(index_dtype) * pixel_stride
    line_base = levels.starts.to(index_dtype) * pixel_stride + base[:, None, :, None, None]
    index = torch.stack((a.index0, a.index1), dim=1)  # (x/y, corner 0/1, …)
    row_y = index[1] * line_stride + line_base
    row_x = index[0] * pixel_stride if pixel_stride != 1 else index[0]
    valid = torch.stack((a.valid0, a.valid1), dim=1)
    factors = torch.stack((1 - a.frac, a.frac), dim=1)
    return _Corners(rows=row_y[:, None] + row_x[None, :], inside=valid[1][:, None] & valid[0][None, :],
                    fy=factors[1], fx=factors[0], deriv_y=a.deriv[1], deriv_x=a.deriv[0])


def _blocks(n: int, rows_per_item: int, value_rows: torch.Tensor) -> list[tuple[int, int]]:
    """Ranges of items (bags) whose gathered rows fit ``_GATHER_BYTES_PER_BLOCK``."""
    row_bytes = value_rows.shape[1] * value_rows.element_size()
    step = max(1, _GATHER_BYTES_PER_BLOCK // (rows_per_item * row_bytes))
    return [(b0, min(n, b0 + step)) for b0 in range(0, n, step)]


def _gather_block(value_rows: torch.Tensor, rows: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
    """Rows (4, n, K) of bags b0:b1 -> their value rows (b1 - b0, 4*K, C_h), bag-major."""
    index = rows[:, b0:b1].transpose(0, 1).reshape(-1)
    return value_rows.index_select(0, index).view(b1 - b0, -1, value_rows.shape[1])


def _weighted_sum(value_rows: torch.Tensor, rows: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """sum over corners c and entries k of coef[c, n, k] * V[rows[c, n, k]] -> (n, C_h).

    float32: ``embedding_bag`` (FBGEMM's prefetching kernel), one bag per (corner, n). Other
    dtypes: cache-sized gathers reduced by ``bmm`` (embedding_bag's non-float32 kernel is a
    serial loop, twice as slow on one thread and not multithreaded)."""
    corners, n, k = rows.shape
    if value_rows.dtype == torch.float32:
        per_corner = F.embedding_bag(rows.reshape(-1, k), value_rows,
                                     per_sample_weights=coef.reshape(-1, k), mode="sum")
        return per_corner.view(corners, n, -1).sum(0)
    out = torch.empty(n, value_rows.shape[1], dtype=value_rows.dtype, device=value_rows.device)
    for b0, b1 in _blocks(n, corners * k, value_rows):
        weights = coef[:, b0:b1].transpose(0, 1).reshape(b1 - b0, 1, corners * k)
        torch.bmm(weights, _gather_block(value_rows, rows, b0, b1), out=out[b0:b1, None, :])
    return out


def _query_blocks(chunks: list[slice], problem: MSDAProblem) -> list[slice]:
    """The query ranges ``chunks`` each cut into the fewest blocks of at most
    ``_CORNERS_PER_BLOCK`` corners, of (nearly) equal sizes, so that pool threads share the work
    evenly. Fixed by the problem alone: the grad_value sums follow the block order."""
    p = problem
    per_query = 4 * p.batch * p.num_heads * p.num_levels * p.num_points
    blocks = []
    for qs in chunks:
        queries = qs.stop - qs.start
        count = min(queries, -(-queries * per_query // _CORNERS_PER_BLOCK))
        bounds = [qs.start + queries * i // count for i in range(count + 1)]
        blocks += [slice(q0, q1) for q0, q1 in zip(bounds[:-1], bounds[1:])]
    return blocks


def forward(value_rows: torch.Tensor, problem: MSDAProblem, levels: LevelTables,
            u: torch.Tensor, v: torch.Tensor, attn: torch.Tensor, out: torch.Tensor,
            chunks: list[slice]) -> bool:
    """Write the output (B, N_q, N_h, C_h) into ``out``; False if any of it is not finite
    (then a clamped out-of-map corner may have read inf/NaN: the caller recomputes)."""
    p = problem
    index_dtype = _index_dtype(value_rows.shape[0])
    per_bag = p.num_levels * p.num_points

    def block(qs: slice) -> bool:
        c = _corners(p, levels, u[:, qs], v[:, qs], index_dtype)
        # 0, not a * 0, outside the map: an infinite attention weight adds nothing there
        coef = torch.where(c.inside, c.weights() * attn[:, qs], torch.zeros((), dtype=attn.dtype))
        sums = _weighted_sum(value_rows, c.rows.reshape(4, -1, per_bag), coef.reshape(4, -1, per_bag))
        out[:, qs] = sums.view(out[:, qs].shape)
        return bool(torch.isfinite(sums.sum()))

    return all(map_blocks(block, _query_blocks(chunks, p)))


def _corner_dots(value_rows: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """<grad[n], V[rows[c, n, k]]> for rows (4, n, K) and grad (n, C_h) -> (4, n, K)."""
    corners, n, k = rows.shape
    dots = torch.empty(n, corners * k, dtype=value_rows.dtype, device=value_rows.device)
    for b0, b1 in _blocks(n, corners * k, value_rows):
        torch.bmm(_gather_block(value_rows, rows, b0, b1), grad[b0:b1, :, None],
                  out=dots[b0:b1, :, None])
    return dots.view(n, corners, k).transpose(0, 1)


@dataclass(frozen=True)
class _ChunkTerms:
    """grad_value terms of the corners of one query chunk, block after block (fixed order):
    ``keys`` the value row of each corner (``num_value_rows`` for corners outside the map),
    ``coef`` bilinear * attention weight, ``bags`` the corner's row of the chunk's grad_output
    rows (B*q*N_h, C_h)."""

    keys: torch.Tensor
    coef: torch.Tensor
    bags: torch.Tensor

    def put(self, start: int, c: _Corners, coef: torch.Tensor, bags: torch.Tensor,
            num_value_rows: int) -> None:
        n = c.rows.numel()
        torch.where(c.inside, c.rows, torch.tensor(num_value_rows, dtype=c.rows.dtype),
                    out=self.keys[start:start + n].view(c.rows.shape))
        self.coef[start:start + n].view(coef.shape).copy_(coef)
        self.bags[start:start + n].view(c.rows.shape).copy_(bags.expand(c.rows.shape))


def _grad_value_chunk(grad_value: torch.Tensor, grad_rows: torch.Tensor, terms: _ChunkTerms,
                      pieces: int, first: bool) -> None:
    """Per value row, the sum over in-map corners of coef * grad_output row, written into
    grad_value (rows, C_h) for the ``first`` chunk (every row), else added: corners sorted
    (stably) by value row, then one bag per value row; the value rows are split into ``pieces``
    ranges summed independently (each row's sum is the same whatever the split)."""
    num_value_rows = grad_value.shape[0]
    sorted_keys, order = torch.sort(terms.keys, stable=True)
    counts = torch.bincount(sorted_keys, minlength=num_value_rows + 1)[:num_value_rows]
    offsets = torch.zeros(num_value_rows + 1, dtype=torch.int64, device=grad_value.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    used = int(offsets[-1])  # corners outside the map sort last and are dropped
    targets = torch.linspace(0, used, pieces + 1, dtype=torch.float64).round().to(torch.int64)
    bounds = torch.searchsorted(offsets, targets).clamp_(max=num_value_rows).tolist()
    bounds[0], bounds[-1] = 0, num_value_rows
    ranges = [(r0, r1) for r0, r1 in zip(bounds[:-1], bounds[1:]) if r1 > r0]

    def piece(rows: tuple[int, int]) -> None:
        r0, r1 = rows
        e0, e1 = int(offsets[r0]), int(offsets[r1])
        if e1 == e0:
            if first:
                grad_value[r0:r1] = 0
            return
        corners = order[e0:e1]
        sums = F.embedding_bag(
            terms.bags.index_select(0, corners).long(), grad_rows, offsets[r0:r1 + 1] - e0,
            per_sample_weights=terms.coef.index_select(0, corners), mode="sum",
            include_last_offset=True)
        if first:
            grad_value[r0:r1] = sums
        else:
            grad_value[r0:r1] += sums

    map_blocks(piece, ranges)


def backward(grad: torch.Tensor, value_rows: torch.Tensor, problem: MSDAProblem,
             levels: LevelTables, u: torch.Tensor, v: torch.Tensor, attn: torch.Tensor,
             compute: tuple[bool, bool, bool], chunks: list[slice]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad (B, N_q, N_h, C_h) -> (grad_value rows like ``value_rows``, grad_u, grad_v,
    grad_attn (B, N_q, N_h, N_l, N_p)); those not requested in ``compute`` are zeros."""
    p = problem
    want_value, want_loc, want_attn = compute
    dtype, device = value_rows.dtype, value_rows.device
    index_dtype = _index_dtype(value_rows.shape[0])
    # written whole by the first chunk's grad_value pieces (in the pool threads)
    grad_value = torch.empty_like(value_rows) if want_value else torch.zeros_like(value_rows)
    grad_u = torch.zeros(p.attention_weights_shape, dtype=dtype, device=device)
    grad_v = torch.zeros_like(grad_u)
    grad_attn = torch.zeros_like(grad_u)
    zero = torch.zeros((), dtype=dtype, device=device)
    per_bag = p.num_levels * p.num_points
    corners_per_query = 4 * p.batch * p.num_heads * per_bag
    heads = torch.arange(p.num_heads, dtype=index_dtype, device=device)
    for i, qs in enumerate(chunks):
        q_chunk = qs.stop - qs.start
        n = q_chunk * corners_per_query
        terms = _ChunkTerms(torch.empty(n, dtype=index_dtype, device=device),
                            torch.empty(n, dtype=dtype, device=device),
                            torch.empty(n, dtype=index_dtype, device=device))

        def block(qb: slice) -> None:
            c = _corners(p, levels, u[:, qb], v[:, qb], index_dtype)
            a = attn[:, qb]
            weights = c.weights()
            if want_value:
                queries = torch.arange(qb.start - qs.start, qb.stop - qs.start, dtype=index_dtype,
                                       device=device)
                batches = torch.arange(p.batch, dtype=index_dtype, device=device)[:, None]
                bags = ((batches * q_chunk + queries)[:, :, None] * p.num_heads + heads)
                terms.put((qb.start - qs.start) * corners_per_query, c, weights * a,
                          bags[..., None, None], value_rows.shape[0])
            if want_loc or want_attn:
                g = grad[:, qb].reshape(-1, p.head_dim)  # (B*q*N_h, C_h), bag order
                scale, unscale = row_scales(g)  # dots of 2^-k g, gradients times 2^k last
                unscale = unscale.view(*a.shape[:3], 1, 1)
                dots = _corner_dots(value_rows, c.rows.reshape(4, -1, per_bag), g * scale)
                dots = torch.where(c.inside, dots.reshape(c.rows.shape), zero)  # (y, x, …)
                if want_attn:
                    grad_attn[:, qb] = (weights * dots).sum((0, 1)) * unscale
                if want_loc:
                    along_x = dots[:, 1] - dots[:, 0]  # (y, …)
                    along_y = dots[1] - dots[0]  # (x, …)
                    grad_u[:, qb] = a * c.deriv_x * (c.fy * along_x).sum(0) * unscale
                    grad_v[:, qb] = a * c.deriv_y * (c.fx * along_y).sum(0) * unscale

        blocks = _query_blocks([qs], p)
        map_blocks(block, blocks)
        if want_value:
            _grad_value_chunk(grad_value, grad[:, qs].reshape(-1, p.head_dim), terms, len(blocks),
                              first=i == 0)
    return grad_value, grad_u, grad_v, grad_attn
