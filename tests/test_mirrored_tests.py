"""Both test roots mirror the package file by file (docs/architecture.md, "Tests").

A test file ``<root>/<folder>/test_<name>.py`` (root ``tests`` or ``simulator_tests``) is named
after what it tests, in the folder that mirrors ``nkilib_msda/<folder>/``: ``<name>`` is
``<module>`` or ``<module>_<aspect>``, where ``<module>`` is

- a module of ``nkilib_msda/<folder>/``, a private module's leading underscore dropped
  (``tests/simulator/timing/test_recorder.py`` for ``simulator/timing/recorder.py``,
  ``tests/simulator/test_memory_hazards.py`` for the hazards of ``simulator/memory.py``,
  ``tests/test_env.py`` for ``_env.py``), or
- a subpackage of it, or the package ``<folder>`` itself, tested as a whole
  (``tests/simulator/test_simulator_layering.py``: the ``simulator`` package's layering;
  ``tests/test_simulator_route.py``).

Two exceptions: ``tests/benchmarks/`` mirrors the scripts of ``benchmarks/`` the same way, and
the package-wide checks of :data:`PACKAGE_WIDE` stay at the root of ``tests/``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_ROOTS = ("simulator_tests", "tests")

# Package-wide checks: they test no one module but the package (or the repository) as a whole,
# so they live at the root of tests/ (each entry says what it checks).
PACKAGE_WIDE = {
    "test_doc_references.py",  # every path and name the docs cite exists
    "test_docs.py",  # docs/ tell the truth: layout, commands, numbers
    "test_examples.py",  # the scripts of examples/ run end to end
    "test_mirrored_tests.py",  # this file: the test layout
    "test_package.py",  # the package surface: lazy imports, kernel names, sys.path hygiene
    "test_package_layering.py",  # imports between the package's folders go one way
    "test_shared_facts.py",  # one definition of each shared fact across the package
}

# Folders mirrored outside the package: tests/<folder>/ mirrors <folder>/ of the repository.
OTHER_MIRRORS = {"tests/benchmarks": "benchmarks"}


def _test_files() -> list[Path]:
    return sorted(p for top in TEST_ROOTS for p in (ROOT / top).rglob("test_*.py"))


def _modules(folder: Path) -> set[str]:
    """Names of the modules and subpackages in ``folder``, without a leading underscore."""
    if not folder.is_dir():
        return set()
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return {name.lstrip("_") for name in names}


def _mirrored_folder(test_file: Path) -> Path:
    rel = test_file.parent.relative_to(ROOT)
    for tests_folder, other in OTHER_MIRRORS.items():
        if rel == Path(tests_folder) or Path(tests_folder) in rel.parents:
            return ROOT / other / rel.relative_to(tests_folder)
    return ROOT / "nkilib_msda" / Path(*rel.parts[1:])


def _tested_module(test_file: Path) -> str | None:
    """The module (or subpackage) of the mirrored folder that ``test_file`` is named after."""
    name = test_file.stem.removeprefix("test_")
    folder = _mirrored_folder(test_file)
    candidates = _modules(folder) | ({folder.name} if folder.is_dir() and folder != ROOT / "nkilib_msda"
                                     else set())
    for module in sorted(candidates, key=len, reverse=True):
        if name == module or name.startswith(module + "_"):
            return module
    return None


def test_the_test_roots_are_the_two_of_the_card():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert tuple(sorted(config["testpaths"])) == TEST_ROOTS
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and "test" in p.name) == list(TEST_ROOTS)


def test_every_test_file_is_named_after_the_module_it_tests_in_the_mirrored_folder():
    unmatched = []
    for test_file in _test_files():
        rel = test_file.relative_to(ROOT)
        if rel.parent == Path("tests") and test_file.name in PACKAGE_WIDE:
            continue
        if _tested_module(test_file) is None:
            unmatched.append(f"{rel} (expected test_<module>[_<aspect>].py for a module of "
                             f"{_mirrored_folder(test_file).relative_to(ROOT)}/)")
    assert not unmatched, "\n".join(unmatched)


def test_the_package_wide_allow_list_names_files_that_exist():
    assert {p.name for p in (ROOT / "tests").glob("test_*.py")} >= PACKAGE_WIDE


def test_helper_module_names_are_unique_across_both_roots():
    """The helpers are imported by their plain names (the root conftest.py puts their folders
    on sys.path), so one name must mean one file."""
    helpers: dict[str, list[str]] = {}
    for top in TEST_ROOTS:
        for p in (ROOT / top).rglob("*.py"):
            if not p.name.startswith("test_") and p.name != "conftest.py":
                helpers.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    assert {name: paths for name, paths in helpers.items() if len(paths) > 1} == {}


def test_the_check_rejects_a_misnamed_file_and_accepts_an_aspect():
    """The rule itself, on names that are not in the tree."""
    assert _tested_module(ROOT / "tests/simulator/timing/test_recorder.py") == "recorder"
    assert _tested_module(ROOT / "tests/simulator/test_memory_hazards.py") == "memory"
    assert _tested_module(ROOT / "tests/test_env.py") == "env"
    assert _tested_module(ROOT / "tests/simulator/test_simulator_layering.py") == "simulator"
    assert _tested_module(ROOT / "tests/benchmarks/test_corner_cost.py") == "corner_cost"
    assert _tested_module(ROOT / "tests/pytorch/test_torch_ops.py") is None
    assert _tested_module(ROOT / "tests/simulator/conformance/test_isa_dma.py") is None
    assert _tested_module(ROOT / "tests/simulator/test_memoryless.py") is None


def test_test_modules_import_each_other_by_their_dotted_paths():
    """No test folder is on sys.path (importlib mode), so a test module that uses another's
    helpers imports it from the repository root (``from simulator_tests.experimental.
    deformable_attention.test_ms_deformable_attention_bwd import ...``): one module object,
    whatever the base names of the other folders."""
    import ast

    plain = []
    for p in (q for top in TEST_ROOTS for q in (ROOT / top).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            plain += [f"{p.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                      if name.startswith("test_")]
    assert not plain, "\n".join(plain)
