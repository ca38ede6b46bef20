"""Spatial shapes held in a tensor (Deformable-DETR's call style): the checks of what is static,
level tables on the device, and the problem of a call whose shapes are not known on the host.

Two cases (the operators of both families are registered once, in :mod:`.ops`):

- **values unreadable** (torch.compile / torch.export tracing, fake tensors): the output shape
  does not depend on the values, so the functional API calls the operator family that takes
  the shapes as tensors (``ms_deformable_attention_tensor_shapes``); the shapes tensor stays an
  input of the traced graph and the operator handles it when it runs (next case, or a host read
  for a CPU tensor).
- **values on the device** (a CUDA shapes tensor, whatever the mode): when the selected backend
  reads level tables from device memory (``Capabilities.level_tables``: the Triton kernels take
  ``shapes_ptr`` / ``starts_ptr``), the call is bound without reading the values: the tables
  are the shapes as int32 (N_l, 2) and the starts as int32 (N_l,) — level_start_index's own
  values when it is a tensor on the same device, else derived on the device — computed by
  device operations only, so no call copies to the host or synchronizes, and CUDA-graph capture
  (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) works. The planning facts
  come from tensor shapes: N_l is ``spatial_shapes.shape[0]``, L is value's length.
  **The values are not checked on this route** (positive sizes, sum(H*W) = L, the starts), as
  Deformable-DETR's CUDA op does not check them: pass Python ints (or a CPU tensor) to have them
  checked. A backend that needs the values on the host (the reference backend, e.g. for float64
  or padding_mode="reflection") reads them (one host copy), which fails during CUDA-graph capture
  with an error saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nkilib_msda._env import check_optional_bool
from nkilib_msda.pytorch import dispatch
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.validation.layouts import VALUE_DIMS
from nkilib_msda.validation.msda import MSDAProblem, check_shape_tensors

__all__ = ["check_shapes_tensor", "shapes_on_device", "LevelTables", "level_tables",
           "TensorShapesProblem", "tensor_shapes_problem", "validation_shapes",
           "tensor_shapes_operator_args", "refuse_host_read_in_capture"]


def check_shapes_tensor(spatial_shapes: Tensor, level_start_index: Any = None,
                        value: Any = None) -> None:
    """The static checks of a shapes tensor (and level starts): integer dtypes and values to
    read (:func:`~nkilib_msda.validation.msda.check_shape_tensors`), then the rank (N_l, 2)."""
    check_shape_tensors(spatial_shapes, level_start_index, value)
    if spatial_shapes.dim() != 2 or spatial_shapes.shape[1] != 2:
        raise ValueError(f"spatial_shapes: expected an int tensor (N_l, 2) of (H, W) per level, "
                         f"got shape {tuple(spatial_shapes.shape)}")


def shapes_on_device(spatial_shapes: Any) -> bool:
    """Whether ``spatial_shapes`` is a tensor whose values live in accelerator memory (reading
    them on the host is a copy and a stream synchronisation)."""
    return isinstance(spatial_shapes, Tensor) and spatial_shapes.device.type not in ("cpu", "meta")


class LevelTables(NamedTuple):
    """The kernels' level tables on the device: shapes int32 (N_l, 2) as (H, W) rows and starts
    int32 (N_l,), both contiguous."""

    shapes: Tensor
    starts: Tensor


def level_tables(spatial_shapes: Tensor, level_start_index: Any) -> LevelTables:
    """The level tables from a shapes tensor, by device operations only (capturable in a CUDA
    graph, no host synchronisation). The starts are level_start_index's values when it is a
    tensor on the shapes' device, else the exclusive cumulative sum of H*W computed there."""
    check_shapes_tensor(spatial_shapes)
    shapes = spatial_shapes.to(torch.int32).contiguous()
    if isinstance(level_start_index, Tensor) and level_start_index.device == shapes.device:
        if level_start_index.numel() != shapes.shape[0]:
            raise ValueError(f"level_start_index: expected {shapes.shape[0]} starts (one per level "
                             f"of spatial_shapes), got shape {tuple(level_start_index.shape)}")
        starts = level_start_index.reshape(-1).to(torch.int32).contiguous()
    else:
        areas = shapes[:, 0] * shapes[:, 1]
        starts = areas.cumsum(0, dtype=torch.int32) - areas
    return LevelTables(shapes, starts)


@dataclass(frozen=True)
class TensorShapesProblem(MSDAProblem):
    """An MSDA problem whose spatial shapes and level starts are in device tensors: their values
    are unknown on the host, so ``spatial_shapes`` and ``level_start_index`` are empty tuples;
    ``num_levels`` is the shapes tensor's N_l and ``total_pixels`` value's length L. Only a
    backend declaring ``Capabilities.level_tables`` runs it (with the tables)."""

    pixels: int = 0

    @property
    def total_pixels(self) -> int:
        """L, from value's shape."""
        return self.pixels


def _stand_in_shapes(num_levels: int, pixels: int) -> tuple[tuple[int, int], ...]:
    """N_l positive (H, W) pairs summing to L (L >= N_l): what validation needs to check every
    static fact of a call (tensor ranks, sizes, dtypes, layouts) without the real values."""
    if num_levels < 1:
        return ()
    return ((1, pixels - num_levels + 1),) + ((1, 1),) * (num_levels - 1)


def validation_shapes(problem: MSDAProblem) -> tuple[tuple[int, int], ...]:
    """The spatial shapes to validate ``problem``'s tensors against (stand-ins for a
    :class:`TensorShapesProblem`)."""
    if isinstance(problem, TensorShapesProblem):
        return _stand_in_shapes(problem.num_levels, problem.pixels)
    return problem.spatial_shapes


def _pixels(value: Any, value_layout: Any) -> int | None:
    """value's length L when value is a 4-d tensor in a known layout (else None: validation
    reports what is wrong)."""
    if not isinstance(value, Tensor) or value.dim() != 4 or value_layout not in VALUE_DIMS:
        return None
    size = value.shape[VALUE_DIMS[value_layout].index("L")]
    return size if type(size) is int else None


# validated stand-in problem -> its TensorShapesProblem, by identity (validation memoizes).
_AS_TENSOR_SHAPES: dict[int, tuple[MSDAProblem, TensorShapesProblem]] = {}


def tensor_shapes_problem(value: Any, spatial_shapes: Tensor, sampling_locations: Any,
                          attention_weights: Any, value_layout: Any,
                          sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                          grad_output: Any = None) -> TensorShapesProblem:
    """The problem of a call whose shapes stay in ``spatial_shapes`` (N_l, 2): every static
    fact validated (memoized, with the one-line errors of the int-list route), the values not."""
    check_shapes_tensor(spatial_shapes)
    num_levels = int(spatial_shapes.shape[0])
    pixels = _pixels(value, value_layout)
    if pixels is not None and pixels < num_levels:
        raise ValueError(f"value: expected L >= N_l = {num_levels} (at least one pixel per level "
                         f"of spatial_shapes), got L = {pixels}")
    stand_in = _stand_in_shapes(num_levels, 1 if pixels is None else pixels)
    problem = validated_problem(value, stand_in, None, sampling_locations, attention_weights,
                                value_layout, sampling_locations_layout, align_corners,
                                padding_mode, grad_output=grad_output)
    known = _AS_TENSOR_SHAPES.get(id(problem))
    if known is not None and known[0] is problem:
        return known[1]
    values = {f.name: getattr(problem, f.name) for f in fields(MSDAProblem)}
    values.update(spatial_shapes=(), level_start_index=())
    result = TensorShapesProblem(**values, pixels=problem.total_pixels)
    if len(_AS_TENSOR_SHAPES) >= 256:
        _AS_TENSOR_SHAPES.clear()
    _AS_TENSOR_SHAPES[id(problem)] = (problem, result)
    return result


def refuse_host_read_in_capture(backend: str) -> None:
    """Raise a one-line error instead of torch's when the shapes would be read on the host while
    a CUDA graph is captured (the backend running the call needs their values)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            f"spatial_shapes: a CUDA tensor cannot be read on the host during CUDA graph capture, "
            f"and backend {backend!r}, which runs this call, needs its values; use a backend that "
            f"reads them on the device (triton) or pass the (H, W) pairs as Python ints")


def tensor_shapes_operator_args(value: Any, spatial_shapes: Tensor, level_start_index: Any,
                                sampling_locations: Any, attention_weights: Any,
                                value_layout: str, sampling_locations_layout: str,
                                align_corners: bool, padding_mode: str, backend: Any,
                                deterministic: Any) -> tuple:
    """The tensor-shapes forward operator's positional arguments for a user call.

    Only what is static is checked here (argument types, the shapes tensor's dims, the
    backend's name); the values are handled by the operator when it runs. Level starts given
    as ints become a constant tensor for a CPU shapes tensor (checked when the operator runs)
    and are dropped for a shapes tensor on a device (derived there, see the module docstring)."""
    for name, x in (("value", value), ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    check_shapes_tensor(spatial_shapes)
    if level_start_index is not None and not isinstance(level_start_index, Tensor):
        starts = [int(s) for s in level_start_index]
        level_start_index = (None if shapes_on_device(spatial_shapes)
                             else torch.tensor(starts, dtype=torch.int64))
    return (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
            value_layout, sampling_locations_layout, align_corners, padding_mode,
            dispatch.backend_argument(backend), check_optional_bool("deterministic", deterministic))
