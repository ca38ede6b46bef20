"""Argument checks shared by every Block AttnRes backend (docs/block_attn_res.md).

Works on NumPy arrays and torch tensors (anything with ``.shape`` and ``.dtype``; ``.device`` is
compared when present). Errors are ``ValueError`` (or ``TypeError`` for a non-tensor) naming the
argument, what was expected and what was received. The checks return a frozen
:class:`BlockAttnResProblem` that the backends use to reshape and plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from nkilib_msda.hardware import KERNEL_DTYPES, PARTITIONS
from nkilib_msda.validation.msda import FLOAT_DTYPE_NAMES, dtype_name, symbolic_or_int

__all__ = ["BlockAttnResProblem", "KERNEL_DTYPES", "MAX_BLOCKS", "MAX_SOURCES",
           "validate_block_attn_res_args", "validate_block_attn_res_backward_args",
           "validate_stacked_values", "validate_stacked_backward_args"]

MAX_BLOCKS = 127
MAX_SOURCES = PARTITIONS  # the kernels' limit on L (the tiling planner checks the same)


@dataclass(frozen=True)
class BlockAttnResProblem:
    """Static description of one call: blocks [B, T, D] x N (+ partial) -> L sources."""

    batch: int
    seq_len: int
    dim: int
    num_blocks: int
    has_partial: bool
    dtype: str
    enable_rmsnorm: bool

    @property
    def num_sources(self) -> int:
        """L = N + 1 with a partial block, else N."""
        return self.num_blocks + int(self.has_partial)

    @property
    def num_tokens(self) -> int:
        """B * T, the kernels' token axis."""
        return self.batch * self.seq_len


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"shape {tuple(int(s) for s in x.shape)} and dtype {dtype_name(x.dtype)}"
    return f"{type(x).__name__} {x!r}"


def _device(x: Any) -> str | None:
    device = getattr(x, "device", None)
    return None if device is None else str(device)


def _tensor(name: str, x: Any) -> tuple[int, ...]:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name}: expected an array or tensor, got {_describe(x)}")
    return tuple(symbolic_or_int(s) for s in x.shape)


def _check_like(name: str, x: Any, shape: tuple[int, ...], dtypes: Sequence[str], device: str | None,
                what: str) -> None:
    """Check shape, dtype (one of ``dtypes``) and device of ``x`` against the blocks."""
    got = _tensor(name, x)
    if got != shape:
        raise ValueError(f"{name}: expected shape {shape} ({what}), got {_describe(x)}")
    if dtype_name(x.dtype) not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(dtypes)}, got {_describe(x)}")
    if _device(x) != device:
        raise ValueError(f"{name}: expected device {device} (the blocks' device), got {_device(x)}")


def _check_blocks(blocks: Any, partial_block: Any, allowed_dtypes: Sequence[str]
                  ) -> tuple[tuple[int, int, int], str, str | None, int]:
    if not isinstance(blocks, (list, tuple)):
        raise TypeError(f"blocks: expected a list or tuple of [B, T, D] tensors, "
                        f"got {_describe(blocks)}")
    n_blocks = len(blocks)
    if not 1 <= n_blocks <= MAX_BLOCKS:
        raise ValueError(f"blocks: expected between 1 and {MAX_BLOCKS} blocks (L = N + partial "
                         f"<= {MAX_SOURCES} sources), got {n_blocks}")
    shape = _tensor("blocks[0]", blocks[0])
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"blocks[0]: expected a non-empty [B, T, D] tensor, got {_describe(blocks[0])}")
    dtype = dtype_name(blocks[0].dtype)
    if dtype not in allowed_dtypes:
        raise ValueError(f"blocks[0]: expected dtype {' or '.join(allowed_dtypes)}, got {_describe(blocks[0])}")
    device = _device(blocks[0])
    for i, block in enumerate(blocks[1:], start=1):
        _check_like(f"blocks[{i}]", block, shape, (dtype,), device, "like blocks[0]")
    if partial_block is not None:
        _check_like("partial_block", partial_block, shape, (dtype,), device, "like blocks[0]")
    return shape, dtype, device, n_blocks  # type: ignore[return-value]


def _weight_dtypes(dtype: str) -> tuple[str, ...]:
    # The blocks' dtype, or float32 (fp32 master weights; the kernels take fp32 w and gamma anyway).
    return (dtype,) if dtype in ("float32", "float64") else (dtype, "float32")


def _check_weights(proj_weight: Any, rmsnorm_gamma: Any, enable_rmsnorm: bool, dim: int, dtype: str,
                   device: str | None) -> None:
    _check_like("proj_weight", proj_weight, (dim,), _weight_dtypes(dtype), device, "(D,)")
    if rmsnorm_gamma is None:
        if enable_rmsnorm:
            raise ValueError("rmsnorm_gamma: required when enable_rmsnorm=True, got None")
    else:
        _check_like("rmsnorm_gamma", rmsnorm_gamma, (dim,), _weight_dtypes(dtype), device, "(D,)")


def _check_number(name: str, value: Any, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a Python number, got {type(value).__name__} {value!r}")
    # x - x == 0 is false exactly for inf and NaN, and unlike math.isfinite it also works on
    # the symbolic floats torch.compile(dynamic=True) makes of float arguments.
    if not (value - value) == 0 or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name}: expected a finite number{bound}, got {value!r}")


def validate_block_attn_res_args(blocks: Sequence[Any], proj_weight: Any, partial_block: Any = None,
                                 scale: float = 1.0, rmsnorm_eps: float = 1e-6,
                                 rmsnorm_gamma: Any = None, enable_rmsnorm: bool = True,
                                 rms_out_flag: bool = False, *,
                                 allowed_dtypes: Sequence[str] = KERNEL_DTYPES) -> BlockAttnResProblem:
    """Check the forward arguments; return the problem description."""
    (batch, seq_len, dim), dtype, device, n_blocks = _check_blocks(blocks, partial_block, allowed_dtypes)
    _check_weights(proj_weight, rmsnorm_gamma, enable_rmsnorm, dim, dtype, device)
    _check_number("scale", scale)
    _check_number("rmsnorm_eps", rmsnorm_eps, minimum=0.0)
    if rms_out_flag and not enable_rmsnorm:
        raise ValueError("rms_out_flag: the rms cache exists only with enable_rmsnorm=True, "
                         "got rms_out_flag=True with enable_rmsnorm=False")
    return BlockAttnResProblem(batch, seq_len, dim, n_blocks, partial_block is not None, dtype,
                               bool(enable_rmsnorm))


def validate_block_attn_res_backward_args(grad_h: Any, blocks: Sequence[Any], proj_weight: Any,
                                          alpha_cache: Any, partial_block: Any = None,
                                          rmsnorm_gamma: Any = None, rms_cache: Any = None,
                                          scale: float = 1.0, enable_rmsnorm: bool = True, *,
                                          allowed_dtypes: Sequence[str] = KERNEL_DTYPES
                                          ) -> BlockAttnResProblem:
    """Check the backward arguments; return the problem description."""
    (batch, seq_len, dim), dtype, device, n_blocks = _check_blocks(blocks, partial_block, allowed_dtypes)
    _check_like("grad_h", grad_h, (batch, seq_len, dim), (dtype,), device, "[B, T, D] like the blocks")
    _check_weights(proj_weight, rmsnorm_gamma, enable_rmsnorm, dim, dtype, device)
    _check_number("scale", scale)
    n_sources = n_blocks + int(partial_block is not None)
    if alpha_cache is None:
        raise ValueError("alpha_cache: required (the forward's alpha [B, T, L]), got None")
    _check_like("alpha_cache", alpha_cache, (batch, seq_len, n_sources), FLOAT_DTYPE_NAMES, device,
                "[B, T, L]")
    if enable_rmsnorm:
        if rms_cache is None:
            raise ValueError("rms_cache: required when enable_rmsnorm=True (the forward's rms "
                             "[B, T, L, 1]), got None")
        _check_like("rms_cache", rms_cache, (batch, seq_len, n_sources, 1), FLOAT_DTYPE_NAMES, device,
                    "[B, T, L, 1]")
    return BlockAttnResProblem(batch, seq_len, dim, n_blocks, partial_block is not None, dtype,
                               bool(enable_rmsnorm))


# ------------------------------------------------------- the registered operators' form


def _check_values(values: Any, allowed_dtypes: Sequence[str]
                  ) -> tuple[tuple[int, int, int, int], str, str | None]:
    shape = _tensor("values", values)
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"values: expected a non-empty [L, B, T, D] tensor (the sources "
                         f"stacked), got {_describe(values)}")
    if shape[0] > MAX_SOURCES:
        raise ValueError(f"values: expected at most {MAX_SOURCES} sources L in [L, B, T, D], "
                         f"got {_describe(values)}")
    dtype = dtype_name(values.dtype)
    if dtype not in allowed_dtypes:
        raise ValueError(f"values: expected dtype {' or '.join(allowed_dtypes)}, got "
                         f"{_describe(values)}")
    return shape, dtype, _device(values)  # type: ignore[return-value]


def validate_stacked_values(values: Any, proj_weight: Any, rmsnorm_gamma: Any, scale: float,
                            rmsnorm_eps: float, enable_rmsnorm: bool, *,
                            allowed_dtypes: Sequence[str] = KERNEL_DTYPES) -> BlockAttnResProblem:
    """Check the forward operator's arguments: the L sources stacked as values [L, B, T, D]
    (the partial block, if any, last; the problem counts L blocks and no partial)."""
    (n_src, batch, seq_len, dim), dtype, device = _check_values(values, allowed_dtypes)
    _check_weights(proj_weight, rmsnorm_gamma, enable_rmsnorm, dim, dtype, device)
    _check_number("scale", scale)
    _check_number("rmsnorm_eps", rmsnorm_eps, minimum=0.0)
    return BlockAttnResProblem(batch, seq_len, dim, n_src, False, dtype, bool(enable_rmsnorm))


def validate_stacked_backward_args(grad_h: Any, values: Any, proj_weight: Any, alpha: Any,
                                   rmsnorm_gamma: Any, rms: Any, scale: float,
                                   enable_rmsnorm: bool, *,
                                   allowed_dtypes: Sequence[str] = KERNEL_DTYPES
                                   ) -> BlockAttnResProblem:
    """Check the backward operator's arguments (values [L, B, T, D] as in
    :func:`validate_stacked_values`, the forward's alpha [B, T, L] and rms [B, T, L, 1])."""
    (n_src, batch, seq_len, dim), dtype, device = _check_values(values, allowed_dtypes)
    _check_like("grad_h", grad_h, (batch, seq_len, dim), (dtype,), device, "[B, T, D] like values")
    _check_weights(proj_weight, rmsnorm_gamma, enable_rmsnorm, dim, dtype, device)
    _check_number("scale", scale)
    if alpha is None:
        raise ValueError("alpha: required (the forward's alpha [B, T, L]), got None")
    _check_like("alpha", alpha, (batch, seq_len, n_src), FLOAT_DTYPE_NAMES, device, "[B, T, L]")
    if enable_rmsnorm:
        if rms is None:
            raise ValueError("rms: required when enable_rmsnorm=True (the forward's rms "
                             "[B, T, L, 1]), got None")
        _check_like("rms", rms, (batch, seq_len, n_src, 1), FLOAT_DTYPE_NAMES, device, "[B, T, L, 1]")
    return BlockAttnResProblem(batch, seq_len, dim, n_src, False, dtype, bool(enable_rmsnorm))
