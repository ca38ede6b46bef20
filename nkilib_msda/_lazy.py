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
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable, Sequence


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


def alias_modules(aliases: dict[str, str]) -> None:
    """Let each ``aliases`` key (a module that moved) import as its value, the module's new name.

    Nothing is imported until the old name is: a meta path finder resolves ``import old`` to
    the module object of ``new``, so both names are the same module (isinstance checks and
    monkeypatching agree) and the module keeps its own ``__spec__``.
    """
    if not any(isinstance(f, _AliasFinder) and f.aliases == aliases for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(aliases))  # before path finders that may hold a stale copy


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        new_name = self.aliases.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name
        self.own_spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the old name's spec on the module: give it back its own.
        module.__spec__ = self.own_spec
