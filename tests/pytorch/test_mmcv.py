"""nkilib_msda.mmcv against mmcv's documented behaviour (mmcv itself is not installed here).

The oracles: mmcv's ``multi_scale_deformable_attn_pytorch`` is the package's grid_sample
reference (bilinear ``grid_sample``, align_corners=False, zero padding, one level at a time;
``nkilib_msda.mmcv`` runs the registered op instead), and this file's own transcription of the
module's forward (value projection, padding mask, offsets normalised by (w, h) or scaled by
the box half-size, softmax over levels x points, output projection, dropout, residual). All
comparisons are float64 on fresh random inputs. ``patch_mmcv`` runs against a fake ``mmcv``
package planted in ``sys.modules``.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import nkilib_msda.mmcv as ours
# mmcv's ``multi_scale_deformable_attn_pytorch`` is this formulation: per level, grid_sample of
# the (bs*heads, dims, h, w) map at 2*loc-1 (bilinear, zeros, align_corners=False), weighted sum
# over levels x points.
from nkilib_msda.reference.grid_sample import msda_grid_sample as mmcv_pytorch_reference

SHAPES = ((5, 7), (3, 4), (2, 2), (1, 1))  # non-square levels, a 1x1 level


def _starts(shapes):
    starts, total = [], 0
    for h, w in shapes:
        starts.append(total)
        total += h * w
    return starts, total


def _inputs(bs=2, nq=6, heads=2, dims=4, points=3, shapes=SHAPES, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    _, total = _starts(shapes)
    value = torch.randn(bs, total, heads, dims, dtype=torch.float64, generator=g)
    loc = torch.rand(bs, nq, heads, len(shapes), points, 2, dtype=torch.float64, generator=g) * 1.2 - 0.1
    attn = torch.rand(bs, nq, heads, len(shapes), points, dtype=torch.float64, generator=g)
    return [t.requires_grad_(requires_grad) for t in (value, loc, attn)]


def _assert_close(got, want, tol=1e-12):
    scale = max(want.abs().max().item(), 1e-300)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= tol * scale, (got - want).abs().max().item()


# ----------------------------------------------------------------------------- function and op


@pytest.mark.parametrize("shapes_as", ["tensor", "tuple"])
def test_function_and_pytorch_path_match_mmcv_forward_and_gradients(shapes_as):
    value, loc, attn = _inputs(requires_grad=True, seed=1)
    shapes_t = torch.tensor(SHAPES)
    starts = torch.tensor(_starts(SHAPES)[0])
    shapes = shapes_t if shapes_as == "tensor" else SHAPES
    grad_out = torch.randn(2, 6, 8, dtype=torch.float64)
    want = mmcv_pytorch_reference(value, shapes_t, loc, attn)
    want_grads = torch.autograd.grad(want, (value, loc, attn), grad_out)
    for got in (ours.MultiScaleDeformableAttnFunction.apply(value, shapes, starts, loc, attn, 64),
                ours.multi_scale_deformable_attn_pytorch(value, shapes, loc, attn)):
        _assert_close(got, want)
        for g, w in zip(torch.autograd.grad(got, (value, loc, attn), grad_out), want_grads):
            _assert_close(g, w, 1e-10)


def test_function_any_batch_and_im2col_step_as_tensor():
    value, loc, attn = _inputs(bs=3, seed=2)  # mmcv's CUDA op needs bs % im2col_step == 0
    got = ours.MultiScaleDeformableAttnFunction.apply(value, torch.tensor(SHAPES),
                                                      torch.tensor(_starts(SHAPES)[0]), loc, attn,
                                                      torch.tensor(2))
    _assert_close(got, mmcv_pytorch_reference(value, torch.tensor(SHAPES), loc, attn))


def test_function_casts_weights_to_value_dtype_like_mmcv():
    value, loc, attn = _inputs(seed=3)
    got = ours.MultiScaleDeformableAttnFunction.apply(value.float(), torch.tensor(SHAPES),
                                                      torch.tensor(_starts(SHAPES)[0]), loc.float(),
                                                      attn, 64)
    assert got.dtype == torch.float32
    _assert_close(got.double(), mmcv_pytorch_reference(value, torch.tensor(SHAPES), loc, attn), 1e-5)


def test_gradcheck_tiny():
    shapes = ((3, 2), (1, 2))
    value, loc, attn = _inputs(bs=1, nq=2, heads=1, dims=2, points=2, shapes=shapes, seed=4,
                               requires_grad=True)
    with torch.no_grad():
        loc.clamp_(0.05, 0.95)  # keep samples off the pixel grid's kinks
    torch.autograd.gradcheck(lambda v, l, a: ours.multi_scale_deformable_attn_pytorch(v, shapes, l, a),
                             (value, loc, attn))


# ----------------------------------------------------------------------------- the module


def mmcv_init_transcription(heads, levels, points):
    """mmcv's sampling_offsets bias: unit-max-norm directions, repeated, ring i scaled by i+1."""
    thetas = torch.arange(heads, dtype=torch.float32) * (2.0 * math.pi / heads)
    grid = torch.stack([thetas.cos(), thetas.sin()], -1)
    grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(heads, 1, 1, 2).repeat(1, levels, points, 1)
    for i in range(points):
        grid[:, :, i, :] *= i + 1
    return grid.view(-1)


def mmcv_module_transcription(m, query, value, identity, query_pos, key_padding_mask, reference_points,
                              spatial_shapes, batch_first):
    """mmcv's MultiScaleDeformableAttention.forward, in eval mode (dropout is identity)."""
    value = query if value is None else value
    identity = query if identity is None else identity  # the query before query_pos is added
    query = query if query_pos is None else query + query_pos
    if not batch_first:  # (num_query, bs, C) -> (bs, num_query, C)
        query, value = query.transpose(0, 1), value.transpose(0, 1)
    bs, nq, _ = query.shape
    nv = value.shape[1]
    value = F.linear(value, m["value_proj.weight"], m["value_proj.bias"])
    if key_padding_mask is not None:
        value = value.masked_fill(key_padding_mask[..., None], 0.0)
    heads, levels = m["heads"], spatial_shapes.shape[0]
    value = value.view(bs, nv, heads, -1)
    off = F.linear(query, m["sampling_offsets.weight"], m["sampling_offsets.bias"]).view(
        bs, nq, heads, levels, -1, 2)
    points = off.shape[4]
    attn = F.linear(query, m["attention_weights.weight"], m["attention_weights.bias"]).view(
        bs, nq, heads, levels * points).softmax(-1).view(bs, nq, heads, levels, points)
    if reference_points.shape[-1] == 2:
        norm = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
        loc = reference_points[:, :, None, :, None, :] + off / norm[None, None, None, :, None, :]
    else:
        loc = (reference_points[:, :, None, :, None, :2]
               + off / points * reference_points[:, :, None, :, None, 2:] * 0.5)
    out = mmcv_pytorch_reference(value, spatial_shapes, loc, attn)
    out = F.linear(out, m["output_proj.weight"], m["output_proj.bias"])
    if not batch_first:
        out = out.permute(1, 0, 2)
    return out + identity


MMCV_KEYS = {f"{layer}.{p}" for layer in ("sampling_offsets", "attention_weights", "value_proj", "output_proj")
             for p in ("weight", "bias")}


def _random_mmcv_state_dict(embed, heads, levels, points, ratio=1.0, seed=0):
    """A state dict shaped like an mmcv checkpoint's, with random (trained-looking) values."""
    g = torch.Generator().manual_seed(seed)
    proj = int(embed * ratio)
    shapes = {"sampling_offsets": (heads * levels * points * 2, embed),
              "attention_weights": (heads * levels * points, embed),
              "value_proj": (proj, embed), "output_proj": (embed, proj)}
    sd = {}
    for name, (out_f, in_f) in shapes.items():
        sd[f"{name}.weight"] = torch.randn(out_f, in_f, dtype=torch.float64, generator=g) / math.sqrt(in_f)
        sd[f"{name}.bias"] = torch.randn(out_f, dtype=torch.float64, generator=g) * 0.1
    return sd


def test_module_parameters_and_initialisation_are_mmcv_s():
    torch.manual_seed(0)
    m = ours.MultiScaleDeformableAttention(embed_dims=32, num_heads=4, num_levels=3, num_points=5,
                                           value_proj_ratio=0.5)
    assert set(m.state_dict()) == MMCV_KEYS
    assert tuple(m.value_proj.weight.shape) == (16, 32) and tuple(m.output_proj.weight.shape) == (32, 16)
    assert (m.im2col_step, m.batch_first, m.dropout.p) == (64, False, 0.1)
    torch.testing.assert_close(m.sampling_offsets.bias.detach(), mmcv_init_transcription(4, 3, 5),
                               rtol=0, atol=0)
    assert not m.sampling_offsets.weight.any() and not m.attention_weights.weight.any()
    assert not m.attention_weights.bias.any() and not m.value_proj.bias.any() and not m.output_proj.bias.any()
    bound = math.sqrt(6 / (32 + 16))  # xavier_uniform, gain 1
    assert m.value_proj.weight.abs().max() <= bound and m.value_proj.weight.std() > bound / 4
    defaults = ours.MultiScaleDeformableAttention()
    assert (defaults.embed_dims, defaults.num_heads, defaults.num_levels, defaults.num_points) == (256, 8, 4, 4)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("ref_dims", [2, 4])
@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_module_loads_mmcv_checkpoint_and_matches_mmcv_forward_and_gradients(batch_first, ref_dims, ratio):
    embed, heads, points, levels = 16, 2, 3, len(SHAPES)
    sd = _random_mmcv_state_dict(embed, heads, levels, points, ratio, seed=ref_dims)
    m = ours.MultiScaleDeformableAttention(embed, heads, levels, points, dropout=0.3,
                                           batch_first=batch_first, value_proj_ratio=ratio).double()
    m.load_state_dict(sd, strict=True)
    m.eval()
    g = torch.Generator().manual_seed(10 + ref_dims)
    bs, nq = 2, 5
    _, nv = _starts(SHAPES)
    seq = (lambda n: (bs, n, embed)) if batch_first else (lambda n: (n, bs, embed))
    query = torch.randn(*seq(nq), dtype=torch.float64, generator=g, requires_grad=True)
    value = torch.randn(*seq(nv), dtype=torch.float64, generator=g, requires_grad=True)
    query_pos = torch.randn(*seq(nq), dtype=torch.float64, generator=g)
    identity = torch.randn(*seq(nq), dtype=torch.float64, generator=g)
    ref = torch.rand(bs, nq, levels, ref_dims, dtype=torch.float64, generator=g)
    mask = torch.rand(bs, nv, generator=g) < 0.3
    shapes_t, starts_t = torch.tensor(SHAPES), torch.tensor(_starts(SHAPES)[0])
    sd["heads"] = heads

    for kwargs in (dict(identity=identity, query_pos=query_pos, key_padding_mask=mask),
                   dict()):  # identity None -> the query before query_pos
        got = m(query, None, value, reference_points=ref, spatial_shapes=shapes_t,
                level_start_index=starts_t, **kwargs)
        want = mmcv_module_transcription(sd, query, value, kwargs.get("identity"), kwargs.get("query_pos"),
                                         kwargs.get("key_padding_mask"), ref, shapes_t, batch_first)
        _assert_close(got, want)
        grad_out = torch.randn_like(want)
        params = [query, value, *m.parameters()]
        got_grads = torch.autograd.grad(got, params, grad_out)
        want_grads = torch.autograd.grad(
            mmcv_module_transcription({**dict(m.named_parameters()), "heads": heads}, query, value,
                                      kwargs.get("identity"), kwargs.get("query_pos"),
                                      kwargs.get("key_padding_mask"), ref, shapes_t, batch_first),
            params, grad_out)
        for gg, ww in zip(got_grads, want_grads):
            _assert_close(gg, ww, 1e-10)
    assert set(m.state_dict()) == MMCV_KEYS  # round trip keeps mmcv's names
    m2 = ours.MultiScaleDeformableAttention(embed, heads, levels, points, value_proj_ratio=ratio).double()
    m2.load_state_dict(m.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))


def test_module_value_defaults_to_query_and_residual_is_identity():
    torch.manual_seed(1)
    shapes = ((2, 3), (1, 2))
    m = ours.MultiScaleDeformableAttention(8, 2, 2, 2, batch_first=True).double().eval()
    query = torch.randn(1, 8, 8, dtype=torch.float64)  # self-attention: num_query = sum(h*w)
    ref = torch.rand(1, 8, 2, 2, dtype=torch.float64)
    base = m(query, reference_points=ref, spatial_shapes=torch.tensor(shapes))
    explicit = m(query, value=query, identity=query, reference_points=ref, spatial_shapes=shapes)
    torch.testing.assert_close(base, explicit, rtol=0, atol=0)
    other = torch.randn_like(query)
    with pytest.warns(DeprecationWarning, match="residual"):
        via_residual = m(query, reference_points=ref, spatial_shapes=shapes, residual=other)
    torch.testing.assert_close(via_residual - other, base - query, rtol=1e-12, atol=1e-12)


def test_module_dropout_in_training_applies_to_the_attention_output_only():
    torch.manual_seed(2)
    m = ours.MultiScaleDeformableAttention(8, 2, 1, 2, dropout=0.5, batch_first=True).double()
    sd = _random_mmcv_state_dict(8, 2, 1, 2, seed=3)
    m.load_state_dict(sd)
    query = torch.randn(2, 6, 8, dtype=torch.float64)
    ref = torch.rand(2, 6, 1, 2, dtype=torch.float64)
    identity = torch.randn(2, 6, 8, dtype=torch.float64)
    clean = m.eval()(query, identity=identity, reference_points=ref, spatial_shapes=((2, 3),)) - identity
    torch.manual_seed(5)
    dropped = m.train()(query, identity=identity, reference_points=ref, spatial_shapes=((2, 3),)) - identity
    kept = dropped != 0
    assert 0 < kept.sum() < kept.numel()  # some outputs dropped, some kept
    torch.testing.assert_close(dropped[kept], 2 * clean[kept], rtol=1e-12, atol=1e-12)


def test_module_gradcheck_tiny():
    torch.manual_seed(3)
    m = ours.MultiScaleDeformableAttention(4, 2, 2, 1, dropout=0.0, batch_first=True).double()
    m.load_state_dict(_random_mmcv_state_dict(4, 2, 2, 1, seed=4))
    shapes = ((2, 2), (1, 2))
    ref = torch.rand(1, 2, 2, 2, dtype=torch.float64) * 0.6 + 0.2
    value = torch.randn(1, 6, 4, dtype=torch.float64, requires_grad=True)
    query = torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda q, v: m(q, value=v, reference_points=ref, spatial_shapes=shapes),
                             (query, value))


def test_module_errors_name_the_argument():
    m = ours.MultiScaleDeformableAttention(8, 2, 2, 2, batch_first=True)
    q = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="reference_points"):
        m(q, value=torch.randn(1, 8, 8), reference_points=torch.rand(1, 3, 2, 3), spatial_shapes=((2, 3), (1, 2)))
    with pytest.raises(ValueError, match="spatial_shapes"):
        m(q, value=torch.randn(1, 9, 8), reference_points=torch.rand(1, 3, 2, 2), spatial_shapes=((2, 3), (1, 2)))
    with pytest.raises(ValueError, match="embed_dims"):
        ours.MultiScaleDeformableAttention(10, 4)
    with pytest.raises(ValueError, match=r"^num_points: expected a positive int, got 2\.0 \(float\)$"):
        ours.MultiScaleDeformableAttention(8, 2, 2, 2.0)


# ----------------------------------------------------------------------------- patch_mmcv

_FAKE_MMCV_SOURCE = '''
import torch
from torch.autograd import Function

class MultiScaleDeformableAttnFunction(Function):
    """Stands in for mmcv's compiled op: counts its calls."""
    calls = 0

    @staticmethod
    def forward(ctx, value, shapes, starts, loc, attn, im2col_step):
        MultiScaleDeformableAttnFunction.calls += 1
        return TRANSCRIPTION(value, shapes, loc, attn)

def multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    multi_scale_deformable_attn_pytorch.calls += 1
    return TRANSCRIPTION(value, value_spatial_shapes, sampling_locations, attention_weights)
multi_scale_deformable_attn_pytorch.calls = 0

class MultiScaleDeformableAttention(torch.nn.Module):
    """The part of mmcv's module forward that picks the op (looked up as module globals)."""
    def forward(self, value, spatial_shapes, level_start_index, loc, attn, use_cuda_path=False):
        if use_cuda_path:
            return MultiScaleDeformableAttnFunction.apply(value, spatial_shapes, level_start_index, loc, attn, 64)
        return multi_scale_deformable_attn_pytorch(value, spatial_shapes, loc, attn)
'''


@pytest.fixture
def fake_mmcv(monkeypatch):
    """mmcv, mmcv.ops (re-exporting), mmcv.ops.multi_scale_deform_attn and a downstream project
    module that copied the function with ``from ... import`` (as BEVFormer does)."""
    msda = types.ModuleType(ours.MMCV_MODULE)
    msda.TRANSCRIPTION = mmcv_pytorch_reference
    exec(_FAKE_MMCV_SOURCE, vars(msda))  # noqa: S102
    ops = types.ModuleType("mmcv.ops")
    for name in ("MultiScaleDeformableAttnFunction", "multi_scale_deformable_attn_pytorch",
                 "MultiScaleDeformableAttention"):
        setattr(ops, name, getattr(msda, name))
    ops.multi_scale_deform_attn = msda
    mmcv = types.ModuleType("mmcv")
    mmcv.ops = ops
    project = types.ModuleType("fake_bevformer_sca")
    project.multi_scale_deformable_attn_pytorch = msda.multi_scale_deformable_attn_pytorch
    for name, module in (("mmcv", mmcv), ("mmcv.ops", ops), (ours.MMCV_MODULE, msda),
                         ("fake_bevformer_sca", project)):
        monkeypatch.setitem(sys.modules, name, module)
    yield msda, ops, project
    ours.unpatch_mmcv()


def test_patch_mmcv_routes_function_op_and_module_through_nkilib(fake_mmcv, monkeypatch):
    msda, ops, project = fake_mmcv
    original_fn, original_op = msda.multi_scale_deformable_attn_pytorch, msda.MultiScaleDeformableAttnFunction
    layer = msda.MultiScaleDeformableAttention()  # built before the patch
    value, loc, attn = _inputs(seed=7)
    shapes, starts = torch.tensor(SHAPES), torch.tensor(_starts(SHAPES)[0])
    want = mmcv_pytorch_reference(value, shapes, loc, attn)

    calls = []
    real = ours.multi_scale_deformable_attention
    monkeypatch.setattr(ours, "multi_scale_deformable_attention",
                        lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k))
    assert ours.patch_mmcv(backend="reference") == 5  # 2 in the op module, 2 re-exports, 1 copy
    for module in (msda, ops):
        assert module.MultiScaleDeformableAttnFunction is not original_op
        assert module.multi_scale_deformable_attn_pytorch is not original_fn
    assert ops.MultiScaleDeformableAttention is msda.MultiScaleDeformableAttention  # the module stays mmcv's

    outs = [layer(value, shapes, starts, loc, attn), layer(value, shapes, starts, loc, attn, use_cuda_path=True),
            ops.multi_scale_deformable_attn_pytorch(value, shapes, loc, attn),
            project.multi_scale_deformable_attn_pytorch(value, shapes, loc, attn),
            ops.MultiScaleDeformableAttnFunction.apply(value, shapes, starts, loc, attn, 64)]
    assert calls == ["reference"] * 5
    assert original_op.calls == 0 and original_fn.calls == 0
    for out in outs:
        _assert_close(out, want)

    assert ours.patch_mmcv() == 5  # patch again (automatic backend): replaces the first patch
    calls.clear()
    project.multi_scale_deformable_attn_pytorch(value, shapes, loc, attn)
    assert calls == [None]

    assert ours.unpatch_mmcv() == 5
    assert msda.multi_scale_deformable_attn_pytorch is original_fn and ops.MultiScaleDeformableAttnFunction is original_op
    assert project.multi_scale_deformable_attn_pytorch is original_fn
    layer(value, shapes, starts, loc, attn)
    assert original_fn.calls == 1


def test_patch_mmcv_without_mmcv_raises_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mmcv", None)  # import mmcv -> ImportError
    with pytest.raises(ImportError, match="patch_mmcv: cannot import mmcv.ops.multi_scale_deform_attn"):
        ours.patch_mmcv()


def test_patch_mmcv_rejects_a_non_string_backend(fake_mmcv):
    with pytest.raises(TypeError, match="backend"):
        ours.patch_mmcv(backend=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_first", [True, False])
def test_module_batch_size_zero_gives_an_empty_output(batch_first):
    m = ours.MultiScaleDeformableAttention(8, 2, 2, 2, batch_first=batch_first)
    shapes = ((2, 3), (1, 2))
    query = torch.randn(0, 3, 8) if batch_first else torch.randn(3, 0, 8)
    value = torch.randn(0, 8, 8) if batch_first else torch.randn(8, 0, 8)
    out = m(query, value=value, reference_points=torch.rand(0, 3, 2, 2), spatial_shapes=shapes)
    assert out.shape == query.shape


@pytest.mark.parametrize("kwargs,error,needle", [
    ({"dropout": float("nan")}, ValueError, "dropout: expected a probability in [0, 1], got nan (float)"),
    ({"dropout": 1.5}, ValueError, "dropout: expected a probability in [0, 1], got 1.5 (float)"),
    ({"dropout": "0.1"}, ValueError, "dropout: expected a probability in [0, 1], got '0.1' (str)"),
    ({"value_proj_ratio": "1"}, ValueError,
     "value_proj_ratio: expected a finite positive number, got '1' (str)"),
    ({"value_proj_ratio": float("inf")}, ValueError,
     "value_proj_ratio: expected a finite positive number, got inf (float)"),
    ({"backend": "bogus"}, ValueError, "backend: expected None or one of ['auto', 'reference', 'nki', "
                                       "'triton'], got 'bogus'"),
    ({"backend": 3}, TypeError, "backend: expected None or one of"),
])
def test_module_constructor_rejects_bad_options_naming_them(kwargs, error, needle):
    """Bad options fail in the constructor, with one line that names the argument (they used to
    be accepted, or fail late, or with a message about something else)."""
    with pytest.raises(error) as info:
        ours.MultiScaleDeformableAttention(8, 2, **kwargs)
    message = str(info.value)
    assert message.startswith(needle) and "\n" not in message, message
