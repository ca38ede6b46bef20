"""The float64 reference: forward formulas and finite-difference checks of the backward."""

from __future__ import annotations

import numpy as np
import pytest

from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref

CASES = [  # (n_blocks, with_partial, enable_rmsnorm, scale)
    (3, True, True, 1.0),
    (2, False, True, 0.7),
    (1, False, True, 1.3),
    (3, True, False, 0.5),
    (1, True, False, 1.0),
]


def _problem(rng, n_blocks, with_partial, b=2, t=3, d=5):
    blocks = [rng.standard_normal((b, t, d)) for _ in range(n_blocks)]
    partial = rng.standard_normal((b, t, d)) if with_partial else None
    w = rng.standard_normal(d)
    gamma = 1.0 + 0.5 * rng.standard_normal(d)
    return blocks, partial, w, gamma


def _loss(grad_h, blocks, partial, w, gamma, scale, rms_on):
    h, _, _ = block_attn_res_ref(blocks, w, partial, scale=scale, rmsnorm_gamma=gamma,
                                 enable_rmsnorm=rms_on)
    return float(np.sum(h * grad_h))


def _central_difference(f, x, step=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + step
        plus = f()
        x[i] = old - step
        minus = f()
        x[i] = old
        grad[i] = (plus - minus) / (2 * step)
    return grad


@pytest.mark.parametrize("n_blocks,with_partial,rms_on,scale", CASES)
def test_backward_matches_finite_differences(n_blocks, with_partial, rms_on, scale):
    rng = np.random.default_rng(n_blocks * 10 + int(with_partial) + 2 * int(rms_on))
    blocks, partial, w, gamma = _problem(rng, n_blocks, with_partial)
    grad_h = rng.standard_normal(blocks[0].shape)
    g_blocks, g_partial, g_w, g_gamma = block_attn_res_backward_ref(
        grad_h, blocks, w, partial, rmsnorm_gamma=gamma, scale=scale, enable_rmsnorm=rms_on)

    def f():
        return _loss(grad_h, blocks, partial, w, gamma, scale, rms_on)

    for blk, g in zip(blocks, g_blocks):
        np.testing.assert_allclose(g, _central_difference(f, blk), rtol=1e-7, atol=1e-8)
    if with_partial:
        np.testing.assert_allclose(g_partial, _central_difference(f, partial), rtol=1e-7, atol=1e-8)
    else:
        assert g_partial is None
    np.testing.assert_allclose(g_w, _central_difference(f, w), rtol=1e-7, atol=1e-8)
    if rms_on:
        np.testing.assert_allclose(g_gamma, _central_difference(f, gamma), rtol=1e-7, atol=1e-8)
    else:
        assert g_gamma is None


def test_forward_matches_direct_formula():
    rng = np.random.default_rng(7)
    blocks, partial, w, gamma = _problem(rng, 4, True, b=1, t=2, d=6)
    eps, scale = 1e-3, 0.8
    h, rms, alpha = block_attn_res_ref(blocks, w, partial, scale=scale, rmsnorm_eps=eps,
                                       rmsnorm_gamma=gamma)
    sources = [*blocks, partial]
    assert rms.shape == (1, 2, 5, 1) and alpha.shape == (1, 2, 5) and h.shape == (1, 2, 6)
    for b in range(1):
        for t in range(2):
            rows = [s[b, t] for s in sources]
            r = [np.sqrt(np.mean(x ** 2) + eps) for x in rows]
            z = np.array([scale * np.dot(x / ri * gamma, w) for x, ri in zip(rows, r)])
            a = np.exp(z) / np.exp(z).sum()
            np.testing.assert_allclose(rms[b, t, :, 0], r, rtol=1e-14)
            np.testing.assert_allclose(alpha[b, t], a, rtol=1e-12)
            np.testing.assert_allclose(h[b, t], sum(ai * x for ai, x in zip(a, rows)), rtol=1e-12)


def test_zero_weight_gives_uniform_average_and_no_partial_means_l_equals_n():
    rng = np.random.default_rng(3)
    blocks, _, w, gamma = _problem(rng, 3, False)
    h, rms, alpha = block_attn_res_ref(blocks, np.zeros_like(w), rmsnorm_gamma=gamma)
    assert alpha.shape[-1] == 3 and rms.shape[-2] == 3
    np.testing.assert_allclose(alpha, 1.0 / 3.0, rtol=1e-15)
    np.testing.assert_allclose(h, sum(blocks) / 3.0, rtol=1e-12, atol=1e-15)


def test_large_scores_do_not_overflow():
    rng = np.random.default_rng(5)
    blocks, partial, w, gamma = _problem(rng, 2, True)
    h, _, alpha = block_attn_res_ref(blocks, 1e4 * w, partial, enable_rmsnorm=False)
    assert np.all(np.isfinite(h)) and np.all(np.isfinite(alpha))
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-12)


def test_rms_off_returns_no_rms():
    rng = np.random.default_rng(4)
    blocks, partial, w, _ = _problem(rng, 2, True)
    _, rms, _ = block_attn_res_ref(blocks, w, partial, enable_rmsnorm=False)
    assert rms is None
