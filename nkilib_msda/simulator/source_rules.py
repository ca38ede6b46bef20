"""Kernel-source rules that still hold under NKI 0.7/0.8 Python tracing, checked on the AST.

An eager emulator never sees the compiler's Python subset, so these rules are checked by
parsing the source of the kernel function and of every function, method and class it
references, transitively, that is defined in the kernel's own top-level package (the NKI
compiler inlines called functions, so their code is compiled too). The emulator's own modules,
the standard library and site-packages are never inspected (only code whose file lies outside
them and whose module belongs to the kernel's package). Functions without retrievable source
(``exec``-built) are skipped.

NKI 0.7 specializes kernels by Python tracing, so the old front end's restrictions are gone:
``is`` / ``is not``, classes not deriving from ``NKIObject``, inheritance, generators, non-string
dict keys, ``isinstance`` and ``raise`` are ordinary Python (release notes 0.7.0,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/nki.html).

Rules (messages ``"<qualname of the function holding it>: <rule>: <detail>"``):
- ``neuronxcc import``: importing ``neuronxcc`` (the beta-1 namespace) inside kernel code, or
  using a global bound to a ``neuronxcc`` object, is an error since NKI 0.4; Neuron 2.34 removes
  the namespace entirely.
- ``fails on hardware``: any reference to ``nl.divide``, ``nl.mod`` or ``nl.fmod`` (they "work in
  simulation but fail on hardware"), even on a branch that is never executed.

``simulate(..., source_rules="error")`` (default) raises NkiError on the first violation;
``"warn"`` emits one NkiWarning per rule (naming the first violation and the count); ``"off"``
skips them. (``is_operator=`` is still accepted by ``simulate`` for compatibility and ignored.)
"""

from __future__ import annotations

import ast
import linecache
import os
import site
import sysconfig
import types
import warnings
from typing import Any, Callable, Iterator

from nkilib_msda.simulator.errors import NkiError, NkiWarning

__all__ = ["SOURCE_RULE_MODES", "kernel_source_violations", "check_kernel_source"]

SOURCE_RULE_MODES = ("error", "warn", "off")
_FAILS_ON_HARDWARE = frozenset({"divide", "mod", "fmod"})
_NL_MODULES = frozenset({"nkilib_msda.simulator.language", "nki.language",
                         "neuronxcc.nki.language"})
_EXCLUDED_PREFIXES = ("nkilib_msda.simulator", "nkilib_msda._nki")

_CACHE: dict[Any, tuple[tuple[str, str, str], ...]] = {}


def _unwrap(obj: Any) -> Any:
    """The Python function behind a JitKernel / functools.wraps wrapper / bound method."""
    for _ in range(8):
        if hasattr(obj, "func") and callable(getattr(obj, "func")) and type(obj).__name__ == "JitKernel":
            obj = obj.func
        elif isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            obj = obj.__func__
        else:
            break
    return obj


def _library_roots() -> tuple[str, ...]:
    """Directories of the standard library and of installed packages (never inspected)."""
    paths = {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenv without getsitepackages
        pass
    paths.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


_LIBRARY_ROOTS = _library_roots()


def _is_library_file(filename: str) -> bool:
    real = os.path.realpath(filename) if filename and not filename.startswith("<") else filename
    return real.startswith(_LIBRARY_ROOTS) or "site-packages" in real or "dist-packages" in real


def _in_scope(obj: Any, package: str) -> bool:
    module = getattr(obj, "__module__", None) or ""
    if not module or module.startswith(_EXCLUDED_PREFIXES):
        return False
    if not (module == package or module.startswith(package + ".")):
        return False
    code = getattr(obj, "__code__", None)
    if code is not None and _is_library_file(code.co_filename):
        return False
    return True


def _is_nl(value: Any) -> bool:
    return isinstance(value, types.ModuleType) and value.__name__ in _NL_MODULES


def _is_neuronxcc(value: Any) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "")
    return isinstance(name, str) and (name == "neuronxcc" or name.startswith("neuronxcc."))


_MODULE_FUNCTIONS: dict[str, dict[int, ast.AST] | None] = {}


def _module_functions(filename: str) -> dict[int, ast.AST] | None:
    """Function nodes of a source file keyed by their first line (the first decorator's line
    for decorated functions, as ``co_firstlineno``); the file is parsed once."""
    if filename in _MODULE_FUNCTIONS:
        return _MODULE_FUNCTIONS[filename]
    table: dict[int, ast.AST] | None = None
    lines = linecache.getlines(filename)
    if lines:
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError:
            tree = None
        if tree is not None:
            functions: dict[int, ast.AST] = {}
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    first = min([node.lineno] + [d.lineno for d in
                                                 getattr(node, "decorator_list", [])])
                    functions.setdefault(first, node)
            table = functions
    _MODULE_FUNCTIONS[filename] = table
    return table


def _parse(func: types.FunctionType) -> ast.AST | None:
    """The AST of ``func`` (None when its source is not available, e.g. exec-built code)."""
    table = _module_functions(func.__code__.co_filename)
    if table is None:
        return None
    return table.get(func.__code__.co_firstlineno)


def _function_violations(func: types.FunctionType, nodes: list[ast.AST]) -> Iterator[tuple[str, str]]:
    """(rule, detail) of the violations in one function's own source (its AST ``nodes``)."""
    where = f"{func.__code__.co_filename}:{{}}"
    g = func.__globals__
    for node in nodes:
        line = where.format(getattr(node, "lineno", func.__code__.co_firstlineno))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "neuronxcc" or n.startswith("neuronxcc.") for n in names):
                yield ("neuronxcc import",
                       f"`{ast.unparse(node)}` at {line}: the beta-1 neuronxcc.nki namespace is an "
                       "error inside NKI kernels since 0.4; use `import nki`")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            value = g.get(node.id)
            if value is not None and _is_neuronxcc(value):
                yield ("neuronxcc import",
                       f"`{node.id}` at {line} is bound to {getattr(value, '__name__', value)!r} from "
                       "neuronxcc (beta 1); kernels must use the nki namespace")
        elif isinstance(node, ast.Attribute) and node.attr in _FAILS_ON_HARDWARE \
                and isinstance(node.value, ast.Name) and (
                    _is_nl(g.get(node.value.id)) or node.value.id == "nl"):
            yield ("fails on hardware",
                   f"`{ast.unparse(node)}` at {line}: nl.{node.attr} works in simulation but fails "
                   "on hardware; multiply by a reciprocal instead")


def _referenced(func: types.FunctionType, nodes: list[ast.AST], package: str) -> Iterator[Any]:
    """Functions and classes of ``package`` that ``func`` (AST ``nodes``) references by global
    name or as ``module.attr``."""
    g = func.__globals__
    builtins_ns = g.get("__builtins__")
    for node in nodes:
        value = None
        if isinstance(node, ast.Name):
            value = g.get(node.id)
            if value is None and isinstance(builtins_ns, dict):
                continue
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = g.get(node.value.id)
            if isinstance(base, types.ModuleType):
                value = getattr(base, node.attr, None)
        if value is None:
            continue
        value = _unwrap(value)
        if isinstance(value, (types.FunctionType, type)) and _in_scope(value, package):
            yield value


_FUNCTION_INFO: dict[tuple[Any, str], tuple[list[tuple[str, str]], list[Any]]] = {}


def _function_info(func: types.FunctionType, package: str) -> tuple[list[tuple[str, str]], list[Any]]:
    """(violations, referenced functions/classes) of one function, computed once per code."""
    key = (func.__code__, package)
    info = _FUNCTION_INFO.get(key)
    if info is None:
        tree = _parse(func)
        if tree is None:
            info = ([], [])
        else:
            nodes = list(ast.walk(tree))
            info = (list(_function_violations(func, nodes)), list(_referenced(func, nodes, package)))
        _FUNCTION_INFO[key] = info
    return info


def _class_functions(cls: type, package: str) -> Iterator[types.FunctionType]:
    """Functions defined in ``package`` on ``cls`` and its bases (an ``enum.Enum`` base or a
    stdlib function copied into the class dict is skipped: R02)."""
    for klass in cls.__mro__:
        if klass is object or not _in_scope(klass, package):
            continue
        for member in vars(klass).values():
            member = _unwrap(member)
            if isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType) and _in_scope(member, package):
                yield member


def kernel_source_violations(kernel: Callable[..., Any]) -> tuple[tuple[str, str, str], ...]:
    """(where, rule, detail) for every source-rule violation reachable from ``kernel``."""
    func = _unwrap(kernel)
    if not isinstance(func, types.FunctionType):
        return ()
    key = func.__code__
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    package = (func.__module__ or "").split(".")[0]
    seen: set[Any] = set()
    todo: list[Any] = [func]
    found: list[tuple[str, str, str]] = []
    while todo:
        obj = todo.pop()
        ident = obj.__code__ if isinstance(obj, types.FunctionType) else obj
        if ident in seen:
            continue
        seen.add(ident)
        if isinstance(obj, type):
            todo.extend(_class_functions(obj, package))
            continue
        violations, referenced = _function_info(obj, package)
        found.extend((obj.__qualname__, rule, detail) for rule, detail in violations)
        todo.extend(referenced)
    result = tuple(found)
    _CACHE[key] = result
    return result


def check_kernel_source(kernel: Callable[..., Any], mode: str) -> None:
    """Apply the source rules to ``kernel`` in ``mode`` ("error", "warn" or "off")."""
    if mode == "off":
        return
    violations = kernel_source_violations(kernel)
    errors: list[Any] = list(violations) if mode == "error" else []
    warns: list[Any] = list(violations) if mode == "warn" else []
    if errors:
        where, rule, detail = errors[0]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise NkiError(f"{where}: {rule}: {detail}{more}")
    by_rule: dict[str, list[tuple[str, str, str]]] = {}
    for v in warns:
        by_rule.setdefault(v[1], []).append(v)
    for rule, found in by_rule.items():  # one warning per rule and kernel, naming the first
        where, _, detail = found[0]
        more = f" (+{len(found) - 1} more in code this kernel calls)" if len(found) > 1 else ""
        warnings.warn(f"{where}: {rule}: {detail}{more}", NkiWarning, stacklevel=4)
