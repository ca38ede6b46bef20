"""Dynamic batch and queries (Block AttnRes: batch and tokens) under torch.export and
torch.compile(dynamic=True), and level starts given as a tensor while tracing (spatial shapes
as a tensor: test_tensor_shapes_ops.py).

Every exported or compiled result is compared with the eager call on the same inputs, at sizes
other than the example's; the example sizes avoid the constant dims (N_h, N_l, N_p, 2), which
torch would otherwise share one symbol with."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from torch.export import Dim

import nkilib_msda
from nkilib_msda.pytorch.block_attn_res_ops import block_attn_res

SHAPES = ((4, 6), (3, 2))
STARTS = (0, 24)
LENGTH = 30
BATCH, QUERIES, TOKENS = Dim("batch", min=1, max=64), Dim("queries", min=1, max=1024), Dim(
    "tokens", min=1, max=1024)


def _msda_tensors(batch, queries, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, LENGTH, 2, 4, generator=g),
            torch.rand(batch, queries, 2, 2, 2, 2, generator=g) * 1.2 - 0.1,
            torch.rand(batch, queries, 2, 2, 2, generator=g) + 0.1)


def _module_tensors(batch, queries, seed, d_model=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, queries, d_model, generator=g),
            torch.rand(batch, queries, 2, 2, generator=g),
            torch.randn(batch, LENGTH, d_model, generator=g))


class Functional(torch.nn.Module):
    def forward(self, value, loc, attn):
        return nkilib_msda.multi_scale_deformable_attention(value, SHAPES, None, loc, attn)


class HFLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nkilib_msda.MultiScaleDeformableAttention()

    def forward(self, value, loc, attn):
        return self.attn(value, torch.tensor(SHAPES), list(SHAPES), torch.tensor(STARTS), loc,
                         attn, 64)


class DeformableDetr(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.attn = nkilib_msda.MSDeformAttn(16, 2, 2, 2)

    def forward(self, query, reference_points, input_flatten):
        return self.attn(query, reference_points, input_flatten, SHAPES, STARTS)


class BlockAttnRes(torch.nn.Module):
    def forward(self, blocks, weight):
        return block_attn_res(list(blocks.unbind(0)), weight, enable_rmsnorm=False)


_MSDA_DIMS = ({0: BATCH}, {0: BATCH, 1: QUERIES}, {0: BATCH, 1: QUERIES})
_MODULE_DIMS = ({0: BATCH, 1: QUERIES}, {0: BATCH, 1: QUERIES}, {0: BATCH})


@pytest.mark.parametrize("model, make, dims", [
    (Functional, _msda_tensors, _MSDA_DIMS),
    (HFLayer, _msda_tensors, _MSDA_DIMS),
    (DeformableDetr, _module_tensors, _MODULE_DIMS),
], ids=["functional", "hf_layer", "msdeformattn"])
def test_export_with_dynamic_batch_and_queries(model, make, dims):
    module = model()
    program = torch.export.export(module, make(3, 7, seed=0), dynamic_shapes=dims)
    for batch, queries in ((1, 1), (5, 11), (2, 33)):
        inputs = make(batch, queries, seed=batch * 100 + queries)
        torch.testing.assert_close(program.module()(*inputs), module(*inputs), rtol=0, atol=0)


def test_block_attn_res_export_with_dynamic_batch_and_tokens():
    module = BlockAttnRes()
    g = torch.Generator().manual_seed(1)
    program = torch.export.export(module, (torch.randn(3, 4, 5, 8, generator=g),
                                           torch.randn(8, generator=g)),
                                  dynamic_shapes=({1: BATCH, 2: TOKENS}, None))
    for batch, tokens in ((1, 1), (6, 9), (2, 40)):
        inputs = (torch.randn(3, batch, tokens, 8, generator=g), torch.randn(8, generator=g))
        torch.testing.assert_close(program.module()(*inputs), module(*inputs), rtol=0, atol=0)


def _compiled_grads(fn, tensors):
    leaves = [t.clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    return out, torch.autograd.grad((out * weights).sum(), leaves)


def _assert_compiles_once_with_gradients(module, make, sizes):
    """torch.compile(dynamic=True, fullgraph=True) of ``module`` on ``make(*size)`` for each
    size: outputs and gradients equal eager's, and no new graph after the first size (dynamo
    may restart its first analysis once to specialize float arguments, which the counter sees
    as a second compile of the same frame)."""
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend=counter)
    graphs = []
    for size in sizes:
        tensors = make(*size)
        out, grads = _compiled_grads(compiled, tensors)
        graphs.append(counter.frame_count)
        want_out, want_grads = _compiled_grads(module, tensors)
        torch.testing.assert_close(out, want_out)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want)
    assert graphs[0] >= 1 and graphs == graphs[:1] * len(sizes)


@pytest.mark.parametrize("model, make", [(Functional, _msda_tensors),
                                         (DeformableDetr, _module_tensors)],
                         ids=["functional", "msdeformattn"])
def test_compile_dynamic_with_gradients_compiles_once(model, make):
    _assert_compiles_once_with_gradients(
        model(), lambda batch, queries: make(batch, queries, seed=batch), ((3, 7), (4, 9), (6, 13)))


def test_block_attn_res_compile_dynamic_with_gradients_compiles_once():
    g = torch.Generator().manual_seed(2)
    _assert_compiles_once_with_gradients(
        BlockAttnRes(), lambda batch, tokens: (torch.randn(3, batch, tokens, 8, generator=g),
                                               torch.randn(8, generator=g)),
        ((4, 5), (5, 7), (7, 11)))


def test_compile_dynamic_selects_nki_from_the_environment_at_run_time(monkeypatch):
    """With NKILIB_MSDA_BACKEND=nki the traced problem has symbolic B and N_q, which the nki
    planner cannot take: the choice and its limits are checked when the operators run, with
    real sizes (the nki backend's calls are counted; results within the float32 tolerance)."""
    from nkilib_msda.backends import nki_backend
    from nkilib_msda.workloads import compare, tolerance

    calls = []
    for name in ("msda_forward", "msda_backward"):
        def counting(*args, _name=name, _real=getattr(nki_backend, name), **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(nki_backend, name, counting)
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "nki")
    torch._dynamo.reset()
    module = Functional()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, dynamic=True, fullgraph=True, backend=counter)
    for batch, queries in ((3, 5), (4, 7)):
        tensors = _msda_tensors(batch, queries, seed=batch)
        out, grads = _compiled_grads(compiled, tensors)
        want_out, want_grads = _compiled_grads(
            lambda v, l, a: nkilib_msda.multi_scale_deformable_attention(
                v, SHAPES, None, l, a, backend="reference"), tensors)
        for name, got, want in zip(("output", "grad_value", "grad_sampling_locations",
                                    "grad_attention_weights"), (out, *grads), (want_out, *want_grads)):
            result = compare(name, got, want, tolerance(name, "float32"))
            assert result.ok, result.row()
    assert calls == ["msda_forward", "msda_backward"] * 2 and counter.frame_count == 1


# ------------------------------------------------ Deformable-DETR's tensor spatial shapes


def _detr_call(shapes, starts):
    module = DeformableDetr()
    return module, lambda q, r, x: module.attn(q, r, x, shapes, starts)


def test_tensor_level_starts_compile_fullgraph_without_graph_breaks():
    """Level starts in a tensor are derived from the (int) spatial shapes while tracing."""
    torch._dynamo.reset()
    module, call = _detr_call(SHAPES, torch.tensor(STARTS))
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    inputs = _module_tensors(3, 7, seed=5)
    torch.testing.assert_close(torch.compile(call, fullgraph=True, backend=counter)(*inputs),
                               call(*inputs))
    assert counter.frame_count == 1
