"""Backend selection: the ``backend=`` argument, then ``NKILIB_MSDA_BACKEND``, then the device.

- An explicit choice (argument or environment variable) must work: a backend that is not
  available, or cannot do the requested mode, raises an error saying why.
- The automatic choice (``None`` / ``"auto"`` and no environment variable) goes by device:
  CUDA -> "triton", Neuron/XLA -> "nki", anything else -> "reference"; when the device's
  backend cannot run the call it falls back to "reference".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nkilib_msda._env import env_choice
from nkilib_msda.backends import BACKEND_NAMES, BackendUnavailableError, get_backend
from nkilib_msda.validation import MSDAProblem

__all__ = ["ENV_VAR", "NEURON_DEVICE_TYPES", "BackendChoice", "requested_backend",
           "device_default_backend", "select_backend"]

ENV_VAR = "NKILIB_MSDA_BACKEND"
AUTO = "auto"
# "xla": torch-neuronx on PyTorch/XLA; "neuron": TorchNeuron's native device (PrivateUse1
# renamed); "privateuseone" in case the rename has not happened.
NEURON_DEVICE_TYPES = ("xla", "neuron", "privateuseone")


@dataclass(frozen=True)
class BackendChoice:
    """A backend name and where it came from ('argument', ENV_VAR or 'device')."""

    name: str
    source: str

    @property
    def explicit(self) -> bool:
        return self.source != "device"


def requested_backend(backend: str | None, device: torch.device) -> BackendChoice:
    """Resolve the requested backend name without checking that it can run."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend: expected None or one of {[AUTO, *BACKEND_NAMES]}, got {backend!r}")
    if backend is not None and backend != AUTO:
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend: expected None or one of {[AUTO, *BACKEND_NAMES]}, got {backend!r}")
        return BackendChoice(backend, "argument")
    env = env_choice(ENV_VAR, (AUTO, *BACKEND_NAMES))
    if env and env != AUTO:
        return BackendChoice(env, ENV_VAR)
    return BackendChoice(device_default_backend(device), "device")


def device_default_backend(device: torch.device) -> str:
    """'triton' for CUDA, 'nki' for Neuron/XLA, otherwise 'reference'."""
    if device.type == "cuda":
        return "triton"
    if device.type in NEURON_DEVICE_TYPES:
        return "nki"
    return "reference"


def _why_not(name: str, problem: MSDAProblem, value: torch.Tensor,
             sampling_locations: torch.Tensor) -> tuple[str | None, bool]:
    """(reason the backend cannot run this call or None, whether it is unavailable altogether)."""
    try:
        module = get_backend(name)
    except BackendUnavailableError as exc:
        return str(exc), True
    # is_available() may import the backend's dependencies, which torch.compile cannot trace;
    # while compiling, an unavailable backend fails in the operator instead.
    if not torch.compiler.is_compiling() and not module.is_available():
        return f"backend {name!r} is not available in this environment", True
    return module.unsupported_reason(problem, value, sampling_locations), False


def select_backend(backend: str | None, problem: MSDAProblem, value: torch.Tensor,
                   sampling_locations: torch.Tensor) -> str:
    """The backend that will run this call; raises if an explicit choice cannot run it."""
    choice = requested_backend(backend, value.device)
    reason, unavailable = _why_not(choice.name, problem, value, sampling_locations)
    if reason is None:
        return choice.name
    if not choice.explicit:
        return "reference"
    where = "backend argument" if choice.source == "argument" else choice.source
    message = f"backend={choice.name!r} (from the {where}) cannot run this call: {reason}"
    raise BackendUnavailableError(message) if unavailable else ValueError(message)
