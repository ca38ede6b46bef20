"""NumPy emulator of the NKI beta-2 API (``nki``, ``nki.language``, ``nki.isa``).

Strict: every rule of nki-subset.md §7a raises :class:`NkiError`. See docs/simulator.md.
"""

from __future__ import annotations

import types
from typing import Any

from nkilib_msda.simulator import isa as nisa
from nkilib_msda.simulator import language as nl
from nkilib_msda.simulator import wrappers as _wrappers  # noqa: F401  (installs nl tile functions)
from nkilib_msda.simulator.errors import NkiError, NkiHazardWarning, NkiWarning, nki_error
from nkilib_msda.simulator.jit import JitKernel, jit, simulate
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.tensor import NkiTensor

__version__ = "0.5-emulator"

class _TensorAnnotation:
    """``nki.typing.tensor[shape]`` / ``nki.typing.tensor[shape, dtype]``: annotation only."""

    def __class_getitem__(cls, item: object) -> type:
        return cls


typing: Any = types.ModuleType("nki.typing", "Annotation helpers (nki.typing.tensor[shape]).")
typing.tensor = _TensorAnnotation

nki: Any = types.ModuleType("nki", "Emulated nki namespace (jit, language, isa, simulate).")
nki.typing = typing
nki.jit = jit
nki.language = nl
nki.isa = nisa
nki.simulate = simulate
nki.tensor = NkiTensor
nki.__version__ = __version__

__all__ = ["nki", "nl", "nisa", "simulate", "jit", "JitKernel", "NkiError", "NkiWarning",
           "NkiHazardWarning",
           "nki_error", "CostReport", "NkiTensor"]
