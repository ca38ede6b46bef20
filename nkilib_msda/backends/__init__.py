"""The one registry of compute backends for torch tensors (MSDA and Block AttnRes).

Every backend module implements the MSDA interface:

- ``is_available() -> bool``
- ``unsupported_reason(problem, value, sampling_locations) -> str | None``
- ``msda_forward(value, problem, sampling_locations, attention_weights) -> Tensor``
  (B, N_q, N_h*C_h) in value's dtype
- ``msda_backward(grad_output, value, problem, sampling_locations, attention_weights, compute,
  deterministic=None) -> (grad_value, grad_sampling_locations, grad_attention_weights)`` in the
  input layouts, any float dtype, zeros where ``compute`` is False; ``deterministic=True`` asks
  for a bitwise-reproducible grad_value (backends that are always deterministic ignore it).

A forward-only call is checked with ``unsupported_reason`` alone; a backend whose backward
has further limits adds ``backward_unsupported_reason(problem, value, sampling_locations)``.

Backends listed in :data:`BLOCK_ATTN_RES_BACKENDS` also implement Block AttnRes:
``block_attn_res_unsupported_reason(device, dtype) -> str | None``,
``block_attn_res_forward(values, w, gamma, scale, eps, enable_rmsnorm) -> (h, rms, alpha)`` and
``block_attn_res_backward(grad_h, values, w, alpha, gamma, rms, scale, enable_rmsnorm)
-> (grad_values, grad_w, grad_gamma)`` (shapes in :mod:`nkilib_msda.pytorch.block_attn_res_ops`).

Modules are imported lazily so that e.g. Triton is only imported when asked for.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["BACKEND_NAMES", "BLOCK_ATTN_RES_BACKENDS", "BackendUnavailableError", "get_backend",
           "backend_availability"]

_MODULES = {
    "reference": "nkilib_msda.backends.reference_torch",
    "nki": "nkilib_msda.backends.nki_backend",
    "triton": "nkilib_msda.backends.triton_backend",
}
BACKEND_NAMES = tuple(_MODULES)
# The backends that also implement Block AttnRes (there is no Triton Block AttnRes).
BLOCK_ATTN_RES_BACKENDS = ("reference", "nki")


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
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(f"backend: expected one of {list(BACKEND_NAMES)} or None, got {name!r}")
    try:
        module = importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} could not be imported: {exc}") from exc
    _LOADED[name] = module
    return module


def backend_availability() -> dict[str, str]:
    """For ``info``: each backend name -> 'available' or why not."""
    status = {}
    for name in BACKEND_NAMES:
        try:
            module = get_backend(name)
            ok = module.is_available()
        except Exception as exc:  # noqa: BLE001 - report, never fail `info`
            status[name] = f"unavailable ({type(exc).__name__}: {exc})"
            continue
        status[name] = "available" if ok else "unavailable"
    return status
