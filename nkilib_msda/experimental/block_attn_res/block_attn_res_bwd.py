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
RMSNorm, else (grad_values, grad_w). With LNC=2 each program writes its beta partial to shared
HBM, both meet at a core barrier, and program 0 adds partial 0 + partial 1 and writes the weights'
gradients.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nki, nisa, nl
from nkilib_msda.experimental.block_attn_res._kernel_common import (
    check_vector_arg, dtype_str, launch, load_query, sbuf_budget)
from nkilib_msda.experimental.block_attn_res.tiling import (
    BETA_CHUNK, TOKEN_TILE, BackwardPlan, plan_backward)

__all__ = ["block_attn_res_bwd"]

_F32 = nl.float32
_RESET_REDUCE = nisa.reduce_cmd.reset_reduce


class _Tiles:
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
        for name in ("alpha", "rms", "rinv", "d_alpha", "d_u", "weighted", "z", "g", "a", "b"):
            setattr(self, name, nl.ndarray((p, n_src), dtype=_F32, buffer=nl.sbuf, name=name))
        splits = plan.coeff_splits
        self.coeff_mm = nl.ndarray((p, n_src, splits), dtype=mm_dtype, buffer=nl.sbuf, name="coeff_mm")
        self.c = nl.ndarray((p, 1), dtype=_F32, buffer=nl.sbuf, name="c")
        n_beta = 2 if plan.lnc == 2 else 1
        self.beta = [nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name=f"beta{i}")
                     for i in range(n_beta)]
        self.w_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="w_t")
        self.gamma_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="gamma_t")
        self.grad_w_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="grad_w_t")
        self.grad_gamma_t = nl.ndarray((p, chunks), dtype=_F32, buffer=nl.sbuf, name="grad_gamma_t")
        self.beta_psum = nl.ndarray((p, chunks, splits), dtype=_F32, buffer=nl.psum, name="beta_psum")


class _SourceReader:
    """Source l of the current tile: a view of the tile's slab, or a DMA into a rotating tile."""

    def __init__(self, t: _Tiles, values: Any, plan: BackwardPlan) -> None:
        self.t, self.values, self.plan, self.count = t, values, plan, 0
        self.slab = None

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


def _accumulate_beta(t: _Tiles, v: Any, rows: int, l: int, dim: int, first: bool) -> None:
    """beta_psum[p, c, k] += sum_tokens v[token, c*128 + p] * a_k[token, l] (contract over
    tokens; k runs over the hi/lo parts of a)."""
    for c in range(t.beta_psum.shape[1]):
        width = min(BETA_CHUNK, dim - c * BETA_CHUNK)
        nisa.nc_matmul(dst=t.beta_psum[0:width, c, :],
                       stationary=v[:, c * BETA_CHUNK:c * BETA_CHUNK + width],
                       moving=t.coeff_mm[0:rows, l, :], accumulate=not first)


def _column_groups(dim: int) -> list[tuple[int, int, int]]:
    """(first column, columns, rows) groups of the [128, chunks] beta layout (d = c*128 + p)."""
    full, rem = divmod(dim, BETA_CHUNK)
    groups = [(0, full, BETA_CHUNK)] if full else []
    if rem:
        groups.append((full, 1, rem))
    return groups


def _chunked_view(vector: Any, first: int, cols: int, rows: int) -> Any:
    """HBM view [rows, cols] of a [D] vector: element (p, c) = vector[(first + c)*128 + p]."""
    return vector.ap([[1, rows], [BETA_CHUNK, cols]], offset=first * BETA_CHUNK)


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
        _accumulate_beta(t, v, rows, l, dim, first=(i == 0 and l == 0))


def _combine_beta(t: _Tiles, plan: BackwardPlan, pid: int, has_tiles: bool) -> Any:
    """This program's beta in SBUF; with LNC=2, program 0's becomes partial0 + partial1 (the
    caller lets only program 0 write the weights' gradients)."""
    beta = t.beta[0]
    nisa.memset(dst=beta, value=0.0)
    if has_tiles:
        for first, cols, rows in _column_groups(plan.dim):
            nisa.tensor_reduce(dst=beta[0:rows, first:first + cols], op=nl.add,
                               data=t.beta_psum[0:rows, first:first + cols, :], axis=2)
    if plan.lnc == 1:
        return beta
    partials = nl.ndarray((plan.lnc, TOKEN_TILE, plan.beta_chunks), dtype=_F32,
                          buffer=nl.shared_hbm, name="beta_partials")
    nisa.dma_copy(dst=partials[pid], src=beta)
    nisa.core_barrier(partials, cores=(0, 1))
    if pid != 0:
        return beta
    nisa.dma_copy(dst=t.beta[1], src=partials[1])
    nisa.tensor_tensor(dst=beta, data1=beta, data2=t.beta[1], op=nl.add)  # partial0 + partial1
    return beta


def _write_weight_grads(t: _Tiles, beta: Any, proj_weight: Any, rmsnorm_gamma: Any, scale: float,
                        plan: BackwardPlan, grad_w: Any, grad_gamma: Any) -> None:
    groups = _column_groups(plan.dim)
    inputs = [(t.w_t, proj_weight)] + ([(t.gamma_t, rmsnorm_gamma)] if plan.enable_rmsnorm else [])
    for tile, vector in inputs:
        nisa.memset(dst=tile, value=0.0)
        for first, cols, rows in groups:
            nisa.dma_copy(dst=tile[0:rows, first:first + cols],
                          src=_chunked_view(vector, first, cols, rows))
    s = float(scale)
    if plan.enable_rmsnorm:
        nisa.scalar_tensor_tensor(dst=t.grad_w_t, data=t.gamma_t, op0=nl.multiply, operand0=s,
                                  op1=nl.multiply, operand1=beta)
        nisa.scalar_tensor_tensor(dst=t.grad_gamma_t, data=t.w_t, op0=nl.multiply, operand0=s,
                                  op1=nl.multiply, operand1=beta)
    else:
        nisa.tensor_scalar(dst=t.grad_w_t, data=beta, op0=nl.multiply, operand0=s)
    outputs = [(t.grad_w_t, grad_w)] + ([(t.grad_gamma_t, grad_gamma)] if plan.enable_rmsnorm else [])
    for tile, out in outputs:
        for first, cols, rows in groups:
            nisa.dma_copy(dst=_chunked_view(out, first, cols, rows),
                          src=tile[0:rows, first:first + cols])


@nki.jit
def block_attn_res_bwd(grad_h, values, proj_weight, alpha, rmsnorm_gamma=None, rms=None, scale=1.0,
                       enable_rmsnorm=True, mode=None):
    """Backward kernel; ``mode`` None (plan's choice), 'slab' or 'stream'."""
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
    reader = _SourceReader(t, values, plan)
    tiles = plan.tiles_of(pid)
    for i, tile in enumerate(tiles):
        row0, rows = plan.tile_rows(tile)
        _tile_backward(t, reader, grad_h, alpha, rms, grad_values, plan, i, row0, rows)
    beta = _combine_beta(t, plan, pid, len(tiles) > 0)
    if pid == 0:
        _write_weight_grads(t, beta, proj_weight, rmsnorm_gamma, scale, plan, grad_w, grad_gamma)
    if enable_rmsnorm:
        return grad_values, grad_w, grad_gamma
    return grad_values, grad_w
