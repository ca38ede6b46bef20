"""Block AttnRes forward NKI kernel.

Contract: ``values`` [L, BT, D] source-major (bf16/fp16/fp32; the last source is the partial
block when there is one), ``proj_weight`` and ``rmsnorm_gamma`` [D] fp32. Per token:
r_l = sqrt(mean_d v_ld^2 + eps), z_l = (v_l . u) / r_l with u = scale*gamma*w (or z_l = v_l . u,
u = scale*w, without RMSNorm), alpha = softmax_l(z), h = sum_l alpha_l v_l.
Returns (h [BT, D] in the values' dtype, rms [BT, L] fp32, alpha [BT, L] fp32) with RMSNorm,
else (h, alpha). Token tiles of 128 are split between the LNC programs; see tiling.py for the
slab / stream modes.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nki, nisa, nl
from nkilib_msda.experimental.block_attn_res._kernel_common import (
    check_vector_arg, dtype_str, launch, load_query, sbuf_budget)
from nkilib_msda.experimental.block_attn_res.tiling import TOKEN_TILE, ForwardPlan, plan_forward

__all__ = ["block_attn_res_fwd"]

_F32 = nl.float32
_RESET_REDUCE = nisa.reduce_cmd.reset_reduce


class _Tiles:
    """The forward's SBUF working set (allocated once; sizes match plan.sbuf_bytes)."""

    def __init__(self, plan: ForwardPlan, dtype: Any) -> None:
        p, n_src, dim = TOKEN_TILE, plan.num_sources, plan.dim
        self.u = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="u")
        self.product = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="product")
        self.acc = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="acc")
        nbuf = plan.buffers
        self.h = [nl.ndarray((p, dim), dtype=dtype, buffer=nl.sbuf, name=f"h{i}") for i in range(nbuf)]
        per_source = (p, n_src, dim) if plan.mode == "slab" else (p, dim)
        self.values = [nl.ndarray(per_source, dtype=dtype, buffer=nl.sbuf, name=f"values{i}")
                       for i in range(nbuf)]
        scores = ("sumsq", "dot", "z", "e", "alpha", "rms", "rinv", "mean_sq")
        for name in scores:
            setattr(self, name, nl.ndarray((p, n_src), dtype=_F32, buffer=nl.sbuf, name=name))
        columns = ("neg_max", "esum", "rsum", "run_max0", "run_max1", "neg_run_max", "corr", "weight")
        for name in columns:
            setattr(self, name, nl.ndarray((p, 1), dtype=_F32, buffer=nl.sbuf, name=name))


def _source_stats(t: _Tiles, v: Any, rows: int, l: int, enable_rmsnorm: bool) -> None:
    """sumsq[:, l] = sum_d v^2 (ScalarE) and dot[:, l] = v . u (VectorE product, ScalarE sum)."""
    prod = t.product[0:rows]
    if enable_rmsnorm:
        nisa.activation(dst=prod, op=nl.square, data=v, reduce_op=nl.add,
                        reduce_res=t.sumsq[0:rows, l:l + 1], reduce_cmd=_RESET_REDUCE)
    nisa.tensor_tensor(dst=prod, data1=v, data2=t.u[0:rows], op=nl.multiply)
    nisa.activation(dst=prod, op=nl.copy, data=prod, reduce_op=nl.add,
                    reduce_res=t.dot[0:rows, l:l + 1], reduce_cmd=_RESET_REDUCE)


def _scores(t: _Tiles, rows: int, cols: slice, dim: int, eps: float, enable_rmsnorm: bool) -> None:
    """z[:, cols] from dot (and rms, rinv from sumsq) on the [rows, len(cols)] score tiles."""
    z, dot = t.z[0:rows, cols], t.dot[0:rows, cols]
    if not enable_rmsnorm:
        nisa.tensor_copy(dst=z, src=dot)
        return
    rms, rinv = t.rms[0:rows, cols], t.rinv[0:rows, cols]
    nisa.tensor_scalar(dst=t.mean_sq[0:rows, cols], data=t.sumsq[0:rows, cols], op0=nl.multiply,
                       operand0=1.0 / dim, op1=nl.add, operand1=float(eps))
    nisa.activation(dst=rms, op=nl.sqrt, data=t.mean_sq[0:rows, cols])
    nisa.reciprocal(dst=rinv, data=rms)
    nisa.tensor_tensor(dst=z, data1=dot, data2=rinv, op=nl.multiply)


def _softmax(t: _Tiles, rows: int) -> None:
    """alpha = exp(z - max z) / sum; keeps esum and its reciprocal rsum."""
    nisa.tensor_reduce(dst=t.neg_max[0:rows], op=nl.max, data=t.z[0:rows], axis=1, negate=True)
    nisa.activation(dst=t.e[0:rows], op=nl.exp, data=t.z[0:rows], bias=t.neg_max[0:rows],
                    reduce_op=nl.add, reduce_res=t.esum[0:rows], reduce_cmd=_RESET_REDUCE)
    nisa.reciprocal(dst=t.rsum[0:rows], data=t.esum[0:rows])
    nisa.tensor_scalar(dst=t.alpha[0:rows], data=t.e[0:rows], op0=nl.multiply,
                       operand0=t.rsum[0:rows])


def _slab_tile(t: _Tiles, values: Any, plan: ForwardPlan, slab: Any, h_tile: Any, row0: int,
               rows: int, eps: float) -> None:
    """One token tile with its whole [rows, L, D] slab on chip: stats, softmax, weighted sum."""
    n_src, n_tok, dim = plan.num_sources, plan.num_tokens, plan.dim
    # One DMA for the slab: source l of token row0+p is at values[l, row0+p, :].
    nisa.dma_copy(dst=slab[0:rows],
                  src=values.ap([[dim, rows], [n_tok * dim, n_src], [1, dim]], offset=row0 * dim))
    for l in range(n_src):
        _source_stats(t, slab[0:rows, l, :], rows, l, plan.enable_rmsnorm)
    _scores(t, rows, slice(0, n_src), dim, eps, plan.enable_rmsnorm)
    _softmax(t, rows)
    for l in range(n_src):
        v, a_l = slab[0:rows, l, :], t.alpha[0:rows, l:l + 1]
        dst = h_tile[0:rows] if l == n_src - 1 else t.acc[0:rows]
        if l == 0:
            nisa.tensor_scalar(dst=dst, data=v, op0=nl.multiply, operand0=a_l)
        else:
            nisa.scalar_tensor_tensor(dst=dst, data=v, op0=nl.multiply, operand0=a_l,
                                      op1=nl.add, operand1=t.acc[0:rows])


def _stream_tile(t: _Tiles, values: Any, plan: ForwardPlan, h_tile: Any, row0: int, rows: int,
                 eps: float, source_counter: list[int]) -> None:
    """One token tile streaming the sources: online softmax with a rescaled fp32 accumulator.

    acc = sum_l exp(z_l - m) v_l with m the running max; at the end m = max_l z_l, so
    h = acc / sum_l exp(z_l - m) = acc * rsum of the final softmax.
    """
    n_src, dim = plan.num_sources, plan.dim
    run_max = (t.run_max0[0:rows], t.run_max1[0:rows])
    acc = t.acc[0:rows]
    for l in range(n_src):
        v = t.values[source_counter[0] % plan.buffers][0:rows]
        source_counter[0] += 1
        nisa.dma_copy(dst=v, src=values[l, row0:row0 + rows, :])
        _source_stats(t, v, rows, l, plan.enable_rmsnorm)
        _scores(t, rows, slice(l, l + 1), dim, eps, plan.enable_rmsnorm)
        z_l = t.z[0:rows, l:l + 1]
        if l == 0:
            nisa.tensor_copy(dst=run_max[0], src=z_l)
            nisa.tensor_copy(dst=acc, src=v)
            continue
        old_max, new_max = run_max[(l - 1) % 2], run_max[l % 2]
        nisa.tensor_tensor(dst=new_max, data1=old_max, data2=z_l, op=nl.maximum)
        nisa.tensor_scalar(dst=t.neg_run_max[0:rows], data=new_max, op0=nl.multiply, operand0=-1.0)
        nisa.activation(dst=t.corr[0:rows], op=nl.exp, data=old_max, bias=t.neg_run_max[0:rows])
        nisa.activation(dst=t.weight[0:rows], op=nl.exp, data=z_l, bias=t.neg_run_max[0:rows])
        nisa.activation(dst=acc, op=nl.copy, data=acc, scale=t.corr[0:rows])  # ScalarE rescale
        nisa.scalar_tensor_tensor(dst=acc, data=v, op0=nl.multiply, operand0=t.weight[0:rows],
                                  op1=nl.add, operand1=acc)
    _softmax(t, rows)
    nisa.tensor_scalar(dst=h_tile[0:rows], data=acc, op0=nl.multiply, operand0=t.rsum[0:rows])


@nki.jit
def block_attn_res_fwd(values, proj_weight, rmsnorm_gamma=None, scale=1.0, rmsnorm_eps=1e-6,
                       enable_rmsnorm=True, mode=None):
    """Forward kernel; ``mode`` None (plan's choice), 'slab' or 'stream'."""
    n_src, n_tok, dim = values.shape
    check_vector_arg("proj_weight", proj_weight, dim)
    if enable_rmsnorm:
        check_vector_arg("rmsnorm_gamma", rmsnorm_gamma, dim)
    lnc, pid = launch()
    plan = plan_forward(n_src, n_tok, dim, dtype_str(values), lnc, bool(enable_rmsnorm),
                        sbuf_budget=sbuf_budget(), force_mode=mode)

    h = nl.ndarray((n_tok, dim), dtype=values.dtype, buffer=nl.shared_hbm, name="h")
    rms_out = (nl.ndarray((n_tok, n_src), dtype=_F32, buffer=nl.shared_hbm, name="rms")
               if enable_rmsnorm else None)
    alpha_out = nl.ndarray((n_tok, n_src), dtype=_F32, buffer=nl.shared_hbm, name="alpha")

    t = _Tiles(plan, values.dtype)
    load_query(t.u, t.product, proj_weight, rmsnorm_gamma, scale, enable_rmsnorm)
    source_counter = [0]
    for i, tile in enumerate(plan.tiles_of(pid)):
        row0, rows = plan.tile_rows(tile)
        h_tile = t.h[i % plan.buffers]
        if plan.mode == "slab":
            _slab_tile(t, values, plan, t.values[i % plan.buffers], h_tile, row0, rows, rmsnorm_eps)
        else:
            _stream_tile(t, values, plan, h_tile, row0, rows, rmsnorm_eps, source_counter)
        nisa.dma_copy(dst=h[row0:row0 + rows, :], src=h_tile[0:rows])
        nisa.dma_copy(dst=alpha_out[row0:row0 + rows, :], src=t.alpha[0:rows])
        if enable_rmsnorm:
            nisa.dma_copy(dst=rms_out[row0:row0 + rows, :], src=t.rms[0:rows])
    if enable_rmsnorm:
        return h, rms_out, alpha_out
    return h, alpha_out
