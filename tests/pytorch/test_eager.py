"""The low-overhead eager path: memoized validation, direct backend calls, cached normalizer.

These guard the semantics the fast path relies on (no timing assertions): a cached validation
still rejects anything the full validation rejects, with the same message; the direct path and
the registered operators give bitwise the same outputs and gradients; the operators are still
what runs under tracing, modes, transforms and tensor subclasses.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nkilib_msda
from nkilib_msda.pytorch import eager, ops  # noqa: F401 - ops registers the operators
from nkilib_msda.pytorch.problem_cache import (clear_problem_cache, spatial_shapes_tuple,
                                               validated_problem)
from nkilib_msda.validation.msda import normalize_spatial_shapes, validate_msda_args
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention
FWD = torch.ops.nkilib_msda.ms_deformable_attention
SHAPES = ((4, 6), (3, 2), (1, 1))  # make_inputs' default, L = 31


def _full_error(*args, **kwargs) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as info:
        validate_msda_args(*args, **kwargs)
    return type(info.value), str(info.value)


# Each case equals the valid call *by value* (True == 1, 4.0 == 4) or differs in one static
# fact, so a cache keyed carelessly would wrongly accept it after the valid call was cached.
LOOKALIKES = [
    ("float H", dict(spatial_shapes=((4.0, 6), (3, 2), (1, 1)))),
    ("bool W", dict(spatial_shapes=((4, 6), (3, 2), (1, True)))),
    ("float tensor shapes", dict(spatial_shapes=torch.tensor(SHAPES, dtype=torch.float32))),
    ("float start", dict(level_start_index=(0, 24.0, 30))),
    ("wrong starts", dict(level_start_index=(0, 24, 29))),
    ("L changed", dict(value=torch.randn(2, 30, 2, 4, dtype=torch.float64))),
    ("weights shape", dict(attention_weights=torch.rand(2, 5, 2, 3, 3, dtype=torch.float64))),
    ("weights dtype", dict(attention_weights=torch.zeros(2, 5, 2, 3, 2, dtype=torch.int64))),
    ("layout", dict(value_layout="BNLC")),
    ("align_corners 1", dict(align_corners=1)),
    ("padding", dict(padding_mode="wrap")),
    ("grad_output shape", dict(grad_output=torch.randn(2, 5, 7, dtype=torch.float64))),
]


@pytest.mark.parametrize("label,change", LOOKALIKES, ids=[c[0] for c in LOOKALIKES])
def test_cached_validation_still_raises_the_full_validations_error(label, change):
    clear_problem_cache()
    inputs = make_inputs(seed=11)
    args = dict(value=inputs.value, spatial_shapes=SHAPES, level_start_index=(0, 24, 30),
                sampling_locations=inputs.sampling_locations,
                attention_weights=inputs.attention_weights, value_layout="BLNC", sampling_locations_layout="BQHLP2",
                align_corners=False, padding_mode="zeros", grad_output=inputs.grad_output)
    for _ in range(2):  # the second call is a cache hit
        assert validated_problem(**args) == validate_msda_args(**args)
    bad = dict(args, **change)
    error, message = _full_error(**bad)
    with pytest.raises(error) as info:
        validated_problem(**bad)
    assert str(info.value) == message


@pytest.mark.parametrize("shapes", [SHAPES, [[4, 6]], torch.tensor(SHAPES), (), ((4, 0),),
                                    ((4, 6, 1),), ((4, True),), torch.tensor([[4.0, 6.0]]),
                                    torch.tensor([[2, -1]]), "46", None])
def test_spatial_shapes_short_cut_agrees_with_normalize_spatial_shapes(shapes):
    try:
        expect = normalize_spatial_shapes(shapes)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as info:
            spatial_shapes_tuple(shapes)
        assert str(info.value) == str(exc)
    else:
        assert spatial_shapes_tuple(shapes) == expect


def test_spatial_shapes_tensor_is_reread_every_call():
    """A tensor's values are keyed, never its identity: an in-place change is seen."""
    clear_problem_cache()
    inputs = make_inputs(seed=12)
    shapes = torch.tensor(SHAPES)
    MSDA(inputs.value, shapes, None, inputs.sampling_locations, inputs.attention_weights)
    shapes[0, 0] = 5
    with pytest.raises(ValueError, match="value: expected L = sum"):
        MSDA(inputs.value, shapes, None, inputs.sampling_locations, inputs.attention_weights)


@pytest.mark.parametrize("value_layout,loc_layout,padding_mode,dtype",
                         [("BLNC", "BQHLP2", "zeros", torch.float32),
                          ("BNLC", "B2QHLP", "reflection", torch.bfloat16)])
@pytest.mark.parametrize("wanted", [(True, True, True), (False, True, False)])
def test_eager_path_matches_the_registered_operator_bitwise(value_layout, loc_layout,
                                                            padding_mode, dtype, wanted):
    inputs = make_inputs(value_layout=value_layout, sampling_locations_layout=loc_layout,
                         dtype=dtype, seed=13)
    flat = [d for pair in SHAPES for d in pair]
    results = []
    for use_operator in (False, True):
        tensors = [t.detach().clone().requires_grad_(w) for t, w in zip(inputs.tensors(), wanted)]
        value, loc, attn = tensors
        if use_operator:
            out = FWD(value, flat, [0, 24, 30], loc, attn, value_layout, loc_layout, True,
                      padding_mode, "reference")
        else:
            assert eager.can_skip_dispatcher(value, loc, attn)
            out = MSDA(value, SHAPES, None, loc, attn, value_layout=value_layout,
                       sampling_locations_layout=loc_layout, align_corners=True,
                       padding_mode=padding_mode, backend="reference")
        grads = torch.autograd.grad(out, [t for t in tensors if t.requires_grad],
                                    inputs.grad_output.to(dtype))
        results.append((out.detach(), grads))
    (eager_out, eager_grads), (op_out, op_grads) = results
    assert eager_out.abs().sum() > 0
    torch.testing.assert_close(eager_out, op_out, rtol=0, atol=0)
    for got, want in zip(eager_grads, op_grads):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_dispatch_modes_still_see_the_registered_operators():
    inputs = make_inputs(seed=14).requires_grad_()
    with _RecordOps() as mode:
        out = MSDA(*inputs.tensors()[:1], SHAPES, None, *inputs.tensors()[1:], backend="reference")
        torch.autograd.grad(out, inputs.tensors(), inputs.grad_output)
    assert "nkilib_msda.ms_deformable_attention.default" in mode.names
    assert "nkilib_msda.ms_deformable_attention_bwd.default" in mode.names


def test_create_graph_backward_runs_the_registered_backward_operator():
    inputs = make_inputs(seed=15).requires_grad_()
    out = MSDA(inputs.value, SHAPES, None, inputs.sampling_locations, inputs.attention_weights)
    grads = torch.autograd.grad(out, inputs.tensors(), inputs.grad_output, create_graph=True)
    assert all("ms_deformable_attention_bwd" in type(g.grad_fn).__name__ for g in grads)


def test_dispatcher_is_kept_under_tracing_modes_transforms_and_subclasses():
    x = torch.zeros(2)
    assert eager.can_skip_dispatcher(x, torch.nn.Parameter(torch.zeros(1)))
    with _RecordOps():
        assert not eager.can_skip_dispatcher(x)
    with torch.device("cpu"):  # a TorchFunctionMode
        assert not eager.can_skip_dispatcher(x)
    seen = []
    torch.vmap(lambda t: seen.append(eager.can_skip_dispatcher(t)) or t)(torch.zeros(3, 2))
    assert seen == [False]

    class Sub(torch.Tensor):
        pass

    assert not eager.can_skip_dispatcher(x.as_subclass(Sub))


def test_msdeformattn_normalizer_cache_is_safe_across_inference_mode():
    """A normalizer first built under inference_mode must not leak into a training forward
    (inference tensors cannot be saved for backward)."""
    module = nkilib_msda.MSDeformAttn(8, 3, 2, 2, backend="reference")
    query, ref = torch.randn(1, 4, 8), torch.rand(1, 4, 3, 2)
    flat = torch.randn(1, 31, 8)
    with torch.inference_mode():
        expect = module(query, ref, flat, torch.tensor(SHAPES), None)
    out = module(query, ref, flat, torch.tensor(SHAPES), None)
    out.sum().backward()
    assert module.sampling_offsets.weight.grad.abs().sum() > 0
    torch.testing.assert_close(out.detach(), expect, rtol=0, atol=0)


def test_profiler_still_shows_the_operator_names():
    inputs = make_inputs(seed=16).requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = MSDA(inputs.value, SHAPES, None, inputs.sampling_locations, inputs.attention_weights)
        torch.autograd.grad(out, inputs.tensors(), inputs.grad_output)
    names = {event.name for event in prof.events()}
    assert {"nkilib_msda::ms_deformable_attention", "nkilib_msda::ms_deformable_attention_bwd"} <= names


def test_eager_forward_backward_selects_the_backend_once_and_skips_revalidation(msda_counts):
    """Host path: the eager autograd node re-uses the forward's backend choice and problem (the
    engine hands it a gradient of its output's shape and dtype), so one fwd+bwd selects the
    backend once and validates once; the gradients are still the reference's."""
    inputs = make_inputs(seed=23)
    leaves = [t.detach().clone().requires_grad_() for t in
              (inputs.value, inputs.sampling_locations, inputs.attention_weights)]
    out = MSDA(leaves[0], SHAPES, None, leaves[1], leaves[2], backend="reference")
    grads = torch.autograd.grad(out, leaves, inputs.grad_output)
    assert msda_counts == {"select": 1, "validate": 1}
    ref = [t.detach().clone().requires_grad_() for t in leaves]
    want = torch.autograd.grad(FWD(ref[0], [4, 6, 3, 2, 1, 1], [0, 24, 30], ref[1], ref[2],
                                   "BLNC", "BQHLP2", False, "zeros", "reference", None),
                               ref, inputs.grad_output)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ the bound-call memo


def _fwd_bwd(inputs, shapes=SHAPES, **options):
    leaves = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
    out = MSDA(leaves[0], shapes, None, leaves[1], leaves[2], **options)
    return out, torch.autograd.grad(out, leaves, inputs.grad_output)


def _operator_result(inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs.tensors()]
    out = FWD(leaves[0], [4, 6, 3, 2, 1, 1], [0, 24, 30], leaves[1], leaves[2], "BLNC",
              "BQHLP2", False, "zeros", "reference", None)
    return out, torch.autograd.grad(out, leaves, inputs.grad_output)


def test_remembered_call_binds_once_and_gives_the_operators_results(msda_counts):
    """Repeated calls with the same shapes tuple skip binding; the results are bitwise the
    operators'. An equal tuple that is another object binds again (from the validation memo)."""
    inputs = make_inputs(seed=24)
    want_out, want_grads = _operator_result(inputs)
    msda_counts.update(select=0, validate=0)
    for _ in range(3):
        out, grads = _fwd_bwd(inputs)
        torch.testing.assert_close(out, want_out, rtol=0, atol=0)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert msda_counts == {"select": 1, "validate": 0}
    _fwd_bwd(inputs, tuple(tuple(p) for p in SHAPES))
    assert msda_counts == {"select": 2, "validate": 0}


def test_remembered_call_follows_the_environment_on_the_next_call(monkeypatch):
    """NKILIB_MSDA_BACKEND and a bad value of any package variable take effect on the very
    next call, however often the call was remembered before."""
    clear_problem_cache()
    monkeypatch.delenv("NKILIB_MSDA_BACKEND", raising=False)
    inputs = make_inputs(seed=25)
    want_out, _ = _fwd_bwd(inputs)
    _fwd_bwd(inputs)
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "nki")  # cannot run float64: must raise now
    with pytest.raises(ValueError, match="NKILIB_MSDA_BACKEND"):
        _fwd_bwd(inputs)
    monkeypatch.delenv("NKILIB_MSDA_BACKEND")
    out, _ = _fwd_bwd(inputs)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "maybe")
    with pytest.raises(ValueError, match="NKILIB_MSDA_DETERMINISTIC"):
        _fwd_bwd(inputs)


@pytest.mark.parametrize("label,change", [
    ("align_corners 0", dict(align_corners=0)),
    ("deterministic 0", dict(deterministic=0)),
    ("backend 1", dict(backend=1)),
    ("starts as floats", dict(level_start_index=(0, 24.0, 30))),
    ("wrong starts", dict(level_start_index=(0, 24, 29))),
    ("padding", dict(padding_mode="wrap")),
    ("value on meta", dict(value=torch.empty(2, 31, 2, 4, dtype=torch.float64, device="meta"))),
], ids=lambda x: x if isinstance(x, str) else "")
def test_remembered_call_still_rejects_lookalikes(label, change):
    """After a call was remembered (twice), an argument equal to it by value but not by type,
    or differing in one fact (a meta value: another device), gets the binding's own error."""
    clear_problem_cache()
    inputs = make_inputs(seed=26)
    args = dict(value=inputs.value, spatial_shapes=SHAPES, level_start_index=(0, 24, 30),
                sampling_locations=inputs.sampling_locations,
                attention_weights=inputs.attention_weights, align_corners=False,
                deterministic=False)
    for _ in range(2):
        MSDA(**args)
    with pytest.raises((TypeError, ValueError)):
        MSDA(**dict(args, **change))


def test_shapes_list_changed_in_place_is_read_again():
    """Only deeply immutable shapes (tuples of int tuples) are remembered by identity."""
    clear_problem_cache()
    inputs = make_inputs(seed=27)
    shapes = [list(p) for p in SHAPES]
    for _ in range(2):
        MSDA(inputs.value, shapes, None, inputs.sampling_locations, inputs.attention_weights)
    shapes[0][0] = 5
    with pytest.raises(ValueError, match="value: expected L = sum"):
        MSDA(inputs.value, shapes, None, inputs.sampling_locations, inputs.attention_weights)


def test_remembered_no_grad_call_is_not_reused_with_grad():
    """Whether autograd records the call is part of the key: a call first made under no_grad
    then with gradients gets its autograd node and the operators' gradients."""
    clear_problem_cache()
    inputs = make_inputs(seed=28)
    with torch.no_grad():
        for _ in range(2):
            assert MSDA(inputs.value, SHAPES, None, inputs.sampling_locations,
                        inputs.attention_weights).grad_fn is None
    out, grads = _fwd_bwd(inputs)
    want_out, want_grads = _operator_result(inputs)
    assert out.grad_fn is not None
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
