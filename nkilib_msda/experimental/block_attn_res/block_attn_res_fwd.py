"""Block AttnRes forward NKI kernel.

Contract: ``values`` [L, BT, D] source-major (bf16/fp16/fp32; the last source is the partial
block when there is one), ``proj_weight`` and ``rmsnorm_gamma`` [D] fp32. Per token:
r_l = sqrt(mean_d v_ld^2 + eps), z_l = (v_l . u) / r_l with u = scale*gamma*w (or z_l = v_l . u,
u = scale*w, without RMSNorm), alpha = softmax_l(z), h = sum_l alpha_l v_l.
Returns (h [BT, D] in the values' dtype, rms [BT, L] fp32, alpha [BT, L] fp32) with RMSNorm,
else (h, alpha). See tiling.py for the slab / stream (grouped online softmax) modes.

LNC=2: program p takes ceil(BT/2) tokens from p*ceil(BT/2), in ``plan.tiles_per_program``
near-equal tiles of <= 128, so both programs run the same instructions (only addresses depend on
``nl.program_id``). Ragged grey zone: with odd BT one tile of program 1 is one token shorter
(same instructions, smaller access patterns); with BT = 1 program 1 has no tile and issues only
the query setup.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nki, nisa, nl
from nkilib_msda.experimental.block_attn_res._kernel_common import (
    NamedTiles, check_vector_arg, dtype_str, launch, load_query, sbuf_budget)
from nkilib_msda.experimental.block_attn_res.tiling import (TOKEN_TILE, ForwardPlan, check_rmsnorm_eps,
                                                            plan_forward)

__all__ = ["block_attn_res_fwd"]

_F32 = nl.float32
_RESET_REDUCE = nisa.reduce_cmd.reset_reduce


class _Tiles(NamedTiles):
    """The forward's SBUF working set (allocated once; sizes match plan.sbuf_bytes)."""

    def __init__(self, plan: ForwardPlan, dtype: Any) -> None:
        p, n_src, dim = TOKEN_TILE, plan.num_sources, plan.dim
        self.u = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="u")
        self.product = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="product")
        self.acc = nl.ndarray((p, dim), dtype=_F32, buffer=nl.sbuf, name="acc")
        nbuf = plan.buffers
        self.h = [nl.ndarray((p, dim), dtype=dtype, buffer=nl.sbuf, name=f"h{i}") for i in range(nbuf)]
        self.values = [nl.ndarray((p, plan.group, dim), dtype=dtype, buffer=nl.sbuf,
                                  name=f"values{i}") for i in range(nbuf)]
        self.allocate(("sumsq", "dot", "z", "e", "alpha", "rms", "rinv", "mean_sq"), (p, n_src))
        self.allocate(("neg_max", "esum", "rsum", "run_max0", "run_max1", "neg_run_max", "corr", "group_max"),
                      (p, 1))


# v^2 overflows fp32 for |v| > 1.8e19, so with RMSNorm each (token, source) row is scaled by
# c = 1 / s, s = max(sum_d |v| * 2^-24, 1), before squaring and summing: (c v)^2 and c (v . u)
# stay finite for any finite v (D < 2^24) as long as each product v_d u_d is finite, and c = 1
# (the unscaled math) whenever sum |v| < 2^24. The extra pass (|v|) goes to ScalarE and the
# product v * u moves to the otherwise idle GpSimd, so ScalarE and VectorE keep two passes
# over v each (docs/block_attn_res.md, "Numerical range"). Semantics of activation's scale and
# reduction, of tensor_tensor's engine and of tensor_scalar_reduce:
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.activation.html
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.tensor_tensor.html
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.tensor_scalar_reduce.html
_L1_SCALE = 2.0 ** -24


def _source_scale(t: _Tiles, v: Any, rows: int, l: int) -> None:
    """mean_sq[:, l] = sum_d |v| * 2^-24 (ScalarE); _group_scale turns it into s and c."""
    nisa.activation(dst=t.product[0:rows], op=nl.abs, data=v, scale=_L1_SCALE, reduce_op=nl.add,
                    reduce_res=t.mean_sq[0:rows, l:l + 1], reduce_cmd=_RESET_REDUCE)


def _group_scale(t: _Tiles, rows: int, cols: slice) -> None:
    """s = max(mean_sq, 1) in mean_sq and c = 1 / s in rinv, for a group's sources at once."""
    s_cols = t.mean_sq[0:rows, cols]
    nisa.tensor_scalar(dst=s_cols, data=s_cols, op0=nl.maximum, operand0=1.0)
    nisa.reciprocal(dst=t.rinv[0:rows, cols], data=s_cols)


def _source_stats(t: _Tiles, v: Any, rows: int, l: int, enable_rmsnorm: bool) -> None:
    """Without RMSNorm dot[:, l] = v . u (VectorE product, ScalarE sum). With it (after
    _group_scale) sumsq[:, l] = sum_d (c v)^2 (ScalarE) and dot[:, l] = c (v . u) (GpSimd
    product, VectorE scaled sum)."""
    prod = t.product[0:rows]
    if enable_rmsnorm:
        c_col = t.rinv[0:rows, l:l + 1]
        nisa.activation(dst=prod, op=nl.square, data=v, scale=c_col, reduce_op=nl.add,
                        reduce_res=t.sumsq[0:rows, l:l + 1], reduce_cmd=_RESET_REDUCE)
        nisa.tensor_tensor(dst=prod, data1=v, data2=t.u[0:rows], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        nisa.tensor_scalar_reduce(dst=prod, data=prod, op0=nl.multiply, operand0=c_col,
                                  reduce_op=nl.add, reduce_res=t.dot[0:rows, l:l + 1])
        return
    nisa.tensor_tensor(dst=prod, data1=v, data2=t.u[0:rows], op=nl.multiply)
    nisa.activation(dst=prod, op=nl.copy, data=prod, reduce_op=nl.add,
                    reduce_res=t.dot[0:rows, l:l + 1], reduce_cmd=_RESET_REDUCE)


def _scores(t: _Tiles, rows: int, cols: slice, dim: int, eps: float, enable_rmsnorm: bool) -> None:
    """z[:, cols] from dot (and rms, rinv from sumsq) on the [rows, len(cols)] score tiles."""
    z, dot = t.z[0:rows, cols], t.dot[0:rows, cols]
    if not enable_rmsnorm:
        nisa.tensor_copy(dst=z, src=dot)
        return
    # Scaled rows (_source_stats): c r = sqrt(mean (c v)^2 + eps c^2), z = (c v.u) / (c r),
    # r = (c r) * s. e and alpha of these columns are free scratch until the softmax writes them.
    rms, rinv, s_cols = t.rms[0:rows, cols], t.rinv[0:rows, cols], t.mean_sq[0:rows, cols]
    c_sq, cr = t.e[0:rows, cols], t.alpha[0:rows, cols]
    nisa.tensor_tensor(dst=c_sq, data1=rinv, data2=rinv, op=nl.multiply)
    nisa.tensor_scalar(dst=cr, data=t.sumsq[0:rows, cols], op0=nl.multiply, operand0=1.0 / dim)
    nisa.scalar_tensor_tensor(dst=cr, data=c_sq, op0=nl.multiply, operand0=float(eps),
                              op1=nl.add, operand1=cr)
    nisa.activation(dst=cr, op=nl.sqrt, data=cr)
    nisa.reciprocal(dst=rinv, data=cr)
    nisa.tensor_tensor(dst=z, data1=dot, data2=rinv, op=nl.multiply)
    nisa.tensor_tensor(dst=rms, data1=cr, data2=s_cols, op=nl.multiply)


def _softmax(t: _Tiles, rows: int) -> None:
    """alpha = exp(z - max z) / sum; keeps esum and its reciprocal rsum."""
    nisa.tensor_reduce(dst=t.neg_max[0:rows], op=nl.maximum, data=t.z[0:rows], axis=1, negate=True)
    nisa.activation(dst=t.e[0:rows], op=nl.exp, data=t.z[0:rows], bias=t.neg_max[0:rows],
                    reduce_op=nl.add, reduce_res=t.esum[0:rows], reduce_cmd=_RESET_REDUCE)
    nisa.reciprocal(dst=t.rsum[0:rows], data=t.esum[0:rows])
    nisa.tensor_scalar(dst=t.alpha[0:rows], data=t.e[0:rows], op0=nl.multiply,
                       operand0=t.rsum[0:rows])


def _load_group(t: _Tiles, values: Any, plan: ForwardPlan, slab: Any, first: int, count: int,
                row0: int, rows: int) -> None:
    """One DMA: slab[p, j, :] = values[first + j, row0 + p, :] for the group's sources."""
    n_tok, dim = plan.num_tokens, plan.dim
    nisa.dma_copy(dst=slab[0:rows, 0:count, :],
                  src=values.ap([[dim, rows], [n_tok * dim, count], [1, dim]],
                                offset=(first * n_tok + row0) * dim))


def _group_weights(t: _Tiles, rows: int, cols: slice, first_group: bool, run_max: tuple) -> None:
    """Online softmax step for one group: e[:, cols] = exp(z - m) with m the running max;
    the accumulator is rescaled by exp(m_old - m) (one ScalarE pass per group)."""
    r = slice(0, rows)
    new_max = run_max[1] if not first_group else run_max[0]
    nisa.tensor_reduce(dst=t.group_max[r], op=nl.maximum, data=t.z[r, cols], axis=1)
    if first_group:
        nisa.tensor_copy(dst=new_max[r], src=t.group_max[r])
    else:
        old_max = run_max[0]
        nisa.tensor_tensor(dst=new_max[r], data1=old_max[r], data2=t.group_max[r], op=nl.maximum)
    nisa.tensor_scalar(dst=t.neg_run_max[r], data=new_max[r], op0=nl.multiply, operand0=-1.0)
    if not first_group:
        nisa.activation(dst=t.corr[r], op=nl.exp, data=run_max[0][r], bias=t.neg_run_max[r])
        nisa.activation(dst=t.acc[r], op=nl.copy, data=t.acc[r], scale=t.corr[r])
        nisa.tensor_copy(dst=run_max[0][r], src=new_max[r])
    nisa.activation(dst=t.e[r, cols], op=nl.exp, data=t.z[r, cols], bias=t.neg_run_max[r])


def _forward_tile(t: _Tiles, values: Any, plan: ForwardPlan, h_tile: Any, row0: int, rows: int,
                  eps: float, slab_counter: list[int]) -> None:
    """One token tile, group by group: stats and scores of the group's sources, then their
    weighted sum into the fp32 accumulator.

    With one group (slab mode) the weights are the final alpha and the last source's FMA writes
    h. With several, acc = sum_l exp(z_l - m) v_l with m the running max; at the end m = max_l z_l,
    so h = acc / sum_l exp(z_l - m) = acc * rsum of the final softmax.
    """
    n_src, dim = plan.num_sources, plan.dim
    groups = plan.groups()
    single = len(groups) == 1
    run_max = (t.run_max0, t.run_max1)
    for gi, (first, count) in enumerate(groups):
        slab = t.values[slab_counter[0] % plan.buffers]
        slab_counter[0] += 1
        _load_group(t, values, plan, slab, first, count, row0, rows)
        cols = slice(first, first + count)
        if plan.enable_rmsnorm:
            for j in range(count):
                _source_scale(t, slab[0:rows, j, :], rows, first + j)
            _group_scale(t, rows, cols)
        for j in range(count):
            _source_stats(t, slab[0:rows, j, :], rows, first + j, plan.enable_rmsnorm)
        _scores(t, rows, cols, dim, eps, plan.enable_rmsnorm)
        if single:
            _softmax(t, rows)
            weights = t.alpha
        else:
            _group_weights(t, rows, cols, gi == 0, run_max)
            weights = t.e
        for j in range(count):
            l = first + j
            v, w_l = slab[0:rows, j, :], weights[0:rows, l:l + 1]
            dst = h_tile[0:rows] if single and l == n_src - 1 else t.acc[0:rows]
            if l == 0:
                nisa.tensor_scalar(dst=dst, data=v, op0=nl.multiply, operand0=w_l)
            else:
                nisa.scalar_tensor_tensor(dst=dst, data=v, op0=nl.multiply, operand0=w_l,
                                          op1=nl.add, operand1=t.acc[0:rows])
    if not single:
        _softmax(t, rows)
        nisa.tensor_scalar(dst=h_tile[0:rows], data=t.acc[0:rows], op0=nl.multiply,
                           operand0=t.rsum[0:rows])


@nki.jit
def block_attn_res_fwd(values, proj_weight, rmsnorm_gamma=None, scale=1.0, rmsnorm_eps=1e-6,
                       enable_rmsnorm=True, mode=None, group=None):
    """Block Attention Residuals forward: per token, softmax attention over the L sources with
    one learned query, and the weighted sum of the sources.

    Dimensions:
        L: sources (completed blocks, then the partial block when there is one).
        BT: tokens (batch * sequence), tiled by up to 128 per partition tile.
        D: hidden size.

    Args:
        values (HBM tensor): [L, BT, D] source-major; bfloat16, float16 or float32.
        proj_weight (HBM tensor): [D] float32, the query projection w.
        rmsnorm_gamma (HBM tensor | None): [D] float32; required when ``enable_rmsnorm``.
        scale (float): multiplies the scores (default 1.0).
        rmsnorm_eps (float): RMSNorm epsilon (default 1e-6), in [2^-116, 2^116] with RMSNorm (an
            all-zero source row takes nl.sqrt(eps); tiling.check_rmsnorm_eps).
        enable_rmsnorm (bool): score RMS-normalized sources (default True).
        mode (str | None): None (the plan's choice), "slab" (all sources of a tile on chip)
            or "stream" (groups of sources with an online softmax).
        group (int | None): forces the number of sources per on-chip slab (tests).

    Returns:
        With RMSNorm: (h [BT, D] in the values' dtype, rms [BT, L] float32, alpha [BT, L]
        float32); without: (h, alpha). All in shared HBM.

    Notes:
        - r_l = sqrt(mean_d v_ld^2 + eps), z_l = (v_l . u) / r_l with u = scale * gamma * w
          (z_l = v_l . u, u = scale * w without RMSNorm); alpha = softmax_l(z);
          h = sum_l alpha_l v_l. Statistics and accumulation are float32.
        - With RMSNorm each (token, source) row is first scaled by 1 / max(sum_d |v| * 2^-24, 1),
          so the squares stay finite for any finite input (exact scaling below sum |v| = 2^24).
        - LNC=2: each program takes half of the tokens in the same number of tiles; both run
          the same instructions, only addresses depend on the program id.
        - The plan (``tiling.plan_forward``, plain Python) fixes the mode, the group size and
          the buffer counts before any instruction is emitted.

    Pseudocode:
        plan = plan_forward(L, BT, D, dtype, lnc, enable_rmsnorm, sbuf_budget())
        u = scale * (gamma * w if enable_rmsnorm else w)
        for row0, rows in plan.tiles_of(program):                 # rows <= 128 tokens
            m, esum, acc = -inf, 0, zeros((rows, D), fp32)
            for sources in plan.groups():                        # one group in slab mode
                v = load(values[sources, row0:row0 + rows])
                z = (v . u) / rms(v) if enable_rmsnorm else v . u   # [rows, len(sources)]
                m_new = max(m, max(z)); e = exp(z - m_new)
                acc = acc * exp(m - m_new) + sum_l e_l * v_l; esum = ...; m = m_new
            alpha = softmax(z over all sources)
            store(h[row0:row0 + rows], acc / esum); store(alpha, rms)
    """
    n_src, n_tok, dim = values.shape
    check_vector_arg("proj_weight", proj_weight, dim)
    if enable_rmsnorm:
        check_vector_arg("rmsnorm_gamma", rmsnorm_gamma, dim)
    check_rmsnorm_eps(rmsnorm_eps, bool(enable_rmsnorm))
    lnc, pid = launch()
    plan = plan_forward(n_src, n_tok, dim, dtype_str(values), lnc, bool(enable_rmsnorm),
                        sbuf_budget=sbuf_budget(), force_mode=mode, force_group=group)

    h = nl.ndarray((n_tok, dim), dtype=values.dtype, buffer=nl.shared_hbm, name="h")
    rms_out = (nl.ndarray((n_tok, n_src), dtype=_F32, buffer=nl.shared_hbm, name="rms")
               if enable_rmsnorm else None)
    alpha_out = nl.ndarray((n_tok, n_src), dtype=_F32, buffer=nl.shared_hbm, name="alpha")

    t = _Tiles(plan, values.dtype)
    load_query(t.u, t.product, proj_weight, rmsnorm_gamma, scale, enable_rmsnorm)
    slab_counter = [0]
    for i, (row0, rows) in enumerate(plan.tiles_of(pid)):
        h_tile = t.h[i % plan.buffers]
        _forward_tile(t, values, plan, h_tile, row0, rows, rmsnorm_eps, slab_counter)
        nisa.dma_copy(dst=h[row0:row0 + rows, :], src=h_tile[0:rows])
        nisa.dma_copy(dst=alpha_out[row0:row0 + rows, :], src=t.alpha[0:rows])
        if enable_rmsnorm:
            nisa.dma_copy(dst=rms_out[row0:row0 + rows, :], src=t.rms[0:rows])
    if enable_rmsnorm:
        return h, rms_out, alpha_out
    return h, alpha_out
