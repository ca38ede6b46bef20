"""TorchNeuron (the native ``neuron`` device) integration, in one place.

There is no separate Neuron op namespace or autograd: the public operators
``torch.ops.nkilib_msda.*`` carry a ``PrivateUse1`` kernel (TorchNeuron's device is PyTorch's
PrivateUse1 backend renamed to ``neuron``), whose ``"auto"`` backend resolves to ``"nki"``
there; the ``nki`` backend then calls the ``@nki.jit`` kernels directly on the ``neuron``
tensors, which torch-neuronx compiles and runs (see docs/torch.md and
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/how-to-work-with-nki.html).
The LNC degree comes from ``NEURON_LOGICAL_NC_CONFIG`` (1 or 2, validated before a launch).

The PyTorch/XLA path is removed: PyTorch/XLA does not run on Trn2/Trn3, which the kernels need
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/announcements/neuron2.x/announce-no-support-torch-xla-inference-trn.html).

This module only re-exports the knobs (for tests and for users of a custom device stack).
"""

from __future__ import annotations

from nkilib_msda.backends.nki_backend import (
    LNC_ENV_VAR, lnc_degree, run_in_simulator, set_device_launcher)
from nkilib_msda.pytorch.dispatch import NEURON_DEVICE_TYPES

__all__ = ["LNC_ENV_VAR", "NEURON_DEVICE_TYPES", "lnc_degree", "run_in_simulator",
           "set_device_launcher", "is_neuron_device"]


def is_neuron_device(device_type: str) -> bool:
    """Whether ``device_type`` is TorchNeuron's device ("neuron", or "privateuseone" before
    torch-neuronx renames it)."""
    return device_type in NEURON_DEVICE_TYPES
