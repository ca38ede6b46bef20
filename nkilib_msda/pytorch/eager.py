"""Eager fast path: run a bound call without the dispatcher round trip.

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
"""

from __future__ import annotations

from torch import Tensor

from nkilib_msda.pytorch import ops
from nkilib_msda.pytorch._modes import can_skip_dispatcher, profiler_range
from nkilib_msda.pytorch.call import MsdaCall

__all__ = ["can_skip_dispatcher", "msda_forward_eager"]


def msda_forward_eager(call: MsdaCall, value: Tensor, sampling_locations: Tensor,
                       attention_weights: Tensor) -> Tensor:
    """The forward operator's result (and autograd) for a bound call. ``call`` must have been
    bound with ``needs_backward`` exactly when autograd records this call; only valid when
    :func:`can_skip_dispatcher` holds for the three tensors."""
    if call.backward_checked:
        return ops.MSDAFunction.apply(value, sampling_locations, attention_weights, call)
    with profiler_range(ops.FORWARD_NAME):
        return call.forward(value, sampling_locations, attention_weights)
