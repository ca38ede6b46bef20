"""Block AttnRes NKI kernels in the emulator vs the float64 reference.

Cascade as in PyPTO: kernel forward -> fp32 caches -> kernel backward, each compared with the
float64 golden computed on the same (rounded) inputs. Inputs: randn blocks and grad_h,
proj_weight = randn / sqrt(4 D) (times a spread factor so the softmax is not uniform),
gamma = 1 + noise (non-unit) unless stated.
Tolerances (docs/block_attn_res.md): max|err| / max|ref| <= 1.6e-2 for bf16 tensors
(2e-3 fp16, 1e-5 fp32); fp32 caches <= 1e-5 relative; grad_w / grad_gamma relative L2 <= 1e-2 and
max-relative within the dtype tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd
from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd
from nkilib_msda.experimental.block_attn_res.tiling import plan_backward, plan_forward
from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref
from block_attn_res_cases import make_problem, max_rel, run_cascade, simulate


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
    # forced stream modes (grouped online softmax forward, re-reading backward), RMSNorm on and off,
    # uneven groups (26 = 6 * 4 + 2) and one source per group
    dict(n_blocks=25, partial=True, batch=1, seq=200, dim=512, fwd_group=4, bwd_mode="stream", lnc=2),
    dict(n_blocks=8, partial=True, batch=1, seq=60, dim=1536, rms_on=False, fwd_group=1,
         bwd_mode="stream", scale=0.7),
    dict(n_blocks=10, partial=False, batch=1, seq=100, dim=512, fwd_mode="stream", scale=3.0),
    # D not a multiple of 128 (partial beta column), tiny token count
    dict(n_blocks=3, partial=True, batch=1, seq=50, dim=200, lnc=2, scale=0.6),
    # Kimi K3 width D = 7168 (stream modes chosen by the plan), LNC 2
    dict(n_blocks=8, partial=True, batch=1, seq=128, dim=7168, lnc=2, scale=0.8),
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


@pytest.mark.emulator_only  # reads the emulator's cost report
@pytest.mark.parametrize("n_src,tokens,dim,lnc,dtype", [
    (26, 256, 512, 2, "bfloat16"), (33, 128, 1536, 1, "bfloat16"), (3, 130, 200, 2, "float32")])
def test_sbuf_plan_is_exact(n_src, tokens, dim, lnc, dtype):
    """The plans list every buffer the kernels allocate: the emulator's peaks equal them."""
    values, grad_h, w, gamma, *_ = make_problem(1, n_src, False, 1, tokens, dim, dtype)
    fwd = simulate(block_attn_res_fwd, lnc=lnc, report=True)(values, w, gamma)
    bwd = simulate(block_attn_res_bwd, lnc=lnc, report=True)(grad_h, values, w, fwd[2], gamma, fwd[1])
    fwd_plan = plan_forward(n_src, tokens, dim, dtype, lnc)
    bwd_plan = plan_backward(n_src, tokens, dim, dtype, lnc)
    assert fwd[-1].peak_sbuf_bytes_per_partition == fwd_plan.total_sbuf_bytes
    assert fwd[-1].peak_psum_bytes_per_partition == 0
    assert bwd[-1].peak_sbuf_bytes_per_partition == bwd_plan.total_sbuf_bytes
    assert bwd[-1].peak_psum_bytes_per_partition == 4 * bwd_plan.beta_chunks * bwd_plan.coeff_splits


def test_kernel_contract_errors():
    values, grad_h, w, gamma, *_ = make_problem(2, 2, False, 1, 16, 64, "float32")
    with pytest.raises(ValueError, match="proj_weight: expected an HBM tensor of shape"):
        simulate(block_attn_res_fwd)(values, w[:10], gamma)
    with pytest.raises(ValueError, match="rmsnorm_gamma: expected an HBM tensor of shape"):
        simulate(block_attn_res_fwd)(values, w, None)
    alpha = np.full((16, 2), 0.5, np.float32)
    with pytest.raises(ValueError, match="rms: expected"):
        simulate(block_attn_res_bwd)(grad_h, values, w, alpha, gamma, None)
    with pytest.raises(ValueError, match="grad_h, alpha: expected"):
        simulate(block_attn_res_bwd)(grad_h[:8], values, w, alpha, gamma, alpha)


@pytest.mark.parametrize("fwd_group", [None, 2])
def test_peaked_softmax_stays_finite_and_accurate(fwd_group):
    """Large weights without RMSNorm: scores of several hundred, alpha nearly one-hot. The
    max subtraction (slab) and the running max (groups) keep every exp argument <= 0."""
    values, grad_h, w, _, blocks, _, dh64 = make_problem(5, 6, False, 1, 64, 256, "float32")
    w = (w * 400.0).astype(np.float32)
    fwd = simulate(block_attn_res_fwd)(values, w, None, -1.0, 1e-6, False, None, fwd_group)
    h_ref, _, alpha_ref = block_attn_res_ref(blocks, w, None, -1.0, 1e-6, None, False)
    assert np.median(alpha_ref.max(-1)) > 0.99 and np.all(np.isfinite(fwd[0]))
    np.testing.assert_allclose(fwd[1], alpha_ref.reshape(64, 6), rtol=1e-4, atol=1e-6)
    assert max_rel(fwd[0], h_ref.reshape(64, 256)) <= 1e-5
    bwd = simulate(block_attn_res_bwd)(grad_h, values, w, fwd[1], None, None, -1.0, False)
    g_blocks, _, g_w, _ = block_attn_res_backward_ref(dh64, blocks, w, None, None, -1.0, 1e-6, False)
    assert max_rel(bwd[0], np.stack(g_blocks).reshape(6, 64, 256)) <= 1e-4
    assert max_rel(bwd[1], g_w) <= 1e-3


def test_kernels_import_without_torch():
    import subprocess
    import sys

    code = ("import sys; import nkilib_msda.experimental.block_attn_res as m; "
            "m.block_attn_res_fwd; m.block_attn_res_bwd; import nkilib_msda.reference.block_attn_res; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
