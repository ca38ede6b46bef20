"""``nki.compiler``: per-kernel configuration objects passed to ``@nki.jit``.

Pages (NKI 0.7/0.8): https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/api/nki.compiler.html,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.compiler.CompileConfig.html,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.compiler.SpecializationConfig.html.
``CompileConfig`` holds options for the downstream compiler (allocation, scheduling,
optimisation passes); ``SpecializationConfig`` tunes tracing. Neither changes what a kernel
computes, so the emulator only validates the option names and keeps the values.
"""

from __future__ import annotations

import enum
from typing import Any

from nkilib_msda.simulator.errors import nki_error

__all__ = ["CompileConfig", "SpecializationConfig", "AddressRotation"]


class AddressRotation(enum.Enum):
    """Whether the backend may rotate a memloc's address (member names are an assumption: the
    page names the class without listing its members)."""

    DEFAULT = "default"
    DISABLED = "disabled"
    ENABLED = "enabled"


class _Config:
    """Keyword options restricted to the documented attribute names."""

    _OPTIONS: frozenset[str] = frozenset()

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - self._OPTIONS)
        if unknown:
            raise nki_error(f"nki.compiler.{type(self).__name__}", "unknown option",
                            f"{unknown[0]!r} is not a documented option; expected one of "
                            f"{sorted(self._OPTIONS)}")
        self.options = dict(options)
        for name, value in options.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({inner})"


class CompileConfig(_Config):
    """``nki.compiler.CompileConfig(**options)``: attributes of the CompileConfig page plus the
    options of the CompileConfig reference (nki/reference/nki-compile-config-ref)."""

    _OPTIONS = frozenset({
        "address_rotation", "barrier_check", "dead_code_elim", "nki_alloc_fallback",
        "non_ssa_legalization", "prefetch_auto", "opt_level", "split_reused_buffers",
        "tensor_copy_elim", "dma_copy_elim", "element_widening", "engine_balancing",
        "register_load_reuse", "remove_unused_instructions", "remove_overwritten_writes",
        "sbuf_allocation_fallback", "allocation_mode", "scheduling_heuristic",
    })


class SpecializationConfig(_Config):
    """``nki.compiler.SpecializationConfig(allow_nested_config_override=...)``."""

    _OPTIONS = frozenset({"allow_nested_config_override"})
