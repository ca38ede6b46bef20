"""Calibrate the emulator's timing model against AWS nki-library's hardware-measured records.

Usage::

    python benchmarks/calibrate_timing.py PATH_TO_NKI_LIBRARY_CHECKOUT [--kernels qkv_tkg,mlp_tkg]
        [--limit N] [--timeout-s 300] [--rerun] [--fit] [--markdown]

nki-library's integration tests list, per configuration, a value measured on hardware
(``tpbSgCyclesSum`` or ``cyclesQoR``; most likely picoseconds: see docs/calibration.md). This script
parses those lists from the checkout's test files (never importing the tests, which need the
Neuron SDK), runs each in-scope configuration (bf16/fp16, not quantized) through the emulator
with AWS's kernel imported unchanged from the checkout, checks the output against a float64
reference written here, and prints recorded versus modelled time. Results go to
``benchmarks/calibration_runs.json`` (data only); a configuration is re-run only with
``--rerun`` or when its kernel file's commit changed. Each configuration runs in its own
subprocess under ``--timeout-s`` (run it with ``nice``).

No nki-library code is part of this repository: the checkout path is an argument.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import os
import pickle
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from nkilib_msda.hardware import TWO_BYTE_FLOAT_DTYPES

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "benchmarks" / "calibration_runs.json"
GRAPHS = REPO / "benchmarks" / "calibration_graphs"  # pickled timing graphs (git-ignored)
MEASURE_NAMES = ("tpbSgCyclesSum", "cyclesQoR")
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
            records.append(Record(kernel, name, row.lineno, values, measure))
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
def _sym(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


def in_scope(record: Record) -> tuple[bool, str]:
    """bf16/fp16 and not quantized."""
    v = record.values
    dtype = _sym(v.get("dtype", "bfloat16"))
    if dtype not in TWO_BYTE_FLOAT_DTYPES:
        return False, f"dtype {dtype}"
    quant = _sym(v.get("quantization_type", v.get("quant_type", "NONE")))
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


# -- running one configuration (in a subprocess) -------------------------------------------
def _bf16() -> Any:
    import ml_dtypes
    return ml_dtypes.bfloat16


def _rmsnorm(x: Any, gamma: Any, eps: float) -> Any:
    import numpy as np
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def _layernorm(x: Any, gamma: Any, beta: Any, eps: float) -> Any:
    import numpy as np
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * gamma
    return y if beta is None else y + beta


def _normalise(kind: str, x: Any, gamma: Any, beta: Any, eps: float) -> Any:
    if kind == "RMS_NORM":
        return _rmsnorm(x, gamma, eps)
    if kind == "RMS_NORM_SKIP_GAMMA":
        return _rmsnorm(x, 1.0, eps)
    if kind == "LAYER_NORM":
        return _layernorm(x, gamma, beta, eps)
    return x


def _close(got: Any, ref: Any, rtol: float = 2e-2) -> tuple[bool, float]:
    """Normwise check: max |got - ref| <= rtol * max |ref| (bf16 outputs and bf16
    intermediates make elementwise relative errors of near-zero entries meaningless).
    Returns (ok, max |got - ref| / max |ref|)."""
    import numpy as np
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape or not np.isfinite(got).all():
        return False, float("inf")
    worst = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
    return worst <= rtol, worst


def _run_qkv_tkg(v: dict[str, Any], rng: Any) -> tuple[Any, tuple, dict, Callable[[Any], Any]]:
    import numpy as np
    from nkilib_src.nkilib.core.qkv.qkv import qkv
    from nkilib_src.nkilib.core.utils.common_types import NormType, QKVOutputLayout
    bf = _bf16()
    B, S, H, I, dh = v["batch"], v["seqlen"], v["hidden_dim"], v["fused_qkv_dim"], v["d_head"]
    norm = _sym(v["norm_type"])
    eps = float(v.get("eps", 1e-6))
    x = rng.standard_normal((B, S, H)).astype(bf)
    w = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    kw: dict[str, Any] = dict(output_layout=QKVOutputLayout[_sym(v["output_layout"])],
                              fused_norm_type=NormType[norm], norm_eps=eps, d_head=dh,
                              num_q_heads=I // dh - 2, num_kv_heads=1)
    gamma = beta = bias = prev = attn = None
    if norm in ("RMS_NORM", "LAYER_NORM"):
        gamma = rng.uniform(0.5, 1.5, (1, H)).astype(bf)
        kw["gamma_norm_weights"] = gamma
    if v.get("norm_bias"):
        beta = rng.standard_normal((1, H)).astype(bf)
        kw["layer_norm_bias"] = beta
    if v.get("qkv_bias"):
        bias = rng.standard_normal((1, I)).astype(bf)
        kw["bias"] = bias
    if v.get("fused_add"):
        prev = rng.standard_normal((B, S, H)).astype(bf)
        attn = rng.standard_normal((B, S, H)).astype(bf)
        kw.update(fused_residual_add=True, mlp_prev=prev, attention_prev=attn)

    def reference(out: Any) -> tuple[bool, float]:
        f = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
        h = f(x) if prev is None else f(x) + f(prev) + f(attn)
        y = _normalise(norm, h, f(gamma), f(beta), eps) @ f(w)
        if bias is not None:
            y = y + f(bias)
        outs = out if isinstance(out, (list, tuple)) else [out]
        ok, worst = _close(outs[0], y)
        if prev is not None and len(outs) > 1:
            ok2, worst2 = _close(outs[1], h)
            ok, worst = ok and ok2, max(worst, worst2)
        return ok, worst

    return qkv, (x, w), kw, reference


def _activation(name: str) -> Callable[[Any], Any]:
    """The float64 activation of an ``ActFnType`` (SiLU and Swish: x * sigmoid(x); GELU: the
    erf form; GELU_Tanh_Approx: the tanh form)."""
    import numpy as np
    from scipy.special import erf
    if name in ("SiLU", "Swish"):
        return lambda z: z / (1.0 + np.exp(-z))
    if name == "GELU":
        return lambda z: 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))
    if name == "GELU_Tanh_Approx":
        return lambda z: 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
    raise ValueError(f"activation {name!r} has no reference here")


def _run_mlp_tkg(v: dict[str, Any], rng: Any) -> tuple[Any, tuple, dict, Callable[[Any], Any]]:
    import numpy as np
    from nkilib_src.nkilib.core.mlp.mlp import mlp
    from nkilib_src.nkilib.core.utils.common_types import ActFnType, NormType
    _supply_unused_mlp_tkg_field()
    bf = _bf16() if _sym(v.get("dtype", "bfloat16")) == "bfloat16" else np.float16
    B, S, H, I = v["batch"], v["seqlen"], v["hidden"], v["intermediate"]
    norm = _sym(v["norm_type"])
    lnc = v["vnc_degree"]
    x = rng.standard_normal((B, S, H)).astype(bf)
    gate = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    up = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    down = (rng.standard_normal((I, H)) / math.sqrt(I)).astype(bf)
    kw: dict[str, Any] = dict(activation_fn=ActFnType[_sym(v["act_fn_type"])],
                              normalization_type=NormType[norm],
                              skip_gate_proj=bool(v.get("skip_gate_proj", v.get("skip_gate"))))
    for flag in ("use_tkg_gate_up_proj_column_tiling", "use_tkg_down_proj_column_tiling",
                 "use_tkg_down_proj_optimized_layout"):
        if flag in v:  # mlp_cte lists leave the TKG tiling options at their defaults
            kw[flag] = bool(v[flag])
    t: dict[str, Any] = {}
    if norm in ("RMS_NORM", "LAYER_NORM"):
        t["normalization_weights_tensor"] = rng.uniform(0.5, 1.5, (1, H)).astype(bf)
    if v["norm_bias"] and norm == "LAYER_NORM":
        t["normalization_bias_tensor"] = rng.standard_normal((1, H)).astype(bf)
    for flag, name, shape in (("gate_bias", "gate_proj_bias_tensor", (1, I)),
                              ("up_bias", "up_proj_bias_tensor", (1, I)),
                              ("down_bias", "down_proj_bias_tensor", (1, H))):
        if v[flag]:
            t[name] = (rng.standard_normal(shape) * 0.1).astype(bf)
    if v["fused_add"]:
        t["fused_add_tensor"] = rng.standard_normal((B, S, H)).astype(bf)
        kw["store_fused_add_result"] = bool(v["store_add"])
    kw.update(t)

    def reference(out: Any) -> tuple[bool, float]:
        f = lambda a: None if a is None else np.asarray(a).astype(np.float64)  # noqa: E731
        h = f(x) + (f(t["fused_add_tensor"]) if "fused_add_tensor" in t else 0.0)
        n = _normalise(norm, h, f(t.get("normalization_weights_tensor")),
                       f(t.get("normalization_bias_tensor")), 1e-6)
        u = n @ f(up) + (f(t["up_proj_bias_tensor"]) if "up_proj_bias_tensor" in t else 0.0)
        act = _activation(_sym(v["act_fn_type"]))
        if kw["skip_gate_proj"]:
            m = act(u)
        else:
            g = n @ f(gate) + (f(t["gate_proj_bias_tensor"]) if "gate_proj_bias_tensor" in t else 0.0)
            m = act(g) * u
        d = f(down)
        if kw.get("use_tkg_down_proj_optimized_layout"):
            d = d.reshape(I, lnc, H // 128 // lnc, 128).transpose(0, 1, 3, 2).reshape(I, H)
        y = m @ d + (f(t["down_proj_bias_tensor"]) if "down_proj_bias_tensor" in t else 0.0)
        outs = out if isinstance(out, (list, tuple)) else [out]
        ok, worst = _close(outs[0], y)
        if kw.get("store_fused_add_result") and len(outs) > 1:
            ok2, worst2 = _close(outs[1], h)
            ok, worst = ok and ok2, max(worst, worst2)
        return ok, worst

    return mlp, (x, gate, up, down), kw, reference


_ATTN_COLUMNS = {"vnc_degree", "bs", "bs_kv", "seqlen_kv", "seqlen_q", "prior_len",
                 "prior_used_len", "d", "softmax_scale", "dtype", "causal_mask", "tp_q", "tp_k",
                 "tp_out", "sink", "sliding_window"}
_ATTN_CHECK_LIMIT = 1 << 24  # bs * seqlen_q * seqlen_kv up to which the reference is computed


def _run_attention_cte(v: dict[str, Any], rng: Any) -> tuple[Any, tuple, dict, Callable[[Any], Any]]:
    import numpy as np
    from nkilib_src.nkilib.core.attention import attention_cte as module
    _accept_section_params_keywords(module)
    attention_cte = module.attention_cte
    extra = sorted(set(v) - _ATTN_COLUMNS - {"tpbSgCyclesSum"})
    if extra:
        raise ValueError(f"attention_cte: columns {extra} (context parallel, packing) are not "
                         "built by this script")
    dt = _bf16() if _sym(v["dtype"]) == "bfloat16" else np.float16
    bs, bs_kv = v["bs"], v.get("bs_kv", v["bs"])
    sq, skv, d = v["seqlen_q"], v["seqlen_kv"], v["d"]
    tp_q, tp_k, tp_out = bool(v["tp_q"]), bool(v.get("tp_k", False)), bool(v["tp_out"])
    causal, scale = bool(v["causal_mask"]), float(v["softmax_scale"])
    q = rng.uniform(-1, 1, (bs, sq, d) if tp_q else (bs, d, sq)).astype(dt)
    k = rng.uniform(-1, 1, (bs_kv, skv, d) if tp_k else (bs_kv, d, skv)).astype(dt)
    vv = rng.uniform(-1, 1, (bs_kv, skv, d)).astype(dt)
    kw: dict[str, Any] = dict(scale=scale, causal_mask=causal, tp_q=tp_q, tp_k=tp_k,
                              tp_out=tp_out, sliding_window=int(v.get("sliding_window", 0)))
    prior = v.get("prior_len")
    if prior:
        kw["k_prior"] = rng.uniform(-1, 1, (bs_kv, prior, d) if tp_k else (bs_kv, d, prior)).astype(dt)
        kw["v_prior"] = rng.uniform(-1, 1, (bs_kv, prior, d)).astype(dt)
        kw["prior_used_len"] = np.full((1,), v.get("prior_used_len", prior), dtype=np.int32)
    if v.get("sink"):
        kw["sink"] = rng.uniform(15.0, 25.0, (bs, 1)).astype(np.float32)
    checkable = (not prior and not v.get("sink") and not kw["sliding_window"] and bs == bs_kv
                 and (sq == skv or not causal) and bs * sq * skv <= _ATTN_CHECK_LIMIT)

    def reference(out: Any) -> tuple[bool, float]:
        if not checkable:
            return True, float("nan")
        f = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
        qq = f(q) if tp_q else f(q).transpose(0, 2, 1)
        kk = f(k) if tp_k else f(k).transpose(0, 2, 1)
        s = np.einsum("bqd,bkd->bqk", qq, kk) * scale
        if causal:
            s = np.where(np.tril(np.ones((sq, skv), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        y = np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), f(vv))
        got = out[0] if isinstance(out, (list, tuple)) else out
        got = f(got) if not tp_out else f(got).transpose(0, 2, 1)
        return _close(got, y)

    return attention_cte, (q, k, vv), kw, reference


def _accept_section_params_keywords(module: Any) -> None:
    """Upstream defect (all snapshots up to 2026-04-13): ``SectionParams`` is a ``@dataclass``
    whose attributes carry no annotations, so it has no fields and its generated
    ``__init__`` takes no arguments, yet the kernel constructs it with keywords. Give it an
    ``__init__`` that stores the keywords as attributes (what the code evidently expects)."""
    cls = module.SectionParams
    if getattr(cls, "_calibration_patched", False):
        return

    def init(self: Any, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)

    cls.__init__ = init
    cls._calibration_patched = True


def _supply_unused_mlp_tkg_field() -> None:
    """Upstream defect (2026-02/04 snapshots): ``MLPTKGConstantsDimensionSizes`` declares a
    ``remainderIFused`` field that ``calculate_constants`` never passes and nothing reads.
    Supply it (= ``remainderI``) at construction so the unchanged kernel can run."""
    from nkilib_src.nkilib.core.mlp.mlp_tkg import mlp_tkg_constants as consts
    cls = consts.MLPTKGConstantsDimensionSizes
    if getattr(cls, "_calibration_patched", False):
        return
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if "remainderIFused" not in kwargs and not args:
            kwargs["remainderIFused"] = kwargs.get("remainderI")
        original(self, *args, **kwargs)

    cls.__init__ = init
    cls._calibration_patched = True


RUNNERS = {"qkv_tkg": _run_qkv_tkg, "mlp_tkg": _run_mlp_tkg,
           "mlp_cte": _run_mlp_tkg, "attention_cte": _run_attention_cte}  # mlp() dispatches to CTE for batch*seqlen > 96


def _lnc_of(v: dict[str, Any]) -> int:
    """The LNC column, else 2: the test harness's default on trn2 (its CompilerArgs)."""
    return int(v.get("lnc_degree", v.get("vnc_degree", 2)))


def run_one(checkout: Path, kernel: str, values: dict[str, Any],
            graph_path: Path | None = None) -> dict[str, Any]:
    """Run one configuration in this process; returns the JSON-able result."""
    import warnings

    import numpy as np
    sys.path.insert(0, str(checkout / "src"))
    from nkilib_msda.simulator import install_as_nki, simulate
    install_as_nki()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(19)
    func, args, kwargs, reference = RUNNERS[kernel](values, rng)
    lnc = _lnc_of(values)
    start = time.perf_counter()
    *outs, report = simulate(func, lnc=lnc, report=True)(*args, **kwargs)
    wall = time.perf_counter() - start
    out = outs[0] if len(outs) == 1 else outs
    ok, worst = reference(out)
    result: dict[str, Any] = {"status": "ran", "match": bool(ok), "worst_rel_err": worst,
                              "emulator_s": round(wall, 2)}
    timing = getattr(report, "timing", None)
    if timing is not None:
        result.update(estimate_us=timing.estimate_us, low_us=timing.low_us,
                      high_us=timing.high_us, bound_by=str(timing.bound_by),
                      lower_bound_us=timing.lower_bound_us,
                      engine_busy_us={k: round(v, 3) for k, v in timing.engine_busy_us.items()},
                      num_nodes=timing.num_nodes)
        if graph_path is not None:  # the recorded graph, so the fit can re-schedule it
            graph_path.parent.mkdir(parents=True, exist_ok=True)
            graph_path.write_bytes(pickle.dumps(timing))
    return result


# -- fitting -------------------------------------------------------------------------------
PRIOR_WEIGHT = 0.05  # pull of each parameter towards its nominal value, per unit of its range
# A fitted parameter moved from its nominal value to within this share of its range from a
# bound is "on a bound" (the prior's pull keeps it from touching it exactly).
BOUND_MARGIN = 0.02


@dataclasses.dataclass
class Sample:
    kernel: str
    key: str
    recorded_us: float
    timing: Any


def _samples(rows: list[tuple[Record, Decision, bool, str]], cache: dict[str, Any],
             set_name: str) -> list[Sample]:
    """Records of the fit (``use_in_fit``) or check set (any recorded value) that ran, matched
    their reference and have a timing graph."""
    out = []
    model = model_version()
    for r, d, scope, _ in rows:
        fam = FAMILIES[r.kernel]
        e = cache.get(r.key(), {})
        if fam.set_name != set_name or not scope or d.recorded_ps is None:
            continue
        if set_name == "fit" and not d.use_in_fit:
            continue
        if set_name == "check" and "placeholder" in d.note:
            continue
        path = graph_file(r.key())
        if e.get("status") != "ran" or not e.get("match") or not path.exists() \
                or e.get("model") != model:
            continue  # no graph, or one recorded by another model (stale)
        out.append(Sample(r.kernel, r.key(), d.recorded_ps / PS_PER_US,
                          pickle.loads(path.read_bytes())))
    return out


def fit(samples: list[Sample]) -> dict[str, Any]:
    """Least squares on log(scale * modelled / recorded) over the unknown parameters (bounded
    to their ranges, with a weak pull towards nominal so unidentified ones stay put) and one
    free global scale."""
    import numpy as np
    from scipy.optimize import least_squares
    ranges = samples[0].timing.ranges()
    names = list(ranges)
    lo = np.array([ranges[n][0] for n in names])
    hi = np.array([ranges[n][2] for n in names])
    nom = np.array([ranges[n][1] for n in names])
    span = np.where(hi > lo, hi - lo, 1.0)
    rec = np.log([s.recorded_us for s in samples])

    def residuals(x: Any) -> Any:
        p = dict(zip(names, x[:-1]))
        model = np.log([s.timing.evaluate(p) for s in samples])
        prior = PRIOR_WEIGHT * (x[:-1] - nom) / span
        return np.concatenate([x[-1] + model - rec, prior])

    x0 = np.concatenate([nom, [0.0]])
    free = hi > lo
    lb = np.concatenate([np.where(free, lo, lo - 1e-9), [math.log(0.1)]])
    ub = np.concatenate([np.where(free, hi, hi + 1e-9), [math.log(10.0)]])
    # soft-L1 loss: a few records off by 2-3x through structural gaps of the model (see
    # docs/calibration.md) must not drag every parameter to a bound
    res = least_squares(residuals, x0, bounds=(lb, ub), x_scale=np.concatenate([span, [1.0]]),
                        diff_step=1e-3, loss="soft_l1", f_scale=0.1)
    params = dict(zip(names, (float(v) for v in res.x[:-1])))
    return {"params": params, "scale": float(math.exp(res.x[-1])), "nominal": dict(zip(names, nom)),
            "ranges": ranges, "cost": float(res.cost), "success": bool(res.success),
            "at_bound": [n for n, v, a, b, m in zip(names, res.x[:-1], lo, hi, nom)
                         if b > a and abs(v - m) > 1e-6 * (b - a)
                         and min(v - a, b - v) < BOUND_MARGIN * (b - a)]}


def errors(samples: list[Sample], params: dict[str, float], scale: float) -> dict[str, Any]:
    """Per kernel and overall: n, median |ratio - 1|, worst factor max(ratio, 1/ratio)."""
    import numpy as np
    by: dict[str, list[float]] = {}
    for s in samples:
        by.setdefault(s.kernel, []).append(scale * s.timing.evaluate(params) / s.recorded_us)
    out: dict[str, Any] = {}
    everything = [r for v in by.values() for r in v]
    for name, ratios in list(by.items()) + [("all", everything)]:
        if not ratios:
            continue
        a = np.array(ratios)
        out[name] = {"n": int(a.size), "median_abs_err": float(np.median(np.abs(a - 1))),
                     "worst_factor": float(np.max(np.maximum(a, 1 / a))),
                     "median_ratio": float(np.median(a)), "min_ratio": float(a.min()),
                     "max_ratio": float(a.max())}
    return out


# -- driver --------------------------------------------------------------------------------
def collect(checkout: Path, kernels: Iterable[str]) -> list[tuple[Record, Decision, bool, str]]:
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


# What a recorded graph depends on: the recorder and the cost formulas (node durations),
# and the hardware constants baked into them. Not the scheduler (a pickled graph is
# re-scheduled with the current code when it is loaded) nor the unknowns' values (every
# duration is linear in them and re-evaluated).
GRAPH_SOURCES = ("recorder.py", "costs.py", "guard.py")


def model_version() -> str:
    """A hash of what a recorded graph depends on: graphs recorded by another model are stale
    (never re-used: the run loop re-runs them and the fit skips them)."""
    from nkilib_msda.simulator.timing.constants import HARDWARE
    h = hashlib.sha1()
    for name in GRAPH_SOURCES:
        h.update((REPO / "nkilib_msda" / "simulator" / "timing" / name).read_bytes())
    h.update(repr(sorted(HARDWARE.items())).encode())
    return h.hexdigest()[:12]


def graph_file(key: str) -> Path:
    return GRAPHS / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".pkl")


def _load_cache() -> dict[str, Any]:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def _save_cache(cache: dict[str, Any], updated: Iterable[str] = ()) -> None:
    """Write the cache; entries ``updated`` by this process are merged into what is on disk
    (another run may be writing other kernels' entries meanwhile)."""
    merged = _load_cache()
    merged.update({k: cache[k] for k in updated} if updated else cache)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(CACHE)
    cache.update(merged)


def _config_text(r: Record) -> str:
    skip = {"lnc_degree", "vnc_degree", "dtype", "quant_dtype", "quant_type",
            "quantization_type", "eps", "act_fn_type"}
    parts = []
    for k, v in r.config().items():
        if k in skip or v in (False, None) or (isinstance(v, str) and v.endswith(".BSD")):
            continue
        parts.append(f"{k}={_sym(v) if isinstance(v, str) else v}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--kernels", default=",".join(FAMILIES))
    ap.add_argument("--limit", type=int, default=None, help="run at most N new configurations")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--no-run", action="store_true", help="print from the cache only")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--fit", action="store_true",
                    help="fit the unknown parameters and a global scale on the fit set "
                         "(qkv_tkg, mlp_tkg) and report the error on the check set")
    ap.add_argument("--write-back", action="store_true",
                    help="with --fit: write the fitted values as the nominal values of the "
                         "timing constants module if the fit is sane")
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    checkout = args.checkout.resolve()
    if args.run_one:
        kernel, values, graph = json.loads(args.run_one)
        print(json.dumps(run_one(checkout, kernel, values, Path(graph))))
        return 0
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    rows = collect(checkout, kernels)
    # smallest first: the product of the integer config values is a proxy for the work
    rows.sort(key=lambda x: (kernels.index(x[0].kernel),
                             math.prod(v for v in x[0].config().values()
                                       if isinstance(v, int) and not isinstance(v, bool) and v > 0)))
    cache = _load_cache()
    model = model_version()
    started = 0
    for r, d, scope, why in rows:
        commit = kernel_commit(checkout, FAMILIES[r.kernel].kernel_file)
        entry = cache.get(r.key())
        fresh = (entry is not None and entry.get("commit") == commit and not args.rerun
                 and (entry.get("status") != "ran" or (graph_file(r.key()).exists()
                                                       and entry.get("model") == model)))
        if fresh or args.no_run or not scope or d.recorded_ps is None or "placeholder" in d.note:
            continue
        if r.kernel not in RUNNERS:
            cache[r.key()] = {"commit": commit, "status": "not run",
                              "reason": "no input builder/reference for this family yet"}
            _save_cache(cache, [r.key()])
            continue
        if args.limit is not None and started >= args.limit:
            continue
        started += 1
        payload = json.dumps([r.kernel, dict(r.values), str(graph_file(r.key()))], default=str)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, str(checkout), "--run-one", payload],
                                  capture_output=True, text=True, timeout=args.timeout_s,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            if proc.returncode == 0:
                result = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                result = {"status": "error", "reason": tail[-1][:300] if tail else "?"}
        except subprocess.TimeoutExpired:
            result = {"status": "timeout", "reason": f"over {args.timeout_s:.0f} s"}
        result.update(commit=commit, model=model, wall_s=round(time.perf_counter() - t0, 1))
        cache[r.key()] = result
        _save_cache(cache, [r.key()])
        print(f"[{started}] {r.kernel} {_config_text(r)}: {result['status']}"
              f" {result.get('match', '')} {result.get('reason', '')}", file=sys.stderr)
    fitted = None
    if args.fit:
        fitted = run_fit(collect(checkout, list(FAMILIES)), cache)
        if args.write_back:
            write_back(fitted)
    print_table(rows, cache, checkout, args.markdown, fitted)
    return 0


FIT_RESULT = REPO / "benchmarks" / "calibration_fit.json"


def run_fit(rows: list[tuple[Record, Decision, bool, str]], cache: dict[str, Any]) -> dict[str, Any]:
    """Fit on the fit set; errors of nominal and fitted parameters on both sets; saved to
    ``benchmarks/calibration_fit.json`` and printed."""
    fit_set, check_set = _samples(rows, cache, "fit"), _samples(rows, cache, "check")
    if not fit_set:
        raise SystemExit("calibrate_timing: no fit-set record with a timing graph; run the "
                         "qkv_tkg and mlp_tkg configurations first")
    result = fit(fit_set)
    nominal = result["nominal"]
    summary = {
        **result,
        "fit_set_nominal": errors(fit_set, nominal, 1.0),
        "fit_set_fitted": errors(fit_set, result["params"], result["scale"]),
        "check_set_nominal": errors(check_set, nominal, 1.0),
        "check_set_fitted": errors(check_set, result["params"], result["scale"]),
        "fitted_us": {s.key: result["scale"] * s.timing.evaluate(result["params"])
                      for s in fit_set + check_set},
    }
    FIT_RESULT.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"fit: scale {summary['scale']:.3f}; parameters (nominal -> fitted, range):")
    for name, value in summary["params"].items():
        lo, nom, hi = summary["ranges"][name]
        print(f"  {name}: {nom:g} -> {value:.4g}  [{lo:g}, {hi:g}]")
    for label in ("fit_set_nominal", "fit_set_fitted", "check_set_nominal", "check_set_fitted"):
        for kernel, e in summary[label].items():
            print(f"{label:18s} {kernel:15s} n={e['n']:3d} median|r-1|={e['median_abs_err']:.1%} "
                  f"worst factor={e['worst_factor']:.2f} ratios [{e['min_ratio']:.2f}, "
                  f"{e['max_ratio']:.2f}]")
    return summary


CONSTANTS = REPO / "nkilib_msda" / "simulator" / "timing" / "constants.py"


def sane(summary: dict[str, Any]) -> tuple[bool, str]:
    """A fit is written back only if it converged, no parameter ended on a bound of its range
    (one there absorbs a structural error of the model rather than measuring a constant), its
    scale is within 2x of 1 (the units are picoseconds), it improves the fit set's median
    error and it does not worsen the check set's."""
    if not summary["success"]:
        return False, "least squares did not converge"
    if summary.get("at_bound"):
        return False, "parameters on a bound of their range: " + ", ".join(summary["at_bound"])
    if not 0.5 <= summary["scale"] <= 2.0:
        return False, f"global scale {summary['scale']:.3f} is not within [0.5, 2]"
    before = summary["fit_set_nominal"]["all"]["median_abs_err"]
    after = summary["fit_set_fitted"]["all"]["median_abs_err"]
    if after >= before:
        return False, f"no improvement of the fit set ({before:.1%} -> {after:.1%})"
    # Validation gate (no parameter is chosen by it): fitted values that make the held-out
    # check set worse are not adopted as the model's nominal values.
    check_before = summary["check_set_nominal"].get("all", {}).get("median_abs_err")
    check_after = summary["check_set_fitted"].get("all", {}).get("median_abs_err")
    if check_before is not None and check_after is not None and check_after > check_before:
        return False, (f"the fitted values make the check set worse ({check_before:.1%} -> "
                       f"{check_after:.1%} median error)")
    return True, ""


def write_back(summary: dict[str, Any]) -> None:
    """Replace the nominal value of every fitted parameter in the timing constants module
    (``Param("name", low, nominal, high, ...)``); the ranges stay."""
    ok, why = sane(summary)
    if not ok:
        print(f"write-back skipped: {why}")
        return
    text = CONSTANTS.read_text()
    for name, value in summary["params"].items():
        lo, nom, hi = summary["ranges"][name]
        if math.isclose(value, nom, rel_tol=1e-3, abs_tol=1e-9):
            continue
        pattern = re.compile(r'(Param\("' + re.escape(name) + r'",\s*)([^,]+),(\s*)([^,]+),')
        match = pattern.search(text)
        if match is None:
            print(f"write-back: {name} not found in {CONSTANTS.name}; left alone")
            continue
        nominal_src = match.group(4).strip()
        rounded = float(f"{value:.3g}")
        if re.fullmatch(r"[0-9.eE+-]+", nominal_src):
            new = repr(rounded)
        else:  # an expression of a hardware constant, e.g. ``hwdge_ns``
            new = f"{rounded / nom:.3g} * {nominal_src}"
        text = text[:match.start(4)] + match.group(4).replace(nominal_src, new) + \
            text[match.end(4):]
        print(f"write-back: {name} nominal {nom:g} -> {new}")
    CONSTANTS.write_text(text)


def print_table(rows: list[tuple[Record, Decision, bool, str]], cache: dict[str, Any],
                checkout: Path, markdown: bool, fitted: dict[str, Any] | None = None) -> None:
    head = ["kernel", "set", "config", "LNC", "recorded", "rec µs", "est µs", "low µs",
            "high µs", "ratio", "fitted µs", "fitted ratio", "run", "record note", "commit"]
    fitted_us = (fitted or {}).get("fitted_us", {})
    model = model_version()
    lines = []
    for r, d, scope, why in rows:
        e = cache.get(r.key(), {})
        if not scope or (d.recorded_ps is None and not e):
            continue  # out of scope, or nothing recorded and nothing run
        if e.get("status") == "ran" and e.get("model") != model:  # never show stale times
            e = {"status": "not run", "reason": "graph of another timing model (stale)"}
        rec_us = d.recorded_ps / PS_PER_US if d.recorded_ps else None
        est = e.get("estimate_us")
        ratio = est / rec_us if est and rec_us else None
        fit_us = fitted_us.get(r.key())
        fit_ratio = fit_us / rec_us if fit_us and rec_us else None
        run = e.get("status", "-")
        if run == "ran":
            run = "match" if e.get("match") else f"MISMATCH ({e.get('worst_rel_err', 0):.2g})"
        fmt = lambda x: "-" if x is None else f"{x:,.1f}"  # noqa: E731
        if run in ("error", "timeout", "not run"):
            run = f"{run}: {e.get('reason', '')}"[:90].replace("|", "/")
        lines.append([r.kernel, FAMILIES[r.kernel].set_name, _config_text(r),
                      str(_lnc_of(r.values)),
                      "-" if d.recorded_ps is None else f"{d.recorded_ps:,}", fmt(rec_us),
                      fmt(est), fmt(e.get("low_us")), fmt(e.get("high_us")),
                      "-" if ratio is None else f"{ratio:.2f}", fmt(fit_us),
                      "-" if fit_ratio is None else f"{fit_ratio:.2f}", run,
                      "; ".join(x for x in (d.note, FAMILIES[r.kernel].note) if x)
                      + ("" if d.use_in_fit else " (not fitted)"),
                      e.get("commit", kernel_commit(checkout, FAMILIES[r.kernel].kernel_file))[:10]])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
    else:
        for ln in [head] + lines:
            print("  ".join(ln))


if __name__ == "__main__":
    raise SystemExit(main())
