"""Register ``torch.ops.nkilib_msda.*`` as soon as both nkilib_msda and torch are imported.

``import nkilib_msda`` must not import torch (the NumPy parts work without it, and importing it
costs seconds), yet a program saved with ``torch.export`` must load in a process that imports
only nkilib_msda and torch, in either order. So: if torch is already imported, the operator
modules are imported now; otherwise a one-shot import hook imports them right after torch
finishes importing. Nothing happens when torch is not installed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Sequence

__all__ = ["register_torch_ops_when_available", "OPS_MODULES"]

OPS_MODULES = ("nkilib_msda.pytorch.ops", "nkilib_msda.pytorch.block_attn_res_ops")


def _register() -> None:
    try:
        for name in OPS_MODULES:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        warnings.warn(f"nkilib_msda: could not register the torch operators ({exc})",
                      RuntimeWarning, stacklevel=2)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so the operators register after it runs."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from recursing
        spec = importlib.util.find_spec("torch")
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or loader is None or exec_module is None:
            return spec

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            _register()

        loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def register_torch_ops_when_available() -> None:
    """Register the operators now (torch imported) or when torch is imported (installed)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "library"):
        _register()
    elif importlib.util.find_spec("torch") is not None:
        if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterTorchImport())
