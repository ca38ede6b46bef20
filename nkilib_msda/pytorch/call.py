"""One MSDA call, bound once: the validated problem, the backend chosen for it and the options.

:func:`bind_msda_call` is the only place the torch layer turns user or operator arguments into
a call: it checks them (:func:`~nkilib_msda.pytorch.problem_cache.validated_problem`, memoized
on the call's static facts) and selects the backend (:func:`.dispatch.select_backend`), once.
The functional API binds the user's arguments; the registered operators bind theirs (the
untrusted boundary: anyone may call ``torch.ops.nkilib_msda.*``). Forward and backward then
take the :class:`MsdaCall`, never the raw arguments again.

After validation ``spatial_shapes`` has one form, ``problem.spatial_shapes`` (a tuple of
(H, W) int pairs); the operators' flat int list ``[H0, W0, H1, W1, ...]`` exists only on the
operator boundary (:meth:`MsdaCall.op_args`, ``ops.MsdaFamily.bind``). The exception is a
shapes tensor on a device whose backend reads level tables there (:mod:`.tensor_shapes_ops`):
then the call carries the tables (``MsdaCall.tables``) and a problem without the values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from nkilib_msda._env import check_optional_bool
from nkilib_msda.backends import get_backend
from nkilib_msda.pytorch import dispatch
from nkilib_msda.pytorch._modes import autocast_disabled
from nkilib_msda.pytorch.problem_cache import validated_problem
from nkilib_msda.pytorch.tensor_shapes_ops import (
    LevelTables, level_tables, refuse_host_read_in_capture, shapes_on_device,
    tensor_shapes_problem, validation_shapes)
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["MsdaCall", "bind_msda_call", "msda_operator_args",
           "spatial_shapes_from_flat", "needs_input_grad"]


def needs_input_grad(*tensors: Any) -> bool:
    """Whether autograd will record this call (grad mode on and an input requires grad)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


@dataclass(frozen=True)
class MsdaCall:
    """A validated MSDA call and the backend that runs it.

    ``backend`` was selected for ``problem`` from ``request`` (the ``backend=`` argument, None
    for automatic); ``backward_checked`` says the selection also checked the backward's limits
    (otherwise :meth:`for_backward` does, once, when autograd records the call). ``tables``:
    the level tables on the device when the shapes stay there (then ``problem`` is a
    :class:`~.tensor_shapes_ops.TensorShapesProblem`), else None.
    """

    problem: MSDAProblem
    backend: str
    request: str | None
    deterministic: bool | None
    backward_checked: bool
    tables: LevelTables | None = None

    # ------------------------------------------------------------------ compute

    def forward(self, value: Tensor, sampling_locations: Tensor,
                attention_weights: Tensor) -> Tensor:
        """(B, N_q, N_h*C_h) in value's dtype; empty problems call no kernel."""
        if _is_empty(self.problem):
            return value.new_zeros(self.problem.output_shape)
        backend = get_backend(self.backend)
        with autocast_disabled(value.device.type):
            if self.tables is None:
                out = backend.msda_forward(value, self.problem, sampling_locations,
                                           attention_weights)
            else:
                out = backend.msda_forward(value, self.problem, sampling_locations,
                                           attention_weights, level_tables=self.tables)
        return _as_like(out, value.dtype, None)

    def backward(self, grad_output: Tensor, value: Tensor, sampling_locations: Tensor,
                 attention_weights: Tensor, compute: tuple[bool, bool, bool]
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """(grad_value, grad_sampling_locations, grad_attention_weights), each in its input's
        shape, layout and dtype; zeros where ``compute`` is False. ``grad_output`` must have
        been checked against the problem (:meth:`check_grad_output` or the binding)."""
        flags = (bool(compute[0]), bool(compute[1]), bool(compute[2]))
        if any(flags) and not _is_empty(self.problem):
            backend = get_backend(self.backend)
            with autocast_disabled(value.device.type):
                if self.tables is None:
                    grads = backend.msda_backward(grad_output, value, self.problem,
                                                  sampling_locations, attention_weights, flags,
                                                  deterministic=self.deterministic)
                else:
                    grads = backend.msda_backward(grad_output, value, self.problem,
                                                  sampling_locations, attention_weights, flags,
                                                  deterministic=self.deterministic,
                                                  level_tables=self.tables)
        else:
            grads = (torch.zeros_like(value), torch.zeros_like(sampling_locations),
                     torch.zeros_like(attention_weights))
        grad_value, grad_loc, grad_attn = grads
        return (_as_like(grad_value, value.dtype, value.shape),
                _as_like(grad_loc, sampling_locations.dtype, sampling_locations.shape),
                _as_like(grad_attn, attention_weights.dtype, attention_weights.shape))

    # ------------------------------------------------------------------ checks

    def for_backward(self, value: Tensor, sampling_locations: Tensor) -> "MsdaCall":
        """This call with its backend checked against the backward's limits (itself when
        already checked): the same backend when its backward can run the call, otherwise an
        error for an explicit choice and the fallback backend for an automatic one."""
        if self.backward_checked:
            return self
        name = dispatch.backward_backend(self.backend, self.request, self.problem, value,
                                         sampling_locations)
        return replace(self, backend=name, backward_checked=True)

    def check_grad_output(self, grad_output: Tensor, value: Tensor, sampling_locations: Tensor,
                          attention_weights: Tensor) -> None:
        """Raise the validation's error unless ``grad_output`` is (B, N_q, N_h*C_h) in a float
        dtype (the autograd engine hands a node exactly its output's shape and dtype)."""
        p = self.problem
        if grad_output.shape == p.output_shape and grad_output.dtype == value.dtype:
            return
        shapes = validation_shapes(p)
        validated_problem(value, shapes, None if shapes is not p.spatial_shapes else
                          p.level_start_index, sampling_locations, attention_weights,
                          p.value_layout, p.sampling_locations_layout, p.align_corners,
                          p.padding_mode, grad_output=grad_output)

    # ------------------------------------------------------------------ operator boundary

    def op_args(self) -> tuple[Any, Any, str, str, bool, str]:
        """(spatial shapes, level starts, value_layout, sampling_locations_layout,
        align_corners, padding_mode) as the operators take them: flat int lists for the int-list
        family, the level tables for the tensor-shapes family (when :attr:`tables` is set)."""
        args = _problem_op_args(self.problem)
        if self.tables is not None:
            return (self.tables.shapes, self.tables.starts, *args[2:])
        return args

    @property
    def op_backend(self) -> str:
        """The ``backend`` argument for the operators: the request, "auto" when automatic (so
        a traced graph resolves it where it runs)."""
        return dispatch.AUTO if self.request is None else self.request


def _problem_op_args(p: MSDAProblem) -> tuple[list[int], list[int], str, str, bool, str]:
    return ([d for pair in p.spatial_shapes for d in pair], list(p.level_start_index),
            p.value_layout, p.sampling_locations_layout, p.align_corners, p.padding_mode)


def _is_empty(problem: MSDAProblem) -> bool:
    """B = 0 or N_q = 0: the output is empty and no kernel runs."""
    return problem.batch == 0 or problem.num_queries == 0


def _as_like(x: Tensor, dtype: torch.dtype, shape: torch.Size | None) -> Tensor:
    """``x.to(dtype).reshape(shape).contiguous()``, skipping the calls that would be no-ops
    (each costs microseconds of host time)."""
    if x.dtype != dtype:
        x = x.to(dtype)
    if shape is not None and x.shape != shape:
        x = x.reshape(shape)
    return x.contiguous()


def _check_tensors(value: Any, sampling_locations: Any, attention_weights: Any) -> None:
    for name, x in (("value", value), ("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _check_devices(value: Tensor, sampling_locations: Tensor, attention_weights: Tensor) -> None:
    for name, x in (("sampling_locations", sampling_locations),
                    ("attention_weights", attention_weights)):
        if x.device != value.device:
            raise ValueError(f"{name}: expected a tensor on value's device {value.device}, "
                             f"got one on {x.device}")


def bind_msda_call(value: Any, spatial_shapes: Any, level_start_index: Any,
                   sampling_locations: Any, attention_weights: Any, value_layout: Any,
                   sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                   backend: Any, deterministic: Any, *, needs_backward: bool,
                   grad_output: Any = None) -> MsdaCall:
    """Validate the arguments (once, memoized) and select the backend (once): the call.

    ``backend``: None or "auto" (automatic), or a backend name. ``needs_backward``: select
    with the backward's limits too (autograd will record the call). ``grad_output``: the
    backward operator's incoming gradient, validated with the rest."""
    argument = dispatch.backend_argument(backend)
    request = None if argument == dispatch.AUTO else argument
    if shapes_on_device(spatial_shapes):
        call = _bind_on_device(value, spatial_shapes, level_start_index, sampling_locations,
                               attention_weights, value_layout, sampling_locations_layout,
                               align_corners, padding_mode, request, deterministic,
                               needs_backward, grad_output)
        if call is not None:
            return call
    problem, deterministic = _checked_problem(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        value_layout, sampling_locations_layout, align_corners, padding_mode, deterministic,
        grad_output)
    name = dispatch.select_backend(request, problem, value, sampling_locations,
                                   needs_backward=needs_backward)
    return MsdaCall(problem, name, request, deterministic, needs_backward)


def _bind_on_device(value: Any, spatial_shapes: Tensor, level_start_index: Any,
                    sampling_locations: Any, attention_weights: Any, value_layout: Any,
                    sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                    request: str | None, deterministic: Any, needs_backward: bool,
                    grad_output: Any) -> MsdaCall | None:
    """The call with the shapes kept on the device (no host read) when the backend selected
    for it reads level tables there; None when it needs the values on the host (refused while a
    CUDA graph is captured)."""
    _check_tensors(value, sampling_locations, attention_weights)
    if spatial_shapes.device != value.device:
        raise ValueError(f"spatial_shapes: expected a tensor on value's device {value.device} (or "
                         f"on the CPU, or Python ints), got one on {spatial_shapes.device}")
    if not dispatch.takes_level_tables(request, value.device):
        refuse_host_read_in_capture(dispatch.requested_backend(request, value.device).name)
        return None
    deterministic = check_optional_bool("deterministic", deterministic)
    problem = tensor_shapes_problem(value, spatial_shapes, sampling_locations, attention_weights,
                                    value_layout, sampling_locations_layout, align_corners,
                                    padding_mode, grad_output)
    _check_devices(value, sampling_locations, attention_weights)
    name = dispatch.select_backend(request, problem, value, sampling_locations,
                                   needs_backward=needs_backward)
    if not get_backend(name).CAPABILITIES.level_tables:  # the automatic fallback
        refuse_host_read_in_capture(name)
        return None
    return MsdaCall(problem, name, request, deterministic, needs_backward,
                    level_tables(spatial_shapes, level_start_index))


def _checked_problem(value: Any, spatial_shapes: Any, level_start_index: Any,
                     sampling_locations: Any, attention_weights: Any, value_layout: Any,
                     sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                     deterministic: Any, grad_output: Any) -> tuple[MSDAProblem, bool | None]:
    deterministic = check_optional_bool("deterministic", deterministic)
    _check_tensors(value, sampling_locations, attention_weights)
    problem = validated_problem(value, spatial_shapes, level_start_index, sampling_locations,
                                attention_weights, value_layout, sampling_locations_layout,
                                align_corners, padding_mode, grad_output=grad_output)
    _check_devices(value, sampling_locations, attention_weights)
    return problem, deterministic


def msda_operator_args(value: Any, spatial_shapes: Any, level_start_index: Any,
                       sampling_locations: Any, attention_weights: Any, value_layout: Any,
                       sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                       backend: Any, deterministic: Any) -> tuple:
    """The forward operator's positional arguments for a user call routed through the
    dispatcher: checked like :func:`bind_msda_call` (errors name the argument; the validation
    is memoized) but with no backend selected. The operator binds the call when it runs (the
    one selection; its autograd node re-uses it), and the automatic choice travels as "auto",
    so a traced or exported graph selects on the machine and device where it runs."""
    problem, deterministic = _checked_problem(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        value_layout, sampling_locations_layout, align_corners, padding_mode, deterministic,
        None)
    shapes, starts, value_layout, loc_layout, align_corners, padding_mode = _problem_op_args(problem)
    return (value, shapes, starts, sampling_locations, attention_weights, value_layout,
            loc_layout, align_corners, padding_mode, dispatch.backend_argument(backend),
            deterministic)


def spatial_shapes_from_flat(flat: list[int]) -> tuple[tuple[int, int], ...]:
    """The operators' ``[H0, W0, H1, W1, ...]`` as (H, W) pairs (checked by the validation)."""
    if len(flat) % 2:
        raise ValueError(f"spatial_shapes: expected a flat list [H0, W0, H1, W1, ...], got {flat!r}")
    return tuple((int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))
