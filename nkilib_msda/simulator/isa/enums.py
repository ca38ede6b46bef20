"""Enums of ``nki.isa`` with the members and numeric values of NKI 0.8, and :func:`as_enum`.

Values are those of the generated API source ``_modules/nki/isa.html``
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/_modules/nki/isa.html; the same values
are in the v2.33.0 page and in the published ``nki/api/nki/isa/__init__.py`` stubs):
``engine`` tensor=1, scalar=2, gpsimd=3, dma=4, vector=5, sync=6, unknown=0;
``dge_mode`` unknown=0, swdge=1, hwdge=2, none=3; ``oob_mode`` error=0, skip=1;
``reduce_cmd`` idle=0 .. load_reduce=4; ``matmul_perf_mode`` 'none', 'double_row';
``nc_version`` gen2..gen4; ``dma_engine`` dma=1, gpsimd_dma=2.

Instructions accept a member or the member's raw value (``dge_mode=3``), as the real API does
(an ``Enum`` argument is compared by value when the IR is emitted); :func:`as_enum` does the
conversion at every enum argument.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from nkilib_msda.simulator.context import current_or_none
from nkilib_msda.simulator.errors import NkiError, hazard

__all__ = ["engine", "oob_mode", "dge_mode", "reduce_cmd", "matmul_perf_mode", "nc_version",
           "dma_engine", "get_nc_version", "get_nc_sub_version"]

E = TypeVar("E", bound=Enum)


class engine(Enum):
    """Neuron device engines (``engine=`` of multi-engine instructions)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6
    # Emulator-internal alias of ``scalar`` (the ACT engine); not a documented member.
    activation = 2


class oob_mode(Enum):
    """Out-of-bounds handling of dynamic (indirect) DMA addresses."""

    error = 0
    skip = 1


class dge_mode(Enum):
    """Descriptor generation: unknown (compiler picks), swdge (GpSimd software DGE), hwdge
    (hardware DGE), none (descriptors prepared by the runtime before execution)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class reduce_cmd(Enum):
    """Accumulator-register commands (activation, select_reduce, tensor_scalar_reduce)."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class matmul_perf_mode(Enum):
    """``perf_mode`` of ``nc_matmul`` (only ``none`` is modelled)."""

    none = "none"
    double_row = "double_row"


class nc_version(Enum):
    """NeuronCore version: gen2 (trn1/inf2), gen3 (trn2), gen4 (trn3).

    The docs define a plain ``Enum`` (no ordering), but AWS's hardware-tested kernels compare
    versions (``get_nc_version() >= nc_version.gen4``, also against ints): ordering by value
    is accepted with an ``NkiHazardWarning`` "nc_version ordering" (strict: NkiError)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4

    def _order_key(self, other: Any, op: str) -> tuple[int, int] | None:
        if isinstance(other, nc_version):
            right = other.value
        elif isinstance(other, int) and not isinstance(other, bool):
            right = other
        else:
            return None
        ctx = current_or_none()
        hazard("nki.isa.nc_version", "nc_version ordering",
               f"{self!r} {op} {other!r}: nc_version is documented as a plain Enum without "
               "ordering; compared by value as AWS's kernels assume",
               strict=ctx is not None and ctx.options.strict, stacklevel=4)
        return self.value, right

    def __lt__(self, other: Any) -> bool:
        key = self._order_key(other, "<")
        return NotImplemented if key is None else key[0] < key[1]

    def __le__(self, other: Any) -> bool:
        key = self._order_key(other, "<=")
        return NotImplemented if key is None else key[0] <= key[1]

    def __gt__(self, other: Any) -> bool:
        key = self._order_key(other, ">")
        return NotImplemented if key is None else key[0] > key[1]

    def __ge__(self, other: Any) -> bool:
        key = self._order_key(other, ">=")
        return NotImplemented if key is None else key[0] >= key[1]


class dma_engine(Enum):
    """DMA engine of ``nki.lnc.sendrecv``: shared DMA (default) or GpSimd's internal DMA."""

    dma = 1
    gpsimd_dma = 2


def as_enum(value: Any, cls: type[E], argument: str, instruction: str = "nki.isa") -> E:
    """``value`` as a member of ``cls``: a member passes, a raw value (``3`` for
    ``dge_mode.none``) is looked up; anything else raises NkiError naming ``argument``."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, (bool, Enum)):
        try:
            return cls(value)
        except (ValueError, TypeError):
            pass
    members = ", ".join(f"{m.name}={m.value!r}" for m in cls)
    raise NkiError(f"{instruction}: enum argument: {argument} must be a nisa.{cls.__name__} "
                   f"member or its value ({members}), got {value!r}")


def get_nc_version() -> nc_version:
    """NeuronCore version of the running target (trn2 -> gen3, trn3 -> gen4)."""
    from nkilib_msda.simulator.context import current_or_none
    from nkilib_msda.simulator.targets import get_target

    ctx = current_or_none()
    target = ctx.target if ctx is not None else get_target()
    return nc_version.gen4 if target.name == "trn3" else nc_version.gen3


def get_nc_sub_version() -> Any:
    """Documented in ``nki.isa``; the emulator has no sub-versions."""
    raise NkiError("get_nc_sub_version is not modelled by this emulator")
