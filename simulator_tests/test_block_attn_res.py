"""Block AttnRes NKI kernels in the simulator vs the float64 reference.

Cascade as in PyPTO: kernel forward -> fp32 caches -> kernel backward, each compared with the
float64 golden computed on the same (rounded) inputs. Inputs: randn blocks and grad_h,
proj_weight = randn / sqrt(4 D) (times a spread factor so the softmax is not uniform),
gamma = 1 + noise (non-unit) unless stated.
Tolerances (block-attn-res.md section 7): max|err| / max|ref| <= 1.6e-2 for bf16 tensors
(2e-3 fp16, 1e-5 fp32); fp32 caches <= 1e-5 relative; grad_w / grad_gamma relative L2 <= 1e-2 and
max-relative within the dtype tolerance.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.experimental.block_attn_res.tiling import plan_backward, plan_forward
from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref
from nkilib_msda.simulator import simulate

NP_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
TOL = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 1e-5}
CACHE_RTOL = 1e-5


def max_rel(actual, expected) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def rel_l2(actual, expected) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def make_problem(seed, n_blocks, partial, batch, seq, dim, dtype, spread=4.0, unit_gamma=False):
    """Rounded inputs (values source-major [L, BT, D]) plus the float64 views the reference takes."""
    rng = np.random.default_rng(seed)
    n_src = n_blocks + int(partial)
    values = rng.standard_normal((n_src, batch * seq, dim)).astype(NP_DTYPES[dtype])
    grad_h = rng.standard_normal((batch * seq, dim)).astype(NP_DTYPES[dtype])
    w = (spread * rng.standard_normal(dim) / np.sqrt(4 * dim)).astype(np.float32)
    gamma = np.ones(dim, np.float32) if unit_gamma else (1 + 0.3 * rng.standard_normal(dim)).astype(np.float32)
    v64 = values.astype(np.float64).reshape(n_src, batch, seq, dim)
    blocks = [v64[i] for i in range(n_blocks)]
    partial_block = v64[n_blocks] if partial else None
    return values, grad_h, w, gamma, blocks, partial_block, grad_h.astype(np.float64).reshape(batch, seq, dim)


def run_cascade(*, n_blocks, partial, batch, seq, dim, dtype="bfloat16", rms_on=True, scale=1.0,
                eps=1e-6, lnc=1, fwd_mode=None, bwd_mode=None, seed=0, unit_gamma=False):
    values, grad_h, w, gamma, blocks, partial_block, dh64 = make_problem(
        seed, n_blocks, partial, batch, seq, dim, dtype, unit_gamma=unit_gamma)
    n_src, tokens = values.shape[0], batch * seq
    gamma_arg = gamma if rms_on else None
    tol = TOL[dtype]

    fwd = simulate(block_attn_res_fwd, lnc=lnc)(values, w, gamma_arg, scale, eps, rms_on, fwd_mode)
    h_ref, rms_ref, alpha_ref = block_attn_res_ref(blocks, w, partial_block, scale, eps, gamma_arg, rms_on)
    h, alpha = fwd[0], fwd[-1]
    assert h.dtype == values.dtype and h.shape == (tokens, dim)
    assert max_rel(h, h_ref.reshape(tokens, dim)) <= tol
    np.testing.assert_allclose(alpha, alpha_ref.reshape(tokens, n_src), rtol=CACHE_RTOL, atol=1e-7)
    if rms_on:
        assert len(fwd) == 3 and fwd[1].dtype == np.float32
        np.testing.assert_allclose(fwd[1], rms_ref.reshape(tokens, n_src), rtol=CACHE_RTOL)
    else:
        assert len(fwd) == 2

    rms_cache = fwd[1] if rms_on else None
    bwd = simulate(block_attn_res_bwd, lnc=lnc)(grad_h, values, w, alpha, gamma_arg, rms_cache,
                                                 scale, rms_on, bwd_mode)
    g_blocks, g_partial, g_w, g_gamma = block_attn_res_backward_ref(
        dh64, blocks, w, partial_block, gamma_arg, scale, eps, rms_on)
    g_values_ref = np.stack(g_blocks + ([g_partial] if partial else [])).reshape(n_src, tokens, dim)
    grad_values = bwd[0]
    assert grad_values.dtype == values.dtype
    errors = {"h": max_rel(h, h_ref.reshape(tokens, dim)),
              "grad_values": max_rel(grad_values, g_values_ref)}
    assert errors["grad_values"] <= tol
    weight_grads = [("grad_w", bwd[1], g_w)] + ([("grad_gamma", bwd[2], g_gamma)] if rms_on else [])
    assert len(bwd) == len(weight_grads) + 1
    for name, got, ref in weight_grads:
        assert got.dtype == np.float32 and got.shape == (dim,)
        if n_src == 1:  # one source: alpha = 1, no gradient reaches w or gamma
            np.testing.assert_allclose(got, 0.0, atol=1e-6)
            continue
        errors[name] = max_rel(got, ref)
        assert rel_l2(got, ref) <= 1e-2 and errors[name] <= tol, (name, errors)
    return errors


CASCADES = [
    # PyPTO-like: 25 blocks + partial (L = 26), D = 512, unit gamma
    dict(n_blocks=25, partial=True, batch=2, seq=64, dim=512, unit_gamma=True),
    # L = 9 without partial (L = N), D = 1536, partial last tile, scale != 1, LNC 2
    dict(n_blocks=9, partial=False, batch=1, seq=130, dim=1536, scale=0.5, lnc=2),
    # Kimi-Linear D = 2304, 9 blocks + partial, RMSNorm off, scale 2
    dict(n_blocks=9, partial=True, batch=1, seq=96, dim=2304, rms_on=False, scale=2.0),
    # L = 1, both RMSNorm settings
    dict(n_blocks=1, partial=False, batch=2, seq=40, dim=512, lnc=2),
    dict(n_blocks=1, partial=False, batch=1, seq=70, dim=1536, rms_on=False),
    # L = 128 (127 blocks + partial), LNC 2
    dict(n_blocks=127, partial=True, batch=1, seq=128, dim=512, lnc=2, scale=1.5),
    # forced stream modes (online softmax forward, re-reading backward), RMSNorm on and off
    dict(n_blocks=25, partial=True, batch=1, seq=200, dim=512, fwd_mode="stream", bwd_mode="stream", lnc=2),
    dict(n_blocks=8, partial=True, batch=1, seq=60, dim=1536, rms_on=False, fwd_mode="stream",
         bwd_mode="stream", scale=0.7),
    # fp16 and fp32
    dict(n_blocks=8, partial=True, batch=2, seq=50, dim=512, dtype="float16", scale=1.2),
    dict(n_blocks=5, partial=False, batch=1, seq=140, dim=512, dtype="float32", lnc=2),
]


@pytest.mark.parametrize("case", CASCADES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_forward_caches_backward_cascade(case):
    run_cascade(**case)


@pytest.mark.slow
@pytest.mark.parametrize("lnc", [1, 2])
def test_l128_d2304(lnc):
    run_cascade(n_blocks=127, partial=True, batch=1, seq=128, dim=2304, lnc=lnc)
