"""The one registry of compute backends for torch tensors (MSDA and Block AttnRes).

Every backend module implements :class:`~nkilib_msda.backends.protocol.MsdaBackend` and
declares its ``NAME`` and :class:`~nkilib_msda.backends.protocol.Capabilities` (devices,
dtypes, layouts, padding modes, determinism, Block AttnRes): dispatch reads those, never a
table of its own. The MSDA interface:

- ``is_available() -> bool``
- ``unsupported_reason(problem, value, sampling_locations) -> str | None`` (the declared
  capabilities first, then limits that depend on the problem)
- ``msda_forward(value, problem, sampling_locations, attention_weights) -> Tensor``
  (B, N_q, N_h*C_h) in value's dtype
- ``msda_backward(grad_output, value, problem, sampling_locations, attention_weights, compute,
  deterministic=None) -> (grad_value, grad_sampling_locations, grad_attention_weights)`` in the
  input layouts, any float dtype, zeros where ``compute`` is False; ``deterministic=True`` asks
  for a bitwise-reproducible grad_value (backends that are always deterministic ignore it).

A forward-only call is checked with ``unsupported_reason`` alone; the backward's further limits
are ``backward_unsupported_reason(problem, value, sampling_locations)``.

Backends whose capabilities list Block AttnRes dtypes (:func:`block_attn_res_backends`) also
implement it (:class:`~nkilib_msda.backends.protocol.BlockAttnResBackend`):
``block_attn_res_unsupported_reason(device, dtype) -> str | None``,
``block_attn_res_forward(values, w, gamma, scale, eps, enable_rmsnorm) -> (h, rms, alpha)`` and
``block_attn_res_backward(grad_h, values, w, alpha, gamma, rms, scale, enable_rmsnorm)
-> (grad_values, grad_w, grad_gamma)`` (shapes in :mod:`nkilib_msda.pytorch.block_attn_res_ops`).

Modules are imported on first use (each imports its heavy dependencies, e.g. Triton, only
when it computes).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["BACKEND_NAMES", "BLOCK_ATTN_RES_BACKENDS", "FALLBACK_BACKEND", "BackendUnavailableError",
           "get_backend", "block_attn_res_backends"]

# Where each backend lives, in the automatic choice's order of preference; what each can do
# is declared by the module itself (``CAPABILITIES``).
_LOCATIONS = {
    "reference": "nkilib_msda.backends.reference.backend",
    "nki": "nkilib_msda.backends.nki_backend",
    "triton": "nkilib_msda.backends.triton.backend",
}
BACKEND_NAMES = tuple(_LOCATIONS)
# Runs every call on every device: the automatic choice falls back to it.
FALLBACK_BACKEND = "reference"


class BackendUnavailableError(ValueError, RuntimeError):
    """The requested backend cannot run in this environment (or for this problem).

    A ValueError, like every error a caller's arguments or environment can cause (docs/api.md);
    also a RuntimeError, which it was before, so existing ``except RuntimeError`` keeps working."""


# Imported backend modules. A plain dict lookup keeps `get_backend` traceable by torch.compile
# once a backend has been imported (importlib itself is not traceable).
_LOADED: dict[str, ModuleType] = {}


def get_backend(name: str) -> ModuleType:
    """The backend module called ``name`` ('reference', 'nki' or 'triton')."""
    module = _LOADED.get(name)
    if module is not None:
        return module
    if not isinstance(name, str) or name not in _LOCATIONS:
        raise ValueError(f"backend: expected one of {list(BACKEND_NAMES)} or None, got {name!r}")
    try:
        module = importlib.import_module(_LOCATIONS[name])
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} could not be imported: {exc}") from exc
    _LOADED[name] = module
    return module


def block_attn_res_backends() -> tuple[str, ...]:
    """The backends whose capabilities include Block AttnRes, in registry order (their
    declarations are constants: computed once, kept in a plain list that torch.compile
    traces through)."""
    if not _BLOCK_ATTN_RES:
        _BLOCK_ATTN_RES.append(_declaring_block_attn_res())
    return _BLOCK_ATTN_RES[0]


_BLOCK_ATTN_RES: list[tuple[str, ...]] = []


def _declaring_block_attn_res() -> tuple[str, ...]:
    names = []
    for name in BACKEND_NAMES:
        try:
            module = get_backend(name)
        except BackendUnavailableError:
            continue
        if module.CAPABILITIES.block_attn_res:
            names.append(name)
    return tuple(names)


def __getattr__(name: str) -> Any:
    if name == "BLOCK_ATTN_RES_BACKENDS":  # derived from the declarations, on first use
        return block_attn_res_backends()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
