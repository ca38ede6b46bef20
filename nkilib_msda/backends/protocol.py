"""What a compute backend is: the interface every backend module implements and the
capabilities it declares (one table per backend, read by dispatch and by the backend's own
support check).

A backend is a module. :class:`MsdaBackend` is the typed interface (``typing.Protocol``; a
module satisfies it structurally, and ``tests/pytorch/test_dispatch_protocol.py`` checks
every registered backend against it). Its :class:`Capabilities` say which tensors it takes
(device types, value dtypes), which modes it computes (layouts, padding modes), whether its
grad_value is always bitwise reproducible, and whether it also implements Block AttnRes
(:class:`BlockAttnResBackend`). Dispatch decides from these declarations plus the backend's
``unsupported_reason`` for limits that depend on the problem (e.g. an SBUF budget); it never
names a backend's limits itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from nkilib_msda.validation.msda import LOCATION_LAYOUTS, VALUE_LAYOUTS, MSDAProblem, dtype_name

__all__ = ["NEURON_DEVICE_TYPES", "Capabilities", "MsdaBackend", "BlockAttnResBackend",
           "capability_reason", "device_reason"]

# TorchNeuron's native device is PyTorch's PrivateUse1 backend renamed to "neuron";
# "privateuseone" is its name before the rename. (PyTorch/XLA does not run on Trn2/Trn3.)
NEURON_DEVICE_TYPES = ("neuron", "privateuseone")
ANY_DEVICE = ("*",)


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares about itself (all plain values).

    ``device_types``: torch device types whose tensors it takes (``("*",)``: any).
    ``default_for``: device types on which the automatic choice picks it.
    ``dtypes``: value dtypes (names, e.g. "bfloat16") of its MSDA kernels.
    ``always_deterministic``: grad_value is bitwise reproducible whatever ``deterministic``
    says; otherwise ``deterministic=True`` selects a reproducible (slower) mode.
    ``block_attn_res_dtypes``: dtypes of its Block AttnRes kernels; empty when it has none.
    ``level_tables``: its ``msda_forward`` / ``msda_backward`` take ``level_tables=(shapes,
    starts)``, int32 device tensors (N_l, 2) and (N_l,) that its kernels read, in which case the
    problem's ``spatial_shapes`` and ``level_start_index`` are empty (the values are not known on
    the host) and ``total_pixels`` is value's length.
    """

    device_types: tuple[str, ...]
    default_for: tuple[str, ...]
    dtypes: tuple[str, ...]
    padding_modes: tuple[str, ...]
    value_layouts: tuple[str, ...] = VALUE_LAYOUTS
    sampling_locations_layouts: tuple[str, ...] = LOCATION_LAYOUTS
    always_deterministic: bool = True
    block_attn_res_dtypes: tuple[str, ...] = ()
    level_tables: bool = False
    device_note: str = ""  # appended to the device refusal (how to get a device it takes)

    @property
    def block_attn_res(self) -> bool:
        return bool(self.block_attn_res_dtypes)

    def takes_device(self, device_type: str) -> bool:
        return self.device_types == ANY_DEVICE or device_type in self.device_types


@runtime_checkable
class MsdaBackend(Protocol):
    """The MSDA interface of a backend module (shapes in :mod:`nkilib_msda.backends`)."""

    NAME: str
    CAPABILITIES: Capabilities

    def is_available(self) -> bool: ...

    def unsupported_reason(self, problem: MSDAProblem, value: Any,
                           sampling_locations: Any) -> str | None: ...

    def backward_unsupported_reason(self, problem: MSDAProblem, value: Any,
                                    sampling_locations: Any) -> str | None: ...

    def msda_forward(self, value: Any, problem: MSDAProblem, sampling_locations: Any,
                     attention_weights: Any) -> Any: ...

    def msda_backward(self, grad_output: Any, value: Any, problem: MSDAProblem,
                      sampling_locations: Any, attention_weights: Any,
                      compute: tuple[bool, bool, bool] = (True, True, True),
                      deterministic: bool | None = None) -> tuple[Any, Any, Any]: ...


@runtime_checkable
class BlockAttnResBackend(MsdaBackend, Protocol):
    """A backend that also implements Block AttnRes (``CAPABILITIES.block_attn_res``)."""

    def block_attn_res_unsupported_reason(self, device: Any, dtype: Any) -> str | None: ...

    def block_attn_res_forward(self, values: Any, w: Any, gamma: Any, scale: float, eps: float,
                               enable_rmsnorm: bool) -> tuple[Any, Any, Any]: ...

    def block_attn_res_backward(self, grad_h: Any, values: Any, w: Any, alpha: Any, gamma: Any,
                                rms: Any, scale: float, enable_rmsnorm: bool
                                ) -> tuple[Any, Any, Any]: ...


def device_reason(name: str, caps: Capabilities, device: Any) -> str | None:
    """Why a backend declaring ``caps`` refuses tensors on ``device`` (None: it takes them)."""
    device_type = getattr(device, "type", None)
    if device_type is not None and caps.takes_device(device_type):
        return None
    takes = " or ".join(f"{t!r}" for t in caps.device_types)
    return (f"the {name} backend takes tensors on {takes} devices, got tensors on "
            f"{device}{caps.device_note}")


def capability_reason(name: str, caps: Capabilities, problem: MSDAProblem, value: Any, *,
                      check_device: bool = True) -> str | None:
    """Why a backend declaring ``caps`` cannot run ``problem`` on ``value``'s device and dtype
    (None: the declared capabilities cover it). ``check_device=False`` leaves the device to
    the caller (a backend whose device rule depends on the environment)."""
    if problem.padding_mode not in caps.padding_modes:
        return (f"padding_mode={problem.padding_mode!r} is not supported by the {name} backend "
                f"(supported: {list(caps.padding_modes)}); use backend='reference'")
    if problem.value_layout not in caps.value_layouts:
        return (f"value_layout={problem.value_layout!r} is not supported by the {name} backend "
                f"(supported: {list(caps.value_layouts)})")
    if problem.sampling_locations_layout not in caps.sampling_locations_layouts:
        return (f"sampling_locations_layout={problem.sampling_locations_layout!r} is not "
                f"supported by the {name} backend (supported: "
                f"{list(caps.sampling_locations_layouts)})")
    dtype = dtype_name(value.dtype)
    if dtype not in caps.dtypes:
        return (f"value dtype {dtype} is not supported by the {name} backend "
                f"(supported: {list(caps.dtypes)})")
    if not check_device:
        return None
    return device_reason(name, caps, getattr(value, "device", None))
