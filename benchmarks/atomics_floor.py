"""The atomics floor of the fast backward: only its grad_value reductions, nothing else.

    python benchmarks/atomics_floor.py --check      (under TRITON_INTERPRET=1: a tiny shape, CPU)

The fast backward (``msda_backward_samples_kernel``) reduces, per program (BLOCK_Q queries of one
(batch, head), head-slowest order), for each corner c of every sample a (BLOCK_Q, BLOCK_S,
BLOCK_C) tile ``a * w_c * g`` into the fp32 accumulator at the corner's value row, masked where
the corner is outside the map. :func:`corner_entries` precomputes those rows and coefficients
from the same inputs (torch, fp32, the sampling conventions of docs/math.md for
align_corners=False and zeros padding, BLNC value and BQHLP2 locations: the benchmark's), and
``atomics_floor_kernel`` performs exactly those reductions with the backward's tile shape,
program order and warps: the same rows, the same channel vectors of grad_output, the same fp32
accumulator; no corner gathers, dots, parameter gradients or bilinear setup. Its time is what
any kernel that reduces grad_value with these global atomics pays on these inputs
(benchmarks/backward_levers.py ``--floor`` times it beside ours' backward and the peers').
It reads the precomputed rows and coefficients (8 bytes per sample corner) on top.

:func:`repeat_fractions` says how often two reductions of one program (or of a window of
consecutive programs of one (batch, head)) hit the same value row: the share of atomics that
aggregating in registers or shared memory before the global atomic could save.

``--check`` compares the floor's accumulator with the grad_value of the real fast backward
(``compute=(True, False, False)``) on a tiny shape (under the interpreter on CPU): within 1e-5
relative L2 (only the order of the additions may differ); see :func:`check`.
"""

from __future__ import annotations

import argparse
import os
import sys

import triton
import triton.language as tl


@triton.jit
def atomics_floor_kernel(grad_out_ptr, rows_ptr, coef_ptr, acc_ptr, num_queries,
                         num_query_blocks, batch_size, NUM_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, LP: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """acc[rows[e], :] += coef[e] * grad_out[row(e), :] for every valid entry e.

    rows (int32), coef (fp32): (B, N_q, N_h, 4, LP), corner-major within a (b, q, h) row;
    rows are value rows of the (-1, C_h) view (-1: masked corner). grad_out (B*N_q*N_h,
    HEAD_DIM) in its dtype; acc fp32 in value's shape. Program order as the fast backward's
    flat head-slowest grid: query block fastest, then batch, then head."""
    pid = tl.program_id(0)
    q_block = pid % num_query_blocks
    rest = pid // num_query_blocks
    batch = rest % batch_size
    head = rest // batch_size
    q = q_block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = q < num_queries
    q = tl.minimum(q, num_queries - 1)
    row = (batch * num_queries + q) * NUM_HEADS + head
    ch = tl.arange(0, BLOCK_C)
    c_mask = ch < HEAD_DIM
    s = tl.arange(0, BLOCK_S)
    s_mask = s < LP
    s = tl.minimum(s, LP - 1)
    g = tl.load(grad_out_ptr + (row * HEAD_DIM)[:, None] + ch[None, :],
                mask=c_mask[None, :], other=0.0).to(tl.float32)
    g3 = g[:, None, :]
    keep = q_mask[:, None] & s_mask[None, :]
    for c in tl.static_range(4):
        entry = (row[:, None] * 4 + c) * LP + s[None, :]
        rows = tl.load(rows_ptr + entry)
        coef = tl.load(coef_ptr + entry)
        valid = keep & (rows >= 0)
        ptrs = acc_ptr + (tl.maximum(rows, 0) * HEAD_DIM)[:, :, None] + ch[None, None, :]
        tl.atomic_add(ptrs, coef[:, :, None] * g3, mask=valid[:, :, None] & c_mask[None, None, :],
                      sem="relaxed")


def corner_entries(value, levels, loc, attn):
    """(rows int32, coef fp32), each (B, N_q, N_h, 4, LP): the value row of each sample corner
    in value viewed as (-1, C_h) (BLNC: row = (b*S + pixel)*N_h + h), -1 where the corner is
    outside the map, and its coefficient a * w_c (0 where masked). value (B, S, N_h, C_h);
    loc (B, N_q, N_h, N_l, N_p, 2) normalised (x, y); attn (B, N_q, N_h, N_l, N_p)."""
    import torch

    batch, pixels, heads, _ = value.shape
    _, queries, _, num_levels, points, _ = loc.shape
    device = value.device
    sizes = torch.tensor([[w, h] for h, w in levels], dtype=torch.float32, device=device)
    starts = torch.tensor([0] + [h * w for h, w in levels][:-1], device=device).cumsum(0)
    xy = loc.float() * sizes[:, None, :] - 0.5  # (B, Q, H, L, P, 2) pixel coordinates
    x, y = xy[..., 0], xy[..., 1]
    x0, y0 = torch.floor(x), torch.floor(y)
    fx, fy = x - x0, y - y0
    width = sizes[:, 0][:, None].expand(num_levels, points)
    height = sizes[:, 1][:, None].expand(num_levels, points)
    a = attn.float()
    base = (torch.arange(batch, device=device)[:, None, None] * pixels * heads
            + torch.arange(heads, device=device)[None, None, :])  # (B, 1, H)
    rows, coefs = [], []
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        cx, cy = x0 + dx, y0 + dy
        inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)
        wx = fx if dx else 1.0 - fx
        wy = fy if dy else 1.0 - fy
        pixel = (starts[:, None] + cy.clamp(min=0) * width + cx.clamp(min=0)).long()
        row = base[:, :, :, None, None] + pixel * heads
        rows.append(torch.where(inside, row, -1).reshape(batch, queries, heads, -1))
        coefs.append(torch.where(inside, a * (wx * wy), 0.0).reshape(batch, queries, heads, -1))
    return (torch.stack(rows, 3).to(torch.int32).contiguous(),
            torch.stack(coefs, 3).contiguous())


def floor_launch(grad_out, rows, coef, acc, block_q: int, num_warps: int) -> None:
    """One launch of ``atomics_floor_kernel`` adding every entry into ``acc`` (fp32, value's
    shape): ``block_q`` queries per program and ``num_warps`` as the fast backward's plan."""
    batch, queries, heads, _, lp = rows.shape
    channels = acc.shape[-1]
    n_blocks = -(-queries // block_q)
    atomics_floor_kernel[(batch * heads * n_blocks,)](
        grad_out, rows, coef, acc, queries, n_blocks, batch, NUM_HEADS=heads, HEAD_DIM=channels,
        LP=lp, BLOCK_Q=block_q, BLOCK_S=triton.next_power_of_2(lp),
        BLOCK_C=triton.next_power_of_2(channels), num_warps=num_warps)


def repeat_fractions(rows, block_q: int, windows=(1, 8, 64)) -> dict[int, float]:
    """window (in programs) -> share of the valid entries whose row another entry of the same
    window already reduces into ((entries - distinct rows) / entries): the atomics that
    aggregation before the global atomic could save, for a program (window 1) or a run of
    consecutive programs of one (batch, head). Queries past a whole number of windows are left
    out."""
    import torch

    batch, queries, heads, _, lp = rows.shape
    per_head = rows.permute(0, 2, 1, 3, 4).reshape(batch * heads, queries, 4 * lp)
    out = {}
    for window in windows:
        span = block_q * window
        whole = queries // span * span
        if whole == 0:
            continue
        groups = per_head[:, :whole].reshape(batch * heads * (whole // span), span * 4 * lp)
        ordered, _ = torch.sort(groups, dim=1)
        valid = ordered >= 0
        repeat = valid[:, 1:] & (ordered[:, 1:] == ordered[:, :-1])
        total = int(valid.sum())
        out[window] = int(repeat.sum()) / max(total, 1)
    return out


def check(dtype_name: str = "float32") -> tuple[float, float]:
    """On a tiny shape (CPU tensors under TRITON_INTERPRET=1, else CUDA), relative L2 of the
    floor's fp32 accumulator against (1) the fp32 fast backward's grad_value on the same inputs
    upcast to fp32 (exact: a 16-bit backward converts every operand to fp32 before its fp32
    reductions, so its accumulator receives these same additions) and (2) the fast backward's
    grad_value in ``dtype_name`` (the accumulator after its cast; under the interpreter the
    cast of fp32 to bf16 does not round to nearest, so (2) shows that cast's error)."""
    import torch

    from nkilib_msda.backends.triton import backend as tb
    from nkilib_msda.bench.shapes import BenchShape, make_inputs
    from nkilib_msda.validation.msda import validate_msda_args
    from nkilib_msda.workloads import relative_l2

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    shape = BenchShape("tiny", 2, 37, ((9, 11), (5, 6), (3, 3)), 3, heads=2, channels=8)
    seed = int.from_bytes(os.urandom(4), "little")  # fresh inputs on every check
    value, loc, attn, grad = make_inputs(shape, getattr(torch, dtype_name), seed, device)
    loc = ((loc.float() - 0.5) * 1.3 + 0.5).to(value.dtype)  # some corners outside the map

    def fast_backward(v, lo, at, gr):
        problem = validate_msda_args(v, shape.levels, None, lo, at, "BLNC", "BQHLP2", False,
                                     "zeros")
        plan = tb.plan_launch(problem, str(v.dtype).rsplit(".", 1)[-1])
        grad_value = tb.msda_backward(gr, v, problem, lo, at, compute=(True, False, False),
                                      deterministic=False)[0]
        return grad_value, plan.samples_backward

    native, cfg = fast_backward(value, loc, attn, grad)
    upcast, _ = fast_backward(*(t.float() for t in (value, loc, attn, grad)))
    rows, coef = corner_entries(value, shape.levels, loc, attn)
    acc = torch.zeros(value.shape, dtype=torch.float32, device=device)
    floor_launch(grad, rows, coef, acc, cfg.block_q, cfg.num_warps)
    return relative_l2(acc, upcast), relative_l2(acc.to(native.dtype), native)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the real backward")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 2
    failed = False
    for dtype_name in ("float32", "bfloat16"):
        exact, native = check(dtype_name)
        failed |= not exact <= 1e-5
        print(f"{dtype_name}: floor accumulator vs the fast backward's fp32 accumulation: "
              f"relative L2 {exact:.1e} (tolerance 1e-05); vs its {dtype_name} grad_value "
              f"{native:.1e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
