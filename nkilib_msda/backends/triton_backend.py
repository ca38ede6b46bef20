"""Triton backend for CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``).

Public surface used by the op layer (``nkilib_msda.backends``):
``is_available``, ``unsupported_reason``, ``msda_forward``, ``msda_backward``.

Everything about a launch (tile sizes, warps, 64-bit indexing, accumulator dtype) is decided
in plain Python by :func:`plan_launch` before any kernel runs. Coordinates are fp32 inside the
kernels for every value dtype; accumulation is fp32.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Any

from nkilib_msda._env import env_flag
from nkilib_msda.validation import MSDAProblem, dtype_name

DETERMINISTIC_ENV = "NKILIB_MSDA_DETERMINISTIC"
_INT32_MAX = 2**31 - 1
_SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
_SUPPORTED_PADDING = ("zeros", "border")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def _triton_and_device() -> bool:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def is_available() -> bool:
    """True when triton imports and there is a CUDA device (or the Triton interpreter is on)."""
    if _interpreting():
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    return _triton_and_device()


def unsupported_reason(problem: MSDAProblem, value: Any, sampling_locations: Any) -> str | None:
    """Why this backend cannot run the call (None when it can)."""
    if problem.padding_mode not in _SUPPORTED_PADDING:
        return (f"padding_mode={problem.padding_mode!r} is not supported by the triton backend "
                f"(supported: {', '.join(_SUPPORTED_PADDING)}); use backend='reference'")
    if not is_available():
        return "triton backend needs triton and a CUDA device (or TRITON_INTERPRET=1)"
    name = dtype_name(value.dtype)
    if name not in _SUPPORTED_DTYPES:
        return f"value dtype {name} is not supported by the triton backend (expected one of {_SUPPORTED_DTYPES})"
    loc_name = dtype_name(sampling_locations.dtype)
    if loc_name not in _SUPPORTED_DTYPES:
        return (f"sampling_locations dtype {loc_name} is not supported by the triton backend "
                f"(expected one of {_SUPPORTED_DTYPES})")
    device = getattr(value, "device", None)
    if device is None:
        return "triton backend needs torch tensors"
    if device.type != "cuda" and not _interpreting():
        return f"triton backend needs CUDA tensors, got value on {device}"
    if getattr(sampling_locations, "device", device) != device:
        return f"value is on {device} but sampling_locations is on {sampling_locations.device}"
    return None


# ----------------------------------------------------------------------------- planning


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
    forward_kernel: str = "points"  # "points": loop over (l, p); "samples": all samples at once
    head_slowest: bool = True  # program order: all resident programs share one (head, batch)
    rows_block: int = 32  # deterministic reduce: value rows per program
    rows_warps: int = 4


def _next_pow2(n: int) -> int:
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
    block_q = max(1, min(preferred, _next_pow2(problem.num_queries)))
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
    return largest > _INT32_MAX


@functools.lru_cache(maxsize=256)
def plan_launch(problem: MSDAProblem, value_dtype: str, device_index: int = 0) -> LaunchPlan:
    """Tiles chosen from the problem; the rules come from sweeps on an H200
    (benchmarks/RESULTS.md): one 16-byte vector per thread per corner in the forward, 4
    elements per thread in the backward, head-slowest program order, and for small (decoder)
    problems the all-samples forward with 4 queries per program."""
    block_c = _next_pow2(problem.head_dim)
    block_s = _next_pow2(problem.num_levels * problem.num_points)
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
    bwd_q = _pick_block_q(problem, max(1, 256 // block_c), sm_count, minimum=1)
    bwd_warps = 2 if bwd_q * block_c <= 512 else 4
    return LaunchPlan(
        forward=KernelConfig(fwd_q, fwd_warps),
        backward=KernelConfig(bwd_q, bwd_warps),
        block_c=block_c,
        index64=needs_int64(problem),
        grad_value_accumulator="float32",
        forward_kernel=forward_kernel,
    )


# ----------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=64)
def _level_tables(shapes: tuple, starts: tuple, device_str: str):
    """Cached int32 device tensors (N_l, 2) and (N_l,) (no host copy during graph capture)."""
    import torch

    flat = [v for hw in shapes for v in hw]
    return (torch.tensor(flat, dtype=torch.int32, device=device_str),
            torch.tensor(list(starts), dtype=torch.int32, device=device_str))


def _static_args(problem: MSDAProblem, plan: LaunchPlan) -> dict:
    return dict(
        NUM_HEADS=problem.num_heads, HEAD_DIM=problem.head_dim, NUM_LEVELS=problem.num_levels,
        NUM_POINTS=problem.num_points, VALUE_BNLC=problem.value_layout == "BNLC",
        LOC_B2QHLP=problem.sampling_locations_layout == "B2QHLP",
        ALIGN_CORNERS=bool(problem.align_corners), BORDER=problem.padding_mode == "border",
        INDEX64=plan.index64, BLOCK_C=plan.block_c, HEAD_SLOWEST=plan.head_slowest)


def _resolve_deterministic(deterministic: bool | None) -> bool:
    if deterministic is not None:
        return bool(deterministic)
    env = env_flag(DETERMINISTIC_ENV)
    if env is not None:
        return env
    import torch

    return torch.are_deterministic_algorithms_enabled()


def _check_problem(problem: MSDAProblem, value, sampling_locations) -> None:
    reason = unsupported_reason(problem, value, sampling_locations)
    if reason is not None:
        raise ValueError(reason)


# ----------------------------------------------------------------------------- forward


def msda_forward(value, problem: MSDAProblem, sampling_locations, attention_weights,
                 plan: LaunchPlan | None = None):
    """Output (B, N_q, N_h*C_h) in value's dtype. Inputs in the layouts named by ``problem``."""
    import torch
    import triton

    from nkilib_msda.backends.triton_kernels.forward import (
        msda_forward_kernel, msda_forward_samples_kernel)

    _check_problem(problem, value, sampling_locations)
    plan = plan or plan_launch(problem, dtype_name(value.dtype), value.device.index or 0)
    value = value.contiguous()
    sampling_locations = sampling_locations.contiguous()
    attention_weights = attention_weights.contiguous()
    out = torch.empty(problem.output_shape, dtype=value.dtype, device=value.device)
    shapes, starts = _level_tables(problem.spatial_shapes, problem.level_start_index, str(value.device))
    cfg = plan.forward
    n_blocks = triton.cdiv(problem.num_queries, cfg.block_q)
    grid = (problem.batch * problem.num_heads * n_blocks,)
    extra = {}
    kernel = msda_forward_kernel
    if plan.forward_kernel == "samples":
        kernel = msda_forward_samples_kernel
        extra["BLOCK_S"] = _next_pow2(problem.num_levels * problem.num_points)
    kernel[grid](
        value, sampling_locations, attention_weights, out, shapes, starts,
        problem.num_queries, problem.total_pixels, n_blocks, problem.batch,
        BLOCK_Q=cfg.block_q, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **extra, **_static_args(problem, plan))
    return out


# ----------------------------------------------------------------------------- backward


def msda_backward(grad_output, value, problem: MSDAProblem, sampling_locations, attention_weights,
                  compute: tuple[bool, bool, bool] = (True, True, True),
                  deterministic: bool | None = None, plan: LaunchPlan | None = None):
    """(grad_value, grad_sampling_locations, grad_attention_weights).

    grad_value in value's layout and dtype; grad_sampling_locations in the locations' layout
    and dtype; grad_attention_weights (B, N_q, N_h, N_l, N_p) in the weights' dtype; zeros
    where ``compute`` is False. ``deterministic=None`` reads env NKILIB_MSDA_DETERMINISTIC
    (else torch.are_deterministic_algorithms_enabled()); True gives a bitwise-reproducible
    grad_value (sort + ordered per-row reduction) at extra cost.
    """
    import torch
    import triton

    from nkilib_msda.backends.triton_kernels.backward import (
        msda_backward_kernel, msda_grad_value_rows_kernel)

    _check_problem(problem, value, sampling_locations)
    plan = plan or plan_launch(problem, dtype_name(value.dtype), value.device.index or 0)
    want_value, want_loc, want_attn = (bool(c) for c in compute)
    deterministic = _resolve_deterministic(deterministic) and want_value
    device = value.device
    grad_output = grad_output.contiguous()
    value = value.contiguous()
    sampling_locations = sampling_locations.contiguous()
    attention_weights = attention_weights.contiguous()

    alloc_loc = torch.empty_like if want_loc else torch.zeros_like
    alloc_attn = torch.empty_like if want_attn else torch.zeros_like
    grad_loc = alloc_loc(sampling_locations)
    grad_attn = alloc_attn(attention_weights)
    native = plan.grad_value_accumulator == "native" or value.dtype == torch.float32
    grad_value: torch.Tensor | None
    if deterministic:
        grad_value = torch.empty_like(value)
        accumulator = grad_value  # unused by the kernel in this mode
        num_rows = problem.batch * problem.total_pixels * problem.num_heads
        key_dtype = torch.int64 if plan.index64 else torch.int32
        keys = torch.empty(problem.num_samples * 4, dtype=key_dtype, device=device)
        coefs = torch.empty(problem.num_samples * 4, dtype=torch.float32, device=device)
    else:
        grad_value = torch.zeros_like(value) if (native or not want_value) else None
        accumulator = grad_value if grad_value is not None else torch.zeros(
            value.shape, dtype=torch.float32, device=device)
        num_rows = 0
        keys = coefs = accumulator  # placeholders, never touched when not DETERMINISTIC

    if want_value or want_loc or want_attn:
        shapes, starts = _level_tables(problem.spatial_shapes, problem.level_start_index, str(device))
        cfg = plan.backward
        n_blocks = triton.cdiv(problem.num_queries, cfg.block_q)
        grid = (problem.batch * problem.num_heads * n_blocks,)
        msda_backward_kernel[grid](
            grad_output, value, sampling_locations, attention_weights, shapes, starts,
            accumulator, grad_loc, grad_attn, keys, coefs,
            problem.num_queries, problem.total_pixels, n_blocks, problem.batch, num_rows,
            COMPUTE_VALUE=want_value, COMPUTE_LOC=want_loc, COMPUTE_ATTN=want_attn,
            DETERMINISTIC=deterministic, BLOCK_Q=cfg.block_q, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **_static_args(problem, plan))

    if deterministic:
        sorted_keys, perm = torch.sort(keys, stable=True)
        row_ids = torch.arange(num_rows + 1, dtype=key_dtype, device=device)
        row_start = torch.searchsorted(sorted_keys, row_ids)
        static = _static_args(problem, plan)
        msda_grad_value_rows_kernel[(triton.cdiv(num_rows, plan.rows_block),)](
            grad_output, perm, coefs, row_start, grad_value, problem.total_pixels, num_rows,
            NUM_HEADS=problem.num_heads, HEAD_DIM=problem.head_dim,
            LP=problem.num_levels * problem.num_points, VALUE_BNLC=static["VALUE_BNLC"],
            INDEX64=plan.index64, BLOCK_R=plan.rows_block, BLOCK_C=plan.block_c,
            num_warps=plan.rows_warps)
    elif grad_value is None:
        grad_value = accumulator.to(value.dtype)
    return grad_value, grad_loc, grad_attn


def with_configs(plan: LaunchPlan, **changes) -> LaunchPlan:
    """A copy of ``plan`` with some fields replaced (benchmark sweeps)."""
    return replace(plan, **changes)
