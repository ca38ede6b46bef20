"""Eager fast path: run the operators' bodies without the dispatcher round trip.

Calling ``torch.ops.nkilib_msda.ms_deformable_attention`` costs about 100 µs of host time per
call (custom-op dispatch, dynamo-disable wrappers, a second validation), more than a decoder's
whole GPU time. In plain eager mode that round trip buys nothing, so
:func:`msda_forward_eager` calls the same body (:func:`ops.forward_with_backend`) directly,
through :class:`ops.MSDAFunction` when a gradient is needed: the very context and backward
(:func:`ops.save_msda_context`, :func:`ops.msda_input_gradients`) the operator's registered
autograd uses.

The registered operators stay the only path whenever something could observe the difference
(:func:`can_skip_dispatcher` is False): torch.compile / export tracing, ``torch.jit.trace``,
any TorchDispatchMode (FakeTensorMode, make_fx, FlopCounterMode, ...), any TorchFunctionMode
(``with torch.device(...)``), functorch transforms (vmap, grad), tensor subclasses and meta
tensors. While a profiler runs, the direct calls are wrapped in ranges named like the
operators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nkilib_msda.pytorch import ops
from nkilib_msda.pytorch._modes import can_skip_dispatcher, profiler_range
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["can_skip_dispatcher", "msda_forward_eager"]


def msda_forward_eager(problem: MSDAProblem, backend: str, value: Tensor,
                       sampling_locations: Tensor, attention_weights: Tensor,
                       deterministic: bool | None = None) -> Tensor:
    """The forward operator's result (and autograd) for a validated call; ``backend`` is the
    name :func:`select_backend` returned for it (with ``needs_backward`` when an input requires
    grad), so it is not checked again. Only valid when :func:`can_skip_dispatcher` holds for
    the three tensors."""
    if torch.is_grad_enabled() and (value.requires_grad or sampling_locations.requires_grad
                                    or attention_weights.requires_grad):
        return ops.MSDAFunction.apply(value, sampling_locations, attention_weights,
                                      ops.MSDAStatic(problem, backend, deterministic,
                                                     resolved=True))
    with profiler_range(ops.FORWARD_NAME):
        return ops.forward_with_backend(backend, problem, value, sampling_locations,
                                        attention_weights, resolved=True)
