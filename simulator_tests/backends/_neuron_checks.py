"""Checks of the TorchNeuron path on the CPU stand-in device; run by test_nki_backend_neuron.py in one
subprocess (``python _neuron_checks.py``), which prints ``PASSED <name>`` or ``FAILED <name>``
with the traceback for each check in :data:`CHECKS` order."""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

import _neuron_standin as ns
import nkilib_msda
from _torch_inputs import make_inputs
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref

SHAPES = ((4, 6), (3, 2))
MSDA = nkilib_msda.multi_scale_deformable_attention


def _inputs(seed: int):
    inputs = make_inputs(spatial_shapes=SHAPES, channels=8, seed=seed)
    value = inputs.value.to(torch.bfloat16)
    loc = inputs.sampling_locations.float()
    attn = inputs.attention_weights.to(torch.bfloat16)
    grad = inputs.grad_output.to(torch.bfloat16)
    return value, loc, attn, grad


def _close(got: torch.Tensor, want: np.ndarray, rtol: float, name: str) -> None:
    got64 = ns.to_cpu(got).double().numpy()
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got64 - want).max()) / scale
    assert err <= rtol, f"{name}: scaled error {err:.3g} > {rtol}"


def check_functional_forward_backward() -> None:
    """Functional API on neuron tensors: kernels launched on the device path, results equal to
    the CPU emulator run and to the float64 reference."""
    value, loc, attn, grad = _inputs(1)
    dev = [ns.to_neuron(t, requires_grad=True) for t in (value, loc, attn)]
    out = MSDA(*dev[:1], SHAPES, None, *dev[1:])
    assert isinstance(out, ns.NeuronStandIn) and out.device.type == "neuron", out.device
    assert ns.LAUNCHES == ["ms_deformable_attention"], ns.LAUNCHES
    grads = torch.autograd.grad(out, dev, ns.to_neuron(grad))
    assert ns.LAUNCHES == ["ms_deformable_attention", "ms_deformable_attention_bwd"], ns.LAUNCHES
    cpu = [t.clone().requires_grad_() for t in (value, loc, attn)]
    cpu_out = MSDA(cpu[0], SHAPES, None, cpu[1], cpu[2], backend="nki")
    cpu_grads = torch.autograd.grad(cpu_out, cpu, grad)
    assert torch.equal(ns.to_cpu(out), cpu_out)
    for g, c in zip(grads, cpu_grads):
        assert g.device.type == "neuron" and g.dtype == c.dtype
        assert torch.equal(ns.to_cpu(g), c)
    ref = ms_deformable_attention_ref(value.double().numpy(), SHAPES, None, loc.double().numpy(),
                                      attn.double().numpy())
    _close(out, ref, 2e-2, "output")
    ref_grads = ms_deformable_attention_bwd_ref(grad.double().numpy(), value.double().numpy(),
                                                SHAPES, None, loc.double().numpy(),
                                                attn.double().numpy())
    for g, r, name in zip(grads, ref_grads, ("grad_value", "grad_loc", "grad_attn")):
        _close(g, r, 3e-2, name)


def check_direct_op_call() -> None:
    """torch.ops.nkilib_msda.* on neuron tensors (default backend "auto") reaches the kernel
    through the operators' PrivateUse1 kernels."""
    for name in ("ms_deformable_attention", "ms_deformable_attention_bwd", "block_attn_res",
                 "block_attn_res_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"nkilib_msda::{name}",
                                                              "PrivateUse1"), name
    value, loc, attn, _ = _inputs(2)
    out = torch.ops.nkilib_msda.ms_deformable_attention(
        ns.to_neuron(value), [4, 6, 3, 2], [0, 24], ns.to_neuron(loc), ns.to_neuron(attn))
    assert ns.LAUNCHES == ["ms_deformable_attention"], ns.LAUNCHES
    want = MSDA(value, SHAPES, None, loc, attn, backend="nki")
    assert torch.equal(ns.to_cpu(out), want)


def check_module() -> None:
    """MSDeformAttn with its parameters on the neuron device runs the kernels."""
    torch.manual_seed(0)
    module = nkilib_msda.MSDeformAttn(d_model=16, n_levels=2, n_heads=2, n_points=2)
    with torch.no_grad():
        module.sampling_offsets.bias.add_(torch.randn_like(module.sampling_offsets.bias))
    cpu_module = nkilib_msda.MSDeformAttn(d_model=16, n_levels=2, n_heads=2, n_points=2,
                                          backend="nki")
    cpu_module.load_state_dict(module.state_dict())
    module._apply(ns.to_neuron)
    g = torch.Generator().manual_seed(3)
    length = sum(h * w for h, w in SHAPES)
    query = torch.randn(2, 5, 16, generator=g)
    ref_points = torch.rand(2, 5, 2, 2, generator=g)
    feats = torch.randn(2, length, 16, generator=g)
    starts = torch.tensor([0, 24])
    out = module(ns.to_neuron(query), ns.to_neuron(ref_points), ns.to_neuron(feats), SHAPES, starts)
    assert ns.LAUNCHES == ["ms_deformable_attention"], ns.LAUNCHES
    want = cpu_module(query, ref_points, feats, SHAPES, starts)
    assert torch.allclose(ns.to_cpu(out), want, rtol=1e-5, atol=1e-6)


def check_block_attn_res() -> None:
    """block_attn_res on neuron tensors launches the Block AttnRes kernels."""
    from nkilib_msda.pytorch.block_attn_res_ops import block_attn_res

    g = torch.Generator().manual_seed(4)
    blocks = [torch.randn(1, 8, 16, generator=g) for _ in range(3)]
    w = torch.randn(16, generator=g)
    gamma = torch.rand(16, generator=g) + 0.5
    out = block_attn_res([ns.to_neuron(b) for b in blocks], ns.to_neuron(w),
                         rmsnorm_gamma=ns.to_neuron(gamma))
    assert ns.LAUNCHES == ["block_attn_res_fwd"], ns.LAUNCHES
    want = block_attn_res(blocks, w, rmsnorm_gamma=gamma, backend="nki")
    assert torch.equal(ns.to_cpu(out), want)


def check_lnc_degree() -> None:
    """NEURON_LOGICAL_NC_CONFIG: 2 runs both logical cores (same result), 3 is refused."""
    value, loc, attn, _ = _inputs(5)
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = "1"
    one = MSDA(ns.to_neuron(value), SHAPES, None, ns.to_neuron(loc), ns.to_neuron(attn))
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = "2"
    two = MSDA(ns.to_neuron(value), SHAPES, None, ns.to_neuron(loc), ns.to_neuron(attn))
    assert torch.allclose(ns.to_cpu(one).float(), ns.to_cpu(two).float(), rtol=1e-2, atol=1e-2)
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = "3"
    launched = len(ns.LAUNCHES)
    try:
        MSDA(ns.to_neuron(value), SHAPES, None, ns.to_neuron(loc), ns.to_neuron(attn))
    except ValueError as exc:
        assert "NEURON_LOGICAL_NC_CONFIG" in str(exc) and "'3'" in str(exc), exc
    else:
        raise AssertionError("NEURON_LOGICAL_NC_CONFIG=3 was accepted")
    assert len(ns.LAUNCHES) == launched, "a kernel was launched with an invalid LNC degree"


def check_no_torch_neuronx_message() -> None:
    """Without torch-neuronx (and no launcher installed) neuron tensors get a clear error."""
    from nkilib_msda.backends import nki_backend

    nki_backend.set_device_launcher(None)
    value, loc, attn, _ = _inputs(6)
    try:
        MSDA(ns.to_neuron(value), SHAPES, None, ns.to_neuron(loc), ns.to_neuron(attn))
    except RuntimeError as exc:
        assert "torch-neuronx" in str(exc), exc
    else:
        raise AssertionError("no error without torch-neuronx")


CHECKS = ("functional_forward_backward", "direct_op_call", "module", "block_attn_res",
          "lnc_degree", "no_torch_neuronx_message")  # the last two change process state

if __name__ == "__main__":
    import traceback

    for name in sys.argv[1:] or CHECKS:
        ns.install_emulator_launcher()
        ns.LAUNCHES.clear()
        os.environ.pop("NEURON_LOGICAL_NC_CONFIG", None)
        try:
            globals()[f"check_{name}"]()
        except Exception:  # noqa: BLE001 - reported per check
            print("FAILED", name)
            traceback.print_exc(file=sys.stdout)
        else:
            print("PASSED", name)
