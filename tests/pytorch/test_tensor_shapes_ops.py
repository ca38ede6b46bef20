"""Spatial shapes as a tensor (Deformable-DETR's call style) under torch.compile(fullgraph=True)
and torch.export: no graph break, the values read when the graph runs, bad values rejected then.

Every compiled or exported result is compared with the eager call on the same inputs (eager
reads the tensor on the host and takes the int-list path), outputs and gradients at 1e-6 in
float32, and on shapes tensors other than the one traced."""

from __future__ import annotations

import io

import pytest
import torch
import torch._dynamo.testing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim

import nkilib_msda

SHAPES = ((4, 6), (3, 2))
STARTS = (0, 24)
OTHER_SHAPES = ((5, 5), (1, 5))   # same level count and L = 30, other values
LENGTH = 30
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _attn(n_points=2):
    torch.manual_seed(3)
    return nkilib_msda.MSDeformAttn(16, 2, 2, n_points)


def _module_inputs(batch, queries, seed, ref_dims=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, queries, 16, generator=g),
            torch.rand(batch, queries, 2, ref_dims, generator=g) * 0.8 + 0.1,
            torch.randn(batch, LENGTH, 16, generator=g))


def _msda_inputs(batch, queries, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, LENGTH, 2, 4, generator=g),
            torch.rand(batch, queries, 2, 2, 2, 2, generator=g) * 1.2 - 0.1,
            torch.rand(batch, queries, 2, 2, 2, generator=g) + 0.1)


def _out_and_grads(fn, tensors, params=()):
    leaves = [t.clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
    return out, torch.autograd.grad((out * weights).sum(), [*leaves, *params])


def _assert_same(got, want):
    (out, grads), (want_out, want_grads) = got, want
    torch.testing.assert_close(out, want_out, **TOL)
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, **TOL)


def _fullgraph(fn):
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, fullgraph=True, backend=counter), counter


@pytest.mark.parametrize("n_points, ref_dims", [(2, 2), (2, 4), ((3, 1), 2)],
                         ids=["points", "boxes", "per_level_points"])
def test_msdeformattn_fullgraph_compile_forward_and_backward(n_points, ref_dims):
    """One graph, no break; outputs and gradients (inputs and parameters) equal eager's, also
    for a shapes tensor with other values (read when the compiled graph runs)."""
    module = _attn(n_points)
    params = tuple(module.parameters())

    def call(q, r, x, shapes, starts):
        return module(q, r, x, shapes, starts)

    compiled, counter = _fullgraph(call)
    for shapes, seed in ((SHAPES, 1), (OTHER_SHAPES, 2)):
        shapes_t = torch.tensor(shapes)
        starts_t = torch.tensor((0, shapes[0][0] * shapes[0][1]))
        q, r, x = _module_inputs(3, 7, seed, ref_dims)

        def bind(fn):
            return lambda q, x: fn(q, r, x, shapes_t, starts_t)

        _assert_same(_out_and_grads(bind(compiled), (q, x), params),
                     _out_and_grads(bind(call), (q, x), params))
    assert counter.frame_count == 1
    explained = torch._dynamo.explain(call)(*_module_inputs(3, 7, 3), torch.tensor(SHAPES),
                                            torch.tensor(STARTS))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def _functional(value, loc, attn, shapes):
    return nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn)


def _hf_layer(value, loc, attn, shapes):  # called without value_spatial_shapes_list
    return nkilib_msda.MultiScaleDeformableAttention()(value, shapes, None,
                                                       torch.tensor(STARTS), loc, attn, 64)


def _detr_function(value, loc, attn, shapes):
    return nkilib_msda.MSDeformAttnFunction.apply(value, shapes, torch.tensor(STARTS), loc,
                                                  attn, 64)


@pytest.mark.parametrize("call", [_functional, _hf_layer, _detr_function],
                         ids=["functional", "hf_layer", "msdeformattn_function"])
def test_entry_points_fullgraph_compile_forward_and_backward(call):
    compiled, counter = _fullgraph(call)
    cases = [(SHAPES, 4)] + ([(OTHER_SHAPES, 5)] if call is _functional else [])
    for shapes, seed in cases:
        tensors = _msda_inputs(2, 5, seed=seed)
        shapes_t = torch.tensor(shapes)
        _assert_same(_out_and_grads(lambda *t: compiled(*t, shapes_t), tensors),
                     _out_and_grads(lambda *t: call(*t, shapes_t), tensors))
    assert counter.frame_count == 1


class _DetrAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _attn()

    def forward(self, query, reference_points, input_flatten, spatial_shapes):
        return self.attn(query, reference_points, input_flatten, spatial_shapes, None)


def test_export_keeps_the_shapes_tensor_an_input_and_reads_it_when_run():
    model = _DetrAttention()
    program = torch.export.export(model, (*_module_inputs(3, 7, 5), torch.tensor(SHAPES)))
    user_inputs = [n for n in program.graph.nodes if n.op == "placeholder"][-4:]
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "nkilib_msda.ms_deformable_attention_tensor_shapes.default" in targets
    shapes_node = user_inputs[-1]
    assert any(str(user.target).startswith("nkilib_msda.ms_deformable_attention_tensor_shapes")
               for user in shapes_node.users)
    for shapes, seed in ((SHAPES, 6), (OTHER_SHAPES, 7)):
        inputs = (*_module_inputs(3, 7, seed), torch.tensor(shapes))
        torch.testing.assert_close(program.module()(*inputs), model(*inputs), **TOL)


def test_export_with_dynamic_batch_and_queries_saves_and_loads():
    model = _DetrAttention()
    batch, queries = Dim("batch", min=1, max=64), Dim("queries", min=1, max=1024)
    program = torch.export.export(
        model, (*_module_inputs(3, 7, 15), torch.tensor(SHAPES)),
        dynamic_shapes=({0: batch, 1: queries}, {0: batch, 1: queries}, {0: batch}, None))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    for size, shapes in (((1, 1), SHAPES), ((5, 11), OTHER_SHAPES)):
        inputs = (*_module_inputs(*size, seed=sum(size)), torch.tensor(shapes))
        torch.testing.assert_close(loaded(*inputs), model(*inputs), **TOL)


def test_bad_shape_values_fail_at_run_time_with_one_line():
    """sum(H*W) != Len_in is only known when the graph runs: the operator's one-line error,
    from the exported program and from the compiled function alike."""
    model = _DetrAttention()
    program = torch.export.export(model, (*_module_inputs(2, 3, 8), torch.tensor(SHAPES)))
    compiled, _ = _fullgraph(model)
    bad = torch.tensor(((4, 6), (3, 3)))  # sum(H*W) = 33, Len_in = 30
    for fn in (program.module(), compiled):
        with pytest.raises(ValueError) as info:
            fn(*_module_inputs(2, 3, 9), bad)
        message = str(info.value)
        assert message.startswith("value: expected L = sum(H*W) = 33 (from spatial_shapes)")
        assert "\n" not in message


def test_tensor_starts_are_checked_at_run_time():
    def call(value, loc, attn, shapes, starts):
        return nkilib_msda.multi_scale_deformable_attention(value, shapes, starts, loc, attn)

    compiled, _ = _fullgraph(call)
    tensors = _msda_inputs(2, 3, seed=10)
    torch.testing.assert_close(compiled(*tensors, torch.tensor(SHAPES), torch.tensor(STARTS)),
                               call(*tensors, torch.tensor(SHAPES), torch.tensor(STARTS)), **TOL)
    with pytest.raises(ValueError, match=r"^level_start_index: expected \(0, 24\)"):
        compiled(*tensors, torch.tensor(SHAPES), torch.tensor((0, 25)))


def test_shapes_tensor_of_the_wrong_rank_names_the_argument():
    with pytest.raises(ValueError, match=r"^input_spatial_shapes: expected an int tensor "
                                         r"\(n_levels, 2\)"):
        torch.export.export(_DetrAttention(),
                            (*_module_inputs(2, 3, 11), torch.tensor([4, 6, 3, 2])))


def test_fake_mode_gives_the_output_shape():
    value, loc, attn = _msda_inputs(2, 5, seed=12)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (value, loc, attn, torch.tensor(SHAPES))]
        out = nkilib_msda.multi_scale_deformable_attention(fakes[0], fakes[3], None, fakes[1],
                                                           fakes[2])
    assert out.shape == (2, 5, 8) and out.dtype == torch.float32


def test_tensor_shapes_operator_opcheck():
    value, loc, attn = _msda_inputs(1, 3, seed=13)
    for t in (value, loc, attn):
        t.requires_grad_()
    torch.library.opcheck(
        torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes.default,
        (value, torch.tensor(SHAPES), torch.tensor(STARTS), loc, attn))
    packed = [t.detach().flatten(3, 4).requires_grad_() for t in (loc, attn)]
    torch.library.opcheck(
        torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes.default,
        (value, torch.tensor(SHAPES), None, *packed), {"num_points": [2, 2]})


def test_msda_v2_default_method_with_tensor_shapes_compiles_fullgraph():
    from nkilib_msda.pytorch.msda_v2 import multi_scale_deformable_attention_v2

    counts = [3, 1]

    def call(value, loc, attn, shapes):
        return multi_scale_deformable_attention_v2(value, shapes, loc, attn, counts)

    compiled, counter = _fullgraph(call)
    value, loc, attn = _msda_inputs(2, 5, seed=14)   # 2 levels x 2 points = sum(counts)
    tensors = (value, loc.flatten(3, 4), attn.flatten(3, 4))
    shapes_t = torch.tensor(SHAPES)
    _assert_same(_out_and_grads(lambda *t: compiled(*t, shapes_t), tensors),
                 _out_and_grads(lambda *t: call(*t, shapes_t), tensors))
    assert counter.frame_count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (triton backend)")
def test_msdeformattn_fullgraph_compile_on_cuda_with_tensor_shapes():
    """Deformable-DETR's call style on a GPU: shapes and starts as CUDA tensors, compiled by
    inductor with fullgraph=True; the triton backend runs, values read when the graph runs,
    for two shapes tensors; equal to eager (which reads the tensor on the host)."""
    module = _attn().cuda()
    params = tuple(module.parameters())

    def call(q, r, x, shapes, starts):
        return module(q, r, x, shapes, starts)

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    for shapes, seed in ((SHAPES, 6), (OTHER_SHAPES, 7)):
        shapes_t = torch.tensor(shapes, device="cuda")
        starts_t = torch.tensor((0, shapes[0][0] * shapes[0][1]), device="cuda")
        q, r, x = (t.cuda() for t in _module_inputs(2, 9, seed))

        def bind(fn):
            return lambda q, x: fn(q, r, x, shapes_t, starts_t)

        _assert_same(_out_and_grads(bind(compiled), (q, x), params),
                     _out_and_grads(bind(call), (q, x), params))
    assert counter.frame_count == 1


# ---------------------------------------------- the operators called directly (untrusted input)


def test_tensor_shapes_operators_reject_shapes_without_values():
    """A meta-device shapes (or starts) tensor has no values to read: both operators name the
    argument instead of computing on whatever memory ``.tolist()`` returns."""
    value, loc, attn = _msda_inputs(1, 3, seed=14)
    fwd = torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes
    bwd = torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes_bwd
    meta_shapes = torch.tensor(SHAPES, device="meta")
    with pytest.raises(ValueError, match=r"^spatial_shapes: expected a tensor holding values "
                                         r"\(not on the meta device\), got one on meta \(value is on cpu\)$"):
        fwd(value, meta_shapes, torch.tensor(STARTS), loc, attn)
    with pytest.raises(ValueError, match=r"^level_start_index: expected a tensor holding values"):
        fwd(value, torch.tensor(SHAPES), torch.tensor(STARTS, device="meta"), loc, attn)
    grad = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match=r"^spatial_shapes: expected a tensor holding values"):
        bwd(grad, value, meta_shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros", "auto",
            [True, True, True])
    # every tensor on meta: a shapes-only call, as before
    metas = [t.to("meta") for t in (value, loc, attn)]
    assert fwd(metas[0], meta_shapes, None, *metas[1:]).shape == (1, 3, 8)


@pytest.mark.parametrize("starts", [torch.tensor((0.0, 24.0)), torch.tensor((0.0, 24.7)),
                                    torch.tensor((False, True))], ids=["float", "fraction", "bool"])
def test_tensor_shapes_operators_reject_non_integer_starts(starts):
    """A float (or bool) level_start_index used to be truncated by int(): rejected, naming it."""
    value, loc, attn = _msda_inputs(1, 3, seed=15)
    with pytest.raises(TypeError, match=r"^level_start_index: expected an integer tensor, got "
                                        rf"dtype {str(starts.dtype).removeprefix('torch.')}$"):
        torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes(
            value, torch.tensor(SHAPES), starts, loc, attn)
    with pytest.raises(TypeError, match=r"^spatial_shapes: expected an integer tensor"):
        torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes(
            value, torch.tensor(SHAPES, dtype=torch.float32), None, loc, attn)


def test_int_list_operators_take_level_start_index_none():
    """``level_start_index=None`` on the int-list operators means "derived from the shapes", as
    on the functional API and the tensor-shapes operator (it used to fail in torch's argument
    parser with "TypeError: 'NoneType' object is not iterable")."""
    value, loc, attn = _msda_inputs(2, 3, seed=16)
    flat = [d for pair in SHAPES for d in pair]
    op = torch.ops.nkilib_msda
    want = op.ms_deformable_attention(value, flat, list(STARTS), loc, attn)
    torch.testing.assert_close(op.ms_deformable_attention(value, flat, None, loc, attn), want,
                               rtol=0, atol=0)
    grad = torch.randn_like(want)
    args = ("BLNC", "BQHLP2", False, "zeros", "auto", [True, True, True])
    for got, expected in zip(op.ms_deformable_attention_bwd(grad, value, flat, None, loc, attn, *args),
                             op.ms_deformable_attention_bwd(grad, value, flat, list(STARTS), loc, attn,
                                                            *args)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

# ------------------------------------------------- shapes on the device: the level-tables route


@pytest.fixture
def tables_backend(monkeypatch):
    """The CPU standing in for a device: CPU shapes tensors count as "on the device" and the
    reference backend declares ``level_tables``; its stub entry points record what they got and
    play the device (they read the tables to rebuild the problem). The torch layer's host route
    (``call._checked_problem``) refuses a shapes tensor: it must not be read there."""
    from dataclasses import fields, replace

    from nkilib_msda.backends.reference import backend as reference_torch
    from nkilib_msda.pytorch import call as call_module
    from nkilib_msda.validation.msda import MSDAProblem

    seen = []
    real_forward, real_backward = reference_torch.msda_forward, reference_torch.msda_backward

    def read(problem, tables):
        if tables is None:
            return problem
        seen.append((problem, tables))
        values = {f.name: getattr(problem, f.name) for f in fields(MSDAProblem)}
        values.update(spatial_shapes=tuple(map(tuple, tables.shapes.tolist())),
                      level_start_index=tuple(tables.starts.tolist()))
        return MSDAProblem(**values)

    def forward(value, problem, loc, attn, level_tables=None):
        return real_forward(value, read(problem, level_tables), loc, attn)

    def backward(grad, value, problem, loc, attn, compute, deterministic=None, level_tables=None):
        return real_backward(grad, value, read(problem, level_tables), loc, attn, compute,
                             deterministic)

    real_checked = call_module._checked_problem

    def no_host_read(value, spatial_shapes, *args):
        assert not isinstance(spatial_shapes, torch.Tensor), "the shapes were read on the host"
        return real_checked(value, spatial_shapes, *args)

    monkeypatch.setattr(reference_torch, "CAPABILITIES",
                        replace(reference_torch.CAPABILITIES, level_tables=True))
    monkeypatch.setattr(reference_torch, "msda_forward", forward)
    monkeypatch.setattr(reference_torch, "msda_backward", backward)
    monkeypatch.setattr(call_module, "shapes_on_device", lambda x: isinstance(x, torch.Tensor))
    monkeypatch.setattr(call_module, "_checked_problem", no_host_read)
    return seen


@pytest.mark.parametrize("starts", [None, torch.tensor(STARTS)], ids=["derived", "given"])
def test_shapes_on_the_device_reach_the_backend_as_level_tables(tables_backend, starts):
    from nkilib_msda.pytorch.tensor_shapes_ops import TensorShapesProblem

    tensors = _msda_inputs(2, 5, seed=16)
    want = _out_and_grads(lambda v, l, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, l, a, backend="reference"), tensors)
    got = _out_and_grads(lambda v, l, a: nkilib_msda.multi_scale_deformable_attention(
        v, torch.tensor(SHAPES), starts, l, a), tensors)
    _assert_same(got, want)
    assert len(tables_backend) == 2  # the forward and the backward got level tables
    for problem, tables in tables_backend:
        assert isinstance(problem, TensorShapesProblem) and problem.spatial_shapes == ()
        assert (problem.num_levels, problem.total_pixels) == (2, LENGTH)
        assert tables.shapes.dtype == tables.starts.dtype == torch.int32
        assert tables.shapes.tolist() == [list(p) for p in SHAPES]
        assert tables.starts.tolist() == list(STARTS)


def test_shapes_on_the_device_through_the_tensor_shapes_operator(tables_backend):
    """The dispatcher route (here a direct operator call) binds the same way: forward, and the
    backward through setup_context's call."""
    tensors = _msda_inputs(2, 4, seed=17)
    want = _out_and_grads(lambda v, l, a: nkilib_msda.multi_scale_deformable_attention(
        v, SHAPES, None, l, a, backend="reference"), tensors)
    got = _out_and_grads(lambda v, l, a: torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes(
        v, torch.tensor(SHAPES), None, l, a), tensors)
    _assert_same(got, want)
    assert len(tables_backend) == 2


def test_shapes_on_the_device_still_check_every_static_fact(tables_backend):
    value, loc, attn = _msda_inputs(2, 5, seed=18)
    with pytest.raises(ValueError, match=r"^sampling_locations: .*N_l") as info:
        nkilib_msda.multi_scale_deformable_attention(value, torch.tensor(SHAPES + ((1, 1),)),
                                                     None, loc, attn)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"^value: expected L >= N_l = 2"):
        nkilib_msda.multi_scale_deformable_attention(value[:, :1], torch.tensor(SHAPES), None,
                                                     loc, attn)
    with pytest.raises(ValueError, match=r"^spatial_shapes: expected an int tensor \(N_l, 2\)"):
        nkilib_msda.multi_scale_deformable_attention(value, torch.tensor([4, 6, 3, 2]), None,
                                                     loc, attn)


def test_the_route_table_names_one_route_per_call():
    from nkilib_msda.pytorch.functional import ROUTES, route_of

    assert [r.name for r in ROUTES] == ["eager", "torch.func", "op with tensor shapes", "op"]
    value, loc, attn = _msda_inputs(1, 2, seed=19)
    assert route_of(value, SHAPES, loc, attn) == "eager"
    assert route_of(value, torch.tensor(SHAPES), loc, attn) == "eager"
    assert route_of(value.to("meta"), SHAPES, loc.to("meta"), attn.to("meta")) == "op"
    assert torch.func.grad(lambda v: route_of(v, SHAPES, loc, attn) == "torch.func" and
                           v.sum())(value).shape == value.shape
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (value, loc, attn, torch.tensor(SHAPES))]
        assert route_of(fakes[0], fakes[3], fakes[1], fakes[2]) == "op with tensor shapes"


# ------------------------------------------------- CUDA graphs (GPU only)


def _cuda_detr_inputs(seed, batch=2, queries=9):
    q, r, x = _module_inputs(batch, queries, seed)
    return q.cuda(), r.cuda(), x.cuda()


def _eager_step(module, q, r, x, params):
    """Eager reference on the int-list route (Python int shapes: the validated path)."""
    return _out_and_grads(lambda q, x: module(q, r, x, SHAPES, None), (q, x), params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (triton backend)")
def test_detr_tensor_shapes_under_a_manual_cuda_graph_capture():
    """Deformable-DETR's call style (shapes and starts as CUDA int64 tensors) captured with
    ``torch.cuda.graph``, forward and backward (input and parameter gradients), replayed twice
    with new inputs copied into the captured ones: equal to eager each time."""
    module = _attn().cuda()
    params = tuple(module.parameters())
    shapes = torch.tensor(SHAPES, device="cuda")
    starts = torch.tensor(STARTS, device="cuda")
    q, r, x = (t.clone() for t in _cuda_detr_inputs(20))
    q.requires_grad_()
    x.requires_grad_()
    weights = torch.linspace(-1, 1, 2 * 9 * 16, device="cuda").reshape(2, 9, 16)

    def step():
        out = module(q, r, x, shapes, starts)
        return out, torch.autograd.grad((out * weights).sum(), [q, x, *params])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (kernel compilation, caches) before capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, grads = step()
    for seed in (21, 22):
        new_q, new_r, new_x = _cuda_detr_inputs(seed)
        with torch.no_grad():
            q.copy_(new_q), r.copy_(new_r), x.copy_(new_x)
            out.fill_(float("nan"))
            for g in grads:
                g.fill_(float("nan"))
        graph.replay()
        want_out, want_grads = _eager_step(module, new_q, new_r, new_x, params)
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (triton backend)")
def test_detr_tensor_shapes_under_compile_reduce_overhead():
    """The same module under ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees,
    forward and backward graphs): recorded, then replayed twice with new inputs; no cudagraph
    skip; equal to eager each time."""
    from torch._dynamo.utils import counters

    module = _attn().cuda()
    params = tuple(module.parameters())
    shapes = torch.tensor(SHAPES, device="cuda")
    starts = torch.tensor(STARTS, device="cuda")

    def call(q, r, x, shapes, starts):
        return module(q, r, x, shapes, starts)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(call, mode="reduce-overhead", fullgraph=True)
    for seed in (23, 24, 25, 26):  # warm-up run, recording run, two replays
        q, r, x = _cuda_detr_inputs(seed)
        got = _out_and_grads(lambda q, x: compiled(q, r, x, shapes, starts), (q, x), params)
        got = (got[0].clone(), tuple(g.clone() for g in got[1]))
        _assert_same_within(got, _eager_step(module, q, r, x, params), 1e-5)
    assert counters["inductor"]["cudagraph_skips"] == 0


def _assert_same_within(got, want, tol):
    (out, grads), (want_out, want_grads) = got, want
    torch.testing.assert_close(out, want_out, rtol=tol, atol=tol)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def test_level_starts_of_the_wrong_length_are_refused_on_the_device_route(tables_backend):
    value, loc, attn = _msda_inputs(2, 5, seed=27)
    with pytest.raises(ValueError, match=r"^level_start_index: expected 2 starts"):
        nkilib_msda.multi_scale_deformable_attention(value, torch.tensor(SHAPES),
                                                     torch.tensor([0, 24, 30]), loc, attn)
