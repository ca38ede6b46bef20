"""Block AttnRes with RMSNorm is right for inputs up to the fp32 range.

RMSNorm squares its input, and v*v overflows fp32 for |v| > 1.8e19. The NumPy reference, the
torch `reference` backend and the NKI forward kernel scale each row before squaring, so h, rms
and alpha are right for any finite fp32/bf16 input (docs/block_attn_res.md, "Numerical range").

The oracle for a scaled input k*v (k a power of two, so the scaling is exact) is the float64
reference on v itself: r(k v, eps) = k r(v, eps / k^2), alpha(k v) = alpha(v), h(k v) = k h(v).
"""

from __future__ import annotations

import numpy as np
import pytest

from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref
from nkilib_msda.workloads import max_relative_error

torch = pytest.importorskip("torch")

from nkilib_msda import (  # noqa: E402
    block_attn_res, block_attn_res_backward)

B, T, N, D, EPS = 1, 6, 3, 64, 1e-6
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def _inputs(seed: int, dtype: torch.dtype, k: float):
    """Blocks and partial block with entries k * N(0, 1) (rounded to dtype), w, gamma."""
    g = torch.Generator().manual_seed(seed)
    unit = [torch.randn(B, T, D, generator=g).to(dtype) for _ in range(N + 1)]
    w = (torch.randn(D, generator=g) / (4 * D) ** 0.5).to(dtype)
    gamma = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    scaled = [x * k for x in unit]  # exact: k is a power of two
    assert all(bool(x.isfinite().all()) for x in scaled)
    return unit, scaled, w, gamma


def _np(x):
    return x.double().numpy()


def _rel(got, ref) -> float:
    return max_relative_error(got, ref)


@pytest.mark.parametrize("k", [2.0 ** 70, 2.0 ** 100, 2.0 ** 125])
def test_reference_is_scale_consistent(k):
    unit, scaled, w, gamma = _inputs(0, torch.float32, k)
    h1, r1, a1 = block_attn_res_ref([_np(x) for x in unit[:N]], _np(w), _np(unit[N]),
                                    rmsnorm_eps=EPS / k ** 2, rmsnorm_gamma=_np(gamma))
    with np.errstate(all="raise"):
        hk, rk, ak = block_attn_res_ref([_np(x) for x in scaled[:N]], _np(w), _np(scaled[N]),
                                        rmsnorm_eps=EPS, rmsnorm_gamma=_np(gamma))
    np.testing.assert_allclose(hk, k * h1, rtol=1e-12, atol=0)
    np.testing.assert_allclose(rk, k * r1, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ak, a1, rtol=1e-12, atol=1e-300)


def test_reference_float64_beyond_fp32_range():
    """float64 inputs near 1e300 (their squares overflow float64)."""
    unit, _, w, gamma = _inputs(1, torch.float64, 1.0)
    k = 2.0 ** 1000
    h1, r1, a1 = block_attn_res_ref([_np(x) for x in unit[:N]], _np(w), _np(unit[N]),
                                    rmsnorm_eps=0.0, rmsnorm_gamma=_np(gamma))
    with np.errstate(all="raise"):
        hk, rk, ak = block_attn_res_ref([k * _np(x) for x in unit[:N]], _np(w), k * _np(unit[N]),
                                        rmsnorm_eps=EPS, rmsnorm_gamma=_np(gamma))
    np.testing.assert_allclose(hk / k, h1, rtol=1e-12)
    np.testing.assert_allclose(rk / k, r1, rtol=1e-12)
    np.testing.assert_allclose(ak, a1, rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "nki"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1.0, 2.0 ** 64, 2.0 ** 125])
def test_forward_up_to_the_fp32_range(monkeypatch, backend, dtype, k):
    monkeypatch.delenv("NKILIB_MSDA_BACKEND", raising=False)
    unit, scaled, w, gamma = _inputs(2, dtype, k)
    h, rms, alpha = block_attn_res(scaled[:N], w, scaled[N], rmsnorm_eps=EPS, rmsnorm_gamma=gamma,
                                   rms_out_flag=True, alpha_out_flag=True, backend=backend)
    # oracle: the float64 reference on the unit-scale inputs, eps / k^2
    h1, r1, a1 = block_attn_res_ref([_np(x) for x in unit[:N]], _np(w), _np(unit[N]),
                                    rmsnorm_eps=EPS / k ** 2, rmsnorm_gamma=_np(gamma))
    for name, t in (("h", h), ("rms", rms), ("alpha", alpha)):
        assert bool(t.float().isfinite().all()), f"{name} is not finite at |v| ~ {k:.1e}"
    assert _rel(h.double() / k, h1) <= TOL[dtype]
    assert _rel(rms.double() / k, r1) <= 1e-5
    assert _rel(alpha.double(), a1) <= 1e-5


@pytest.mark.parametrize("backend", ["reference", "nki"])
@pytest.mark.parametrize("k", [2.0 ** 64, 2.0 ** 100])
def test_backward_at_large_inputs(monkeypatch, backend, k):
    """The backward takes rms from the forward's cache and never squares v; its gradients are
    right while they and |v| * sum|u| fit in fp32 (here |v| ~ 1e30)."""
    monkeypatch.delenv("NKILIB_MSDA_BACKEND", raising=False)
    dtype = torch.float32
    unit, scaled, w, gamma = _inputs(3, dtype, k)
    g = torch.Generator().manual_seed(4)
    grad_h = torch.randn(B, T, D, generator=g)
    _, rms, alpha = block_attn_res(scaled[:N], w, scaled[N], rmsnorm_eps=EPS, rmsnorm_gamma=gamma,
                                   rms_out_flag=True, alpha_out_flag=True, backend=backend)
    grads = block_attn_res_backward(grad_h, scaled[:N], w, alpha, scaled[N], rmsnorm_gamma=gamma,
                                    rms_cache=rms, backend=backend)
    refs = block_attn_res_backward_ref(_np(grad_h), [_np(x) for x in scaled[:N]], _np(w),
                                       _np(scaled[N]), rmsnorm_gamma=_np(gamma), rmsnorm_eps=EPS)
    got = [*grads[0], grads[1], grads[2], grads[3]]
    want = [*refs[0], refs[1], refs[2], refs[3]]
    for i, (a, b) in enumerate(zip(got, want)):
        assert bool(a.isfinite().all()), i
        assert _rel(a.double().numpy(), b) <= 1e-4, (i, _rel(a.double().numpy(), b))


def test_reference_raises_no_numpy_floating_point_errors():
    """Under np.seterr(all="raise"): scores so far apart that exp underflows, tiny and zero
    blocks, and NaN / inf inputs (which propagate to the results instead of warning)."""
    unit, _, w, gamma = _inputs(5, torch.float64, 1.0)
    blocks = [_np(x) for x in unit[:N]]
    blocks[0] = blocks[0] * 1e-200
    blocks[1] = np.zeros_like(blocks[1])
    big_w = _np(w) * 1e4  # |z| ~ 1e4: exp(z - max) underflows to 0
    old = np.seterr(all="raise")
    try:
        h, rms, alpha = block_attn_res_ref(blocks, big_w, _np(unit[N]), rmsnorm_gamma=_np(gamma))
        grads = block_attn_res_backward_ref(np.ones(h.shape), blocks, big_w, _np(unit[N]),
                                            rmsnorm_gamma=_np(gamma))
        assert np.isfinite(h).all() and np.isfinite(alpha).all() and (alpha >= 0).all()
        assert all(np.isfinite(g).all() for g in [*grads[0], *grads[1:]])
        np.testing.assert_allclose(rms[:, :, 1, 0], np.sqrt(1e-6))  # zero block: r = sqrt(eps)
        bad = [b.copy() for b in blocks]
        bad[2][0, 0, 0] = np.nan
        bad[2][0, 1, 0] = np.inf
        h_bad, _, _ = block_attn_res_ref(bad, _np(w), _np(unit[N]), rmsnorm_gamma=_np(gamma))
        assert np.isnan(h_bad[0, 0]).all() and not np.isfinite(h_bad[0, 1]).all()
        np.testing.assert_array_equal(np.isfinite(h_bad[0, 2:]), True)  # other tokens unaffected
    finally:
        np.seterr(**old)
