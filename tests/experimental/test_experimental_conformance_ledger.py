"""docs/conformance.md lists every NKI form the kernels use (issue 29): the AST of each kernel
source under ``nkilib_msda/experimental/`` is scanned for

- calls and attribute references rooted at ``nl``, ``nisa`` or ``nki`` (instructions, enums,
  dtypes, buffers, ALU ops), with the keyword arguments of every call, and ``getattr`` on
  them (a constant name, or ``getattr(nl, ...)`` for a dynamic one);
- NkiTensor view methods (``.ap``, ``.view``, ``.reshape``, ``.broadcast``, ...) with their
  keyword arguments;
- decorators;

and each must have a ledger row whose "Keywords" cell names every keyword used. A row whose
form the kernels no longer use fails too, so the ledger stays true.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "nkilib_msda" / "experimental"
LEDGER = ROOT / "docs" / "conformance.md"
NKI_ROOTS = ("nl", "nisa", "nki")
# NkiTensor view methods (NkiTensor page, NKI 0.7): calls on any receiver with these names.
TENSOR_METHODS = frozenset({
    "ap", "broadcast", "expand_dim", "flatten_dims", "get_pattern", "indirect", "is_contiguous",
    "permute", "rearrange", "reshape", "reshape_dim", "select", "slice", "squeeze_dim",
    "vector_select", "view", "reinterpret_cast"})


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in NKI_ROOTS:
        return ".".join([node.id] + parts[::-1])
    return None


def kernel_forms() -> dict[str, dict[str, set[str]]]:
    """form -> {"keywords": set, "files": set} over every kernel source."""
    forms: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"keywords": set(), "files": set()})
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        name = str(path.relative_to(KERNELS))
        called: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                for dec in node.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    form = _dotted(target)
                    if form:
                        forms["@" + form]["files"].add(name)
                        called.add(id(target))
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "getattr" and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in NKI_ROOTS:
                attr = node.args[1] if len(node.args) > 1 else None
                dynamic = not (isinstance(attr, ast.Constant) and isinstance(attr.value, str))
                root = node.args[0].id
                forms[f"getattr({root}, ...)" if dynamic else f"{root}.{attr.value}"]["files"].add(name)
                continue
            form = _dotted(func)
            if form is None and isinstance(func, ast.Attribute) and func.attr in TENSOR_METHODS:
                form = "." + func.attr
            if form is None:
                continue
            called.add(id(func))
            entry = forms[form]
            entry["files"].add(name)
            entry["keywords"].update(k.arg for k in node.keywords if k.arg)
        prefixes = _prefixes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in called:
                form = _dotted(node)
                # only whole chains (not the nisa in nisa.engine.scalar)
                if form and form.count(".") >= 1 and id(node) not in prefixes:
                    forms[form]["files"].add(name)
    return forms


def _prefixes(tree: ast.AST) -> set[int]:
    """ids of the attribute nodes that are the head of a longer chain (``nisa.engine`` in
    ``nisa.engine.scalar``). Computed per tree while it is alive: ids of collected trees are
    reused, so a cache keyed by ``id(tree)`` would answer for another file."""
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}


def ledger_rows() -> dict[str, set[str]]:
    """form -> keywords allowed, from the ledger's table rows ``| `form` | `kw`, ... | ...``."""
    rows: dict[str, set[str]] = {}
    for line in LEDGER.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[^`]+`", cells[0]):
            continue
        rows[cells[0].strip("`")] = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[1]))
    return rows


def test_every_kernel_form_has_a_ledger_row():
    rows = ledger_rows()
    missing = []
    for form, entry in sorted(kernel_forms().items()):
        if form not in rows:
            missing.append(f"{form} (in {', '.join(sorted(entry['files']))})")
            continue
        extra = entry["keywords"] - rows[form]
        if extra:
            missing.append(f"{form}: keywords {sorted(extra)} not in its row")
    assert not missing, "docs/conformance.md lacks: " + "; ".join(missing)


def test_every_ledger_row_is_used():
    used = kernel_forms()
    stale = sorted(f for f in ledger_rows() if f not in used)
    assert not stale, f"docs/conformance.md rows for forms no kernel uses: {stale}"
    for form, allowed in ledger_rows().items():
        unused = allowed - used[form]["keywords"]
        assert not unused, f"docs/conformance.md: {form} lists unused keywords {sorted(unused)}"


def test_the_scanner_sees_each_kind_of_form(tmp_path):
    """The scanner is not vacuous: known forms of each kind are found."""
    forms = kernel_forms()
    assert "@nki.jit" in forms
    assert {"dst", "src", "oob_mode"} <= forms["nisa.dma_copy"]["keywords"]
    assert {"vector_offset", "offset"} <= forms[".ap"]["keywords"]
    assert "nisa.oob_mode.skip" in forms and "nl.float32" in forms
