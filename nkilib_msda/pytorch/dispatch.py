"""Backend selection: the ``backend=`` argument, then ``NKILIB_MSDA_BACKEND``, then the device.

- An explicit choice (argument or environment variable) must work: a backend that is not
  available, or cannot do the requested mode, raises an error saying why.
- The automatic choice (``None`` / ``"auto"`` and no environment variable) goes by device:
  CUDA -> "triton", TorchNeuron's ``neuron`` device -> "nki", anything else -> "reference";
  when the device's backend cannot run the call it falls back to "reference".
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
    BACKEND_NAMES, BLOCK_ATTN_RES_BACKENDS, BackendUnavailableError, get_backend)
from nkilib_msda.validation.msda import MSDAProblem

__all__ = ["ENV_VAR", "AUTO", "NEURON_DEVICE_TYPES", "BackendChoice", "requested_backend",
           "device_default_backend", "select_backend", "select_block_attn_res_backend"]

ENV_VAR = "NKILIB_MSDA_BACKEND"
AUTO = "auto"
# TorchNeuron's native device is PrivateUse1 renamed to "neuron"; "privateuseone" in case the
# rename has not happened. (PyTorch/XLA does not run on Trn2/Trn3, so "xla" is not one.)
NEURON_DEVICE_TYPES = ("neuron", "privateuseone")


@dataclass(frozen=True)
class BackendChoice:
    """A backend name and where it came from ('argument', ENV_VAR or 'device')."""

    name: str
    source: str

    @property
    def explicit(self) -> bool:
        return self.source != "device"


def requested_backend(backend: str | None, device: torch.device,
                      names: tuple[str, ...] = BACKEND_NAMES) -> BackendChoice:
    """Resolve the requested backend name (one of ``names``) without checking that it can run.

    ``NKILIB_MSDA_BACKEND`` naming a backend outside ``names`` (e.g. "triton" for Block
    AttnRes) selects by device instead."""
    if backend is not None:  # the package's one rule for words: any case
        try:
            backend = match_word("backend", backend, (AUTO, *names))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"backend: expected None or one of {[AUTO, *names]}, "
                            f"got {backend!r}") from None
    if backend is not None and backend != AUTO:
        return BackendChoice(backend, "argument")
    env = read_env(ENV_VAR)
    if env and env != AUTO:
        if env in names:
            return BackendChoice(env, ENV_VAR)
    default = device_default_backend(device)
    return BackendChoice(default if default in names else "reference", "device")


def device_default_backend(device: torch.device) -> str:
    """'triton' for CUDA, 'nki' for TorchNeuron's device, otherwise 'reference'."""
    if device.type == "cuda":
        return "triton"
    if device.type in NEURON_DEVICE_TYPES:
        return "nki"
    return "reference"


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
    reason = module.unsupported_reason(problem, value, sampling_locations)
    backward_reason = getattr(module, "backward_unsupported_reason", None)
    if reason is None and needs_backward and backward_reason is not None:
        reason = backward_reason(problem, value, sampling_locations)
    return reason, False


def _resolve(choice: BackendChoice, reason: str | None, unavailable: bool) -> str:
    if reason is None:
        return choice.name
    if not choice.explicit:
        return "reference"
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


def select_block_attn_res_backend(backend: str | None, device: torch.device,
                                  dtype: torch.dtype) -> str:
    """The Block AttnRes backend, by the same rules, among those implementing it."""
    choice = requested_backend(backend, device, BLOCK_ATTN_RES_BACKENDS)
    try:
        module = get_backend(choice.name)
    except BackendUnavailableError as exc:
        return _resolve(choice, str(exc), True)
    return _resolve(choice, module.block_attn_res_unsupported_reason(device, dtype), False)
