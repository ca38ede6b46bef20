"""Every ValueError/TypeError of the Block AttnRes argument checks (docs/block_attn_res.md, "Errors"),
through the public torch functions (the checks run before any backend work)."""

from __future__ import annotations

import re

import pytest
import torch

from nkilib_msda import block_attn_res, block_attn_res_backward

B, T, D = 2, 3, 8


def _blocks(n=2, dtype=torch.bfloat16):
    return [torch.randn(B, T, D).to(dtype) for _ in range(n)]


def _fwd_args(**overrides):
    args = dict(blocks=_blocks(), proj_weight=torch.randn(D).bfloat16(), partial_block=None,
                rmsnorm_gamma=torch.ones(D).bfloat16())
    args.update(overrides)
    return args


FORWARD_ERRORS = [
    (dict(blocks=[]), ValueError, "blocks: expected between 1 and 127"),
    (dict(blocks=_blocks(128)), ValueError, "got 128"),
    (dict(blocks=torch.randn(2, B, T, D)), TypeError, "blocks: expected a list or tuple"),
    (dict(blocks=[torch.randn(B, T)]), ValueError, "blocks[0]: expected a non-empty [B, T, D]"),
    (dict(blocks=[torch.randn(B, T, D).to(torch.int32)]), ValueError, "blocks[0]: expected dtype"),
    (dict(blocks=[torch.randn(B, T, D).bfloat16(), torch.randn(B, T + 1, D).bfloat16()]), ValueError,
     "blocks[1]: expected shape"),
    (dict(blocks=[torch.randn(B, T, D).bfloat16(), torch.randn(B, T, D).half()]), ValueError,
     "blocks[1]: expected dtype bfloat16"),
    (dict(partial_block=torch.randn(B, T, D + 1).bfloat16()), ValueError, "partial_block: expected shape"),
    (dict(partial_block=torch.randn(B, T, D).float()), ValueError, "partial_block: expected dtype"),
    (dict(partial_block=torch.randn(B, T, D).bfloat16().to("meta")), ValueError,
     "partial_block: expected device"),
    (dict(proj_weight=torch.randn(1, D).bfloat16()), ValueError, "proj_weight: expected shape (8,)"),
    (dict(proj_weight=torch.randn(D).half()), ValueError, "proj_weight: expected dtype bfloat16 or float32"),
    (dict(proj_weight=[0.0] * D), TypeError, "proj_weight: expected an array or tensor"),
    (dict(rmsnorm_gamma=None), ValueError, "rmsnorm_gamma: required when enable_rmsnorm=True"),
    (dict(rmsnorm_gamma=torch.ones(D + 1).bfloat16()), ValueError, "rmsnorm_gamma: expected shape"),
    (dict(rmsnorm_gamma=torch.ones(D).half(), enable_rmsnorm=False), ValueError,
     "rmsnorm_gamma: expected dtype"),
    (dict(enable_rmsnorm=False, rms_out_flag=True), ValueError, "rms_out_flag"),
    (dict(scale=float("nan")), ValueError, "scale: expected a finite number"),
    (dict(scale="1"), TypeError, "scale: expected a Python number"),
    (dict(rmsnorm_eps=-1e-6), ValueError, "rmsnorm_eps: expected a finite number >= 0.0"),
    (dict(backend="triton"), ValueError, "backend: expected None"),
    (dict(backend=3), TypeError, "backend: expected None"),
]


def test_explicit_nki_backend_rejects_float64():
    blocks = [b.double() for b in _blocks()]
    with pytest.raises(ValueError, match="backend='nki' cannot run this call"):
        block_attn_res(blocks, torch.randn(D).double(), rmsnorm_gamma=torch.ones(D).double(), backend="nki")


def test_valid_calls_pass_validation():
    """Boundaries that must be accepted: 127 blocks + partial (L = 128), fp32 weights with bf16
    blocks, gamma given with RMSNorm off."""
    block = torch.randn(1, 1, 4).bfloat16()
    h = block_attn_res([block] * 127, torch.zeros(4), block, rmsnorm_gamma=torch.ones(4))
    assert h.shape == (1, 1, 4) and h.dtype == torch.bfloat16
    block_attn_res(_blocks(), torch.randn(D).bfloat16(), rmsnorm_gamma=torch.ones(D).bfloat16(),
                   enable_rmsnorm=False)


def _bwd_args(**overrides):
    n_src = 3
    args = dict(grad_h=torch.randn(B, T, D).bfloat16(), blocks=_blocks(),
                proj_weight=torch.randn(D).bfloat16(),
                alpha_cache=torch.rand(B, T, n_src), partial_block=torch.randn(B, T, D).bfloat16(),
                rmsnorm_gamma=torch.ones(D).bfloat16(), rms_cache=torch.rand(B, T, n_src, 1) + 0.5)
    args.update(overrides)
    return args


BACKWARD_ERRORS = [
    (dict(blocks=[]), ValueError, "blocks: expected between 1 and 127"),
    (dict(grad_h=torch.randn(B, T, D + 1).bfloat16()), ValueError, "grad_h: expected shape"),
    (dict(grad_h=torch.randn(B, T, D).half()), ValueError, "grad_h: expected dtype bfloat16"),
    (dict(grad_h=torch.randn(B, T, D).bfloat16().to("meta")), ValueError, "grad_h: expected device"),
    (dict(blocks=[torch.randn(B, T, D).bfloat16(), torch.randn(B, 1, D).bfloat16()]), ValueError,
     "blocks[1]: expected shape"),
    (dict(partial_block=torch.randn(B, T, D).half()), ValueError, "partial_block: expected dtype"),
    (dict(proj_weight=torch.randn(D, 1).bfloat16()), ValueError, "proj_weight: expected shape"),
    (dict(alpha_cache=None), ValueError, "alpha_cache: required"),
    (dict(alpha_cache=torch.rand(B, T, 2)), ValueError, "alpha_cache: expected shape (2, 3, 3)"),
    (dict(rmsnorm_gamma=None), ValueError, "rmsnorm_gamma: required"),
    (dict(rmsnorm_gamma=torch.ones(D).half()), ValueError, "rmsnorm_gamma: expected dtype"),
    (dict(rms_cache=None), ValueError, "rms_cache: required when enable_rmsnorm=True"),
    (dict(rms_cache=torch.rand(B, T, 3)), ValueError, "rms_cache: expected shape (2, 3, 3, 1)"),
    (dict(scale=float("inf")), ValueError, "scale: expected a finite number"),
]


# One table for both directions: (function, its valid arguments, overrides, error, message).
ERRORS = ([pytest.param(block_attn_res, _fwd_args, *case, id=f"forward-{case[2]}")
           for case in FORWARD_ERRORS]
          + [pytest.param(block_attn_res_backward, _bwd_args, *case, id=f"backward-{case[2]}")
             for case in BACKWARD_ERRORS])


@pytest.mark.parametrize("function,valid_args,overrides,error,message", ERRORS)
def test_errors(function, valid_args, overrides, error, message):
    with pytest.raises(error, match=re.escape(message)):
        function(**valid_args(**overrides))


def test_backward_without_rmsnorm_needs_no_gamma_or_rms():
    out = block_attn_res_backward(**_bwd_args(rmsnorm_gamma=None, rms_cache=None, enable_rmsnorm=False))
    assert len(out) == 3


def test_numpy_arrays_are_checked_too():
    import numpy as np

    from nkilib_msda.validation.block_attn_res import validate_block_attn_res_args

    blocks = [np.zeros((B, T, D), np.float32)] * 3
    problem = validate_block_attn_res_args(blocks, np.zeros(D, np.float32), blocks[0],
                                           rmsnorm_gamma=np.ones(D, np.float32))
    assert (problem.num_sources, problem.num_tokens, problem.dim) == (4, B * T, D)
    with pytest.raises(ValueError, match=re.escape("proj_weight: expected shape (8,)")):
        validate_block_attn_res_args(blocks, np.zeros(D + 1, np.float32),
                                     rmsnorm_gamma=np.ones(D, np.float32))
