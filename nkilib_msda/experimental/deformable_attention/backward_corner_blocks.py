"""Corner-block gathers of the MSDA backward kernel: each sample's cell row (issue 30, item 4).

With ``cfg.corner_blocks`` the backward gathers, like the forward, from the corner-block scratch
that ``corner_blocks.build_corner_blocks`` writes (the same build pass and layout:
``(B * cells * N_h, 4 * C_h)`` rows, row ``(cs_l + (y0 + 1)(W + 1) + x0 + 1) * N_h + h`` holding
the corners (y0, x0), (y0, x1), (y1, x0), (y1, x1) of head h, out-of-map corners stored as
zeros, the last cell of each batch all zeros). One index per sample moves one ``4 * C_h`` run;
transposed back, that run is the sample's four corner columns of ``gathered`` in the order the
dot products already use (docs/kernels.md, "Corner-block gathers in the backward").

:func:`cell_rows` computes the sample's row from the backward's own tiles (partition j of a
block holds one (h, l), so the level and head terms are per-partition constants,
``backward_sampling`` ``C_CSTRIDE`` / ``C_CBASE``). The corner masks still zero the dot
products of invalid corners (``CornerGather.finish``): a stored zero times an infinite
grad_output would be NaN.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.deformable_attention.backward_sampling import C_CBASE, C_CSTRIDE
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import corner_cells

__all__ = ["cell_rows"]


def cell_rows(cfg: Any, tiles: Any, n: int, f: int) -> Any:
    """Return the (n, f) fp32 view (in ``tiles.xterm``, free after ``sample_terms``) of each
    sample's scratch row: ``y0 * (W + 1) N_h + x0 N_h + (cs_l + W + 2) N_h + h`` where some
    corner is inside the map (then x0 in [-1, W-1] and y0 in [-1, H-1]), else the zero cell's
    row ``(cells - 1) * N_h`` (no corner inside the map, or a NaN coordinate, whose corners
    ``valid`` already marks invalid). Reads the unclamped floors ``corner[:, :, 0]`` (finite:
    the pixel coordinate is clamped first) and ``valid``; every value is an integer below
    2^24, so the fp32 arithmetic is exact."""
    p = cfg.problem
    c = tiles.consts[0:n]
    zero_row = float((corner_cells(p) - 1) * p.num_heads)
    valid = tiles.valid[0:n, :, :, 0:f]       # (n, axis, corner s, f)
    floor = tiles.corner[0:n, :, 0, 0:f]      # (n, axis, f): x0, y0
    term = tiles.xterm[0:n, :, 0:f]
    ok, row = term[:, 0, :], term[:, 1, :]
    # a cell has a corner inside the map iff one of its x corners and one of its y corners is
    nisa.tensor_tensor(dst=term, data1=valid[:, :, 0, :], data2=valid[:, :, 1, :], op=nl.maximum)
    nisa.tensor_tensor(dst=ok, data1=ok, data2=row, op=nl.multiply)
    nisa.tensor_scalar(dst=row, data=floor[:, 0, :], op0=nl.multiply, operand0=float(p.num_heads),
                       op1=nl.add, operand1=c[:, C_CBASE:C_CBASE + 1])
    nisa.scalar_tensor_tensor(dst=row, data=floor[:, 1, :], op0=nl.multiply,
                              operand0=c[:, C_CSTRIDE:C_CSTRIDE + 1], op1=nl.add, operand1=row)
    # (row - zero_row) * ok + zero_row: the row, or the zero cell's
    nisa.scalar_tensor_tensor(dst=row, data=row, op0=nl.subtract, operand0=zero_row,
                              op1=nl.multiply, operand1=ok)
    nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=zero_row)
    return row
