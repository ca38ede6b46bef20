"""NumPy emulator of NKI 0.8 (Neuron 2.34): ``nki``, ``nki.language``, ``nki.isa``, ``nki.lnc``.

See docs/emulator.md. :func:`install_as_nki` registers the emulator under the ``nki`` module
names so unmodified third-party kernels (``import nki.language as nl``) run on it.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from nkilib_msda.simulator import isa as nisa
from nkilib_msda.simulator import language as nl
from nkilib_msda.simulator import lnc
from nkilib_msda.simulator import wrappers as _wrappers  # noqa: F401  (installs nl tile functions)
from nkilib_msda.simulator.errors import (NkiArgumentError, NkiError, NkiHazardWarning, NkiWarning,
                                          OtherProgramAborted, nki_error)
from nkilib_msda.simulator.jit import JitKernel, jit, simulate
from nkilib_msda.simulator.progress import Progress
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.tensor import NkiTensor

__version__ = "0.8-emulator"


class _TensorAnnotation:
    """``nki.typing.tensor[shape]`` / ``nki.typing.tensor[shape, dtype]``: annotation only."""

    def __class_getitem__(cls, item: object) -> type:
        return cls


typing: Any = types.ModuleType("nki.typing", "Annotation helpers (nki.typing.tensor[shape]).")
typing.tensor = _TensorAnnotation

# nki.dtype: the NKI dtypes as one namespace (assumption: the same objects as nl.<dtype>).
dtype: Any = types.ModuleType("nki.dtype", "NKI data types (the nki.language dtypes).")
for _name in ("bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16",
              "bfloat16", "float32", "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2",
              "float8_e8m0fnu"):
    setattr(dtype, _name, getattr(nl, _name))

nki: Any = types.ModuleType("nki", "Emulated nki namespace (jit, simulate, language, isa, lnc).")
nki.typing = typing
nki.dtype = dtype
nki.jit = jit
nki.language = nl
nki.isa = nisa
nki.lnc = lnc
nki.simulate = simulate
nki.tensor = NkiTensor
nki.__version__ = __version__
nki.__path__ = []  # a package, so `import nki.language` resolves through sys.modules

_NKI_MODULES = {
    "nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.isa.constants": nisa.constants,
    "nki.lnc": lnc, "nki.typing": typing, "nki.dtype": dtype,
}


class _RemovedNeuronxccNki:
    """Meta-path finder: ``import neuronxcc.nki`` fails as on Neuron 2.34 (namespace removed)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "neuronxcc.nki" or fullname.startswith("neuronxcc.nki."):
            raise ImportError(f"{fullname}: the neuronxcc.nki namespace was removed in Neuron "
                              "2.34; use `import nki` (nki.language, nki.isa)")
        return None


_REMOVED_FINDER = _RemovedNeuronxccNki()


def install_as_nki() -> None:
    """Register the emulator as ``nki``, ``nki.language``, ``nki.isa``, ``nki.isa.constants``,
    ``nki.lnc``, ``nki.typing`` and ``nki.dtype`` in ``sys.modules``, so kernels that
    ``import nki`` run unmodified on the emulator. Idempotent. Raises RuntimeError when a
    different (real) ``nki`` is already imported. ``neuronxcc.nki`` stays unimportable: Neuron
    2.34 removed that namespace."""
    existing = sys.modules.get("nki")
    if existing is not None and existing is not nki:
        raise RuntimeError(
            f"install_as_nki: a different 'nki' module is already imported ({existing!r}); "
            "the emulator will not replace it. Call install_as_nki() before importing nki, or "
            "use nkilib_msda.simulator directly")
    sys.modules.update(_NKI_MODULES)
    if _REMOVED_FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _REMOVED_FINDER)


__all__ = ["nki", "nl", "nisa", "lnc", "simulate", "jit", "JitKernel", "NkiError", "NkiWarning",
           "NkiHazardWarning",
           "OtherProgramAborted", "nki_error", "CostReport", "NkiTensor", "install_as_nki",
           "NkiArgumentError",
           "Progress"]
