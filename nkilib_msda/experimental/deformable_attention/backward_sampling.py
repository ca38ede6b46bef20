"""Per-partition constants and per-sample bilinear terms of the MSDA backward kernel.

Partition j of a block holds sample row (q_sub, h, l) with (h, l) = divmod(j mod G, N_l)
(see backward_config). All math is fp32 on the Vector engine; indices are exact fp32 integers
(< 2^24) converted once to int32/uint32.

Per-sample tile layouts (f = T*N_p samples per partition):
- ``xy``/``frac`` (P, 2, f): coordinate c (0 = x along W, 1 = y along H).
- ``corner``/``corner_c``/``valid``/``fw`` (P, 2, 2, f): coordinate c, corner s (0 = floor,
  1 = floor + 1); ``fw`` holds the masked 1-D weights (1-d)*v0 and d*v1.
- ``rows``/``weights``/``dwx``/``dwy`` (P, f, 4) with the 4 = (a, b) = (y corner, x corner)
  in the order (y0,x0), (y0,x1), (y1,x0), (y1,x1).
"""

from __future__ import annotations

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention import coordinates as crd
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import cell_starts

# columns of the per-partition constant tile
C_SX, C_SY, C_XHI, C_YHI, C_XMAX, C_YMAX, C_ROWBASE, C_YSTRIDE, C_PAIRMAX = range(9)
C_J, C_T1, C_T2, C_HL, C_H, C_L, C_EQ = range(9, 16)
# corner-block gathers only (backward_corner_blocks): a sample's cell row in the corner-block
# scratch is y0 * C_CSTRIDE + x0 * N_h + C_CBASE, C_CSTRIDE = (W + 1) * N_h and
# C_CBASE = (cs_l + W + 2) * N_h + h (cs_l: the level's first cell, corner_plan.cell_starts)
C_CSTRIDE, C_CBASE = 16, 17


def _col(t, c):
    return t[:, c:c + 1]


def _mod_floor(dst_quot, dst_rem, j, divisor: int, tmp, tmp_int, tmp_gt) -> None:
    """quot = floor(j / d), rem = j - d*quot for small non-negative integer-valued fp32 j."""
    nisa.tensor_scalar(dst=tmp, data=j, op0=nl.add, operand0=0.5, op1=nl.multiply,
                       operand1=1.0 / divisor)
    crd.floor_and_fraction(dst_quot, tmp_gt, tmp, tmp_int)
    if dst_rem != None:  # noqa: E711
        nisa.scalar_tensor_tensor(dst=dst_rem, data=dst_quot, op0=nl.multiply, operand0=float(-divisor),
                                  op1=nl.add, operand1=j)


def build_partition_constants(cfg, tiles) -> None:
    """Fill ``consts`` (128, 16) fp32 (18 with corner-block gathers: the cell-row terms)."""
    p = cfg.problem
    consts = tiles.consts
    ti = tiles.xy_int[:, 0, 0:1]
    tg = tiles.xy_tmp[:, 0, 0:1]
    j = _col(consts, C_J)
    nisa.memset(dst=consts, value=0.0)
    nisa.iota(dst=ti, pattern=[[0, 1]], offset=0, channel_multiplier=1)
    nisa.tensor_copy(dst=j, src=ti)
    hl, h, lvl = _col(consts, C_HL), _col(consts, C_H), _col(consts, C_L)
    _mod_floor(_col(consts, C_T2), hl, j, cfg.groups, _col(consts, C_T1), ti, tg)
    _mod_floor(h, lvl, hl, p.num_levels, _col(consts, C_T1), ti, tg)

    blnc = p.value_layout == "BLNC"
    alpha = p.num_heads if blnc else 1  # row step between x-adjacent pixels
    cells = cell_starts(p)
    for level, ((height, width), start) in enumerate(zip(p.spatial_shapes, p.level_start_index)):
        sx = float(width - 1 if p.align_corners else width)
        sy = float(height - 1 if p.align_corners else height)
        values = {C_SX: sx, C_SY: sy, C_XHI: width + 1.0, C_YHI: height + 1.0,
                  C_XMAX: width - 1.0, C_YMAX: height - 1.0, C_ROWBASE: float(start * alpha),
                  C_YSTRIDE: float(width * alpha), C_PAIRMAX: max(width - 2.0, 0.0)}
        if cfg.corner_blocks:
            values.update({C_CSTRIDE: float((width + 1) * p.num_heads),
                           C_CBASE: float((cells[level] + width + 2) * p.num_heads)})
        eq = _col(consts, C_EQ)
        nisa.tensor_scalar(dst=eq, data=lvl, op0=nl.equal, operand0=float(level))
        for c, v in values.items():
            if v != 0.0:
                nisa.scalar_tensor_tensor(dst=_col(consts, c), data=eq, op0=nl.multiply, operand0=v,
                                          op1=nl.add, operand1=_col(consts, c))
    head_step = 1.0 if blnc else float(p.total_pixels)
    rowbase = _col(consts, C_ROWBASE)
    nisa.scalar_tensor_tensor(dst=rowbase, data=h, op0=nl.multiply, operand0=head_step,
                              op1=nl.add, operand1=rowbase)
    if cfg.corner_blocks:  # the scratch is cell-major with the head inside, whatever the layout
        cbase = _col(consts, C_CBASE)
        nisa.tensor_tensor(dst=cbase, data1=cbase, data2=h, op=nl.add)


def build_kscale(cfg, tiles) -> None:
    """kscale_f[j] = floor((j mod P_s) / G) * R, the proven-unique buffer of partition j."""
    consts = tiles.consts
    ti = tiles.xy_int[:, 0, 0:1]
    tg = tiles.xy_tmp[:, 0, 0:1]
    t1, t2 = _col(consts, C_T1), _col(consts, C_T2)
    local = _col(consts, C_EQ)
    _mod_floor(t2, local, _col(consts, C_J), cfg.scatter_partitions, t1, ti, tg)
    _mod_floor(t2, None, local, cfg.groups, t1, ti, tg)
    nisa.tensor_scalar(dst=tiles.kscale_f, data=t2, op0=nl.multiply, operand0=float(cfg.rows_per_batch))
    nisa.tensor_copy(dst=tiles.kscale, src=tiles.kscale_f)


def _bc(view2, dims_after):
    """(n, F) -> broadcast view with size-1 dims inserted then broadcast (list of (dim, size))."""
    v = view2
    for d, size in dims_after:
        v = v.expand_dim(d).broadcast(d, size)
    return v


def sample_terms(cfg, tiles, n: int, f: int, want_gather: bool, want_gsl: bool) -> None:
    """Bilinear rows/weights (and derivatives) of the loaded super-tile (partitions [0:n]).

    Reads ``loc`` (u, v) and ``attn``; writes ``rows``, ``weights``, ``scale_a`` (a * d px/d u,
    zero where border-clipped), ``dwx``/``dwy`` (d w / d px), ``valid``, ``vbits`` and the
    pair tiles. The coordinate steps are the shared helpers of ``coordinates.py``.
    """
    p = cfg.problem
    c = tiles.consts[0:n]
    sx, sy = c[:, C_SX:C_SX + 1], c[:, C_SY:C_SY + 1]
    xhi, yhi = c[:, C_XHI:C_XHI + 1], c[:, C_YHI:C_YHI + 1]
    xmax, ymax = c[:, C_XMAX:C_XMAX + 1], c[:, C_YMAX:C_YMAX + 1]
    loc = tiles.loc[0:n, 0:f, :]
    u, v = loc[:, :, 0], loc[:, :, 1]
    mask = tiles.okmask[0:n, :, 0:f]   # (n, axis, f) int32: all ones where not NaN
    tmp = tiles.xy_tmp[0:n, :, 0:f]
    crd.remove_nan(u, u, mask[:, 0, :])
    crd.remove_nan(v, v, mask[:, 1, :])

    xy = tiles.xy[0:n, :, 0:f]
    scale_a = tiles.scale_a[0:n, :, 0:f]
    attn = tiles.attn[0:n, 0:f]
    shift = 0.0 if p.align_corners else -0.5
    border = p.padding_mode == "border"
    for axis, src, s, hi, mx in ((0, u, sx, xhi, xmax), (1, v, sy, yhi, ymax)):
        px = xy[:, axis, :]
        if border:
            crd.pixel_transform(px, src, s, shift, 0.0, mx)
        else:
            crd.pixel_transform(px, src, s, shift, -2.0, hi)
        sa = scale_a[:, axis, :]
        if border:
            # Strictly inside (0, size - 1) after the clamp iff strictly inside before it.
            nisa.tensor_scalar(dst=sa, data=px, op0=nl.greater, operand0=0.0)
            nisa.scalar_tensor_tensor(dst=sa, data=px, op0=nl.less, operand0=mx, op1=nl.multiply, operand1=sa)
            nisa.scalar_tensor_tensor(dst=sa, data=sa, op0=nl.multiply, operand0=s, op1=nl.multiply,
                                      operand1=attn)
        else:
            nisa.tensor_scalar(dst=sa, data=attn, op0=nl.multiply, operand0=s)

    corner = tiles.corner[0:n, :, :, 0:f]
    corner_c = tiles.corner_c[0:n, :, :, 0:f]
    frac = tiles.frac[0:n, :, 0:f]
    crd.floor_and_fraction(corner[:, :, 0, :], frac, xy, tiles.xy_int[0:n, :, 0:f])
    nisa.tensor_scalar(dst=corner[:, :, 1, :], data=corner[:, :, 0, :], op0=nl.add, operand0=1.0)
    crd.clamp_corner(corner_c[:, 0], corner[:, 0], xmax)
    crd.clamp_corner(corner_c[:, 1], corner[:, 1], ymax)
    valid = tiles.valid[0:n, :, :, 0:f]
    crd.corner_validity(valid, corner_c, corner)
    crd.apply_mask(valid, _bc(mask, [(2, 2)]))
    fw = tiles.fw[0:n, :, :, 0:f]
    nisa.tensor_tensor(dst=fw[:, :, 1, :], data1=frac, data2=valid[:, :, 1, :], op=nl.multiply)
    nisa.scalar_tensor_tensor(dst=fw[:, :, 0, :], data=frac, op0=nl.subtract, operand0=1.0, reverse0=True,
                              op1=nl.multiply, operand1=valid[:, :, 0, :])
    if tiles.vbits != None:  # noqa: E711
        vy_all = valid[:, 1].permute((0, 2, 1))  # (n, f, a)
        vx_all = valid[:, 0].permute((0, 2, 1))  # (n, f, b)
        crd.corner_bits(tiles.vbits[0:n, 0:f, :].reshape_dim(2, (2, 2)), _bc(vy_all, [(3, 2)]),
                        _bc(vx_all, [(2, 2)]))

    fx = fw[:, 0].permute((0, 2, 1))   # (n, f, b)
    fy = fw[:, 1].permute((0, 2, 1))   # (n, f, a)
    weights = tiles.weights[0:n, 0:f, :].reshape_dim(2, (2, 2))
    nisa.tensor_tensor(dst=weights, data1=fy.expand_dim(3).broadcast(3, 2),
                       data2=fx.expand_dim(2).broadcast(2, 2), op=nl.multiply)
    if want_gsl:
        vx = valid[:, 0].permute((0, 2, 1))  # (n, f, b)
        vy = valid[:, 1].permute((0, 2, 1))  # (n, f, a)
        dwx = tiles.dwx[0:n, 0:f, :].reshape_dim(2, (2, 2))
        dwy = tiles.dwy[0:n, 0:f, :].reshape_dim(2, (2, 2))
        for b, sign in ((0, -1.0), (1, 1.0)):  # d w_ab / d x = sign_b * fy_a * vx_b
            nisa.scalar_tensor_tensor(dst=dwx[:, :, :, b], data=fy, op0=nl.multiply, operand0=sign,
                                      op1=nl.multiply, operand1=_bc(vx[:, :, b], [(2, 2)]))
        for a, sign in ((0, -1.0), (1, 1.0)):  # d w_ab / d y = sign_a * vy_a * fx_b
            nisa.scalar_tensor_tensor(dst=dwy[:, :, a, :], data=fx, op0=nl.multiply, operand0=sign,
                                      op1=nl.multiply, operand1=_bc(vy[:, :, a], [(2, 2)]))

    # rows of the 4 corners: y_c * W*alpha + x_c*alpha + rowbase
    blnc = p.value_layout == "BLNC"
    alpha = float(p.num_heads if blnc else 1)
    rowbase, ystride = c[:, C_ROWBASE:C_ROWBASE + 1], c[:, C_YSTRIDE:C_YSTRIDE + 1]
    xterm = tiles.xterm[0:n, :, 0:f]
    nisa.tensor_scalar(dst=xterm, data=corner_c[:, 0], op0=nl.multiply, operand0=alpha, op1=nl.add,
                       operand1=rowbase)
    rows = tiles.rows[0:n, 0:f, :].reshape_dim(2, (2, 2))
    cy = corner_c[:, 1].permute((0, 2, 1))  # (n, f, a)
    nisa.scalar_tensor_tensor(dst=rows, data=cy.expand_dim(3).broadcast(3, 2), op0=nl.multiply,
                              operand0=ystride, op1=nl.add,
                              operand1=xterm.permute((0, 2, 1)).expand_dim(2).broadcast(2, 2))
    if cfg.pair_mode:
        pairmax = c[:, C_PAIRMAX:C_PAIRMAX + 1]
        pbase = tmp[:, 0, :]
        nisa.tensor_scalar(dst=pbase, data=corner_c[:, 0, 0, :], op0=nl.minimum, operand0=pairmax)
        nisa.tensor_scalar(dst=tmp[:, 1, :], data=pbase, op0=nl.multiply, operand0=alpha, op1=nl.add,
                           operand1=rowbase)
        pair_rows = tiles.pair_rows[0:n, 0:f, :]
        nisa.scalar_tensor_tensor(dst=pair_rows, data=cy, op0=nl.multiply, operand0=ystride, op1=nl.add,
                                  operand1=_bc(tmp[:, 1, :], [(2, 2)]))
        # slot of corner b inside the pair (x_bc - pair base is 0 or 1)
        sel = tiles.pair_sel[0:n, 0:f, :]
        nisa.tensor_tensor(dst=sel, data1=corner_c[:, 0].permute((0, 2, 1)),
                           data2=_bc(pbase, [(2, 2)]), op=nl.subtract)
        # all-ones/zero masks of "corner b sits in pair slot 0 / 1" (exact bit selects)
        masks = tiles.pair_masks[0:n, :, 0:f, :]
        nisa.tensor_scalar(dst=masks[:, 0], data=sel, op0=nl.subtract, operand0=1.0)
        nisa.tensor_scalar(dst=masks[:, 1], data=sel, op0=nl.multiply, operand0=-1.0)
