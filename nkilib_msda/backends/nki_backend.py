"""The "nki" backend for CPU tensors: the NKI kernels executed by the simulator.

The kernels take NumPy arrays in the simulator, so tensors are converted (bfloat16 through
``ml_dtypes.bfloat16``) and the results converted back. The same argument preparation
(:func:`call_forward_kernel`, :func:`call_backward_kernel`) is used by the Neuron glue in
:mod:`nkilib_msda.pytorch.neuron`, where the kernels run on the device instead.

Dtype policy (torch-integration.md section 6): sampling locations go to the kernels in float32,
attention weights in the value's dtype; the kernels return grad_sampling_locations in float32.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch

from nkilib_msda.validation import MSDAProblem, dtype_name

__all__ = ["is_available", "unsupported_reason", "msda_forward", "msda_backward",
           "run_in_simulator", "call_forward_kernel", "call_backward_kernel", "LNC_ENV_VAR",
           "SUPPORTED_VALUE_DTYPES", "PADDING_MODES"]

LNC_ENV_VAR = "NKILIB_MSDA_SIM_LNC"
SUPPORTED_VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PADDING_MODES = ("zeros", "border")
# Device types whose tensors this backend (or the Neuron glue next to it) can take.
_DEVICE_TYPES = ("cpu", "xla", "neuron", "privateuseone")


def is_available() -> bool:
    """True when the simulator and the two kernels can be imported."""
    try:
        _kernels()
    except ImportError:
        return False
    return True


def _kernels() -> tuple[Any, Any]:
    from nkilib_msda.experimental.deformable_attention import (
        ms_deformable_attention, ms_deformable_attention_bwd)

    return ms_deformable_attention, ms_deformable_attention_bwd


def unsupported_reason(problem: MSDAProblem, value: torch.Tensor,
                       sampling_locations: torch.Tensor) -> str | None:
    """Why the NKI kernels cannot run this call (None when they can)."""
    if value.device.type not in _DEVICE_TYPES:
        return (f"the nki backend takes CPU tensors (simulator) or Neuron/XLA tensors, "
                f"got tensors on {value.device}")
    if problem.padding_mode not in PADDING_MODES:
        return (f"padding_mode={problem.padding_mode!r} is not supported by the NKI kernels "
                f"(supported: {list(PADDING_MODES)}); use backend='reference'")
    if value.dtype not in SUPPORTED_VALUE_DTYPES:
        return (f"value dtype {dtype_name(value.dtype)} is not supported by the NKI kernels "
                f"(supported: {[dtype_name(d) for d in SUPPORTED_VALUE_DTYPES]})")
    # The kernels' own planners hold their limits (row-unit indices below 2^24, N_h*N_l <= 128
    # for the backward, SBUF budget): ask them instead of restating the rules here.
    from nkilib_msda.experimental.deformable_attention.backward_config import make_backward_config
    from nkilib_msda.experimental.deformable_attention.forward_config import build_forward_config

    try:
        build_forward_config(problem, dtype_name(value.dtype))
        make_backward_config(problem, dtype_name(value.dtype))
    except ValueError as exc:
        return f"the NKI kernels cannot plan this call: {exc}"
    return None


# -------------------------------------------------------------- tensor <-> NumPy


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: np.ndarray, device: torch.device) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device)


def default_lnc() -> int:
    """Logical-core count for simulated runs: ``NKILIB_MSDA_SIM_LNC`` (1 or 2), default 1."""
    raw = os.environ.get(LNC_ENV_VAR, "1").strip()
    if raw not in ("1", "2"):
        raise ValueError(f"{LNC_ENV_VAR}: expected 1 or 2, got {raw!r}")
    return int(raw)


def run_in_simulator(kernel: Any, lnc: int | None = None) -> Callable[..., Any]:
    """Wrap an ``@nki.jit`` kernel so it takes and returns torch tensors, running on CPU.

    Tensor arguments become NumPy arrays (HBM tensors in the simulator); everything else passes
    through. Returns a tensor, or a tuple of tensors, on the first tensor argument's device.
    """
    from nkilib_msda.simulator import simulate

    def call(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        conv = [_to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]
        kwconv = {k: _to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        result = simulate(kernel, lnc=lnc if lnc is not None else default_lnc())(*conv, **kwconv)
        if isinstance(result, tuple):
            return tuple(_to_torch(r, device) for r in result)
        return _to_torch(result, device)

    return call


# ------------------------------------------------------- kernel argument preparation


def _kernel_inputs(value: torch.Tensor, sampling_locations: torch.Tensor,
                   attention_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous value, float32 locations, attention weights in value's dtype."""
    return (value.contiguous(), sampling_locations.to(torch.float32).contiguous(),
            attention_weights.to(value.dtype).contiguous())


def _static_args(problem: MSDAProblem) -> tuple:
    return (problem.spatial_shapes, problem.level_start_index)


def _layout_args(problem: MSDAProblem) -> tuple:
    return (problem.value_layout, problem.sampling_locations_layout, problem.align_corners,
            problem.padding_mode)


def call_forward_kernel(call: Callable[..., Any], value: torch.Tensor, problem: MSDAProblem,
                        sampling_locations: torch.Tensor, attention_weights: torch.Tensor
                        ) -> torch.Tensor:
    """Run the forward kernel through ``call`` (simulator wrapper or the device kernel)."""
    value, locations, weights = _kernel_inputs(value, sampling_locations, attention_weights)
    return call(value, *_static_args(problem), locations, weights, *_layout_args(problem))


def call_backward_kernel(call: Callable[..., Any], grad_output: torch.Tensor, value: torch.Tensor,
                         problem: MSDAProblem, sampling_locations: torch.Tensor,
                         attention_weights: torch.Tensor, compute: tuple[bool, bool, bool]
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernel through ``call``; always three gradients (zeros where not
    computed), in the kernels' dtypes (value dtype; float32 for the locations)."""
    if not any(compute):
        raise ValueError("compute: expected at least one gradient flag to be True, got "
                         f"{tuple(compute)}")
    value, locations, weights = _kernel_inputs(value, sampling_locations, attention_weights)
    grad = grad_output.to(value.dtype).contiguous()
    outputs = call(grad, value, *_static_args(problem), locations, weights, *_layout_args(problem),
                   compute_grad_value=bool(compute[0]),
                   compute_grad_sampling_locations=bool(compute[1]),
                   compute_grad_attention_weights=bool(compute[2]))
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    produced = iter(outputs)
    like = (value, locations, weights)
    return tuple(next(produced) if flag else torch.zeros_like(x)  # type: ignore[return-value]
                 for flag, x in zip(compute, like))


# ------------------------------------------------------------- backend interface


def msda_forward(value: torch.Tensor, problem: MSDAProblem, sampling_locations: torch.Tensor,
                 attention_weights: torch.Tensor) -> torch.Tensor:
    """Forward kernel in the simulator: (B, N_q, N_h*C_h) in value's dtype."""
    forward_kernel, _ = _kernels()
    return call_forward_kernel(run_in_simulator(forward_kernel), value, problem,
                               sampling_locations, attention_weights)


def msda_backward(grad_output: torch.Tensor, value: torch.Tensor, problem: MSDAProblem,
                  sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                  compute: tuple[bool, bool, bool] = (True, True, True),
                  deterministic: bool | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernel in the simulator: (grad_value, grad_sampling_locations,
    grad_attention_weights); zeros where ``compute`` is False. The kernel's fixed-order
    reduction is bitwise deterministic, so ``deterministic`` needs no action."""
    _, backward_kernel = _kernels()
    return call_backward_kernel(run_in_simulator(backward_kernel), grad_output, value, problem,
                                sampling_locations, attention_weights, compute)
