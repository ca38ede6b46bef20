"""The whole package imports in one direction (docs/architecture.md).

Every module of ``nkilib_msda`` belongs to one layer; a module may import its own layer or a
lower one, never a higher one, and the graph has no cycle. The graph counts every edge the
code can follow, not only the eager ones:

- ``import`` / ``from ... import`` anywhere in a module, function bodies included;
- a string literal that names a package module (``_LAZY`` tables of ``lazy_exports``,
  ``importlib.import_module`` targets, backend and operator module tables): a lazy import;
- importing ``a.b.c`` from outside package ``a.b`` runs ``a.b``'s ``__init__``, an edge to it.
  The root ``nkilib_msda/__init__`` is the package face at the top and is not counted so.

The emulator's own internal order is tested in tests/simulator/test_simulator_layering.py.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import graphlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nkilib_msda

PKG = "nkilib_msda"
ROOT = Path(nkilib_msda.__file__).parent

# Lowest first; a module takes the first layer with a matching pattern (relative names, "" is
# the package face). Kernels and the emulator stand beside each other: kernels reach NKI only
# through `_nki`, which picks the real `nki` or the emulator.
LAYERS: list[tuple[str, list[str]]] = [
    ("base: version, environment, lazy names, hardware facts",
     ["_version", "_env", "_lazy", "hardware"]),
    ("problem types and validation", ["validation", "validation.*"]),
    ("references and workloads", ["reference", "reference.*", "workloads"]),
    ("planners (plain Python, no NKI)",
     ["experimental", "experimental.deformable_attention.plan", "experimental.deformable_attention.plan.*",
      "experimental.block_attn_res.tiling"]),
    ("emulator", ["simulator", "simulator.*"]),
    ("NKI selection", ["_nki"]),
    ("kernels", ["experimental.*"]),
    ("backends", ["backends", "backends.*"]),
    ("torch layer", ["pytorch", "pytorch.*"]),
    ("tools", ["tools", "tools.*", "bench", "bench.*"]),
    ("package face", ["", "_torch_ops", "__main__"]),
]

# Upward edges that are deliberate, with the reason. Nothing else may point up.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("experimental.block_attn_res", "pytorch.block_attn_res_ops"):
        "deprecated alias: docs/api.md §7 first listed the torch functions under the kernel "
        "package; it resolves them lazily with a DeprecationWarning",
}

# String literals that name a package module without importing it.
NOT_IMPORTS: set[tuple[str, str]] = {
    ("simulator.source_rules", "nkilib_msda.simulator"),  # frames the NKI source rules skip
    ("simulator.source_rules", "nkilib_msda._nki"),
}

Edge = tuple[str, int, str]  # (imported module, line, "import" | "lazy" | "package init")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _relative(full: str, modules: set[str]) -> str | None:
    """The package module that ``full`` (a dotted name) imports, relative; None if not ours."""
    if full != PKG and not full.startswith(PKG + "."):
        return None
    rel = full[len(PKG) + 1:] if full != PKG else ""
    while rel not in modules and "." in rel:
        rel = rel.rsplit(".", 1)[0]
    return rel if rel in modules else ("" if "" in modules else None)


def _is_package(root: Path, module: str) -> bool:
    return (root / module.replace(".", "/") / "__init__.py").exists() if module else True


def _import_targets(root: Path, importer: str, node: ast.Import | ast.ImportFrom,
                    modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg_parts = (PKG + ("." + importer if importer else "")).split(".")
        keep = len(pkg_parts) - node.level + (1 if _is_package(root, importer) else 0)
        base = ".".join(pkg_parts[:keep] + ([base] if base else []))
    out = []
    for alias in node.names:
        full = f"{base}.{alias.name}"
        rel = full[len(PKG) + 1:] if full.startswith(PKG + ".") else None
        out.append(full if rel in modules else base)
    return out


def _with_parent_packages(importer: str, target: str, line: int, kind: str) -> list[Edge]:
    edges = [(target, line, kind)]
    parts = target.split(".") if target else []
    for k in range(1, len(parts)):
        parent = ".".join(parts[:k])
        if not (importer == parent or importer.startswith(parent + ".")):
            edges.append((parent, line, "package init"))
    return edges


def module_edges(root: Path, importer: str, source: str, modules: set[str]) -> list[Edge]:
    """Edges of one module's source, every kind (see the module docstring)."""
    edges: list[Edge] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for full in _import_targets(root, importer, node, modules):
                rel = _relative(full, modules)
                if rel is not None and rel != importer:
                    edges += _with_parent_packages(importer, rel, node.lineno, "import")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.startswith(PKG + ".") and text[len(PKG) + 1:] in modules \
                    and (importer, text) not in NOT_IMPORTS:
                rel = text[len(PKG) + 1:]
                if rel != importer:
                    edges += _with_parent_packages(importer, rel, node.lineno, "lazy")
    return [e for e in edges if e[0] != importer and e[0] != ""]


def import_graph(root: Path = ROOT) -> dict[str, list[Edge]]:
    """module -> edges, for the package whose sources are under ``root``."""
    paths = {_module_name(root, p): p for p in root.rglob("*.py")}
    modules = set(paths)
    return {name: module_edges(root, name, path.read_text(), modules)
            for name, path in sorted(paths.items())}


@functools.lru_cache(maxsize=1)
def _package_graph() -> dict[str, list[Edge]]:
    return import_graph(ROOT)


def layer_of(module: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    raise AssertionError(f"module {PKG}.{module} has no layer: add it to LAYERS in {__file__}")


def _excused(module: str, dep: str) -> bool:
    """EXCEPTIONS names the edge (or the module whose package ``__init__`` it runs)."""
    return any(module == importer and (dep == target or target.startswith(dep + "."))
               for importer, target in EXCEPTIONS)


def upward_imports(graph: dict[str, list[Edge]]) -> list[str]:
    """Every edge from a lower layer to a higher one that EXCEPTIONS does not name."""
    bad = []
    for module, edges in graph.items():
        for dep, line, kind in edges:
            if layer_of(dep) > layer_of(module) and not _excused(module, dep):
                bad.append(f"{PKG}.{module}:{line} imports {PKG}.{dep} ({kind}): "
                           f"{LAYERS[layer_of(module)][0]} -> {LAYERS[layer_of(dep)][0]}")
    return sorted(bad)


def find_cycle(graph: dict[str, list[Edge]]) -> list[str] | None:
    """One import cycle as [m1, ..., m1], or None."""
    try:
        graphlib.TopologicalSorter({m: {d for d, _, _ in es} for m, es in graph.items()}).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_every_module_has_a_layer() -> None:
    for module in _package_graph():
        layer_of(module)


def test_package_imports_follow_the_layer_order() -> None:
    bad = upward_imports(_package_graph())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_package_imports_have_no_cycle() -> None:
    """The EXCEPTIONS edges are left out: the deprecated alias closes a circle through the
    backends on paper, never at run time (it resolves only when the old name is used)."""
    graph = {m: [e for e in es if not _excused(m, e[0])] for m, es in _package_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_every_layer_pattern_names_a_module() -> None:
    """No stale entry: each pattern of LAYERS matches a module that exists."""
    modules = list(_package_graph())
    stale = [p for _, patterns in LAYERS for p in patterns
             if not any(fnmatch.fnmatchcase(m, p) for m in modules)]
    assert not stale, f"LAYERS patterns that match no module of {PKG}: {stale}"


def test_every_exception_is_still_needed() -> None:
    edges = {(m, d) for m, es in _package_graph().items() for d, _, _ in es}
    stale = [pair for pair in EXCEPTIONS if pair not in edges]
    assert not stale, f"exceptions that no edge uses any more: {stale}"


def test_kernels_reach_the_emulator_only_through_nki() -> None:
    kernels = [m for m in _package_graph() if LAYERS[layer_of(m)][0] == "kernels"]
    direct = [f"{m} -> {d}" for m in kernels for d, _, _ in _package_graph()[m]
              if d == "simulator" or d.startswith("simulator.")]
    assert not direct, direct


# The checker itself: it sees every kind of edge and fails on a planted upward import.

def test_checker_sees_function_level_and_lazy_edges() -> None:
    graph = _package_graph()
    assert ("simulator", "_nki") in {(d, m) for m, es in graph.items() for d, _, _ in es}
    lazy = {(m, d) for m, es in graph.items() for d, _, kind in es if kind == "lazy"}
    assert ("_torch_ops", "pytorch.ops") in lazy
    assert ("experimental.deformable_attention",
            "experimental.deformable_attention.ms_deformable_attention") in lazy
    modules = set(graph)
    source = "def f():\n    from nkilib_msda.pytorch import ops\n"
    assert ("pytorch.ops", 2, "import") in module_edges(ROOT, "validation.msda", source, modules)
    assert ("pytorch", 2, "package init") in module_edges(ROOT, "validation.msda", source, modules)


@pytest.mark.parametrize("planted", [
    "from nkilib_msda.pytorch.functional import multi_scale_deformable_attention\n",
    "def later():\n    import nkilib_msda.backends\n",
    "import importlib\nimportlib.import_module('nkilib_msda.pytorch.ops')\n",
    "from nkilib_msda._lazy import lazy_exports\n"
    "__getattr__, __dir__ = lazy_exports(__name__, {'f': 'nkilib_msda.tools.cli'})\n",
])
def test_a_planted_upward_import_fails(tmp_path: Path, planted: str) -> None:
    copy = tmp_path / PKG
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not upward_imports(import_graph(copy))
    with (copy / "validation" / "msda.py").open("a") as f:
        f.write("\n" + planted)
    bad = upward_imports(import_graph(copy))
    assert len(bad) >= 1 and all(b.startswith(f"{PKG}.validation.msda:") for b in bad), bad


def test_a_synthetic_cycle_is_found() -> None:
    graph = {"a": [("b", 1, "import")], "b": [("c", 1, "lazy")], "c": [("a", 1, "import")]}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": [("b", 1, "import")], "b": []}) is None


# What the layers buy at run time (fresh interpreters: nothing imported by other tests).

def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint('\\n'.join(m for m in sys.modules if m.startswith('nkilib_msda')))\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def _emulator(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == f"{PKG}.simulator" or m.startswith(f"{PKG}.simulator.")
                  or m == f"{PKG}._nki")


def test_torch_reference_forward_and_backward_load_no_emulator() -> None:
    pytest.importorskip("torch")
    loaded = _loaded_after(
        "import torch, nkilib_msda\n"
        "g = torch.Generator().manual_seed(0)\n"
        "shapes = [(4, 5), (2, 3)]\n"
        "value = torch.randn(2, 26, 2, 8, generator=g, requires_grad=True)\n"
        "loc = torch.rand(2, 7, 2, 2, 3, 2, generator=g, requires_grad=True)\n"
        "attn = torch.rand(2, 7, 2, 2, 3, generator=g, requires_grad=True)\n"
        "out = nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn,"
        " backend='reference')\n"
        "out.sum().backward()\n"
        "assert value.grad is not None and loc.grad is not None and attn.grad is not None\n"
        "blocks = [torch.randn(1, 3, 16, generator=g, requires_grad=True) for _ in range(2)]\n"
        "h = nkilib_msda.block_attn_res(blocks, torch.randn(16, generator=g), rmsnorm_gamma=torch.ones(16),"
        " backend='reference')\n"
        "h.sum().backward()\n")
    assert f"{PKG}.backends.reference.backend" in loaded  # the probe did run the backend
    assert not _emulator(loaded), _emulator(loaded)


@pytest.mark.parametrize("planner", [
    "nkilib_msda.experimental.deformable_attention.plan.forward_config",
    "nkilib_msda.experimental.deformable_attention.plan.backward_config",
    "nkilib_msda.experimental.block_attn_res.tiling",
])
def test_a_planner_imports_without_nki_or_the_emulator(planner: str) -> None:
    loaded = _loaded_after(f"import {planner}")
    assert planner in loaded
    assert not _emulator(loaded), _emulator(loaded)
