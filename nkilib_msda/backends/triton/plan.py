"""Launch planning of the Triton backend: tile sizes, warps, kernel variants and 64-bit
indexing, decided in plain Python from the problem before any kernel runs.

The rules come from sweeps on an H200 (benchmarks/RESULTS.md); :func:`plan_launch` says which.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from nkilib_msda._env import read_env
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["KernelConfig", "LaunchPlan", "plan_launch", "needs_int64", "with_configs",
           "uses_samples_backward"]

INT32_MAX = 2**31 - 1
# The largest fp32 grad_value accumulator a call signature keeps between calls (see
# LaunchPlan.grad_value_scratch): decoder-sized problems, whose backward is bounded by host time.
KEPT_SCRATCH_MAX_BYTES = 64 * 2**20
# Kept accumulators are on: benchmarks/check_gpu.py passed with them on an H200 ("kept
# grad_value accumulator": repeated calls, a side stream, graph replay; "ddetr_enc backward ...
# kept"), after the barrier that fixed the race their first GPU run found in the clearing cast.
KEEP_SCRATCH_BY_DEFAULT = True


def _interpreting() -> bool:
    return bool(read_env("TRITON_INTERPRET"))


@dataclass(frozen=True)
class KernelConfig:
    """Tile and launch parameters of one kernel."""

    block_q: int
    num_warps: int
    num_stages: int = 1


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs besides the tensors."""

    forward: KernelConfig
    backward: KernelConfig
    block_c: int
    index64: bool
    grad_value_accumulator: str  # "float32" scratch, or "native" (atomics in the value dtype)
    # 16-bit values, fast mode: "kept", the fp32 accumulator is kept per (call signature, stream)
    # and the kernel that casts it to grad_value also clears it (no zero-fill launch per call);
    # "fresh", it is allocated and zero-filled per call.
    grad_value_scratch: str = "fresh"
    forward_kernel: str = "points"  # "points": loop over (l, p); "samples": all samples at once
    backward_kernel: str = "points"  # the same choice for the fast-mode backward
    samples_backward: KernelConfig = KernelConfig(1, 2)  # tiles of the all-samples backward
    head_slowest: bool = True  # program order: all resident programs share one (head, batch)
    rows_block: int = 32  # deterministic reduce: value rows per program
    rows_warps: int = 4


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    import torch

    if _interpreting() or not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pick_block_q(problem: MSDAProblem, preferred: int, sm_count: int, minimum: int = 8) -> int:
    """Largest query block <= preferred that still gives >= 2 programs per SM (decoders)."""
    groups = problem.batch * problem.num_heads
    block_q = max(1, min(preferred, next_pow2(problem.num_queries)))
    while block_q > minimum and groups * -(-problem.num_queries // block_q) < 2 * sm_count:
        block_q //= 2
    return block_q


def needs_int64(problem: MSDAProblem) -> bool:
    """Whether any flat element/entry offset can exceed int32."""
    b, q, h, c = problem.batch, problem.num_queries, problem.num_heads, problem.head_dim
    largest = max(b * problem.total_pixels * h * c,           # value / grad_value
                  problem.num_samples * 4 + 1,                # loc elements, deterministic entries
                  b * q * h * c,                              # output / grad_output
                  b * problem.total_pixels * h + 1)           # row keys (+ sentinel)
    return largest > INT32_MAX


@functools.lru_cache(maxsize=256)
def plan_launch(problem: MSDAProblem, value_dtype: str, device_index: int = 0) -> LaunchPlan:
    """Tiles chosen from the problem; the rules come from sweeps on an H200
    (benchmarks/RESULTS.md): one 16-byte vector per thread per corner in the forward,
    head-slowest program order, for small (decoder) problems the all-samples forward with 4
    queries per program, and the all-samples backward in fast mode with one query per program,
    or with 8 (fp32) / 16 (16-bit) samples per program when queries have fewer samples (the
    points backward, 4 elements per thread, in deterministic mode). With
    KEEP_SCRATCH_BY_DEFAULT, 16-bit values of up to KEPT_SCRATCH_MAX_BYTES of fp32 keep their
    grad_value accumulator between calls."""
    block_c = next_pow2(problem.head_dim)
    block_s = next_pow2(problem.num_levels * problem.num_points)
    sm_count = _sm_count(device_index)
    # One 16-byte vector per thread per gathered corner: 8 bf16/fp16 or 4 fp32 elements.
    vector = 4 if value_dtype in ("float32", "torch.float32") else 8
    fwd_warps = 8 if vector == 4 else 4
    fwd_q = _pick_block_q(problem, max(8, min(128, vector * 32 * fwd_warps // block_c)), sm_count)
    forward_kernel = "points"
    groups = problem.batch * problem.num_heads
    if groups * -(-problem.num_queries // fwd_q) < 4 * sm_count and block_s * block_c <= 1024:
        forward_kernel = "samples"  # decoders: few queries, put every sample's loads in flight
        fwd_q, fwd_warps = max(1, min(4, 2048 // (block_s * block_c))), 2
    # Fast-mode backward: the all-samples kernel, one query per program (coalesced parameter
    # tiles; 19-20 % faster than the points kernel on the encoder and BEV SCA shapes).
    # Deterministic mode keeps the points kernel and its tiles.
    bwd_q = _pick_block_q(problem, max(1, 256 // block_c), sm_count, minimum=1)
    bwd_warps = 2 if bwd_q * block_c <= 512 else 4
    samples_warps = max(2, min(8, block_s * block_c // 256))
    # Few samples per query (BEV TSA: 4) on large problems: several queries per program, so a
    # program holds as many samples as the encoder's one query (measured 2026-12-03, H200,
    # BEV TSA backward alone: fp32 273 -> 239 us with 2 queries, bf16 286 -> 236 us with 4;
    # the encoder's 16 samples stay fastest at 1 query; benchmarks/RESULTS.md). Decoder-sized
    # problems (the all-samples forward) keep 1 query: not measured there.
    samples_q = 1
    if forward_kernel == "points":
        samples_q = max(1, (8 if vector == 4 else 16) // block_s)
    value_elements = problem.batch * problem.total_pixels * problem.num_heads * problem.head_dim
    small = value_elements * 4 <= KEPT_SCRATCH_MAX_BYTES
    scratch = "kept" if KEEP_SCRATCH_BY_DEFAULT and vector == 8 and small else "fresh"
    return LaunchPlan(
        forward=KernelConfig(fwd_q, fwd_warps),
        backward=KernelConfig(bwd_q, bwd_warps),
        block_c=block_c,
        index64=needs_int64(problem),
        grad_value_accumulator="float32",
        grad_value_scratch=scratch,
        forward_kernel=forward_kernel,
        backward_kernel="samples",
        samples_backward=KernelConfig(samples_q, samples_warps),
    )


def with_configs(plan: LaunchPlan, **changes) -> LaunchPlan:
    """A copy of ``plan`` with some fields replaced (benchmark sweeps)."""
    return replace(plan, **changes)


def uses_samples_backward(plan: LaunchPlan, deterministic: bool) -> bool:
    """Whether the backward runs ``msda_backward_samples_kernel`` (fast mode only)."""
    return plan.backward_kernel == "samples" and not deterministic
