"""Eager fast path: run a bound call without the dispatcher round trip, and the memo of bound
calls that lets a repeated call skip binding altogether.

Calling ``torch.ops.nkilib_msda.ms_deformable_attention`` costs about 100 µs of host time per
call (custom-op dispatch, dynamo-disable wrappers, binding the operator's arguments again). In
plain eager mode that round trip buys nothing, so :func:`msda_forward_eager` runs the call the
functional API bound (:meth:`~nkilib_msda.pytorch.call.MsdaCall.forward`) directly, through
:class:`ops.MSDAFunction` when a gradient is needed: the very context and backward
(:func:`ops.save_msda_context`, :func:`ops.input_gradients`) the operators' registered
autograd uses.

The registered operators stay the only path whenever something could observe the difference
(:func:`can_skip_dispatcher` is False): torch.compile / export tracing, ``torch.jit.trace``,
any TorchDispatchMode (FakeTensorMode, make_fx, FlopCounterMode, ...), any TorchFunctionMode
(``with torch.device(...)``), functorch transforms (vmap, grad), tensor subclasses and meta
tensors. While a profiler runs, the direct calls are wrapped in ranges named like the
operators.

**The bound-call memo** (:func:`remember_eager_call`, :func:`run_remembered`). Binding a call
(validation memo lookup, the package's environment check, backend selection) costs more host
time than the rest of the eager forward. A call on the eager route whose spatial shapes are a
tuple of (H, W) tuples of ints and whose level starts are None or a tuple of ints is
remembered under one key: the identity of those two objects (deeply immutable; the memo keeps
them alive, so their ids cannot be reused while the entry exists), each tensor's shape, dtype
and device, the layouts, ``align_corners``, ``padding_mode``, the ``backend=`` and
``deterministic=`` arguments (exact types: ``True`` is not ``1``), whether autograd records the
call, and the raw strings of every environment variable the package reads
(:func:`~nkilib_msda._env.environment_snapshot`). These are every input of the binding: the
validation reads the static facts, the selection reads the request, the device, the dtypes,
the problem and the environment (``NKILIB_MSDA_BACKEND``, and ``TRITON_INTERPRET`` for the
Triton backend's CPU rule), and the package's variables are checked when one of them changes.
So a hit returns the call the binding would return now; a changed variable is a miss that
binds (and raises for a bad value) again, so "``NKILIB_MSDA_BACKEND`` takes effect on the next
call" stays true. Errors are never remembered (only a bound call is). A backend's availability
is a property of the process (an import that worked or failed) and is remembered with the
call. The entries live in the validation memo's dict (:mod:`.problem_cache`), so
``clear_problem_cache`` forgets them too and the same size bound applies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nkilib_msda._env import environment_snapshot
from nkilib_msda.pytorch import ops
from nkilib_msda.pytorch._modes import can_skip_dispatcher, profiler_range
from nkilib_msda.pytorch.call import MsdaCall
from nkilib_msda.pytorch.problem_cache import cached, store

__all__ = ["can_skip_dispatcher", "msda_forward_eager", "remember_eager_call",
           "run_remembered"]

_PLAIN = (Tensor, nn.Parameter)
_TAG = "eager msda call"  # the memo keys' first item (the dict also holds problems)
# torch.autograd.Function.apply less its functorch handling (unwrapping dead functorch
# wrappers, custom_function_call under transforms): the fast path only runs on plain tensors
# outside any transform (can_skip_dispatcher), where that handling does nothing.
_APPLY = super(torch.autograd.Function, ops.MSDAFunction).apply


def msda_forward_eager(call: MsdaCall, value: Tensor, sampling_locations: Tensor,
                       attention_weights: Tensor) -> Tensor:
    """The forward operator's result (and autograd) for a bound call. ``call`` must have been
    bound with ``needs_backward`` exactly when autograd records this call; only valid when
    :func:`can_skip_dispatcher` holds for the three tensors."""
    if call.backward_checked:
        return _APPLY(value, sampling_locations, attention_weights, call)
    with profiler_range(ops.FORWARD_NAME):
        return call.forward(value, sampling_locations, attention_weights)


def _key(value: Any, spatial_shapes: Any, level_start_index: Any, sampling_locations: Any,
         attention_weights: Any, value_layout: Any, sampling_locations_layout: Any,
         align_corners: Any, padding_mode: Any, backend: Any, deterministic: Any
         ) -> tuple | None:
    """The memo key of a call (module docstring), None when it has no cheap exact form."""
    if (type(value) not in _PLAIN or type(sampling_locations) not in _PLAIN
            or type(attention_weights) not in _PLAIN or type(spatial_shapes) is not tuple
            or (level_start_index is not None and type(level_start_index) is not tuple)
            or type(value_layout) is not str or type(sampling_locations_layout) is not str
            or type(padding_mode) is not str or type(align_corners) is not bool
            or (backend is not None and type(backend) is not str)
            or (deterministic is not None and type(deterministic) is not bool)):
        return None
    needs_backward = torch.is_grad_enabled() and (
        value.requires_grad or sampling_locations.requires_grad
        or attention_weights.requires_grad)
    return (_TAG, id(spatial_shapes), id(level_start_index),
            value.shape, value.dtype, value.device,
            sampling_locations.shape, sampling_locations.dtype, sampling_locations.device,
            attention_weights.shape, attention_weights.dtype, attention_weights.device,
            value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
            deterministic, needs_backward, environment_snapshot())


def _int_tuple(x: Any) -> bool:
    return type(x) is tuple and all(type(i) is int for i in x)


def remember_eager_call(call: MsdaCall, args: tuple) -> None:
    """Remember ``call``, just bound on the eager route from the functional API's eleven
    arguments ``args``, when they have a memo key (module docstring)."""
    spatial_shapes, level_start_index = args[1], args[2]
    if call.tables is not None or not (
            type(spatial_shapes) is tuple and all(_int_tuple(p) for p in spatial_shapes)
            and (level_start_index is None or _int_tuple(level_start_index))):
        return
    key = _key(*args)
    if key is not None and key[-2] == call.backward_checked:
        store(key, (call, spatial_shapes, level_start_index))


def run_remembered(value: Any, spatial_shapes: Any, level_start_index: Any,
                   sampling_locations: Any, attention_weights: Any, value_layout: Any,
                   sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                   backend: Any, deterministic: Any) -> Tensor | None:
    """The eager route's result from a remembered call, or None on a miss (the caller then
    routes the call). The caller checks first that nothing observes the call (no tracing,
    mode or transform: :func:`~._modes.plain_eager_now`)."""
    key = _key(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
               value_layout, sampling_locations_layout, align_corners, padding_mode, backend,
               deterministic)
    if key is None:
        return None
    entry = cached(key)
    if entry is None or entry[1] is not spatial_shapes or entry[2] is not level_start_index:
        return None
    return msda_forward_eager(entry[0], value, sampling_locations, attention_weights)
