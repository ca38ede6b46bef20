"""The simulator package imports in one direction (docs/emulator.md, "Memory, hazards and
strict mode" > Layering).

The graph is built from the AST of every module, function-level imports included, so an
import hidden inside a function to dodge a cycle still counts. Importing a submodule from
outside its package also imports the package's ``__init__`` (an edge to it); the simulator
package's own ``__init__`` is the top of the stack and is not counted as such an edge.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import nkilib_msda.simulator as simulator_pkg

PKG = "nkilib_msda.simulator"
ROOT = Path(simulator_pkg.__file__).parent

# Lowest first. A module may import modules of its own or a lower layer (never a higher one),
# and the graph must be acyclic. Every name is a module that exists (tested below).
LAYERS: list[tuple[str, set[str]]] = [
    ("errors", {"errors"}),
    ("instruction events", {"access_geometry", "events"}),
    ("dtypes/targets", {"dtypes", "targets", "report", "unmodelled", "compiler"}),
    ("timing model", {"timing", "timing.guard", "timing.constants", "timing.costs", "timing.graph", "timing.calibrated", "timing.fingerprint",
                      "timing.scenarios",
                      "timing.recorder", "timing.schedule"}),
    ("memory", {"memory"}),
    ("context", {"context"}),
    ("tensors and views", {"geometry", "dynamic_views", "tensor"}),
    ("operand access", {"access"}),
    ("ALU semantics", {"alu"}),
    ("instruction support", {"isa._operands", "isa._dma_operands", "isa.enums"}),
    ("instructions", {"isa", "isa.dma", "isa.vector", "isa.vector_reduce", "isa.scalar", "isa.gpsimd",
                      "isa.tensor_engine", "isa.sync", "isa.scalars", "isa.constants"}),
    ("nl namespace", {"language", "lnc"}),
    ("nl wrappers", {"wrappers"}),
    ("progress display", {"progress"}),
    ("kernel arguments and outputs", {"kernel_io"}),
    ("jit/simulate", {"source_rules", "jit"}),
    ("package", {""}),
]
DEFAULT_ISA_LAYER = "instructions"  # isa modules not listed above


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(importer: str, node: ast.AST, modules: set[str]) -> list[tuple[str, int]]:
    """Simulator modules (relative names) imported by ``node``, with line numbers."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg_parts = (PKG + ("." + importer if importer else "")).split(".")
            is_pkg = (ROOT / importer.replace(".", "/") / "__init__.py").exists() if importer \
                else True
            keep = len(pkg_parts) - node.level + (1 if is_pkg else 0)
            base = ".".join(pkg_parts[:keep] + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            rel = full[len(PKG) + 1:] if full.startswith(PKG + ".") else None
            targets.append(full if rel in modules else base)
    out = []
    for full in targets:
        if full != PKG and not full.startswith(PKG + "."):
            continue
        rel = full[len(PKG) + 1:] if full != PKG else ""
        while rel not in modules and "." in rel:
            rel = rel.rsplit(".", 1)[0]
        if rel not in modules:
            continue
        out.append((rel, node.lineno))
        # Importing a.b.c from outside package a.b also runs a.b's __init__.
        parts = rel.split(".")
        for k in range(1, len(parts)):
            parent = ".".join(parts[:k])
            if not (importer == parent or importer.startswith(parent + ".")):
                out.append((parent, node.lineno))
    return out


def import_graph() -> dict[str, list[tuple[str, int]]]:
    """module -> [(imported module, line)], relative names ("" is the package)."""
    return {name: list(edges) for name, edges in _parsed_import_graph().items()}


@functools.lru_cache(maxsize=1)
def _parsed_import_graph() -> dict[str, list[tuple[str, int]]]:
    """import_graph's parse of the package sources, once per test session."""
    modules = _modules()
    names = set(modules)
    graph: dict[str, list[tuple[str, int]]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [e for e in _resolve(name, node, names) if e[0] != name]
        graph[name] = edges
    return graph


def _layer_of(module: str) -> int:
    for i, (_, members) in enumerate(LAYERS):
        if module in members:
            return i
    if module.startswith("isa."):
        return [n for n, _ in LAYERS].index(DEFAULT_ISA_LAYER)
    raise AssertionError(f"simulator module {module!r} has no layer: add it to LAYERS in "
                         f"{__file__}")


def _find_cycle(graph: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep, _ in graph.get(m, []):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_every_listed_module_exists() -> None:
    """No stale entry: each name in LAYERS is a module of the simulator package."""
    modules = set(_modules())
    stale = sorted(m for _, members in LAYERS for m in members if m not in modules)
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    assert ("access", 0) not in graph["tensor"]
    deps = {d for d, _ in graph["wrappers"]}
    assert {"alu", "isa", "language", "access"} <= deps
    # The builder must see an import inside a function body.
    tree = ast.parse("def f():\n    from nkilib_msda.simulator.isa import dma\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert ("isa.dma", 2) in _resolve("tensor", node, set(_modules()))
    assert ("isa", 2) in _resolve("tensor", node, set(_modules()))


def test_simulator_imports_have_no_cycle() -> None:
    cycle = _find_cycle(import_graph())
    assert cycle is None, f"import cycle in {PKG}: {' -> '.join(cycle or [])}"


def test_simulator_imports_follow_the_layer_order() -> None:
    graph = import_graph()
    bad = []
    for module, edges in graph.items():
        for dep, line in edges:
            if _layer_of(dep) > _layer_of(module):
                bad.append(f"{module or PKG}:{line} imports {dep} "
                           f"({LAYERS[_layer_of(module)][0]} -> {LAYERS[_layer_of(dep)][0]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("module", ["tensor", "access", "alu", "isa.dma", "isa.scalar"])
def test_core_modules_have_no_function_level_simulator_imports(module: str) -> None:
    path = _modules()[module]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    nested = [n.lineno for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top
              and _resolve(module, n, set(_modules()))]
    assert not nested, f"{module}: function-level simulator imports at lines {nested}"
