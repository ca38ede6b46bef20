"""``nkilib_msda.multi_scale_deformable_attention``: the differentiable functional API.

Per call, one binding (validation memoized on the call's static facts, then one backend
selection; a forward-only call is checked against forward limits only):

- plain eager mode on CPU/CUDA: the functional API binds (:func:`.call.bind_msda_call`) and
  runs the call directly (:mod:`.eager`), which saves ~100 µs of host time per call;
- anything else (tracing, modes, subclasses, meta tensors, TorchNeuron's ``neuron`` device,
  whose PrivateUse1 kernel launches the NKI kernels): the functional API only checks the
  arguments (:func:`.call.msda_operator_args`) and the registered operator binds when it runs,
  so ``backend=None`` stays "auto" in a traced or exported graph;
- inside ``torch.func`` transforms: the same operators through :mod:`.func_transforms`;
- spatial shapes in a tensor while tracing (Deformable-DETR's call style under torch.compile /
  torch.export): the operator that takes them as a tensor and reads them when it runs
  (:mod:`.tensor_shapes_ops`), so the graph neither breaks nor bakes the values in.

Every path shares one backward (:mod:`.ops`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from nkilib_msda.backends import BACKEND_NAMES, BackendUnavailableError, get_backend
from nkilib_msda.pytorch import ops  # noqa: F401 - registers the operators
from nkilib_msda.pytorch._modes import FAST_PATH_DEVICES, in_functorch_transform, values_unreadable
from nkilib_msda.pytorch.call import bind_msda_call, msda_operator_args, needs_input_grad
from nkilib_msda.pytorch.eager import can_skip_dispatcher, msda_forward_eager
from nkilib_msda.pytorch.func_transforms import msda_under_transform
from nkilib_msda.pytorch.point_counts import level_count, pad_point_counts
from nkilib_msda.pytorch.tensor_shapes_ops import tensor_shapes_operator_args

__all__ = ["multi_scale_deformable_attention"]

# Import the backend modules now (they import their heavy dependencies lazily), so that a first
# call under torch.compile(fullgraph=True) does not have to import them while tracing.
for _name in BACKEND_NAMES:
    try:
        get_backend(_name)
    except BackendUnavailableError:
        pass


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
    num_points: Sequence[int] | None = None,
) -> Tensor:
    """Multi-scale deformable attention; returns (B, N_q, N_h*C_h) in value's dtype.

    Args:
        value: (B, L, N_h, C_h) for ``value_layout="BLNC"`` or (B, N_h, L, C_h) for "BNLC",
            L = sum(H_l * W_l).
        spatial_shapes: (H_l, W_l) per level: pairs or an int tensor (N_l, 2) (read when the
            call runs, also in a compiled or exported graph).
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
        num_points: per-level point counts (P_0, ..., P_{N_l-1}) (RT-DETRv2, D-FINE, DEIMv2):
            then sampling_locations is (B, N_q, N_h, sum(P), 2) ((B, 2, N_q, N_h, sum(P)) for
            "B2QHLP") and attention_weights (B, N_q, N_h, sum(P)), level after level. Padded
            to max(P) points per level with zero weights (:mod:`.point_counts`).

    Differentiable with respect to value, sampling_locations and attention_weights. Invalid
    arguments raise ``ValueError``/``TypeError`` naming the argument before any kernel runs.
    Empty inputs (B = 0 or N_q = 0) return an empty output (and zero-size gradients) without
    calling a kernel. Meta tensors go through the operators' fake kernels (shapes only).
    """
    if num_points is not None:
        sampling_locations, attention_weights = pad_point_counts(
            sampling_locations, attention_weights, num_points, level_count(spatial_shapes),
            sampling_locations_layout)
    if _plain_eager(value, sampling_locations, attention_weights):
        call = bind_msda_call(value, spatial_shapes, level_start_index, sampling_locations,
                              attention_weights, value_layout, sampling_locations_layout,
                              align_corners, padding_mode, backend, deterministic,
                              needs_backward=needs_input_grad(value, sampling_locations,
                                                              attention_weights))
        return msda_forward_eager(call, value, sampling_locations, attention_weights)
    if isinstance(spatial_shapes, Tensor) and values_unreadable(spatial_shapes):
        return torch.ops.nkilib_msda.ms_deformable_attention_tensor_shapes(
            *tensor_shapes_operator_args(value, spatial_shapes, level_start_index,
                                         sampling_locations, attention_weights, value_layout,
                                         sampling_locations_layout, align_corners, padding_mode,
                                         backend, deterministic))
    args = msda_operator_args(value, spatial_shapes, level_start_index, sampling_locations,
                              attention_weights, value_layout, sampling_locations_layout,
                              align_corners, padding_mode, backend, deterministic)
    if in_functorch_transform():
        return msda_under_transform(*args)
    return torch.ops.nkilib_msda.ms_deformable_attention(*args)


def _plain_eager(value: Tensor, sampling_locations: Tensor, attention_weights: Tensor) -> bool:
    """CPU/CUDA tensors in plain eager mode (or arguments that are not tensors, which the
    binding rejects). Other devices (TorchNeuron's PrivateUse1, meta) always go through the
    dispatcher."""
    if not all(isinstance(t, Tensor) for t in (value, sampling_locations, attention_weights)):
        return True
    return value.device.type in FAST_PATH_DEVICES and can_skip_dispatcher(
        value, sampling_locations, attention_weights)
