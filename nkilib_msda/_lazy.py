"""Lazy module attributes: names that import their defining module on first access.

Keeps `import nkilib_msda` (and the kernel packages) free of torch and of modules the
caller does not use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(module_name: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``module_name``, resolving ``exports[name]`` modules lazily."""

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(sys.modules[module_name])))

    return __getattr__, __dir__
