"""nki-library's hardware-measured QoR records: parsing the test files' lists (never importing
the tests, which need the Neuron SDK), deciding what each measured entry means, and the kernel
families the calibration knows (docs/calibration.md)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable

from nkilib_msda.hardware import TWO_BYTE_FLOAT_DTYPES

__all__ = ["Record", "Decision", "Family", "FAMILIES", "MEASURE_NAMES", "PS_PER_US", "Row",
           "parse_records", "decide", "in_scope", "sym", "kernel_commit", "collect", "config_text"]

MEASURE_NAMES = ("tpbSgCyclesSum", "cyclesQoR", "qor")  # "qor": attention_cte's context-parallel lists
PS_PER_US = 1e6


# -- parsing the records ------------------------------------------------------------------
@dataclasses.dataclass
class Record:
    """One configuration of a QoR list: ``values`` by column name, the raw measured entry."""

    kernel: str
    table: str
    line: int
    values: dict[str, Any]
    measure_column: str

    @property
    def raw_measure(self) -> Any:
        return self.values[self.measure_column]

    def config(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k != self.measure_column}

    def key(self) -> str:
        items = ",".join(f"{k}={v}" for k, v in sorted(self.config().items()))
        return f"{self.kernel}|{items}"


class _Symbol(str):
    """A name or attribute in a record (``nl.bfloat16``, ``NormType.RMS_NORM``)."""


def _literal(node: ast.AST) -> Any:
    """Evaluate a record cell: literals, +-*// arithmetic, tuples/lists, dotted names."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.BinOp):
        a, b = _literal(node.left), _literal(node.right)
        ops: dict[type, Callable[[Any, Any], Any]] = {
            ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
            ast.Mult: lambda x, y: x * y, ast.FloorDiv: lambda x, y: x // y,
            ast.Div: lambda x, y: x / y}
        if type(node.op) in ops and not isinstance(a, str) and not isinstance(b, str):
            return ops[type(node.op)](a, b)
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _Symbol(ast.unparse(node))
    return _Symbol(ast.unparse(node))


def _row_cells(node: ast.AST) -> list[ast.AST] | None:
    """The cells of one row: a list/tuple literal or ``pytest.param(..., marks=...)``."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return list(node.elts)
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("param"):
        return list(node.args)
    return None


def _header_columns(text: str) -> list[str] | None:
    """Column names from a header text naming a measure column (comma separated)."""
    if not any(m in text for m in MEASURE_NAMES):
        return None
    text = re.sub(r"(?m)^\s*#", " ", text)
    text = text.split(":", 1)[1] if re.search(r"(Parameters|format)\s*:", text) else text
    names = [re.sub(r"[^A-Za-z0-9_]", "", part) for part in text.replace("\n", " ").split(",")]
    names = [n for n in names if n]
    return names or None


def _comment_headers(source: str) -> list[tuple[int, list[str]]]:
    """(last line, columns) of ``# Parameters: a, b, ...`` comment blocks and of
    ``Config format: [...]`` docstrings."""
    headers: list[tuple[int, list[str]]] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"\s*#\s*Parameters\s*:", lines[i]) or "Config format:" in lines[i]:
            block = [lines[i]]
            j = i + 1
            while j < len(lines) and (lines[j].strip().startswith("#") or (
                    "Config format:" in lines[i] and "]" not in block[-1])):
                block.append(lines[j])
                j += 1
            text = "\n".join(block).replace("[", " ").replace("]", " ").replace("{", " ")
            text = re.sub(r"ModelTestType\s*:", " ", text)
            cols = _header_columns(text)
            if cols:
                headers.append((j, cols))
            i = j
        else:
            i += 1
    return headers


def parse_records(source: str, kernel: str) -> list[Record]:
    """Every row of every QoR list in a test file. A list's columns come from the nearest
    preceding header: a string constant naming the measure column (``"a, b, tpbSgCyclesSum"``)
    or a ``# Parameters:`` / ``Config format:`` comment. Rows whose length differs from the
    header are skipped."""
    tree = ast.parse(source)
    string_headers: list[tuple[int, list[str]]] = []
    tables: list[tuple[int, str, list[ast.AST]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = ast.unparse(node.targets[0])
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                cols = _header_columns(value.value)
                if cols:
                    string_headers.append((node.lineno, cols))
            elif isinstance(value, ast.List):
                tables.append((node.lineno, name, list(value.elts)))
            elif isinstance(value, ast.Dict):
                for v in value.values:
                    if isinstance(v, ast.List):
                        tables.append((node.lineno, name, list(v.elts)))
    headers = sorted(string_headers + _comment_headers(source))
    records: list[Record] = []
    for lineno, name, rows in sorted(tables, key=lambda t: t[0]):
        before = [h for h in headers if h[0] <= lineno]
        if not before:
            continue
        cols = before[-1][1]
        measure = next((c for c in cols if c in MEASURE_NAMES), None)
        if measure is None:
            continue
        for row in rows:
            cells = _row_cells(row)
            if cells is None or len(cells) != len(cols):
                continue
            values = dict(zip(cols, (_literal(c) for c in cells)))
            records.append(Record(kernel, name, getattr(row, "lineno", lineno), values, measure))
    return records


# -- deciding per record -------------------------------------------------------------------
@dataclasses.dataclass
class Decision:
    recorded_ps: int | None
    use_in_fit: bool
    note: str


def decide(record: Record, all_values: Iterable[Any]) -> Decision:
    """What the measured entry means: a number, a pair with one filled slot (used), None (no
    measurement), a round-number placeholder (0 or an integer multiple of 10^6 written as an
    int among precise values), a float literal such as ``196e7`` (a measurement rounded to
    three digits: kept for the check set, never fitted), or a value shared with another
    configuration (a copied entry: kept, not fitted)."""
    raw = record.raw_measure
    note = []
    if isinstance(raw, tuple):
        filled = [x for x in raw if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(filled) != 1:
            return Decision(None, False, f"pair {raw}: no single value")
        note.append(f"pair {tuple(raw)}: filled slot used")
        raw = filled[0]
    if raw is None or isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return Decision(None, False, "no measurement recorded")
    fit = True
    if isinstance(raw, float):
        note.append("rounded value (float literal)")
        fit = False
    value = int(round(raw))
    if value == 0 or (isinstance(raw, int) and value % 1_000_000 == 0):
        return Decision(value, False, "; ".join(note + ["round-number placeholder"]))
    count = sum(1 for x in all_values if x == raw)
    if count > 1:
        note.append(f"value repeated {count}x (copied)")
        fit = False
    return Decision(value, fit, "; ".join(note) or "measured")


# -- the kernel families -------------------------------------------------------------------
def sym(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


def in_scope(record: Record) -> tuple[bool, str]:
    """bf16/fp16 and not quantized."""
    v = record.values
    dtype = sym(v.get("dtype", "bfloat16"))
    if dtype not in TWO_BYTE_FLOAT_DTYPES:
        return False, f"dtype {dtype}"
    quant = sym(v.get("quantization_type", v.get("quant_type", "NONE")))
    if quant != "NONE" or v.get("quant_dtype") not in (None,):
        return False, f"quantized ({quant})"
    return True, ""


@dataclasses.dataclass
class Family:
    name: str
    test_files: tuple[str, ...]
    kernel_file: str
    set_name: str  # "fit" or "check"
    note: str = ""  # said of every record of the family


FAMILIES = {
    "qkv_tkg": Family("qkv_tkg", ("test/integration/nkilib/core/qkv/test_qkv_tkg.py",),
                      "src/nkilib_src/nkilib/core/qkv/qkv_tkg.py", "fit"),
    "mlp_tkg": Family("mlp_tkg", ("test/integration/nkilib/core/mlp/test_mlp_tkg.py",
                                  "test/integration/nkilib/core/mlp/test_mlp_tkg_model_config.py"),
                      "src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg.py", "fit"),
    "mlp_cte": Family("mlp_cte", ("test/integration/nkilib/core/mlp/test_mlp_cte.py",
                                  "test/integration/nkilib/core/mlp/test_mlp_cte_model_config.py"),
                      "src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte.py", "check",
                      "LNC column ignored by the test harness (runs at the platform default); "
                      "values differ between LNC 1 and 2 rows, so run at the column's LNC"),
    "attention_cte": Family("attention_cte",
                            ("test/integration/nkilib/core/attention/test_attention_cte.py",),
                            "src/nkilib_src/nkilib/core/attention/attention_cte.py", "check"),
    "rmsnorm_quant": Family("rmsnorm_quant",
                            ("test/integration/nkilib/core/rmsnorm/test_rmsnorm_quant.py",),
                            "src/nkilib_src/nkilib/core/rmsnorm/rmsnorm_quant.py", "check"),
    "find_nonzero_indices_with_count": Family(
        "find_nonzero_indices_with_count",
        ("test/integration/nkilib/experimental/benchmark/test_find_nonzero_indices_with_count.py",),
        "src/nkilib_src/nkilib/core/subkernels/find_nonzero_indices.py", "check"),
}


def kernel_commit(checkout: Path, rel: str) -> str:
    """The upstream commit a kernel file came from: ``PROVENANCE.json`` in the checkout
    (path -> commit) if present, else the last git commit touching it."""
    prov = checkout / "PROVENANCE.json"
    if prov.exists():
        table = json.loads(prov.read_text())
        if rel in table:
            return str(table[rel])
        if "*" in table:
            return str(table["*"])
    try:
        out = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%H", "--", rel],
                             capture_output=True, text=True, check=True).stdout.strip()
        return out or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


Row = tuple["Record", "Decision", bool, str]  # record, decision, in scope, why not


def collect(checkout: Path, kernels: Iterable[str]) -> list[Row]:
    rows = []
    for name in kernels:
        fam = FAMILIES[name]
        records: list[Record] = []
        for rel in fam.test_files:
            path = checkout / rel
            if path.exists():
                records += parse_records(path.read_text(), name)
        # every row of the family (quantized ones too): a value shared with any other
        # configuration is a copied entry
        measures = [r.raw_measure[-1] if isinstance(r.raw_measure, tuple) else r.raw_measure
                    for r in records]
        seen = set()
        for r in records:
            if r.key() in seen:
                continue
            seen.add(r.key())
            scope, why = in_scope(r)
            rows.append((r, decide(r, measures), scope, why))
    return rows


def config_text(r: Record) -> str:
    skip = {"lnc_degree", "vnc_degree", "dtype", "quant_dtype", "quant_type",
            "quantization_type", "eps", "act_fn_type"}
    parts = []
    for k, v in r.config().items():
        if k in skip or v in (False, None) or (isinstance(v, str) and v.endswith(".BSD")):
            continue
        parts.append(f"{k}={sym(v) if isinstance(v, str) else v}")
    return " ".join(parts)
