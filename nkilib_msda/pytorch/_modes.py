"""Whether the current call can be observed by anything but plain eager execution.

Used by the eager fast path (:mod:`.eager`) and the shared autograd (:mod:`.ops`): the operator
bodies may be called directly, without the dispatcher round trip, only when this says so.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import Tensor, nn

__all__ = ["can_skip_dispatcher", "plain_eager_now", "in_functorch_transform", "profiler_range", "autocast_disabled",
           "values_unreadable", "FAST_PATH_DEVICES"]

# Device types whose eager calls may skip the dispatcher; any other (TorchNeuron's
# PrivateUse1, meta) always meets the registered operators' kernels.
FAST_PATH_DEVICES = ("cpu", "cuda")

_PLAIN_TENSOR_TYPES = (Tensor, nn.Parameter)
_C = torch._C


def plain_eager_now() -> bool:
    """Nothing but plain eager execution can observe a call made now: no torch.compile /
    export tracing, no ``torch.jit.trace``, no TorchDispatchMode or TorchFunctionMode, no
    functorch transform (the tensors' own checks are :func:`can_skip_dispatcher`'s)."""
    if torch.compiler.is_compiling():  # first: dynamo folds it (the others would break)
        return False
    return not (_C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()
                or _C._get_tracing_state() is not None
                or _C._functorch.peek_interpreter_stack() is not None)


def can_skip_dispatcher(*tensors: Tensor) -> bool:
    """Whether calling the operator bodies directly is indistinguishable from the operators.

    False while tracing (torch.compile / export, ``torch.jit.trace``), under any
    TorchDispatchMode or TorchFunctionMode, inside functorch transforms, for tensor subclasses
    and for meta tensors (those go through the operators' fake kernels).
    """
    if not plain_eager_now():
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TENSOR_TYPES or t.is_meta:
            return False
    return True


def values_unreadable(x: Tensor) -> bool:
    """Whether the values of tensor ``x`` cannot be read now: while torch.compile /
    torch.export traces (reading them would break the graph), or a fake tensor (fake mode)."""
    if torch.compiler.is_compiling():
        return True
    return type(x) is not Tensor and torch._subclasses.fake_tensor.is_fake(x)


def in_functorch_transform() -> bool:
    """Inside a ``torch.func`` transform (grad, vjp, jacrev, vmap, ...) in eager mode.

    Always False while torch.compile traces: dynamo reports an interpreter there whether or not
    the user's code is transformed, and its graphs use the operators' registered autograd."""
    if torch.compiler.is_compiling():
        return False
    return _C._functorch.peek_interpreter_stack() is not None


# contextlib.nullcontext is reusable and reentrant: one instance serves every call.
_NO_CONTEXT = contextlib.nullcontext()


def profiler_range(name: str) -> ContextManager:
    """A profiler range called ``name`` while a profiler runs (what the operator would show)."""
    if _C._autograd._profiler_enabled():
        return torch.autograd.profiler.record_function(name)
    return _NO_CONTEXT


def autocast_disabled(device_type: str) -> ContextManager:
    """Autocast off for ``device_type`` while the operator bodies run: the operators compute in
    the dtypes they receive (fp32 coordinates and accumulation) whatever the caller's autocast
    region says. A no-op when autocast is already off there."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast support
        return _NO_CONTEXT
    if not enabled:
        return _NO_CONTEXT
    return torch.autocast(device_type=device_type, enabled=False)
