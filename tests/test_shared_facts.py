"""One home for each shared fact (the hardware ones are tests/test_hardware_facts.py).

The package and the benchmark scripts are scanned as code (comments and docstrings do not
count); each check names the one module a fact lives in and fails on a second definition:

- dtype name sets: :data:`nkilib_msda.hardware.KERNEL_DTYPES` and ``TWO_BYTE_FLOAT_DTYPES``,
  :data:`nkilib_msda.validation.msda.FLOAT_DTYPE_NAMES`; the kernels' padding modes,
  :data:`nkilib_msda.validation.msda.KERNEL_PADDING_MODES`;
- the layouts and their dimension orders, the level starts: :mod:`nkilib_msda.validation.layouts`;
- the positive-int check: :mod:`nkilib_msda.validation.arguments`;
- the torch <-> NumPy bridge (bf16 through its bits, the float64 copy): :mod:`nkilib_msda.validation.arrays`;
- the GPU checks' tolerances: :data:`nkilib_msda.workloads.GPU_TOLERANCES`;
- nki-library's test shapes: :data:`nkilib_msda.workloads.NKI_LIBRARY_SHAPES`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import nkilib_msda
from nkilib_msda import hardware
from nkilib_msda.validation import layouts
from nkilib_msda.validation.msda import FLOAT_DTYPE_NAMES, KERNEL_PADDING_MODES

PKG = Path(nkilib_msda.__file__).parent
ROOT = PKG.parent
NAMED_DTYPE_SETS = {"KERNEL_DTYPES": hardware.KERNEL_DTYPES,
                    "TWO_BYTE_FLOAT_DTYPES": hardware.TWO_BYTE_FLOAT_DTYPES,
                    "FLOAT_DTYPE_NAMES": FLOAT_DTYPE_NAMES, "KERNEL_PADDING_MODES": KERNEL_PADDING_MODES}
LAYOUT_NAMES = set(layouts.VALUE_LAYOUTS) | set(layouts.LOCATION_LAYOUTS)


def _files() -> list[Path]:
    """The package's modules and the benchmark scripts."""
    return sorted([*PKG.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")])


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tokens(path: Path, kinds: set[int]) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline) if t.type in kinds]


def _code(path: Path) -> str:
    """The source without strings and comments, tokens joined by one space."""
    skip = {tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT}
    if hasattr(tokenize, "FSTRING_START"):  # Python 3.12+: f-strings are tokenized
        skip |= {tokenize.FSTRING_START, tokenize.FSTRING_MIDDLE, tokenize.FSTRING_END}
    out = [t.string for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
           if t.type not in skip]
    return " ".join(out)


def _string_collections(path: Path) -> list[tuple[int, set[str]]]:
    """(line, values) of every tuple, list, set or dict-keys literal made only of strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else (
            [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else None)
        if elts and len(elts) >= 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                           for e in elts):
            found.append((node.lineno, {e.value for e in elts}))
    return found


def _offenders(pattern: re.Pattern[str], home: set[str], text=_code) -> list[str]:
    return [_rel(p) for p in _files() if _rel(p) not in home and pattern.search(text(p))]


# ------------------------------------------------------------------ dtype names and layouts

def test_named_dtype_and_padding_sets_are_written_once():
    homes = {"KERNEL_DTYPES": "nkilib_msda/hardware.py", "TWO_BYTE_FLOAT_DTYPES": "nkilib_msda/hardware.py",
             "FLOAT_DTYPE_NAMES": "nkilib_msda/validation/msda.py",
             "KERNEL_PADDING_MODES": "nkilib_msda/validation/msda.py"}
    found = []
    for path in _files():
        for line, values in _string_collections(path):
            for name, named in NAMED_DTYPE_SETS.items():
                if values == set(named) and _rel(path) != homes[name]:
                    found.append(f"{_rel(path)}:{line} writes {name} again")
    assert not found, found


def test_layout_names_and_dimension_orders_are_written_once():
    home = "nkilib_msda/validation/layouts.py"
    found = [f"{_rel(p)}:{line} {sorted(values)}" for p in _files() if _rel(p) != home
             for line, values in _string_collections(p) if len(values & LAYOUT_NAMES) >= 2]
    assert not found, f"use nkilib_msda.validation.layouts (VALUE_DIMS / LOCATION_DIMS): {found}"


def test_level_starts_are_computed_once():
    """Cumulative H*W, by a loop (``+= h * w``, ``starts[-1] + h * w``) or by ``cumsum``, only
    in layouts.level_starts."""
    hw = r"(h|height) \* (w|width)\b"
    pattern = re.compile(rf"\+= {hw}|\[ - 1 \] \+ {hw}|= \w+ \+ {hw} ,|cumsum \( \[ 0 \] \+ \[ h \* w")
    found = _offenders(pattern, {"nkilib_msda/validation/layouts.py"})
    assert not found, f"use nkilib_msda.validation.layouts.level_starts: {found}"


# ------------------------------------------------------------------ checks and conversions

def test_the_positive_int_check_is_written_once():
    """The message (and so the check) lives in validation/arguments.py. The emulator is left
    out: its errors repeat the official NKI front end's wording for NKI's own arguments."""
    def strings(path: Path) -> str:
        return " ".join(t.string for t in _tokens(path, {tokenize.STRING}))

    pattern = re.compile(r"expected (None or )?a positive int\b")
    found = [p for p in _offenders(pattern, {"nkilib_msda/validation/arguments.py"}, strings)
             if not p.startswith("nkilib_msda/simulator/")]
    assert not found, f"use nkilib_msda.validation.arguments.check_positive_int: {found}"


def test_the_torch_numpy_bridge_is_written_once():
    pattern = re.compile(r"\. view \( (torch|np) \. u?int16 \)|\. double \( \) \. numpy \( \)")
    found = _offenders(pattern, {"nkilib_msda/validation/arrays.py"})
    assert not found, f"use nkilib_msda.validation.arrays (to_numpy / to_torch / as_float64): {found}"


# ------------------------------------------------------------------ workloads and tolerances

GPU_CHECKERS = ["benchmarks/check_gpu.py", "tests/backends/triton/_interpreter_cases.py"]


@pytest.mark.parametrize("rel", GPU_CHECKERS)
def test_gpu_checks_read_their_tolerances_from_the_table(rel):
    from nkilib_msda.workloads import GPU_ACCUMULATED_BF16_TOLERANCE, GPU_TOLERANCES

    values = {*GPU_TOLERANCES.values(), GPU_ACCUMULATED_BF16_TOLERANCE}
    path = ROOT / rel
    written = [f"{rel}:{t.start[0]} {t.string}" for t in _tokens(path, {tokenize.NUMBER})
               if float(t.string) in values]
    assert not written, f"use nkilib_msda.workloads.GPU_TOLERANCES: {written}"
    assert "GPU_TOLERANCES" in path.read_text()


def test_the_side_by_side_shapes_are_named_workloads():
    import runpy

    from nkilib_msda.workloads import NKI_LIBRARY_SHAPE_DESCRIPTIONS, NKI_LIBRARY_SHAPES

    script = ROOT / "benchmarks" / "msda_side_by_side.py"
    assert "MSDACase(" not in _code(script).replace(" ", "")
    names = runpy.run_path(str(script), run_name="side_by_side_under_test")
    assert names["SHAPES"] is NKI_LIBRARY_SHAPES
    assert names["SHAPE_DESCRIPTIONS"] is NKI_LIBRARY_SHAPE_DESCRIPTIONS


# ------------------------------------------------------------------ the scanners can fail

def test_the_scanners_see_a_planted_second_definition(tmp_path: Path):
    planted = tmp_path / "planted.py"
    planted.write_text('DT = ("float32", "bfloat16", "float16")  # a comment "BLNC"\n'
                       'LAYOUTS = {"BQHLP2": 1, "B2QHLP": 2}\n'
                       'def f(shapes):\n    acc = 0\n    for h, w in shapes:\n        acc += h * w\n'
                       '    x = t.view(torch.int16)\n    raise ValueError("n: expected a positive int")\n')
    values = [v for _, v in _string_collections(planted)]
    assert set(hardware.KERNEL_DTYPES) in values
    assert any(len(v & LAYOUT_NAMES) >= 2 for v in values)
    code = _code(planted)
    assert re.search(r"\+= (h|height) \* (w|width)\b", code)
    assert re.search(r"\. view \( (torch|np) \. u?int16 \)", code)
    assert "BLNC" not in code and "positive" not in code  # comments and strings are not code
