"""``nkilib_msda.multi_scale_deformable_attention``: the differentiable functional API.

Per call: validation (memoized on the call's static facts, :mod:`.problem_cache`), backend
selection (:mod:`.dispatch`; a forward-only call is checked against forward limits only), then
either the registered operator (tracing, modes, transforms, subclasses, meta tensors, and
TorchNeuron's ``neuron`` device, whose PrivateUse1 kernel launches the NKI kernels) or, in
plain eager mode, the same operator body called directly (:mod:`.eager`), which saves ~100 µs
of host time per call. Every path shares one autograd definition (:mod:`.ops`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from nkilib_msda._env import check_optional_bool
from nkilib_msda.backends import BACKEND_NAMES, BackendUnavailableError, get_backend
from nkilib_msda.pytorch import ops
from nkilib_msda.pytorch.dispatch import select_backend
from nkilib_msda.pytorch.eager import can_skip_dispatcher, msda_forward_eager
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["multi_scale_deformable_attention", "validate_torch_args"]

_FAST_PATH_DEVICES = ("cpu", "cuda")

# Import the backend modules now (they import their heavy dependencies lazily), so that a first
# call under torch.compile(fullgraph=True) does not have to import them while tracing.
for _name in BACKEND_NAMES:
    try:
        get_backend(_name)
    except BackendUnavailableError:
        pass


def validate_torch_args(value: Any, spatial_shapes: Any, level_start_index: Any,
                        sampling_locations: Any, attention_weights: Any, value_layout: str,
                        sampling_locations_layout: str, align_corners: bool, padding_mode: str
                        ) -> MSDAProblem:
    """Shared validation plus the torch-only checks (tensor types, one device for all inputs)."""
    for name, x in (("value", value), ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    problem = validated_problem(value, spatial_shapes, level_start_index, sampling_locations,
                                attention_weights, value_layout, sampling_locations_layout,
                                align_corners, padding_mode)
    for name, x in (("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if x.device != value.device:
            raise ValueError(f"{name}: expected a tensor on value's device {value.device}, "
                             f"got one on {x.device}")
    return problem


def multi_scale_deformable_attention(
    value: Tensor,
    spatial_shapes: Sequence[Sequence[int]] | Tensor,
    level_start_index: Sequence[int] | Tensor | None,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    *,
    value_layout: str = "BLNC",
    sampling_locations_layout: str = "BQHLP2",
    align_corners: bool = False,
    padding_mode: str = "zeros",
    backend: str | None = None,
    deterministic: bool | None = None,
) -> Tensor:
    """Multi-scale deformable attention; returns (B, N_q, N_h*C_h) in value's dtype.

    Args:
        value: (B, L, N_h, C_h) for ``value_layout="BLNC"`` or (B, N_h, L, C_h) for "BNLC",
            L = sum(H_l * W_l).
        spatial_shapes: (H_l, W_l) per level: pairs or an int tensor (N_l, 2).
        level_start_index: cumulative H*W per level (tuple/list/tensor) or None to derive it.
        sampling_locations: normalized (x, y) in [0, 1]; (B, N_q, N_h, N_l, N_p, 2) for
            "BQHLP2" or (B, 2, N_q, N_h, N_l, N_p) for "B2QHLP".
        attention_weights: (B, N_q, N_h, N_l, N_p).
        align_corners, padding_mode: as ``grid_sample`` ("zeros", "border", "reflection").
        backend: None/"auto", "reference", "nki" or "triton" (see :mod:`.dispatch`).
        deterministic: True asks for a bitwise-reproducible backward (grad_value); None uses
            the backend's default (triton: ``NKILIB_MSDA_DETERMINISTIC``, else
            ``torch.are_deterministic_algorithms_enabled()``). The reference and nki backends
            are deterministic on CPU and Neuron whatever the flag.

    Differentiable with respect to value, sampling_locations and attention_weights. Invalid
    arguments raise ``ValueError``/``TypeError`` naming the argument before any kernel runs.
    Empty inputs (B = 0 or N_q = 0) return an empty output (and zero-size gradients) without
    calling a kernel. Meta tensors go through the operators' fake kernels (shapes only).
    """
    deterministic = check_optional_bool("deterministic", deterministic)
    problem = validate_torch_args(value, spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights, value_layout, sampling_locations_layout,
                                  align_corners, padding_mode)
    needs_backward = torch.is_grad_enabled() and (
        value.requires_grad or sampling_locations.requires_grad or attention_weights.requires_grad)
    name = select_backend(backend, problem, value, sampling_locations,
                          needs_backward=needs_backward)
    # Other devices (TorchNeuron's PrivateUse1, meta) always go through the dispatcher.
    if value.device.type in _FAST_PATH_DEVICES and can_skip_dispatcher(
            value, sampling_locations, attention_weights):
        return msda_forward_eager(problem, name, value, sampling_locations, attention_weights,
                                  deterministic)
    return torch.ops.nkilib_msda.ms_deformable_attention(
        value, ops.flatten_spatial_shapes(problem.spatial_shapes), list(problem.level_start_index),
        sampling_locations, attention_weights, problem.value_layout,
        problem.sampling_locations_layout, problem.align_corners, problem.padding_mode, name,
        deterministic)
