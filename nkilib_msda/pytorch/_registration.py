"""How the package's torch operators are registered (MSDA and Block AttnRes alike).

:func:`register_operator` makes one ``torch.library.custom_op`` with

- its implementation for every device, also registered for ``PrivateUse1`` (TorchNeuron's
  ``neuron`` device: the same body, whose automatic backend choice there is "nki");
- a fake (meta) kernel, so tracing, ``torch.compile``, ``torch.export`` and meta tensors see
  shapes without running anything;
- ``AutocastCPU`` / ``AutocastCUDA`` kernels that rerun it with autocast off, so an autocast
  region never changes what it computes (it works in the dtypes it receives);
- optionally autograd (``backward`` and ``setup_context``);
- optionally an explicit ``schema`` (otherwise inferred from ``impl``'s type hints): then the
  implementation and the fake kernel receive every argument positionally, the schema's
  defaults filled in for those the caller left out, so they need not repeat the defaults.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["LIBRARY", "register_operator"]

LIBRARY = "nkilib_msda"
# custom_op cannot register autocast keys itself: they go through a Library fragment.
_LIB = torch.library.Library(LIBRARY, "FRAGMENT")  # noqa: TOR901 - keys custom_op lacks
# TorchNeuron's device is PrivateUse1 renamed to "neuron"; "privateuseone" is the name
# torch.library accepts before (and after) the rename.
_NEURON_KEY = "privateuseone"
_AUTOCAST_KEYS = (("AutocastCPU", "cpu"), ("AutocastCUDA", "cuda"))


def register_operator(name: str, impl: Callable[..., Any], fake: Callable[..., Any], *,
                      schema: str | None = None, backward: Callable[..., Any] | None = None,
                      setup_context: Callable[..., Any] | None = None) -> Any:
    """Register ``nkilib_msda::name`` (see the module docstring); returns the custom op."""
    if schema is not None:
        defaults: list[Any] = []
        impl, fake = _with_defaults(impl, defaults), _with_defaults(fake, defaults)
    op = torch.library.custom_op(f"{LIBRARY}::{name}", impl, mutates_args=(), schema=schema)
    if schema is not None:
        defaults.extend(argument.default_value if argument.has_default_value() else None
                        for argument in getattr(torch.ops.nkilib_msda, name).default._schema.arguments)
    op.register_fake(fake)
    op.register_kernel(_NEURON_KEY)(impl)
    for key, device_type in _AUTOCAST_KEYS:
        _LIB.impl(name, _autocast_off(name, device_type), key)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op


def _with_defaults(fn: Callable[..., Any], defaults: list[Any]) -> Callable[..., Any]:
    """``fn`` called with every argument: the dispatcher passes only those up to the last one
    the caller gave; ``defaults`` (one per schema argument) fills in the rest."""
    def full(*args: Any) -> Any:
        if len(args) < len(defaults):
            args = (*args, *defaults[len(args):])
        return fn(*args)

    return full


def _autocast_off(name: str, device_type: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, enabled=False):
            return getattr(torch.ops.nkilib_msda, name).default(*args, **kwargs)

    return kernel
