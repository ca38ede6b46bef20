"""Tiling plans for the Block AttnRes kernels, computed before any instruction is emitted.

Kernel layout: source-major values [L, BT, D]; up to 128 tokens per tile on the partitions, D
on the free axis, the softmax over L as a free-axis op on a [tokens, L] tile. Each of the lnc
programs takes ceil(BT / lnc) consecutive tokens in ceil(BT / (128 lnc)) near-equal tiles, so at
LNC=2 both programs run the same number of tiles (see ``tiles_of``). Every SBUF buffer the
kernels allocate is listed here (bytes per partition), so the budget check is exact.

Forward modes
- ``slab``: rotating [128, L, D] slabs (DMA of tile t+1 overlaps compute on tile t); the
  scores and the weighted sum are two on-chip passes over the slab.
- ``stream``: rotating [128, G, D] slabs of G < L sources and an online softmax across the
  groups (running max; the fp32 accumulator is rescaled once per group); V is still read from
  HBM once. The largest G that fits wins.
Backward modes
- ``slab``: the tile's whole slab stays on chip between pass A (dots) and pass B (dV, beta).
- ``stream``: pass B reads each source again (1.5x the compulsory HBM traffic of V).
The first candidate that fits wins: forward G = L, L-1, ..., 1 with two buffers, then G = 1 with
one; backward slab x2, slab x1, stream x2, stream x1 (xN = rotation depth of the streamed tiles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, cast

from nkilib_msda.hardware import DTYPE_BYTES as _ALL_DTYPE_BYTES
from nkilib_msda.hardware import KERNEL_DTYPES, PARTITIONS, PLANNER_SBUF_BUDGET, PSUM_BANK_FP32, SQRT_VALID_INPUT

__all__ = ["TOKEN_TILE", "BETA_CHUNK", "PLANNER_SBUF_BUDGET", "ForwardPlan", "BackwardPlan",
           "plan_forward", "plan_backward"]

TOKEN_TILE = PARTITIONS  # tokens per tile = partitions
BETA_CHUNK = PARTITIONS  # D values per beta matmul (the stationary's M = PSUM partitions)
# The kernels' tensor dtypes and their sizes (hardware facts live in kernel_commons).
DTYPE_BYTES = {name: _ALL_DTYPE_BYTES[name] for name in KERNEL_DTYPES}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class _Plan:
    num_sources: int
    num_tokens: int
    dim: int
    dtype: str
    lnc: int
    enable_rmsnorm: bool
    mode: str
    buffers: int  # rotation depth of the streamed tiles (2 = DMA overlaps compute)
    sbuf_bytes: tuple[tuple[str, int], ...]  # (buffer name, bytes per partition)
    sbuf_budget: int

    @property
    def tiles_per_program(self) -> int:
        """Token tiles of every program: ceil(BT / (128 * lnc))."""
        return _ceil_div(self.num_tokens, TOKEN_TILE * self.lnc)

    def program_tokens(self, program_id: int) -> tuple[int, int]:
        """(first token, token count) of one program: ceil(BT / lnc) tokens, the last program
        one fewer when BT is odd at LNC=2 (none when BT = 1)."""
        share = _ceil_div(self.num_tokens, self.lnc)
        start = min(program_id * share, self.num_tokens)
        return start, min(share, self.num_tokens - start)

    def tiles_of(self, program_id: int) -> tuple[tuple[int, int], ...]:
        """(first token, token count) of each token tile of one program, in order.

        Every program splits its tokens into ``tiles_per_program`` near-equal tiles (larger
        ones first), so at LNC=2 both programs run the same number of tiles, of the same sizes
        when BT is even; when BT is odd exactly one tile of program 1 is one token shorter
        (BT = 1: program 1 has no tile).
        """
        start, count = self.program_tokens(program_id)
        n_tiles = min(self.tiles_per_program, count)
        if n_tiles == 0:
            return ()
        base, extra = divmod(count, n_tiles)
        tiles = []
        for i in range(n_tiles):
            rows = base + (1 if i < extra else 0)
            tiles.append((start, rows))
            start += rows
        return tuple(tiles)

    @property
    def total_sbuf_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.sbuf_bytes)


@dataclass(frozen=True)
class ForwardPlan(_Plan):
    """Forward tiling: ``group`` sources per on-chip slab; ``mode`` 'slab' when group = L."""

    group: int

    def groups(self) -> list[tuple[int, int]]:
        """(first source, sources) of each group, in order."""
        return [(g0, min(self.group, self.num_sources - g0))
                for g0 in range(0, self.num_sources, self.group)]


@dataclass(frozen=True)
class BackwardPlan(_Plan):
    """Backward tiling: ``mode`` is 'slab' or 'stream'; beta accumulates in one PSUM bank."""

    @property
    def beta_chunks(self) -> int:
        """Columns of the [128, chunks] PSUM beta accumulator (D value c*128 + p at (p, c))."""
        return _ceil_div(self.dim, BETA_CHUNK)

    @property
    def matmul_dtype(self) -> str:
        """Dtype of the beta matmul's moving operand (the coefficients a): fp32 with fp32 values,
        else bf16 (fp16 would flush small g/r to subnormals)."""
        return "float32" if self.dtype == "float32" else "bfloat16"

    @property
    def weight_band(self) -> int:
        """D values of grad_w / grad_gamma each program combines and writes: ceil(D / lnc)."""
        return _ceil_div(self.dim, self.lnc)

    @property
    def weight_band_chunks(self) -> int:
        """Columns of one band in the [128, chunks] layout."""
        return _ceil_div(self.weight_band, BETA_CHUNK)

    @property
    def stage_weight_band(self) -> bool:
        """LNC=2 with odd D: the bands differ by one value, so each program stages its band in
        HBM and writes it with one contiguous DMA (same instruction count, one value fewer)."""
        return self.dim % self.lnc != 0

    @property
    def coeff_splits(self) -> int:
        """bf16 coefficients go in as a = hi + lo (two bf16 columns, ~16 significant bits), so
        beta keeps nearly fp32 accuracy; the N = 2 moving costs the Tensor engine ~nothing."""
        return 1 if self.matmul_dtype == "float32" else 2


def _check_common(num_sources: int, num_tokens: int, dim: int, dtype: str, lnc: int) -> None:
    if not 1 <= num_sources <= PARTITIONS:
        raise ValueError(f"num_sources: expected 1..{PARTITIONS}, got {num_sources}")
    if num_tokens < 1 or dim < 1:
        raise ValueError(f"num_tokens, dim: expected >= 1, got {num_tokens}, {dim}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if lnc not in (1, 2):
        raise ValueError(f"lnc: expected 1 or 2, got {lnc}")


def check_rmsnorm_eps(rmsnorm_eps: float, enable_rmsnorm: bool) -> None:
    """With RMSNorm the forward takes sqrt(mean (c v)^2 + eps c^2) with c = 1 for a row of
    small values (mean (c v)^2 <= 4 otherwise), so an all-zero source row reaches sqrt(eps):
    eps must keep that inside the square root's documented input range
    (hardware.SQRT_VALID_INPUT, [2^-116, 2^118]); this rejects 0, NaN and inf."""
    low, high = SQRT_VALID_INPUT
    if enable_rmsnorm and not (low <= rmsnorm_eps <= high / 4):
        raise ValueError(f"rmsnorm_eps: expected a number in [2^-116, 2^116] for the NKI kernel "
                         f"(an all-zero row takes nl.sqrt(eps), valid from 2^-116), got {rmsnorm_eps!r}")


def _check_mode(force_mode: str | None) -> None:
    if force_mode not in (None, "slab", "stream"):
        raise ValueError(f"mode: expected None, 'slab' or 'stream', got {force_mode!r}")


def _small_tiles(num_sources: int, count: int) -> int:
    return count * 4 * num_sources


def _fits(buffers: dict[str, int], budget: int) -> bool:
    return sum(buffers.values()) <= budget


def _choose(candidates: list[tuple[str, int]], force_mode: str | None,
            buffers_for: Callable[[str, int], dict[str, int]], budget: int) -> tuple[str, int, dict[str, int]]:
    """First (mode, rotating buffers) candidate whose buffer list fits the budget."""
    tried = []
    for mode, nbuf in candidates:
        if force_mode in ("slab", "stream") and mode != force_mode:
            continue
        buffers = buffers_for(mode, nbuf)
        if _fits(buffers, budget):
            return mode, nbuf, buffers
        tried.append(f"{mode} x{nbuf}: {sum(buffers.values())} B")
    raise _NoTiling(f"dim: no tiling fits the {budget:,} SBUF bytes per partition "
                    f"({'; '.join(tried)})")


class _NoTiling(ValueError):
    """No candidate tiling fits the SBUF budget (the public planners add the largest D)."""


def _with_largest_dim(plan: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``plan(*args)`` (args[2] is D); when no tiling fits, the error also names the largest
    D that does, found by bisection (the SBUF need grows with D)."""
    try:
        return plan(*args)
    except _NoTiling as exc:
        def fits(dim: int) -> bool:
            try:
                plan(*args[:2], dim, *args[3:])
            except ValueError:
                return False
            return True

        lo, hi = 0, args[2] - 1  # the answer lies in [lo, hi]; 0: no D fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        advice = (f"the largest D that fits with these arguments is {lo}" if lo
                  else "no D fits with these arguments")
        raise ValueError(f"{exc}; D={args[2]} is too large: {advice}") from None


def plan_forward(num_sources: int, num_tokens: int, dim: int, dtype: str, lnc: int = 1,
                 enable_rmsnorm: bool = True, sbuf_budget: int = PLANNER_SBUF_BUDGET["trn2"],
                 force_mode: str | None = None, force_group: int | None = None) -> ForwardPlan:
    """Choose the forward's source group and buffer rotation; list its SBUF buffers.

    ``force_mode='stream'`` takes the largest group below L; ``force_group`` an exact group size.
    """
    return _with_largest_dim(_plan_forward, (num_sources, num_tokens, dim, dtype, lnc,
                                             enable_rmsnorm, sbuf_budget, force_mode, force_group))


def _plan_forward(num_sources: int, num_tokens: int, dim: int, dtype: str, lnc: int,
                  enable_rmsnorm: bool, sbuf_budget: int, force_mode: str | None,
                  force_group: int | None) -> ForwardPlan:
    _check_common(num_sources, num_tokens, dim, dtype, lnc)
    _check_mode(force_mode)
    forced = isinstance(force_group, int)  # kernel code: no `is None` (NKI 0.3-0.6)
    if forced and not 1 <= cast(int, force_group) <= num_sources:
        raise ValueError(f"group: expected 1..{num_sources} sources per group, got {force_group}")
    es = DTYPE_BYTES[dtype]

    def buffers_for(group: int, nbuf: int) -> dict[str, int]:
        return {
            "u": 4 * dim,  # s*gamma*w (or s*w) on every partition, fp32
            "product": 4 * dim,  # fp32 scratch: gamma staging, then the dot products
            "acc": 4 * dim,  # fp32 weighted sum
            "h": nbuf * es * dim,
            "scores": _small_tiles(num_sources, 8),  # sumsq, dot, z, e, alpha, rms, rinv, mean_sq
            "columns": 4 * 8,  # [128, 1] statistics
            "values": nbuf * group * dim * es,  # rotating [group, D] slabs
        }

    if forced:
        exact_group = cast(int, force_group)
        candidates = [(exact_group, 2), (exact_group, 1)]
    else:
        top = num_sources - 1 if force_mode == "stream" and num_sources > 1 else num_sources
        bottom = num_sources if force_mode == "slab" else 1
        candidates = [(g, 2) for g in range(top, bottom - 1, -1)] + [(bottom, 1)]
    tried = []
    for group, nbuf in candidates:
        buffers = buffers_for(group, nbuf)
        if _fits(buffers, sbuf_budget):
            if not forced:  # same number of groups, evenly sized (smaller slabs)
                group = _ceil_div(num_sources, _ceil_div(num_sources, group))
                buffers = buffers_for(group, nbuf)
            mode = "slab" if group == num_sources else "stream"
            return ForwardPlan(num_sources, num_tokens, dim, dtype, lnc, enable_rmsnorm, mode, nbuf,
                               tuple(buffers.items()), sbuf_budget, group)
        tried.append(f"group {group} x{nbuf}: {sum(buffers.values())} B")
    raise _NoTiling(f"dim: no tiling fits the {sbuf_budget:,} SBUF bytes per partition "
                    f"({'; '.join(tried[-2:])})")


def plan_backward(num_sources: int, num_tokens: int, dim: int, dtype: str, lnc: int = 1,
                  enable_rmsnorm: bool = True, sbuf_budget: int = PLANNER_SBUF_BUDGET["trn2"],
                  force_mode: str | None = None) -> BackwardPlan:
    """Choose the backward's mode and buffer rotation; list its SBUF buffers (bytes/partition)."""
    return _with_largest_dim(_plan_backward, (num_sources, num_tokens, dim, dtype, lnc,
                                              enable_rmsnorm, sbuf_budget, force_mode))


def _plan_backward(num_sources: int, num_tokens: int, dim: int, dtype: str, lnc: int,
                   enable_rmsnorm: bool, sbuf_budget: int,
                   force_mode: str | None) -> BackwardPlan:
    _check_common(num_sources, num_tokens, dim, dtype, lnc)
    _check_mode(force_mode)
    es = DTYPE_BYTES[dtype]
    chunks = _ceil_div(dim, BETA_CHUNK)
    if chunks > PSUM_BANK_FP32:
        raise ValueError(f"dim: D={dim} exceeds one PSUM bank of beta columns "
                         f"({PSUM_BANK_FP32 * BETA_CHUNK})")
    band_chunks = _ceil_div(_ceil_div(dim, lnc), BETA_CHUNK)
    mm_bytes, splits = (4, 1) if dtype == "float32" else (2, 2)
    if chunks * splits > PSUM_BANK_FP32:
        raise ValueError(f"dim: D={dim} exceeds one PSUM bank of beta columns "
                         f"({PSUM_BANK_FP32 // splits * BETA_CHUNK})")

    def buffers_for(mode: str, nbuf: int) -> dict[str, int]:
        per_source = num_sources * dim * es if mode == "slab" else dim * es
        return {
            "u": 4 * dim,
            "product": 4 * dim,  # fp32 scratch: gamma staging, dot products, the dv partial sum
            "grad_h": nbuf * es * dim,
            "grad_values": nbuf * es * dim,
            "scores": _small_tiles(num_sources, 10),  # alpha, rms, rinv, d_alpha, d_u, weighted, z, g, a, b
            "coeff_mm": mm_bytes * num_sources * splits,  # matmul copy of a (hi, lo)
            "columns": 4,  # c = sum_k alpha_k d_alpha_k
            "beta": 4 * chunks,  # beta evacuated from PSUM
            "weights_t": 2 * 4 * chunks,  # w and gamma in the [128, chunks] beta layout
            "grads_t": 2 * 4 * chunks,  # this program's grad_w and grad_gamma in that layout
            "weight_bands": 4 * lnc * 2 * band_chunks if lnc == 2 else 0,  # both partials' bands
            "values": nbuf * per_source,
        }

    mode, nbuf, buffers = _choose([("slab", 2), ("slab", 1), ("stream", 2), ("stream", 1)],
                                  force_mode, buffers_for, sbuf_budget)
    return BackwardPlan(num_sources, num_tokens, dim, dtype, lnc, enable_rmsnorm, mode, nbuf,
                        tuple(buffers.items()), sbuf_budget)
