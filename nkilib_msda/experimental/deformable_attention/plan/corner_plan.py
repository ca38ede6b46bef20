"""Corner-block value layout: the planner's facts and decision (plain Python, no NKI).

The four bilinear corners of a sample are, today, four indirect descriptors of one ``C_h`` row
each (64 B for C_h = 32 bf16). The *corner-block* layout (issue 30, item 4) first writes a
scratch copy of ``value`` in HBM in which every *cell* ``(x, y)``, x in [-1, W-1], y in [-1, H-1]
(plus one all-zero cell), holds the four corners ``(x, y), (x+1, y), (x, y+1), (x+1, y+1)`` of
one head as one contiguous run of ``4 * C_h`` elements (out-of-map corners zero), so each
sample is one descriptor of ``4 * C_h`` elements. Layout picture and measurements:
docs/kernels.md, "Corner-block value layout".

This module holds the layout's sizes (cells, scratch bytes, build strip width and its SBUF),
when the kernel can run it, and the ``gather_layout="auto"`` rule. The rule is a density
threshold (samples per cell and head, :data:`AUTO_MIN_SAMPLES_PER_CELL`) calibrated on the
analytic DMA model of ``benchmarks/corner_cost.py``, which prices both layouts with the timing
model's formulas under every scenario structure and parameter set; planners may not import the
emulator, so the model stays out of the package and a test checks that the rule agrees with it.
"""

from __future__ import annotations

from nkilib_msda.hardware import DTYPE_BYTES, FP32_EXACT_INT_MAX, PARTITIONS
from nkilib_msda.validation.msda import MSDAProblem

__all__ = [
    "MAX_SCRATCH_RATIO", "GATHER_LAYOUTS", "BUILD_SBUF_BYTES", "BUILD_BUFFER_SETS",
    "AUTO_MIN_SAMPLES_PER_CELL", "cell_starts", "corner_cells", "scratch_bytes",
    "build_chunk_cells", "build_sbuf_bytes", "corner_block_supported", "samples_per_cell",
    "value_elements",
    "choose_forward_layout", "resolve_gather_layout",
]

# Issue 30's bound on the extra HBM scratch of a layout change, in value bytes.
MAX_SCRATCH_RATIO = 5.0
GATHER_LAYOUTS = ("four-corner", "corner-block", "auto")
# SBUF per partition of the corner-block build pass (BUILD_BUFFER_SETS sets, so loading one
# chunk overlaps copying the previous one); the forward planner reserves it.
BUILD_SBUF_BYTES = 32 * 1024
BUILD_BUFFER_SETS = 2
# "auto" takes the corner-block layout from this many samples per cell and head on: the
# analytic model's worst ratio over every scenario and band corner is then <= 0.78 at
# C_h = 16 / 32 (<= 0.67 at C_h = 8, where a lower threshold would do: the rule is
# conservative for small C_h), and the emulator measured 0.67-0.90 on the encoder
# shapes (densities 2.6-4.7); decoders (0.09-0.16) lose up to 2.8x
# (`python benchmarks/corner_block_model.py`, docs/kernels.md).
AUTO_MIN_SAMPLES_PER_CELL = 2.0


def cell_starts(problem: MSDAProblem) -> tuple[int, ...]:
    """First cell of each level: level l's cell (x, y) is cell_starts[l] + (y+1)(W+1) + x+1."""
    starts, acc = [], 0
    for h, w in problem.spatial_shapes:
        starts.append(acc)
        acc += (h + 1) * (w + 1)
    return tuple(starts)


def corner_cells(problem: MSDAProblem) -> int:
    """Cells of one batch and head: sum over levels of (H+1)(W+1), plus the all-zero cell
    (the last one) that samples with no corner in the map (or a NaN coordinate) read."""
    return sum((h + 1) * (w + 1) for h, w in problem.spatial_shapes) + 1


def value_elements(p: MSDAProblem) -> int:
    return p.batch * p.total_pixels * p.num_heads * p.head_dim


def build_chunk_cells(problem: MSDAProblem, value_dtype: str) -> int:
    """Cells per build step (x extent of one chunk, 0: none fits): two buffer sets of two value
    row tiles ``(xw + 1, N_h, C_h)`` and one cell tile ``(xw, N_h, 4, C_h)`` within
    BUILD_SBUF_BYTES per partition."""
    row = problem.num_heads * problem.head_dim * DTYPE_BYTES[value_dtype]
    per_set = BUILD_SBUF_BYTES // BUILD_BUFFER_SETS
    xw = (per_set // row - 2) // 6  # 2 (xw + 1) + 4 xw rows of N_h * C_h
    return max(0, min(xw, max(w for _, w in problem.spatial_shapes) + 1))


def build_sbuf_bytes(problem: MSDAProblem, value_dtype: str) -> int:
    """SBUF bytes per partition of the build pass's tiles (all sets)."""
    xw = build_chunk_cells(problem, value_dtype)
    row = problem.num_heads * problem.head_dim * DTYPE_BYTES[value_dtype]
    return BUILD_BUFFER_SETS * row * (2 * (xw + 1) + 4 * xw)


def corner_block_supported(problem: MSDAProblem, value_dtype: str) -> bool:
    """Whether the corner-block forward can run: 2-byte data and ``4 * C_h`` channels that a
    whole number of indirect transposes stack into 128 partitions (``(128 // C_h) % 4 == 0``,
    so C_h <= 32), a build chunk that fits, and fp32-exact cell row indices."""
    p = problem
    rows = p.batch * corner_cells(p) * p.num_heads
    return (DTYPE_BYTES[value_dtype] == 2 and 4 * p.head_dim <= PARTITIONS
            and (PARTITIONS // p.head_dim) % 4 == 0 and build_chunk_cells(p, value_dtype) >= 1
            and rows < FP32_EXACT_INT_MAX)


def scratch_bytes(problem: MSDAProblem, value_dtype: str, design: str) -> int:
    """Extra HBM scratch of a value layout (forward and gathers), in bytes."""
    p, vb = problem, DTYPE_BYTES[value_dtype]
    if design == "corner-block" or design == "corner-gather":
        return p.batch * corner_cells(p) * p.num_heads * 4 * p.head_dim * vb
    if design == "x-pair" and p.value_layout == "BLNC":
        pairs = sum(h * (w + 1) + 1 for h, w in p.spatial_shapes)
        return p.batch * pairs * p.num_heads * 2 * p.head_dim * vb
    return 0


def samples_per_cell(problem: MSDAProblem) -> float:
    """Samples per cell and head, B * N_q * N_h * N_l * N_p / (B * cells * N_h): the gathers
    the layout saves against the cells the build writes (independent of LNC: both halve)."""
    p = problem
    return p.num_queries * p.num_levels * p.num_points / corner_cells(p)


def choose_forward_layout(problem: MSDAProblem, value_dtype: str, lnc: int = 1) -> str:
    """"corner-block" where it is supported, its scratch is within MAX_SCRATCH_RATIO value
    bytes and it has at least AUTO_MIN_SAMPLES_PER_CELL samples per cell and head; else
    "four-corner". ``lnc`` does not change the answer (build and gathers both halve)."""
    if not corner_block_supported(problem, value_dtype):
        return "four-corner"
    value_bytes = value_elements(problem) * DTYPE_BYTES[value_dtype]
    if scratch_bytes(problem, value_dtype, "corner-block") > MAX_SCRATCH_RATIO * value_bytes:
        return "four-corner"
    return "corner-block" if samples_per_cell(problem) >= AUTO_MIN_SAMPLES_PER_CELL else "four-corner"


def resolve_gather_layout(gather_layout: str, problem: MSDAProblem, value_dtype: str, lnc: int,
                          gather_method: str) -> bool:
    """True for the corner-block forward: ``gather_layout`` "corner-block" (a ValueError where
    it cannot run), "auto" (:func:`choose_forward_layout`, transpose gather only) or
    "four-corner" (False)."""
    if gather_layout not in GATHER_LAYOUTS:
        raise ValueError(f"gather_layout: expected one of {list(GATHER_LAYOUTS)}, got {gather_layout!r}")
    if gather_layout == "four-corner":
        return False
    transpose = gather_method == "transpose"
    if gather_layout == "auto":
        return transpose and choose_forward_layout(problem, value_dtype, lnc) == "corner-block"
    if not transpose or not corner_block_supported(problem, value_dtype):
        raise ValueError(
            f"gather_layout='corner-block': expected gather_method='transpose', a 2-byte value dtype "
            f"and C_h <= 32 with (128 // C_h) % 4 == 0, got gather_method={gather_method!r}, "
            f"value dtype {value_dtype}, C_h={problem.head_dim}")
    return True
