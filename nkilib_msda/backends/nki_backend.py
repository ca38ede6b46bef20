"""The "nki" backend: the NKI kernels, in the emulator for CPU tensors and on the device for
TorchNeuron's ``neuron`` tensors.

- CPU tensors: the kernels run in the package's emulator (:func:`run_in_emulator`); tensors
  are converted to NumPy and back by :mod:`nkilib_msda.validation.arrays` (bf16 bit for bit).
- ``neuron`` tensors: the ``@nki.jit`` kernels are called directly on the device tensors, which
  is how torch-neuronx runs NKI kernels in eager mode (it compiles each new combination of
  shapes, dtypes and non-tensor arguments once); see docs/torch.md and
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/how-to-work-with-nki.html
  The launcher is replaceable (:func:`set_device_launcher`) so tests can run this path on CPU
  with a stand-in device.
- LNC degree: ``NEURON_LOGICAL_NC_CONFIG`` (1 or 2; unset means 1, the default of a kernel
  called directly), validated by :func:`lnc_degree` before any launch. On the device the kernel
  reads it itself (no bracket launch, which is being deprecated), after
  :func:`check_device_lnc` has checked it against the degree neuronx-cc compiles at; the
  emulator is given it.
  https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html

Argument preparation (:func:`call_forward_kernel`, :func:`call_backward_kernel`) is shared by
both devices. Dtype policy: sampling locations go to the kernels in float32, attention weights
in the value's dtype; the kernels return grad_sampling_locations in float32. Forward-only calls
are checked against the forward planner only (:func:`unsupported_reason`); the backward
planner's limits apply to the backward (:func:`backward_unsupported_reason`). The gather method
is whichever the planner accepts ("transpose" first, then "copy", e.g. C_h > 1024 in 2-byte
dtypes).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from nkilib_msda._env import EnvironmentVariableError, read_env
from nkilib_msda.backends.protocol import (
    NEURON_DEVICE_TYPES, Capabilities, capability_reason, device_reason)
from nkilib_msda.hardware import KERNEL_DTYPES
from nkilib_msda.validation.arrays import to_numpy, to_torch
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES, MSDAProblem, dtype_name

__all__ = ["NAME", "CAPABILITIES", "is_available", "unsupported_reason",
           "backward_unsupported_reason", "msda_forward",
           "msda_backward", "run_in_emulator", "call_forward_kernel", "call_backward_kernel",
           "LNC_ENV_VAR", "LEGACY_SIM_LNC_ENV_VAR", "lnc_degree", "check_device_lnc",
           "NEURONX_CC_DEFAULT_LNC", "set_device_launcher",
           "kernel_call", "forward_gather_method", "backward_gather_method",
           "block_attn_res_unsupported_reason", "block_attn_res_forward", "block_attn_res_backward"]

LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"
# Older name for the emulated LNC degree; read only when NEURON_LOGICAL_NC_CONFIG is unset.
LEGACY_SIM_LNC_ENV_VAR = "NKILIB_MSDA_SIM_LNC"
GATHER_METHODS = ("transpose", "copy")  # in order of preference

NAME = "nki"
CAPABILITIES = Capabilities(
    # CPU tensors run in the emulator; TorchNeuron's device runs the kernels.
    device_types=("cpu", *NEURON_DEVICE_TYPES), default_for=NEURON_DEVICE_TYPES,
    dtypes=KERNEL_DTYPES, padding_modes=KERNEL_PADDING_MODES,
    always_deterministic=True,  # fixed-order reduction of grad_value
    block_attn_res_dtypes=KERNEL_DTYPES,
    device_note=" (CPU tensors run in the emulator, TorchNeuron 'neuron' tensors on the device)")


def is_available() -> bool:
    """True when the emulator and the two kernels can be imported."""
    try:
        _kernels()
    except ImportError:
        return False
    return True


def _kernels() -> tuple[Any, Any]:
    from nkilib_msda.experimental.deformable_attention import (
        ms_deformable_attention, ms_deformable_attention_bwd)

    return ms_deformable_attention, ms_deformable_attention_bwd


# Planning is pure and deterministic in (problem, value dtype): each signature is planned once
# per process (the support check, the backward check and the launch all ask the same question).
_PLANS_PER_KERNEL = 256


@functools.lru_cache(maxsize=_PLANS_PER_KERNEL)
def _forward_plan(problem: MSDAProblem, value_dtype: str) -> str | ValueError:
    from nkilib_msda.experimental.deformable_attention.plan.forward_config import plan_forward

    return _first_plannable(lambda m: plan_forward(problem, value_dtype, gather_method=m))


@functools.lru_cache(maxsize=_PLANS_PER_KERNEL)
def _backward_plan(problem: MSDAProblem, value_dtype: str) -> str | ValueError:
    from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward

    return _first_plannable(lambda m: plan_backward(problem, value_dtype, gather_method=m))


def forward_gather_method(problem: MSDAProblem, value_dtype: str) -> str:
    """The first gather method the forward planner accepts; raises its error if none does."""
    return _raise_or_return(_forward_plan(problem, value_dtype))


def backward_gather_method(problem: MSDAProblem, value_dtype: str) -> str:
    """The first gather method the backward planner accepts; raises its error if none does."""
    return _raise_or_return(_backward_plan(problem, value_dtype))


def _raise_or_return(plan: str | ValueError) -> str:
    if isinstance(plan, ValueError):
        raise plan.with_traceback(None)  # a memoized error: do not grow its traceback
    return plan


def _first_plannable(plan: Callable[[str], Any]) -> str | ValueError:
    """The first of GATHER_METHODS that ``plan`` accepts, else a ValueError with every
    method's reason (the torch API has no ``gather_method=``: the backend tries them all),
    returned so that the answer is memoized like a success."""
    reasons = []
    for method in GATHER_METHODS:
        try:
            plan(method)
        except ValueError as exc:
            reason = _without_method_hint(str(exc)).removeprefix(f"gather_method={method!r}: ")
            reasons.append(f"gather_method={method!r}: {reason}")
            continue
        return method
    return ValueError("no gather method fits (the backend tried each): " + "; ".join(reasons)
                      + ". Change the shape as the reasons say, or run this call on another "
                        "backend (backend='reference', or 'triton' on CUDA)")


def _without_method_hint(reason: str) -> str:
    """A kernel-API reason without its "use gather_method=..." advice, which the torch API
    cannot follow (the methods are all tried)."""
    head, sep, hint = reason.rpartition("; use gather_method=")
    return head if sep else reason


def unsupported_reason(problem: MSDAProblem, value: torch.Tensor,
                       sampling_locations: torch.Tensor) -> str | None:
    """Why the forward kernel cannot run this call (None when it can): the declared
    capabilities, then the kernel's own planner, which holds its limits (row-unit indices below
    2^24, SBUF budget) instead of restating the rules here."""
    return _planner_reason(problem, value, _forward_plan, "forward")


def backward_unsupported_reason(problem: MSDAProblem, value: torch.Tensor,
                                sampling_locations: torch.Tensor) -> str | None:
    """Why the backward kernel cannot run this call (e.g. N_h*N_l > 128, SBUF budget)."""
    return _planner_reason(problem, value, _backward_plan, "backward")


def _planner_reason(problem: MSDAProblem, value: torch.Tensor,
                    plan: Callable[[MSDAProblem, str], str | ValueError], kernel: str) -> str | None:
    reason = capability_reason(NAME, CAPABILITIES, problem, value)
    if reason is not None:
        return reason
    answer = plan(problem, dtype_name(value.dtype))
    if isinstance(answer, ValueError):
        return f"the NKI {kernel} kernel cannot plan this call: {answer}"
    return None


def lnc_degree() -> int:
    """The LNC degree for kernel launches: ``NEURON_LOGICAL_NC_CONFIG`` (1 or 2), else the
    deprecated ``NKILIB_MSDA_SIM_LNC`` (emulator only; DeprecationWarning), else 1. Anything else raises ValueError
    naming the variable."""
    return read_env(LNC_ENV_VAR) or read_env(LEGACY_SIM_LNC_ENV_VAR) or 1


def run_in_emulator(kernel: Any, lnc: int | None = None) -> Callable[..., Any]:
    """Wrap an ``@nki.jit`` kernel so it takes and returns torch tensors, running on CPU.

    Tensor arguments become NumPy arrays (HBM tensors in the emulator); ``None`` and other
    values pass through. Returns a tensor, or a tuple of tensors, on the first tensor
    argument's device. ``lnc`` defaults to :func:`lnc_degree` at call time.
    """
    from nkilib_msda.simulator import simulate

    def call(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        conv = [to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]
        kwconv = {k: to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        result = simulate(kernel, lnc=lnc if lnc is not None else lnc_degree())(*conv, **kwconv)
        if isinstance(result, (tuple, list)):
            return tuple(to_torch(r, device) for r in result)
        return to_torch(result, device)

    return call


# neuronx-cc compiles a graph at LNC 2 on Trn2 and later unless --lnc says otherwise, while a
# kernel without NEURON_LOGICAL_NC_CONFIG runs at LNC 1; a kernel whose degree differs from the
# graph's is a compile error (NCC_EVRF066):
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/error-codes/EVRF066.html
NEURONX_CC_DEFAULT_LNC = 2


def check_device_lnc() -> int:
    """The LNC degree of a device launch, after checking it equals the degree neuronx-cc
    compiles the graph at (``NEURON_CC_FLAGS``' ``--lnc``, else its Trn2/Trn3 default 2).

    Inside a kernel the compiler's degree cannot be read (``nl.num_programs()`` is the kernel's
    own degree), and the Neuron compiler reports a mismatch only as NCC_EVRF066 at compile
    time; this check says the same before the launch, naming both variables. Raises
    EnvironmentVariableError (a ValueError)."""
    kernel_degree = lnc_degree()
    compiler_degree = read_env("NEURON_CC_FLAGS")
    graph_degree = NEURONX_CC_DEFAULT_LNC if compiler_degree is None else compiler_degree
    if kernel_degree != graph_degree:
        kernel_source = ("set" if read_env(LNC_ENV_VAR) is not None
                         else "unset, so NKI's default")
        graph_source = ("from NEURON_CC_FLAGS" if compiler_degree is not None
                        else "neuronx-cc's default on Trn2 and Trn3, NEURON_CC_FLAGS sets no --lnc")
        raise EnvironmentVariableError(
            f"{LNC_ENV_VAR}: expected the LNC degree the graph is compiled at, "
            f"{graph_degree} ({graph_source}), got {kernel_degree} ({kernel_source}); set "
            f"{LNC_ENV_VAR}={graph_degree}, or NEURON_CC_FLAGS=--lnc={kernel_degree} to compile "
            f"at {kernel_degree} (NCC_EVRF066)")
    return kernel_degree


def _torch_neuronx_launcher(kernel: Any) -> Callable[..., Any]:
    """Call the ``@nki.jit`` kernel on ``neuron`` tensors (torch-neuronx runs it), after
    :func:`check_device_lnc`."""
    try:
        import torch_neuronx  # type: ignore[import-not-found]  # noqa: F401 - registers the device
    except ImportError as exc:
        raise RuntimeError(
            "the nki backend got tensors on TorchNeuron's device but torch-neuronx cannot be "
            f"imported ({exc}); install torch-neuronx on a Trn2/Trn3 instance") from exc
    check_device_lnc()
    return kernel


_device_launcher: Callable[[Any], Callable[..., Any]] = _torch_neuronx_launcher


def set_device_launcher(launcher: Callable[[Any], Callable[..., Any]] | None) -> None:
    """Replace how kernels are launched on non-CPU tensors: ``launcher(kernel)`` returns a
    callable taking and returning torch tensors. None restores the torch-neuronx launcher."""
    global _device_launcher
    _device_launcher = launcher or _torch_neuronx_launcher


def kernel_call(kernel: Any, device: torch.device) -> Callable[..., Any]:
    """``kernel`` as a callable on torch tensors of ``device``: the emulator for CPU, the device
    launcher otherwise. The LNC degree is validated first."""
    degree = lnc_degree()
    if device.type == "cpu":
        return run_in_emulator(kernel, degree)
    return _device_launcher(kernel)


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
    """Run the forward kernel through ``call`` (emulator wrapper or the device kernel), with
    the gather method the planner accepts."""
    method = forward_gather_method(problem, dtype_name(value.dtype))
    value, locations, weights = _kernel_inputs(value, sampling_locations, attention_weights)
    return call(value, *_static_args(problem), locations, weights, *_layout_args(problem),
                gather_method=method)


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
    method = backward_gather_method(problem, dtype_name(value.dtype))
    outputs = call(grad, value, *_static_args(problem), locations, weights, *_layout_args(problem),
                   gather_method=method, compute_grad_value=bool(compute[0]),
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
    """Forward kernel (emulator or device): (B, N_q, N_h*C_h) in value's dtype."""
    forward_kernel, _ = _kernels()
    return call_forward_kernel(kernel_call(forward_kernel, value.device), value, problem,
                               sampling_locations, attention_weights)


def msda_backward(grad_output: torch.Tensor, value: torch.Tensor, problem: MSDAProblem,
                  sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                  compute: tuple[bool, bool, bool] = (True, True, True),
                  deterministic: bool | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernel (emulator or device): (grad_value, grad_sampling_locations,
    grad_attention_weights); zeros where ``compute`` is False. The kernel's fixed-order
    reduction is bitwise deterministic, so ``deterministic`` needs no action."""
    _, backward_kernel = _kernels()
    return call_backward_kernel(kernel_call(backward_kernel, value.device), grad_output, value,
                                problem, sampling_locations, attention_weights, compute)


# ------------------------------------------------------------------ Block AttnRes


def block_attn_res_unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Block AttnRes kernels cannot take tensors of ``device`` and ``dtype``."""
    reason = device_reason(NAME, CAPABILITIES, device)
    if reason is not None:
        return reason
    dtypes = CAPABILITIES.block_attn_res_dtypes
    if dtype_name(dtype) not in dtypes:
        return f"the NKI kernels take {list(dtypes)}, got dtype {dtype_name(dtype)}"
    return None


def _run_block_kernel(kernel: Any, tensors: list[torch.Tensor | None], *static: Any
                      ) -> tuple[torch.Tensor, ...]:
    device = next(t for t in tensors if t is not None).device
    outs = kernel_call(kernel, device)(*tensors, *static)
    return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def block_attn_res_forward(values: torch.Tensor, w: torch.Tensor, gamma: torch.Tensor | None,
                           scale: float, eps: float, enable_rmsnorm: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """values [L, B, T, D] -> (h [B, T, D], rms [B, T, L, 1] fp32 or empty, alpha [B, T, L])."""
    from nkilib_msda.experimental.block_attn_res.block_attn_res_fwd import block_attn_res_fwd

    n_src, b, t, d = values.shape
    gamma32 = gamma.float() if enable_rmsnorm and gamma is not None else None
    outs = _run_block_kernel(block_attn_res_fwd,
                             [values.reshape(n_src, b * t, d).contiguous(), w.float(), gamma32],
                             float(scale), float(eps), bool(enable_rmsnorm))
    h = outs[0].reshape(b, t, d)
    alpha = outs[-1].reshape(b, t, n_src)
    rms = (outs[1].reshape(b, t, n_src, 1) if enable_rmsnorm
           else values.new_empty((0,), dtype=torch.float32))
    return h, rms, alpha


def block_attn_res_backward(grad_h: torch.Tensor, values: torch.Tensor, w: torch.Tensor,
                            alpha: torch.Tensor, gamma: torch.Tensor | None,
                            rms: torch.Tensor | None, scale: float, enable_rmsnorm: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (grad_values [L, B, T, D], grad_w [D], grad_gamma [D] or empty)."""
    from nkilib_msda.experimental.block_attn_res.block_attn_res_bwd import block_attn_res_bwd

    n_src, b, t, d = values.shape
    tokens = b * t
    rms_on = enable_rmsnorm and gamma is not None and rms is not None
    inputs = [grad_h.reshape(tokens, d).contiguous(), values.reshape(n_src, tokens, d).contiguous(),
              w.float(), alpha.float().reshape(tokens, n_src),
              gamma.float() if rms_on and gamma is not None else None,
              rms.float().reshape(tokens, n_src) if rms_on and rms is not None else None]
    outs = _run_block_kernel(block_attn_res_bwd, inputs, float(scale), bool(enable_rmsnorm))
    grad_values = outs[0].reshape(n_src, b, t, d)
    grad_w = outs[1].to(w.dtype)
    grad_gamma = (outs[2].to(gamma.dtype) if rms_on and gamma is not None
                  else w.new_empty((0,)))
    return grad_values, grad_w, grad_gamma
