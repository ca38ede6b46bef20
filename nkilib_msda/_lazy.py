"""Lazy module attributes: names that import their defining module on first access.

Keeps `import nkilib_msda` (and the kernel packages) free of torch, of the emulator and of
modules the caller does not use.

A kernel package exports a kernel under the name of the submodule that defines it
(``deformable_attention.ms_deformable_attention`` is both). When that submodule is imported
first, the import system binds the *module* to the package attribute, and every later
``from package import ms_deformable_attention`` would get the module. The package's module
object therefore refuses exactly that binding for its exported names, so the name always
resolves (lazily) to the function.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any, Callable


def lazy_exports(module_name: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``module_name``, resolving ``exports[name]`` modules lazily.

    Call it from the module's own body (the module must be in ``sys.modules``).
    """

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(sys.modules[module_name])))

    module = sys.modules[module_name]
    if type(module) is ModuleType:
        module.__class__ = _exports_win_over_submodules(module_name, frozenset(exports))
    return __getattr__, __dir__


def _exports_win_over_submodules(module_name: str, names: frozenset[str]) -> type[ModuleType]:
    """A module type that ignores the import system binding a same-named submodule over an export."""

    class ExportingModule(ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if (name in names and isinstance(value, ModuleType)
                    and value.__name__ == f"{module_name}.{name}"):
                return
            super().__setattr__(name, value)

    return ExportingModule
