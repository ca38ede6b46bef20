"""A stand-in for TorchNeuron's ``neuron`` device on CPU (run in a subprocess: it renames
PyTorch's PrivateUse1 backend and registers it as a Python backend, once per process).

Tensors on it are :class:`NeuronStandIn` wrapper subclasses with ``device == neuron:0`` that
hold a CPU tensor: ATen ops run on the CPU data and are wrapped again; ``nkilib_msda`` operators
are redispatched to their ``PrivateUse1`` kernels, exactly where TorchNeuron would send them.
The NKI kernels are "launched" by :func:`install_emulator_launcher`, which runs them in the
package's emulator and counts the launches.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

# Rename PrivateUse1 to "neuron" and give it the hooks, device module and device guard a
# backend needs (PyTorch's Python-backend registration helper).
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend  # noqa: E402

_setup_privateuseone_for_python_backend(rename="neuron")
DEVICE = torch.device("neuron", 0)
_PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
LAUNCHES: list[str] = []


class NeuronStandIn(torch.Tensor):
    """A ``neuron:0`` tensor backed by a CPU tensor."""

    cpu_data: torch.Tensor

    @staticmethod
    def __new__(cls, cpu: torch.Tensor, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, cpu.shape, strides=cpu.stride(),
                                                   dtype=cpu.dtype, device=DEVICE,
                                                   requires_grad=requires_grad)

    def __init__(self, cpu: torch.Tensor, requires_grad: bool = False):
        self.cpu_data = cpu

    def __repr__(self) -> str:
        return f"NeuronStandIn({self.cpu_data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "nkilib_msda":
            return func.redispatch(_PRIVATEUSE1, *args, **kwargs)
        to_cpu = func is torch.ops.aten._to_copy.default and _is_cpu(kwargs.get("device"))
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        return out if to_cpu else tree_map(_wrap, out)


def _is_cpu(device) -> bool:
    return device is not None and torch.device(device).type == "cpu"


def _unwrap(x):
    if isinstance(x, NeuronStandIn):
        return x.cpu_data
    if isinstance(x, torch.device) and x.type == "neuron":
        return torch.device("cpu")
    return x


def _wrap(x):
    if isinstance(x, torch.Tensor) and not isinstance(x, NeuronStandIn):
        return NeuronStandIn(x)
    return x


# Factory functions on the stand-in device (torch.tensor(..., device="neuron"), .to("neuron"))
# allocate a CPU tensor and wrap it.
_LIB = torch.library.Library("aten", "IMPL")


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return NeuronStandIn(torch.empty_strided(size, stride, dtype=dtype))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return NeuronStandIn(torch.empty(size, dtype=dtype))


def _copy_from(src, dst, non_blocking=False):
    dst_data = dst.cpu_data if isinstance(dst, NeuronStandIn) else dst
    src_data = src.cpu_data if isinstance(src, NeuronStandIn) else src
    dst_data.copy_(src_data)
    return dst


_LIB.impl("empty_strided", _empty_strided, "PrivateUse1")
_LIB.impl("_copy_from", _copy_from, "PrivateUse1")
_LIB.impl("empty.memory_format", _empty, "PrivateUse1")


def to_neuron(t: torch.Tensor, requires_grad: bool = False) -> NeuronStandIn:
    return NeuronStandIn(t.detach().clone(), requires_grad=requires_grad)


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu_data if isinstance(t, NeuronStandIn) else t


def install_emulator_launcher() -> None:
    """Make the nki backend run kernels for ``neuron`` tensors in the emulator (LNC from
    ``NEURON_LOGICAL_NC_CONFIG``, as on the device)."""
    from nkilib_msda.backends import nki_backend

    def launcher(kernel):
        def call(*args, **kwargs):
            LAUNCHES.append(getattr(kernel, "__name__", str(kernel)))
            cpu_args = tree_map(_unwrap, args)
            cpu_kwargs = tree_map(_unwrap, kwargs)
            return tree_map(_wrap, nki_backend.run_in_emulator(kernel)(*cpu_args, **cpu_kwargs))

        return call

    nki_backend.set_device_launcher(launcher)
