"""Per-level point counts (``num_points=``) and ``multi_scale_deformable_attention_v2``.

The oracle is this file's own float64 transcription of the models' per-level computation
(``grid_sample`` per level with that level's points), independent of the padding.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import nkilib_msda
from nkilib_msda import workloads
from nkilib_msda.pytorch.msda_v2 import multi_scale_deformable_attention_v2

SHAPES = ((4, 6), (3, 2), (5, 4))
COUNTS = (3, 1, 2)


def _inputs(counts=COUNTS, shapes=SHAPES, batch=2, queries=5, heads=2, channels=4, seed=0,
            low=-0.15, high=1.15):
    g = torch.Generator().manual_seed(seed)
    length = sum(h * w for h, w in shapes)
    total = sum(counts)
    value = torch.randn(batch, length, heads, channels, generator=g, dtype=torch.float64)
    loc = low + (high - low) * torch.rand(batch, queries, heads, total, 2, generator=g,
                                          dtype=torch.float64)
    weights = torch.rand(batch, queries, heads, total, generator=g, dtype=torch.float64) + 0.1
    grad = torch.randn(batch, queries, heads * channels, generator=g, dtype=torch.float64)
    return value, loc, weights, grad


def _oracle(value, shapes, loc, weights, counts):
    """float64 per-level grid_sample (align_corners=False, zero padding), packed points."""
    batch, _, heads, channels = value.shape
    queries = loc.shape[1]
    out = value.new_zeros(batch, heads, channels, queries)
    start = point = 0
    for (h, w), count in zip(shapes, counts):
        level = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(batch * heads, channels, h, w)
        grid = 2 * loc[:, :, :, point:point + count] - 1                  # (B, Q, H, P, 2)
        grid = grid.permute(0, 2, 1, 3, 4).reshape(batch * heads, queries, count, 2)
        sampled = F.grid_sample(level, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)                      # (B*H, C, Q, P)
        wl = weights[:, :, :, point:point + count].permute(0, 2, 1, 3).reshape(
            batch * heads, 1, queries, count)
        out += (sampled * wl).sum(-1).view(batch, heads, channels, queries)
        start += h * w
        point += count
    return out.permute(0, 3, 1, 2).reshape(batch, queries, heads * channels)


def _grads(fn, tensors, grad):
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*tensors)
    return out, torch.autograd.grad(out, tensors, grad.to(out.dtype))


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float64), ("nki", torch.float32)])
@pytest.mark.parametrize("counts", [COUNTS, (1, 4, 1), (2, 2, 2)], ids=str)
def test_num_points_matches_per_level_oracle(backend, dtype, counts):
    value, loc, weights, grad = _inputs(counts, seed=sum(counts) + len(backend))
    rounded = [t.to(dtype) for t in (value, loc, weights)]  # the oracle sees the same inputs
    want, want_grads = _grads(lambda v, s, a: _oracle(v, SHAPES, s, a, counts),
                              [t.double() for t in rounded], grad)
    got, got_grads = _grads(lambda v, s, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, s, a, backend=backend, num_points=counts), rounded, grad)
    assert got.shape == want.shape and got.dtype == dtype
    names = workloads.QUANTITIES
    for name, g, w in zip(names, (got, *got_grads), (want, *want_grads)):
        assert g.shape == w.shape, name
        tol = 1e-12 if dtype == torch.float64 else workloads.tolerance(name, "float32")
        result = workloads.compare(name, g, w, tol)
        assert result.max_rel <= tol, (name, result)


def test_uniform_counts_are_a_plain_reshape():
    value, loc, weights, _ = _inputs((2, 2, 2))
    got = nkilib_msda.multi_scale_deformable_attention(value, SHAPES, None, loc, weights,
                                                       num_points=(2, 2, 2))
    want = nkilib_msda.multi_scale_deformable_attention(
        value, SHAPES, None, loc.unflatten(3, (3, 2)), weights.unflatten(3, (3, 2)))
    assert torch.equal(got, want)


def test_b2qhlp_layout():
    value, loc, weights, grad = _inputs()
    want, want_grads = _grads(lambda v, s, a: _oracle(v, SHAPES, s, a, COUNTS),
                              (value, loc, weights), grad)
    got, got_grads = _grads(lambda v, s, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, s.permute(0, 4, 1, 2, 3), a, sampling_locations_layout="B2QHLP",
        num_points=COUNTS), (value, loc, weights), grad)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend,dtype", [("reference", torch.float64), ("nki", torch.float32)])
@pytest.mark.parametrize("padding_mode,align_corners", [("zeros", False), ("zeros", True),
                                                        ("border", False), ("border", True)])
def test_padded_slots_read_nothing_even_next_to_non_finite_values(backend, dtype, padding_mode,
                                                                  align_corners):
    """Real points stay away from row 0 of every level (y = 1: the last row), whose pixels
    (0, 0) and (0, 1) hold NaN and inf: the padded slots (weight 0) must read nothing in any
    mode, so every result is finite and equals the result with those pixels zeroed. (A padded
    slot that reads pixel (0, 0) with weight 0 turns it into NaN: with "border", which clips
    coordinates onto the map, and with align_corners=True on a level of at most 2x2.)"""
    shapes = ((4, 6), (2, 2), (5, 4))
    value, loc, weights, grad = _inputs(shapes=shapes, low=0.8, high=0.95)
    loc[..., 1] = 1.0
    poisoned = value.clone()
    start = 0
    for h, w in shapes:
        poisoned[:, start] = float("nan")
        poisoned[:, start + 1] = float("inf")
        value[:, start:start + 2] = 0.0
        start += h * w

    def run(v, s, a):
        return nkilib_msda.multi_scale_deformable_attention(
            v, shapes, None, s, a, backend=backend, num_points=COUNTS, padding_mode=padding_mode,
            align_corners=align_corners)

    got, grads = _grads(run, [t.to(dtype) for t in (poisoned, loc, weights)], grad)
    want, want_grads = _grads(run, [t.to(dtype) for t in (value, loc, weights)], grad)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for name, g, w in zip(workloads.QUANTITIES[1:], grads, want_grads):
        if name == "grad_value":  # the poisoned pixels' own gradients are 0 in both runs
            g, w = g.nan_to_num(), w.nan_to_num()
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=name)


def test_num_points_errors_name_the_argument():
    value, loc, weights, _ = _inputs()
    f = nkilib_msda.multi_scale_deformable_attention
    with pytest.raises(ValueError, match="num_points: expected one count per level"):
        f(value, SHAPES, None, loc, weights, num_points=(3, 3))
    with pytest.raises(ValueError, match="num_points: expected positive ints"):
        f(value, SHAPES, None, loc, weights, num_points=(3, 0, 3))
    with pytest.raises(TypeError, match="num_points: expected a sequence"):
        f(value, SHAPES, None, loc, weights, num_points=6)
    with pytest.raises(ValueError, match=r"sampling_locations: expected \(B, N_q, N_h, sum"):
        f(value, SHAPES, None, loc, weights, num_points=(2, 2, 3))
    with pytest.raises(ValueError, match="attention_weights: expected"):
        f(value, SHAPES, None, loc, weights[..., :5], num_points=COUNTS)
    with pytest.raises(ValueError, match="sampling_locations_layout"):
        f(value, SHAPES, None, loc, weights, num_points=COUNTS, sampling_locations_layout="X")


def test_meta_tensors_give_shapes():
    value, loc, weights, _ = _inputs()
    out = nkilib_msda.multi_scale_deformable_attention(
        value.to("meta"), SHAPES, None, loc.to("meta"), weights.to("meta"), num_points=COUNTS)
    assert out.shape == (2, 5, 8) and out.is_meta


# ------------------------------------------------------------------ the module


def test_msdeformattn_uniform_tuple_equals_int():
    torch.manual_seed(0)
    a = nkilib_msda.MSDeformAttn(16, 3, 2, 2).double()
    b = nkilib_msda.MSDeformAttn(16, 3, 2, (2, 2, 2)).double()
    assert torch.equal(a.sampling_offsets.bias, b.sampling_offsets.bias)  # same polar grid
    for p in a.parameters():
        torch.nn.init.normal_(p, std=0.3)
    b.load_state_dict(a.state_dict())
    length = sum(h * w for h, w in SHAPES)
    query, x = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, length, 16, dtype=torch.float64)
    for coords in (2, 4):
        ref = torch.rand(2, 5, 3, coords, dtype=torch.float64)
        torch.testing.assert_close(b(query, ref, x, SHAPES, None), a(query, ref, x, SHAPES, None),
                                   rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("coords", [2, 4])
def test_msdeformattn_per_level_points_matches_oracle(coords):
    torch.manual_seed(1)
    m = nkilib_msda.MSDeformAttn(16, 3, 2, COUNTS).double()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    length = sum(h * w for h, w in SHAPES)
    query = torch.randn(2, 5, 16, dtype=torch.float64)
    x = torch.randn(2, length, 16, dtype=torch.float64)
    ref = torch.rand(2, 5, 3, coords, dtype=torch.float64)
    total = sum(COUNTS)
    offsets = m.sampling_offsets(query).view(2, 5, 2, total, 2)
    weights = m.attention_weights(query).view(2, 5, 2, total).softmax(-1)
    level = [lvl for lvl, count in enumerate(COUNTS) for _ in range(count)]
    ref_pp = ref[:, :, level]                                               # (B, Q, sum(P), c)
    if coords == 2:
        wh = torch.tensor([[w, h] for h, w in SHAPES], dtype=torch.float64)[level]
        loc = ref_pp[:, :, None] + offsets / wh
    else:
        per_point = torch.tensor([1.0 / COUNTS[lvl] for lvl in level], dtype=torch.float64)
        loc = ref_pp[:, :, None, :, :2] + offsets * per_point[:, None] * ref_pp[:, :, None, :, 2:] * 0.5
    value = m.value_proj(x).view(2, length, 2, 8)
    want = m.output_proj(_oracle(value, SHAPES, loc, weights, COUNTS))
    torch.testing.assert_close(m(query, ref, x, SHAPES, None), want, rtol=1e-12, atol=1e-12)


def test_msdeformattn_rejects_bad_per_level_points():
    with pytest.raises(ValueError, match="n_points: expected one count per level"):
        nkilib_msda.MSDeformAttn(16, 3, 2, (2, 2))
    with pytest.raises(ValueError, match="n_points: expected positive ints"):
        nkilib_msda.MSDeformAttn(16, 3, 2, (2, 0, 2))
    with pytest.raises(TypeError, match="n_points"):
        nkilib_msda.MSDeformAttn(16, 3, 2, 2.0)


# ------------------------------------------------------- multi_scale_deformable_attention_v2


def _transformers_v2():
    transformers = pytest.importorskip("transformers")
    del transformers
    from transformers.models.d_fine.modeling_d_fine import multi_scale_deformable_attention_v2
    return multi_scale_deformable_attention_v2


@pytest.mark.parametrize("method", ["default", "discrete"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_v2_matches_transformers_function(method, dtype):
    hf_v2 = _transformers_v2()
    value, loc, weights, grad = _inputs(seed=3, low=-0.3, high=1.3)
    # discrete: include exact half-pixel ties and far outside locations
    loc[0, 0, 0, :, 0] = torch.tensor([0.5 / 6, -2.0, 1.0, 7.0, 0.125, 0.5])
    tensors = [t.to(dtype) for t in (value, loc, weights)]
    wrt = [0, 2] if method == "discrete" else [0, 1, 2]

    def run(fn):
        ts = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(tensors)]
        out = fn(*ts)
        return out, torch.autograd.grad(out, [ts[i] for i in wrt], grad.to(dtype))

    want, want_grads = run(lambda v, s, a: hf_v2(v, list(SHAPES), s, a, list(COUNTS), method))
    got, got_grads = run(lambda v, s, a: multi_scale_deformable_attention_v2(
        v, list(SHAPES), s, a, list(COUNTS), method, backend="reference"))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def test_v2_discrete_gives_locations_no_gradient_and_rejects_unknown_methods():
    value, loc, weights, _ = _inputs()
    loc.requires_grad_()
    out = multi_scale_deformable_attention_v2(value, SHAPES, loc, weights, COUNTS, "discrete")
    assert not out.requires_grad
    with pytest.raises(ValueError, match="method: expected one of"):
        multi_scale_deformable_attention_v2(value, SHAPES, loc, weights, COUNTS, "nearest")
    with pytest.raises(ValueError, match="num_points_list"):
        multi_scale_deformable_attention_v2(value, SHAPES, loc, weights, (3, 3), "discrete")
    with pytest.raises(ValueError, match="value: expected"):
        multi_scale_deformable_attention_v2(value[:, 1:], SHAPES, loc, weights, COUNTS, "discrete")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="triton needs a CUDA device")
def test_triton_num_points_matches_oracle():
    value, loc, weights, grad = _inputs(seed=7)
    tensors = [t.float().cuda() for t in (value, loc, weights)]
    want, want_grads = _grads(lambda v, s, a: _oracle(v, SHAPES, s, a, COUNTS),
                              [t.double().cpu() for t in tensors], grad)
    got, got_grads = _grads(lambda v, s, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, s, a, backend="triton", num_points=COUNTS), tensors, grad.cuda())
    for name, g, w in zip(workloads.QUANTITIES, (got, *got_grads), (want, *want_grads)):
        tol = workloads.tolerance(name, "float32")
        assert workloads.compare(name, g.cpu(), w, tol).max_rel <= tol, name


@pytest.mark.slow
def test_compile_fullgraph_with_num_points():
    value, loc, weights, grad = _inputs(seed=8)

    def f(v, s, a):
        return nkilib_msda.multi_scale_deformable_attention(v, SHAPES, None, s, a,
                                                           num_points=COUNTS)

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    got, got_grads = _grads(compiled, (value, loc, weights), grad)
    want, want_grads = _grads(lambda v, s, a: _oracle(v, SHAPES, s, a, COUNTS),
                              (value, loc, weights), grad)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)


@pytest.mark.slow
def test_export_keeps_padding_as_aten_ops_before_the_operator():
    value, loc, weights, _ = _inputs(seed=9)

    class Attention(torch.nn.Module):
        def forward(self, v, s, a):
            return nkilib_msda.multi_scale_deformable_attention(v, SHAPES, None, s, a,
                                                               num_points=COUNTS)

    program = torch.export.export(Attention(), (value, loc, weights))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets[-1] == "nkilib_msda.ms_deformable_attention.default"
    assert "aten.cat.default" in targets
    torch.testing.assert_close(program.module()(value, loc, weights),
                               _oracle(value, SHAPES, loc, weights, COUNTS), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ the registered operators

_FLAT = [d for pair in SHAPES for d in pair]
_STARTS = [0, 24, 30]


def _op_with_counts(layout, counts=COUNTS):
    """The forward operator called with ``num_points`` (locations given packed, BQHLP2)."""
    def call(v, s, a):
        if layout == "B2QHLP":
            s = s.permute(0, 4, 1, 2, 3)
        return torch.ops.nkilib_msda.ms_deformable_attention(
            v, _FLAT, _STARTS, s, a, "BLNC", layout, False, "zeros", "reference", None,
            list(counts))
    return call


@pytest.mark.parametrize("layout", ["BQHLP2", "B2QHLP"])
@pytest.mark.parametrize("counts", [COUNTS, (1, 4, 1), (2, 2, 2)], ids=str)
def test_operator_num_points_matches_per_level_oracle(layout, counts):
    """Padding and unpadding happen inside the operator: forward and the three gradients in
    the packed shapes equal the float64 per-level oracle."""
    value, loc, weights, grad = _inputs(counts, seed=len(layout) + sum(counts))
    want, want_grads = _grads(lambda v, s, a: _oracle(v, SHAPES, s, a, counts),
                              (value, loc, weights), grad)
    got, got_grads = _grads(_op_with_counts(layout, counts), (value, loc, weights), grad)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12)


def test_operator_num_points_backward_operator_and_compute_mask():
    """The backward operator with ``num_points``: gradients in the packed shapes, zeros where
    ``compute`` is False; it equals the functional API's gradients at 1e-10."""
    value, loc, weights, grad = _inputs(seed=21)
    _, want = _grads(lambda v, s, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, s, a, num_points=COUNTS), (value, loc, weights), grad)
    grads = torch.ops.nkilib_msda.ms_deformable_attention_bwd(
        grad, value, _FLAT, _STARTS, loc, weights, "BLNC", "BQHLP2", False, "zeros", "reference",
        [True, False, True], None, list(COUNTS))
    torch.testing.assert_close(grads[0], want[0], rtol=1e-10, atol=1e-12)
    assert grads[1].shape == loc.shape and not grads[1].any()
    torch.testing.assert_close(grads[2], want[2], rtol=1e-10, atol=1e-12)


def test_operator_num_points_fake_kernel_and_opcheck():
    value, loc, weights, grad = _inputs(batch=1, queries=3, seed=22)
    meta = torch.ops.nkilib_msda.ms_deformable_attention(
        value.to("meta"), _FLAT, _STARTS, loc.to("meta"), weights.to("meta"),
        num_points=list(COUNTS))
    assert meta.shape == (1, 3, 8) and meta.is_meta
    args = (value.requires_grad_(), _FLAT, _STARTS, loc.requires_grad_(),
            weights.requires_grad_())
    torch.library.opcheck(torch.ops.nkilib_msda.ms_deformable_attention.default, args,
                          {"num_points": list(COUNTS)})
    torch.library.opcheck(torch.ops.nkilib_msda.ms_deformable_attention_bwd.default,
                          (grad[:1, :3], value.detach(), _FLAT, _STARTS, loc.detach(),
                           weights.detach(), "BLNC", "BQHLP2", False, "zeros", "reference",
                           [True, True, True], None, list(COUNTS)))


def test_operator_num_points_errors_name_the_argument():
    value, loc, weights, _ = _inputs()
    op = torch.ops.nkilib_msda.ms_deformable_attention
    with pytest.raises(ValueError, match="num_points: expected one count per level"):
        op(value, _FLAT, _STARTS, loc, weights, num_points=[3, 3])
    with pytest.raises(ValueError, match=r"sampling_locations: expected \(B, N_q, N_h, sum"):
        op(value, _FLAT, _STARTS, loc, weights, num_points=[2, 2, 3])


def test_num_points_takes_numpy_integers():
    """``num_points`` of NumPy integers (e.g. read from a config array) equals the int tuple."""
    import numpy as np

    value, loc, weights, _ = _inputs()
    f = nkilib_msda.multi_scale_deformable_attention
    want = f(value, SHAPES, None, loc, weights, num_points=COUNTS)
    for counts in (tuple(np.int64(p) for p in COUNTS), np.array(COUNTS, dtype=np.int32),
                   torch.tensor(COUNTS)):
        torch.testing.assert_close(f(value, SHAPES, None, loc, weights, num_points=counts), want,
                                   rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"num_points: expected positive ints, got \[3, 1.0, 2\]"):
        f(value, SHAPES, None, loc, weights, num_points=(3, 1.0, 2))


def test_no_points_names_n_p_and_no_queries_still_works():
    value, loc, weights, _ = _inputs(counts=(1, 1, 1))
    f = nkilib_msda.multi_scale_deformable_attention
    loc6, w5 = loc.unflatten(-2, (3, 1)), weights.unflatten(-1, (3, 1))
    with pytest.raises(ValueError, match=r"^sampling_locations: expected N_p >= 1 in "):
        f(value, SHAPES, None, loc6[..., :0, :], w5[..., :0])
    assert f(value, SHAPES, None, loc6[:, :0], w5[:, :0]).shape == (2, 0, 8)
