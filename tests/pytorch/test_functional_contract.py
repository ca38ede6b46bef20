"""What the torch layer accepts: forward-only calls within the forward kernel's limits, the
gather method the forward kernel needs, empty inputs, autocast regions and meta tensors, on
every backend that runs on CPU (reference, nki in the emulator; triton under its interpreter
in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nkilib_msda
from nkilib_msda.backends import nki_backend
from nkilib_msda.reference import ms_deformable_attention_ref
from nkilib_msda.validation.msda import validate_msda_args
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention
_HERE = Path(__file__).resolve().parent


def _small(channels, dtype, heads=1, shapes=((2, 3),), points=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    length = sum(h * w for h, w in shapes)
    value = torch.randn(1, length, heads, channels, generator=g).to(dtype)
    loc = torch.rand(1, 2, heads, len(shapes), points, 2, generator=g) * 1.2 - 0.1
    attn = (torch.rand(1, 2, heads, len(shapes), points, generator=g) + 0.1).to(dtype)
    return value, loc, attn


def _ref(value, shapes, loc, attn):
    return torch.from_numpy(ms_deformable_attention_ref(
        value.double().numpy(), shapes, None, loc.double().numpy(), attn.double().numpy()))


# ------------------------------------------------------------ forward-only limits


@pytest.mark.parametrize("case", ["fp32_many_points", "many_heads_times_levels"])
def test_forward_only_calls_are_not_refused_for_backward_limits(case):
    """N_p = 600 fp32 (the backward's SBUF holds ~410 points per sample row) and
    N_h*N_l = 160 > 128 are backward-planner limits only."""
    if case == "fp32_many_points":
        shapes, (value, loc, attn) = ((2, 3),), _small(8, torch.float32, points=600)
    else:
        shapes = ((2, 2),) * 40
        value, loc, attn = _small(8, torch.bfloat16, heads=4, shapes=shapes)
    problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    assert nki_backend.unsupported_reason(problem, value, loc) is None
    assert nki_backend.backward_unsupported_reason(problem, value, loc) is not None
    with torch.no_grad():
        out = MSDA(value.requires_grad_(), shapes, None, loc, attn, backend="nki")
    rtol = 1e-5 if value.dtype == torch.float32 else 2e-2
    want = _ref(value.detach(), shapes, loc, attn)
    assert (out.double() - want).abs().max() <= rtol * max(1.0, want.abs().max())
    # Nothing requires grad: also allowed with grad mode on.
    MSDA(value.detach(), shapes, None, loc, attn, backend="nki")
    # A differentiable call is refused up front, naming the backward limit.
    with pytest.raises(ValueError, match="backward"):
        MSDA(value.detach().requires_grad_(), shapes, None, loc, attn, backend="nki")


def test_wide_two_byte_channels_use_the_copy_gather():
    """C_h = 1040 bf16 does not fit the transpose gather's PSUM bank: the copy gather runs."""
    shapes = ((2, 3),)
    value, loc, attn = _small(1040, torch.bfloat16)
    problem = validate_msda_args(value, shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    assert nki_backend.forward_gather_method(problem, "bfloat16") == "copy"
    narrow = validate_msda_args(*_small(64, torch.bfloat16)[:1], shapes, None, loc, attn, "BLNC", "BQHLP2", False, "zeros")
    assert nki_backend.forward_gather_method(narrow, "bfloat16") == "transpose"
    out = MSDA(value, shapes, None, loc, attn, backend="nki")
    want = _ref(value, shapes, loc, attn)
    assert (out.double() - want).abs().max() <= 2e-2 * max(1.0, want.abs().max())


# ------------------------------------------------------------------- empty inputs


def _empty_case(batch, queries):
    inputs = make_inputs(batch=max(batch, 1), queries=max(queries, 1), seed=7)
    value = inputs.value[:batch].float()
    loc = inputs.sampling_locations[:batch, :queries].float()
    attn = inputs.attention_weights[:batch, :queries].float()
    return value, inputs.spatial_shapes, loc, attn


@pytest.mark.parametrize("backend", ["reference", "nki"])
@pytest.mark.parametrize("batch,queries", [(0, 5), (2, 0), (0, 0)])
def test_empty_inputs_give_empty_outputs_and_gradients_without_a_kernel(
        backend, batch, queries, monkeypatch):
    def no_kernel(*args, **kwargs):
        raise AssertionError("a backend was called for an empty input")

    module = nki_backend if backend == "nki" else nkilib_msda.backends.get_backend("reference")
    monkeypatch.setattr(module, "msda_forward", no_kernel)
    monkeypatch.setattr(module, "msda_backward", no_kernel)
    value, shapes, loc, attn = _empty_case(batch, queries)
    tensors = [t.clone().requires_grad_() for t in (value, loc, attn)]
    heads, channels = value.shape[2], value.shape[3]
    for path in ("functional", "op"):
        if path == "functional":
            out = MSDA(tensors[0], shapes, None, tensors[1], tensors[2], backend=backend)
        else:
            flat = [d for pair in shapes for d in pair]
            starts = list(np.cumsum([0] + [h * w for h, w in shapes])[:-1])
            out = torch.ops.nkilib_msda.ms_deformable_attention(
                tensors[0], flat, [int(s) for s in starts], tensors[1], tensors[2], "BLNC",
                "BQHLP2", False, "zeros", backend)
        assert out.shape == (batch, queries, heads * channels) and out.dtype == value.dtype
        grads = torch.autograd.grad(out.sum(), tensors, allow_unused=False)
        for g, t in zip(grads, tensors):
            assert g.shape == t.shape and g.dtype == t.dtype
            assert not g.any()  # zero-size, or zeros for value when only N_q is 0


def test_empty_inputs_still_check_that_batch_and_queries_agree():
    value, shapes, loc, attn = _empty_case(0, 5)
    with pytest.raises(ValueError, match="attention_weights"):
        MSDA(value, shapes, None, loc, attn[:, :3])
    value, shapes, loc, attn = _empty_case(2, 0)
    with pytest.raises(ValueError, match="sampling_locations"):
        MSDA(value[:1], shapes, None, loc, attn)


# ------------------------------------------------------------------------ autocast


@pytest.mark.parametrize("backend", ["reference", "nki"])
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_autocast_region_computes_exactly_as_outside(backend, autocast_dtype):
    """Inside torch.autocast("cpu") the ops see and compute in the dtypes they receive
    (bitwise the same as outside), forward and backward, functional and direct op call."""
    inputs = make_inputs(spatial_shapes=((4, 6), (3, 2)), channels=8, seed=11)
    value, loc, attn = (t.float() for t in inputs.tensors())
    grad = inputs.grad_output.float()
    flat, starts = [4, 6, 3, 2], [0, 24]

    def run(path):
        tensors = [t.clone().requires_grad_() for t in (value, loc, attn)]
        if path == "functional":
            out = MSDA(tensors[0], inputs.spatial_shapes, None, tensors[1], tensors[2],
                       backend=backend)
        else:
            out = torch.ops.nkilib_msda.ms_deformable_attention(
                tensors[0], flat, starts, tensors[1], tensors[2], "BLNC", "BQHLP2", False,
                "zeros", backend)
        return (out, *torch.autograd.grad(out, tensors, grad))

    for path in ("functional", "op"):
        outside = run(path)
        with torch.autocast("cpu", dtype=autocast_dtype):
            inside = run(path)
        for got, want in zip(inside, outside):
            assert got.dtype == want.dtype == torch.float32
            assert torch.equal(got, want), path
    if backend == "reference":  # fp32 inputs are computed in fp32: error near fp32 rounding
        want = _ref(value, inputs.spatial_shapes, loc, attn)
        assert (outside[0].double() - want).abs().max() < 1e-5


def test_block_attn_res_autocast_region_computes_exactly_as_outside():
    from nkilib_msda.pytorch.block_attn_res_ops import block_attn_res

    g = torch.Generator().manual_seed(12)
    blocks = [torch.randn(2, 4, 16, generator=g) for _ in range(3)]
    w = torch.randn(16, generator=g)
    gamma = torch.rand(16, generator=g) + 0.5
    for backend in ("reference", "nki"):
        outside = block_attn_res(blocks, w, rmsnorm_gamma=gamma, backend=backend)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = block_attn_res(blocks, w, rmsnorm_gamma=gamma, backend=backend)
        assert inside.dtype == torch.float32 and torch.equal(inside, outside), backend


def test_autocast_kernels_are_registered_for_every_operator():
    for name in ("ms_deformable_attention", "ms_deformable_attention_bwd", "block_attn_res",
                 "block_attn_res_backward"):
        for key in ("AutocastCPU", "AutocastCUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"nkilib_msda::{name}", key)


# --------------------------------------------------------------------- meta tensors


def test_meta_tensors_go_through_the_fake_kernels():
    """Meta tensors: output and gradients of the right shapes and dtypes, no data touched."""
    inputs = make_inputs(seed=13)
    meta = [t.float().to("meta").requires_grad_() for t in inputs.tensors()]
    out = MSDA(meta[0], inputs.spatial_shapes, None, meta[1], meta[2])
    assert out.is_meta and out.shape == (2, 5, 8)
    grads = torch.autograd.grad(out, meta, torch.empty_like(out))
    assert all(g.is_meta and g.shape == t.shape for g, t in zip(grads, meta))
    with pytest.raises(ValueError, match="nki"):
        MSDA(meta[0], inputs.spatial_shapes, None, meta[1], meta[2], backend="nki")


# --------------------------------------------------------- triton (interpreter)


def test_triton_interpreter_empty_inputs_and_autocast():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(_HERE.parents[1]), str(_HERE),
                                         env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, str(_HERE / "_triton_layer_checks.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "PASSED" in result.stdout, (
        result.stdout + result.stderr[-4000:])
