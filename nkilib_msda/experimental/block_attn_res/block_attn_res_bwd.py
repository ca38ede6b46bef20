"""Block AttnRes backward NKI kernel.

Contract: ``grad_h`` [BT, D] and ``values`` [L, BT, D] (bf16/fp16/fp32), ``proj_weight`` and
``rmsnorm_gamma`` [D] fp32, caches ``alpha`` and ``rms`` [BT, L] fp32 (rms = sqrt(mean v^2 + eps),
so no eps is needed). Per token, with u = scale*gamma*w (scale*w without RMSNorm):
  d_alpha_l = dh . v_l,  g_l = alpha_l (d_alpha_l - sum_k alpha_k d_alpha_k),
  RMSNorm on:  z_l = (v_l . u) / r_l (recomputed: the caches fix z only up to a constant),
               a_l = g_l / r_l,  b_l = -a_l z_l / (D r_l),  dv_l = alpha_l dh + a_l u + b_l v_l,
  RMSNorm off: a_l = g_l,  dv_l = alpha_l dh + a_l u;
  beta = sum over tokens and sources of a_l v_l (fp32, Tensor engine into one PSUM bank),
  grad_w = scale*gamma*beta and grad_gamma = scale*w*beta (grad_w = scale*beta without RMSNorm).
Returns (grad_values [L, BT, D] in the values' dtype, grad_w [D] fp32, grad_gamma [D] fp32) with
RMSNorm, else (grad_values, grad_w).

LNC=2 (both programs run the same control flow; only addresses depend on ``nl.program_id``):
- Tokens: program p takes ceil(BT/2) tokens from p*ceil(BT/2), in ``plan.tiles_per_program``
  near-equal tiles (tiling.py), so both run the same number of tiles. Ragged grey zone: with odd
  BT one tile of program 1 is one token shorter (same instructions, smaller access patterns);
  with BT = 1 program 1 has no tile and skips the tile loop (everything after it is identical:
  beta starts from an overwriting zero matmul, so it is defined without a tile).
- Weight gradients: each program scales its own beta partial (s*gamma*beta_p, s*w*beta_p), writes
  it to shared HBM and meets the other at a core barrier; then program p adds partial 0 +
  partial 1 (fixed order, fp32) over its band [p*Db, p*Db + Db) of D, Db = ceil(D/2), and writes
  that band. Ragged grey zone, odd D: program 1's band is one value shorter, so both programs
  stage their band in HBM and write it with one contiguous DMA per output (program 1's DMA is
  one value shorter; with D = 1 it has none).
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nki, nisa, nl
from nkilib_msda.experimental.block_attn_res._kernel_common import (
    NamedTiles, barrier, check_vector_arg, dtype_str, launch, load_query, sbuf_budget)
from nkilib_msda.experimental.block_attn_res.tiling import (
    BETA_CHUNK, TOKEN_TILE, BackwardPlan, plan_backward)

__all__ = ["block_attn_res_bwd"]

_F32 = nl.float32
_RESET_REDUCE = nisa.reduce_cmd.reset_reduce


class _Tiles(NamedTiles):
    """The backward's SBUF/PSUM working set (allocated once; sizes match plan.sbuf_bytes)."""

    def __init__(self, plan: BackwardPlan, dtype: Any) -> None:
        p, n_src, dim, chunks = TOKEN_TILE, plan.num_sources, plan.dim, plan.beta_chunks
        mm_dtype = _F32 if plan.matmul_dtype == "float32" else nl.bfloat16
        self.u = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="u")
        self.product = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="product")
        nbuf = plan.buffers
        self.grad_h = [nl.ndarray((p, dim), dtype=dtype, buffer=nl.sbuf, name=f"grad_h{i}")
                       for i in range(nbuf)]
        self.grad_v = [nl.ndarray((p, dim), dtype=dtype, buffer=nl.sbuf, name=f"grad_v{i}")
                       for i in range(nbuf)]
        per_source = (p, n_src, dim) if plan.mode == "slab" else (p, dim)
        self.values = [nl.ndarray(per_source, dtype=dtype, buffer=nl.sbuf, name=f"values{i}")
                       for i in range(nbuf)]
        self.allocate(("alpha", "rms", "rinv", "d_alpha", "d_u", "weighted", "z", "g", "a", "b"), (p, n_src))
        splits = plan.coeff_splits
        self.coeff_mm = nl.ndarray((p, n_src, splits), dtype=mm_dtype, buffer=nl.sbuf, name="coeff_mm")
        self.c = nl.ndarray((p, 1), dtype=_F32, buffer=nl.sbuf, name="c")
        self.beta = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="beta")
        self.w_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="w_t")
        self.gamma_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="gamma_t")
        # [:, 0] grad_w, [:, 1] grad_gamma (this program's partial with LNC=2)
        self.grads = nl.ndarray((p, 2, chunks), dtype=_F32, buffer=nl.sbuf, name="grads_t")
        if plan.lnc == 2:  # [:, k, j] = partial k of output j, this program's band
            self.bands = nl.ndarray((p, plan.lnc, 2, plan.weight_band_chunks), dtype=_F32,
                                    buffer=nl.sbuf, name="weight_bands")
        self.beta_psum = nl.ndarray((p, chunks, splits), dtype=_F32, buffer=nl.psum, name="beta_psum")


class _SourceReader:
    """Source l of the current tile: a view of the tile's slab, or a DMA into a rotating tile."""

    def __init__(self, t: _Tiles, values: Any, plan: BackwardPlan) -> None:
        self.t, self.values, self.plan, self.count = t, values, plan, 0
        self.slab: Any = None

    def load_slab(self, tile_index: int, row0: int, rows: int) -> None:
        if self.plan.mode == "slab":
            n_src, n_tok, dim = self.plan.num_sources, self.plan.num_tokens, self.plan.dim
            self.slab = self.t.values[tile_index % self.plan.buffers]
            nisa.dma_copy(dst=self.slab[0:rows], src=self.values.ap(
                [[dim, rows], [n_tok * dim, n_src], [1, dim]], offset=row0 * dim))

    def source(self, l: int, row0: int, rows: int) -> Any:
        if self.plan.mode == "slab":
            return self.slab[0:rows, l, :]
        v = self.t.values[self.count % self.plan.buffers][0:rows]
        self.count += 1
        nisa.dma_copy(dst=v, src=self.values[l, row0:row0 + rows, :])
        return v


def _dot(t: _Tiles, rows: int, a: Any, b: Any, out_col: Any) -> None:
    """out_col = sum_d a*b: VectorE product, ScalarE reduction (balances the two engines)."""
    prod = t.product[0:rows]
    nisa.tensor_tensor(dst=prod, data1=a, data2=b, op=nl.multiply)
    nisa.activation(dst=prod, op=nl.copy, data=prod, reduce_op=nl.add, reduce_res=out_col,
                    reduce_cmd=_RESET_REDUCE)


def _coefficients(t: _Tiles, rows: int, dim: int, enable_rmsnorm: bool) -> Any:
    """g, then a (and b with RMSNorm) on the [rows, L] tiles; returns the a tile view."""
    r = slice(0, rows)
    nisa.tensor_tensor(dst=t.weighted[r], data1=t.alpha[r], data2=t.d_alpha[r], op=nl.multiply)
    nisa.tensor_reduce(dst=t.c[r], op=nl.add, data=t.weighted[r], axis=1)
    nisa.scalar_tensor_tensor(dst=t.g[r], data=t.d_alpha[r], op0=nl.subtract, operand0=t.c[r],
                              op1=nl.multiply, operand1=t.alpha[r])
    if not enable_rmsnorm:
        return t.g[r]
    nisa.tensor_tensor(dst=t.z[r], data1=t.d_u[r], data2=t.rinv[r], op=nl.multiply)
    nisa.tensor_tensor(dst=t.a[r], data1=t.g[r], data2=t.rinv[r], op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=t.b[r], data=t.a[r], op0=nl.multiply, operand0=-1.0 / dim,
                              op1=nl.multiply, operand1=t.z[r])
    nisa.tensor_tensor(dst=t.b[r], data1=t.b[r], data2=t.rinv[r], op=nl.multiply)
    return t.a[r]


def _grad_source(t: _Tiles, v: Any, dh: Any, coeff: Any, gv: Any, rows: int, l: int,
                 enable_rmsnorm: bool) -> None:
    """gv = alpha_l dh + a_l u (+ b_l v): ScalarE scales one term, VectorE fuses the rest."""
    prod, col = t.product[0:rows], slice(l, l + 1)
    if enable_rmsnorm:
        nisa.activation(dst=prod, op=nl.copy, data=v, scale=t.b[0:rows, col])
        nisa.scalar_tensor_tensor(dst=prod, data=dh, op0=nl.multiply, operand0=t.alpha[0:rows, col],
                                  op1=nl.add, operand1=prod)
    else:
        nisa.activation(dst=prod, op=nl.copy, data=dh, scale=t.alpha[0:rows, col])
    nisa.scalar_tensor_tensor(dst=gv, data=t.u[0:rows], op0=nl.multiply, operand0=coeff[:, col],
                              op1=nl.add, operand1=prod)


def _zero_beta_psum(t: _Tiles, dim: int) -> None:
    """beta_psum = 0 by one overwriting matmul of zeros (PSUM accumulation is defined only after
    an overwriting matmul, not after a memset). Every beta matmul then accumulates, so a program
    without token tiles still evacuates a defined zero beta."""
    m = min(dim, BETA_CHUNK)
    zero_stationary = t.product[0:1, 0:m]
    zero_moving = t.grads[0:1, 0:t.beta_psum.shape[2], :]  # chunks * splits columns
    nisa.memset(dst=zero_stationary, value=0.0)
    nisa.memset(dst=zero_moving, value=0.0)
    nisa.nc_matmul(dst=t.beta_psum[0:m], stationary=zero_stationary, moving=zero_moving,
                   accumulate=False)


def _accumulate_beta(t: _Tiles, v: Any, rows: int, l: int, dim: int) -> None:
    """beta_psum[p, c, k] += sum_tokens v[token, c*128 + p] * a_k[token, l] (contract over
    tokens; k runs over the hi/lo parts of a)."""
    for c in range(t.beta_psum.shape[1]):
        width = min(BETA_CHUNK, dim - c * BETA_CHUNK)
        nisa.nc_matmul(dst=t.beta_psum[0:width, c, :],
                       stationary=v[:, c * BETA_CHUNK:c * BETA_CHUNK + width],
                       moving=t.coeff_mm[0:rows, l, :], accumulate=True)


def _column_groups(dim: int) -> list[tuple[int, int, int]]:
    """(first column, columns, rows) groups of the [128, chunks] beta layout (d = c*128 + p)."""
    full, rem = divmod(dim, BETA_CHUNK)
    groups = [(0, full, BETA_CHUNK)] if full else []
    if rem:
        groups.append((full, 1, rem))
    return groups


def _chunked_view(vector: Any, first: int, cols: int, rows: int, start: int = 0) -> Any:
    """HBM view [rows, cols] of a [D] vector: element (p, c) = vector[start + (first + c)*128 + p]."""
    return vector.ap([[1, rows], [BETA_CHUNK, cols]], offset=start + first * BETA_CHUNK)


def _split_coefficients(t: _Tiles, rows: int, coeff: Any) -> None:
    """coeff_mm[:, :, 0] = a rounded to the matmul dtype; with two splits [:, :, 1] = the rest."""
    hi = t.coeff_mm[0:rows, :, 0]
    nisa.tensor_copy(dst=hi, src=coeff)
    if t.coeff_mm.shape[2] == 2:
        nisa.tensor_tensor(dst=t.coeff_mm[0:rows, :, 1], data1=coeff, data2=hi, op=nl.subtract)


def _tile_backward(t: _Tiles, reader: _SourceReader, grad_h: Any, alpha: Any, rms: Any,
                   grad_values: Any, plan: BackwardPlan, i: int, row0: int, rows: int) -> None:
    n_src, dim, rms_on = plan.num_sources, plan.dim, plan.enable_rmsnorm
    r = slice(0, rows)
    dh = t.grad_h[i % plan.buffers][r]
    nisa.dma_copy(dst=dh, src=grad_h[row0:row0 + rows, :])
    nisa.dma_copy(dst=t.alpha[r], src=alpha[row0:row0 + rows, :])
    if rms_on:
        nisa.dma_copy(dst=t.rms[r], src=rms[row0:row0 + rows, :])
        nisa.reciprocal(dst=t.rinv[r], data=t.rms[r])
    reader.load_slab(i, row0, rows)
    for l in range(n_src):  # pass A: the two dots per source
        v = reader.source(l, row0, rows)
        _dot(t, rows, v, dh, t.d_alpha[r, l:l + 1])
        if rms_on:
            _dot(t, rows, v, t.u[r], t.d_u[r, l:l + 1])
    coeff = _coefficients(t, rows, dim, rms_on)
    _split_coefficients(t, rows, coeff)
    for l in range(n_src):  # pass B: dv and the beta matmuls
        v = reader.source(l, row0, rows)
        gv = t.grad_v[(i * n_src + l) % plan.buffers][r]
        _grad_source(t, v, dh, coeff, gv, rows, l, rms_on)
        nisa.dma_copy(dst=grad_values[l, row0:row0 + rows, :], src=gv)
        _accumulate_beta(t, v, rows, l, dim)


def _partial_weight_grads(t: _Tiles, plan: BackwardPlan, proj_weight: Any, rmsnorm_gamma: Any,
                          scale: float) -> None:
    """t.grads[:, 0] = s*gamma*beta (s*beta without RMSNorm), t.grads[:, 1] = s*w*beta, from this
    program's tokens, in the [128, chunks] layout (d = c*128 + p). Rows past D are exact zeros:
    beta, w and gamma tiles are zeroed before their column groups are filled."""
    groups = _column_groups(plan.dim)
    nisa.memset(dst=t.beta, value=0.0)
    for first, cols, rows in groups:
        nisa.tensor_reduce(dst=t.beta[0:rows, first:first + cols], op=nl.add,
                           data=t.beta_psum[0:rows, first:first + cols, :], axis=2)
    s = float(scale)
    if not plan.enable_rmsnorm:
        nisa.tensor_scalar(dst=t.grads[:, 0, :], data=t.beta, op0=nl.multiply, operand0=s)
        return
    for tile, vector in ((t.w_t, proj_weight), (t.gamma_t, rmsnorm_gamma)):
        nisa.memset(dst=tile, value=0.0)
        for first, cols, rows in groups:
            nisa.dma_copy(dst=tile[0:rows, first:first + cols],
                          src=_chunked_view(vector, first, cols, rows))
    nisa.scalar_tensor_tensor(dst=t.grads[:, 0, :], data=t.gamma_t, op0=nl.multiply, operand0=s,
                              op1=nl.multiply, operand1=t.beta)
    nisa.scalar_tensor_tensor(dst=t.grads[:, 1, :], data=t.w_t, op0=nl.multiply, operand0=s,
                              op1=nl.multiply, operand1=t.beta)


def _write_weight_grads(t: _Tiles, plan: BackwardPlan, pid: int, outputs: tuple) -> None:
    """Write grad_w (and grad_gamma). LNC=1: straight from t.grads. LNC=2: both programs write
    their partials to shared HBM and meet at a core barrier; then program p adds partial 0 +
    partial 1 (fixed order, fp32) over its band [p*Db, p*Db + Db) of D, Db = ceil(D/2), and
    writes it. Only addresses depend on p: both programs issue the same instructions."""
    n_out = len(outputs)
    if plan.lnc == 1:
        for j, out in enumerate(outputs):
            for first, cols, rows in _column_groups(plan.dim):
                nisa.dma_copy(dst=_chunked_view(out, first, cols, rows),
                              src=t.grads[0:rows, j, first:first + cols])
        return
    band, lnc = plan.weight_band, plan.lnc
    padded = lnc * band  # D + 1 for odd D; the padding value is a written zero
    partials = nl.ndarray((lnc, 2, padded), dtype=_F32, buffer=nl.shared_hbm,
                          name="weight_grad_partials")
    for first, cols, rows in _column_groups(padded):
        nisa.dma_copy(dst=partials.ap([[1, rows], [padded, n_out], [BETA_CHUNK, cols]],
                                      offset=pid * 2 * padded + first * BETA_CHUNK),
                      src=t.grads[0:rows, 0:n_out, first:first + cols])
    barrier(partials, lnc)
    start = pid * band
    band_groups = _column_groups(band)
    for first, cols, rows in band_groups:
        both = t.bands[0:rows, :, 0:n_out, first:first + cols]
        nisa.dma_copy(dst=both, src=partials.ap(
            [[1, rows], [2 * padded, lnc], [padded, n_out], [BETA_CHUNK, cols]],
            offset=start + first * BETA_CHUNK))
        total = t.bands[0:rows, 0, 0:n_out, first:first + cols]
        nisa.tensor_tensor(dst=total, data1=total, data2=t.bands[0:rows, 1, 0:n_out, first:first + cols],
                           op=nl.add)  # partial 0 + partial 1 on both programs
    if not plan.stage_weight_band:
        for j, out in enumerate(outputs):
            for first, cols, rows in band_groups:
                nisa.dma_copy(dst=_chunked_view(out, first, cols, rows, start),
                              src=t.bands[0:rows, 0, j, first:first + cols])
        return
    # Odd D: program 1's band is one value shorter, which would change its column groups. Stage
    # the band in partials[0] (that band is read only by this program, which has loaded it) and
    # copy it to the outputs with one contiguous DMA each.
    for first, cols, rows in band_groups:
        nisa.dma_copy(dst=partials.ap([[1, rows], [padded, n_out], [BETA_CHUNK, cols]],
                                      offset=start + first * BETA_CHUNK),
                      src=t.bands[0:rows, 0, 0:n_out, first:first + cols])
    count = min(band, plan.dim - start)  # band, or band - 1 on program 1 (0 when D = 1)
    if count:
        for j, out in enumerate(outputs):
            nisa.dma_copy(dst=out[start:start + count], src=partials[0, j, start:start + count])


@nki.jit
def block_attn_res_bwd(grad_h, values, proj_weight, alpha, rmsnorm_gamma=None, rms=None, scale=1.0,
                       enable_rmsnorm=True, mode=None):
    """Block Attention Residuals backward: gradients of the sources and of the query weights,
    from the forward's alpha and rms caches.

    Dimensions:
        L: sources; BT: tokens, tiled by up to 128 per partition tile; D: hidden size.

    Args:
        grad_h (HBM tensor): [BT, D] in the values' dtype.
        values (HBM tensor): [L, BT, D] source-major; bfloat16, float16 or float32.
        proj_weight (HBM tensor): [D] float32.
        alpha (HBM tensor): [BT, L] float32, the forward's softmax weights.
        rmsnorm_gamma (HBM tensor | None): [D] float32; required when ``enable_rmsnorm``.
        rms (HBM tensor | None): [BT, L] float32, the forward's rms cache (sqrt(mean v^2 +
            eps), so no eps is needed here); required when ``enable_rmsnorm``.
        scale (float): the forward's score scale (default 1.0).
        enable_rmsnorm (bool): the forward's RMSNorm switch (default True).
        mode (str | None): None (the plan's choice), "slab" or "stream".

    Returns:
        With RMSNorm: (grad_values [L, BT, D] in the values' dtype, grad_w [D] float32,
        grad_gamma [D] float32); without: (grad_values, grad_w). All in shared HBM.

    Notes:
        - Per token, with u = scale * gamma * w (scale * w without RMSNorm):
          d_alpha_l = dh . v_l, g_l = alpha_l (d_alpha_l - sum_k alpha_k d_alpha_k);
          RMSNorm on: z_l recomputed as (v_l . u) / r_l, a_l = g_l / r_l,
          b_l = -a_l z_l / (D r_l), dv_l = alpha_l dh + a_l u + b_l v_l;
          off: a_l = g_l, dv_l = alpha_l dh + a_l u.
          beta = sum over tokens and sources of a_l v_l; grad_w = scale * gamma * beta,
          grad_gamma = scale * w * beta (grad_w = scale * beta without RMSNorm).
        - beta accumulates in float32 on the Tensor engine into one PSUM bank (the matmul
          operand split in two parts where its dtype would round a).
        - LNC=2: each program handles half of the tokens and writes its beta partial to shared
          HBM; after one core barrier, program p sums the two partials in a fixed order over
          its half of D.

    Pseudocode:
        plan = plan_backward(L, BT, D, dtype, lnc, enable_rmsnorm, sbuf_budget())
        u = scale * (gamma * w if enable_rmsnorm else w); beta_psum = 0
        for row0, rows in plan.tiles_of(program):                 # rows <= 128 tokens
            dh, a_cache, r = load(grad_h, alpha, rms rows)
            for l in range(L):                                    # pass A
                d_alpha[:, l] = v_l . dh; d_u[:, l] = v_l . u
            a, b = coefficients(alpha, d_alpha, d_u, r)           # [rows, L]
            for l in range(L):                                    # pass B
                store(grad_values[l, rows], alpha_l * dh + a_l * u + b_l * v_l)
                beta_psum += matmul(v_l^T, a_l)                   # contract over tokens
        grad_w, grad_gamma = scale * (gamma, w) * beta            # LNC=2: barrier, band sums
    """
    n_src, n_tok, dim = values.shape
    if tuple(grad_h.shape) != (n_tok, dim) or tuple(alpha.shape) != (n_tok, n_src):
        raise ValueError(f"grad_h, alpha: expected ({n_tok}, {dim}) and ({n_tok}, {n_src}), got "
                         f"{tuple(grad_h.shape)} and {tuple(alpha.shape)}")
    check_vector_arg("proj_weight", proj_weight, dim)
    if enable_rmsnorm:
        check_vector_arg("rmsnorm_gamma", rmsnorm_gamma, dim)
        if not hasattr(rms, "shape") or tuple(rms.shape) != (n_tok, n_src):
            got = tuple(rms.shape) if hasattr(rms, "shape") else rms
            raise ValueError(f"rms: expected an HBM tensor of shape ({n_tok}, {n_src}), got {got}")
    lnc, pid = launch()
    plan = plan_backward(n_src, n_tok, dim, dtype_str(values), lnc, bool(enable_rmsnorm),
                         sbuf_budget=sbuf_budget(), force_mode=mode)

    grad_values = nl.ndarray((n_src, n_tok, dim), dtype=values.dtype, buffer=nl.shared_hbm,
                             name="grad_values")
    grad_w = nl.ndarray((dim,), dtype=_F32, buffer=nl.shared_hbm, name="grad_w")
    grad_gamma = (nl.ndarray((dim,), dtype=_F32, buffer=nl.shared_hbm, name="grad_gamma")
                  if enable_rmsnorm else None)

    t = _Tiles(plan, values.dtype)
    load_query(t.u, t.product, proj_weight, rmsnorm_gamma, scale, enable_rmsnorm)
    _zero_beta_psum(t, dim)
    reader = _SourceReader(t, values, plan)
    for i, (row0, rows) in enumerate(plan.tiles_of(pid)):
        _tile_backward(t, reader, grad_h, alpha, rms, grad_values, plan, i, row0, rows)
    _partial_weight_grads(t, plan, proj_weight, rmsnorm_gamma, scale)
    _write_weight_grads(t, plan, pid, (grad_w, grad_gamma) if enable_rmsnorm else (grad_w,))
    if enable_rmsnorm:
        return grad_values, grad_w, grad_gamma
    return grad_values, grad_w
