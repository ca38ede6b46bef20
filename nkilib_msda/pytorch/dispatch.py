"""Backend selection: the ``backend=`` argument, then ``NKILIB_MSDA_BACKEND``, then the device.

- An explicit choice (argument or environment variable) must work: a backend that is not
  available, or cannot do the requested mode, raises an error saying why.
- The automatic choice (``None`` / ``"auto"`` and no environment variable) goes by device: the
  first registered backend that declares itself the default for the device type
  (``CAPABILITIES.default_for``: CUDA -> "triton", TorchNeuron's ``neuron`` device -> "nki"),
  else the fallback backend ("reference"), which it also falls back to when the device's
  backend cannot run the call.
- Whether a backend can run a call is its own answer (``unsupported_reason``: its declared
  capabilities, then its problem-dependent limits); this module holds no backend facts.
- A forward-only call (``needs_backward=False``) is checked against the forward's limits only;
  the backward's limits are checked when the backward runs (see docs/torch.md).

The same rules pick the Block AttnRes backend (:func:`select_block_attn_res_backend`) among
the backends that implement it (one registry, :mod:`nkilib_msda.backends`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nkilib_msda._env import match_word, read_env
from nkilib_msda.backends import (
    BACKEND_NAMES, FALLBACK_BACKEND, BackendUnavailableError, block_attn_res_backends, get_backend)
from nkilib_msda.backends.protocol import NEURON_DEVICE_TYPES
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["ENV_VAR", "AUTO", "NEURON_DEVICE_TYPES", "BackendChoice", "backend_argument",
           "requested_backend",
           "device_default_backend", "select_backend", "has_symbolic_sizes", "select_block_attn_res_backend",
           "backward_backend", "takes_level_tables"]

ENV_VAR = "NKILIB_MSDA_BACKEND"
AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    """A backend name and where it came from ('argument', ENV_VAR or 'device')."""

    name: str
    source: str

    @property
    def explicit(self) -> bool:
        return self.source != "device"


def requested_backend(backend: str | None, device: torch.device,
                      names: tuple[str, ...] | None = None) -> BackendChoice:
    """Resolve the requested backend name (one of ``names``, default: every registered
    backend) without checking that it can run.

    ``NKILIB_MSDA_BACKEND`` naming a backend outside ``names`` (e.g. "triton" for Block
    AttnRes) selects by device instead."""
    names = BACKEND_NAMES if names is None else names
    backend = backend_argument(backend, names)
    env = read_env(ENV_VAR)  # read even when unused: it checks every package variable
    if backend != AUTO:
        return BackendChoice(backend, "argument")
    if env and env != AUTO:
        if env in names:
            return BackendChoice(env, ENV_VAR)
    default = device_default_backend(device)
    return BackendChoice(default if default in names else FALLBACK_BACKEND, "device")


def takes_level_tables(backend: str | None, device: torch.device) -> bool:
    """Whether the backend requested for a call on ``device`` reads the level tables from device
    memory (``Capabilities.level_tables``), so the shapes need not be read on the host."""
    try:
        return get_backend(requested_backend(backend, device).name).CAPABILITIES.level_tables
    except BackendUnavailableError:
        return False


def backend_argument(backend: str | None, names: tuple[str, ...] | None = None) -> str:
    """The ``backend=`` argument in the operators' form: "auto" for the automatic choice
    (None or "auto", any case), else the backend's name; raises for any other value.

    Only the argument is resolved: "auto" is resolved (environment variable, device) when an
    operator runs, so a traced or exported graph records "auto", not the exporting machine's
    backend."""
    names = BACKEND_NAMES if names is None else names
    if backend is None:
        return AUTO
    try:  # the package's one rule for words: any case
        return match_word("backend", backend, (AUTO, *names))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"backend: expected None or one of {[AUTO, *names]}, "
                        f"got {backend!r}") from None


def device_default_backend(device: torch.device) -> str:
    """The first backend declaring itself the default for ``device``'s type, else the
    fallback ('triton' for CUDA, 'nki' for TorchNeuron's device, otherwise 'reference')."""
    key = (device.type, BACKEND_NAMES)
    if torch.compiler.is_compiling():  # no guard on a memo that eager calls may fill later
        return _first_declaring_default(device.type)
    name = _DEVICE_DEFAULTS.get(key)
    if name is None:
        name = _DEVICE_DEFAULTS[key] = _first_declaring_default(device.type)
    return name


# Declarations are constants: the answer per (device type, registry) is computed once.
_DEVICE_DEFAULTS: dict[tuple[str, tuple[str, ...]], str] = {}


def _first_declaring_default(device_type: str) -> str:
    for name in BACKEND_NAMES:
        try:
            module = get_backend(name)
        except BackendUnavailableError:
            continue
        if device_type in module.CAPABILITIES.default_for:
            return name
    return FALLBACK_BACKEND


def _why_not(name: str, problem: MSDAProblem, value: torch.Tensor,
             sampling_locations: torch.Tensor, needs_backward: bool) -> tuple[str | None, bool]:
    """(reason the backend cannot run this call or None, whether it is unavailable altogether)."""
    try:
        module = get_backend(name)
    except BackendUnavailableError as exc:
        return str(exc), True
    # is_available() may import the backend's dependencies, which torch.compile cannot trace;
    # while compiling, an unavailable backend fails in the operator instead.
    if not torch.compiler.is_compiling() and not module.is_available():
        return f"backend {name!r} is not available in this environment", True
    if has_symbolic_sizes(problem):
        return None, False  # the operator checks the real sizes when it runs
    reason = module.unsupported_reason(problem, value, sampling_locations)
    if reason is None and needs_backward:
        reason = module.backward_unsupported_reason(problem, value, sampling_locations)
    return reason, False


def has_symbolic_sizes(problem: MSDAProblem) -> bool:
    """Whether the problem was traced with symbolic sizes (torch.compile(dynamic=True),
    torch.export with Dims). The backends' limits (planners) need real sizes; a traced graph
    selects, and so checks them, when the operator runs."""
    return not all(type(d) is int for d in (problem.batch, problem.num_queries,
                                             problem.num_heads, problem.head_dim,
                                             problem.num_points))


def _resolve(choice: BackendChoice, reason: str | None, unavailable: bool) -> str:
    if reason is None:
        return choice.name
    if not choice.explicit:
        return FALLBACK_BACKEND
    where = "backend argument" if choice.source == "argument" else choice.source
    message = f"backend={choice.name!r} cannot run this call (from the {where}): {reason}"
    raise BackendUnavailableError(message) if unavailable else ValueError(message)


def select_backend(backend: str | None, problem: MSDAProblem, value: torch.Tensor,
                   sampling_locations: torch.Tensor, *, needs_backward: bool = True) -> str:
    """The MSDA backend that will run this call; raises if an explicit choice cannot run it.

    ``needs_backward=False`` (no input requires grad, or grad mode is off) skips the
    backward's limits."""
    choice = requested_backend(backend, value.device)
    return _resolve(choice, *_why_not(choice.name, problem, value, sampling_locations,
                                      needs_backward))


def backward_backend(name: str, backend: str | None, problem: MSDAProblem, value: torch.Tensor,
                     sampling_locations: torch.Tensor) -> str:
    """The backend for the backward of a call whose forward ran on ``name``, which
    :func:`select_backend` chose from the request ``backend`` with the forward's limits only:
    ``name`` when its backward can run the call; otherwise, like :func:`select_backend`, an
    error for an explicit request and the fallback for an automatic one."""
    if has_symbolic_sizes(problem):
        return name
    reason = get_backend(name).backward_unsupported_reason(problem, value, sampling_locations)
    if reason is None:
        return name
    choice = requested_backend(backend, value.device)
    if name != choice.name:  # already the automatic fallback
        choice = BackendChoice(name, "device")
    return _resolve(choice, reason, False)


def select_block_attn_res_backend(backend: str | None, device: torch.device,
                                  dtype: torch.dtype) -> str:
    """The Block AttnRes backend, by the same rules, among those implementing it."""
    choice = requested_backend(backend, device, block_attn_res_backends())
    try:
        module = get_backend(choice.name)
    except BackendUnavailableError as exc:
        return _resolve(choice, str(exc), True)
    return _resolve(choice, module.block_attn_res_unsupported_reason(device, dtype), False)
