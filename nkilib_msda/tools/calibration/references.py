"""Inputs and float64 references of the calibrated nki-library kernels: per family, a builder
that takes one record's column values and a random generator and returns (AWS's kernel
function, positional arrays, keyword arguments, a check of the kernel's output against a
float64 reference). AWS's modules are imported from the checkout on ``sys.path`` when a builder
runs; nothing of nki-library is part of this package."""

from __future__ import annotations

import math
from typing import Any, Callable

from nkilib_msda.hardware import PARTITIONS
from nkilib_msda.tools.calibration.records import sym

__all__ = ["BUILDERS", "lnc_of"]


def _f64(a: Any) -> Any:
    """``a`` as a float64 array (None stays None)."""
    import numpy as np
    return None if a is None else np.asarray(a).astype(np.float64)


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
    from nkilib_src.nkilib.core.qkv.qkv import qkv
    from nkilib_src.nkilib.core.utils.common_types import NormType, QKVOutputLayout
    bf = _bf16()
    B, S, H, I, dh = v["batch"], v["seqlen"], v["hidden_dim"], v["fused_qkv_dim"], v["d_head"]
    norm = sym(v["norm_type"])
    eps = float(v.get("eps", 1e-6))
    x = rng.standard_normal((B, S, H)).astype(bf)
    w = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    kw: dict[str, Any] = dict(output_layout=QKVOutputLayout[sym(v["output_layout"])],
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
        f = _f64
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
    bf = _bf16() if sym(v.get("dtype", "bfloat16")) == "bfloat16" else np.float16
    B, S, H, I = v["batch"], v["seqlen"], v["hidden"], v["intermediate"]
    norm = sym(v["norm_type"])
    lnc = v["vnc_degree"]
    x = rng.standard_normal((B, S, H)).astype(bf)
    gate = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    up = (rng.standard_normal((H, I)) / math.sqrt(H)).astype(bf)
    down = (rng.standard_normal((I, H)) / math.sqrt(I)).astype(bf)
    kw: dict[str, Any] = dict(activation_fn=ActFnType[sym(v["act_fn_type"])],
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
        f = _f64
        h = f(x) + (f(t["fused_add_tensor"]) if "fused_add_tensor" in t else 0.0)
        n = _normalise(norm, h, f(t.get("normalization_weights_tensor")),
                       f(t.get("normalization_bias_tensor")), 1e-6)
        u = n @ f(up) + (f(t["up_proj_bias_tensor"]) if "up_proj_bias_tensor" in t else 0.0)
        act = _activation(sym(v["act_fn_type"]))
        if kw["skip_gate_proj"]:
            m = act(u)
        else:
            g = n @ f(gate) + (f(t["gate_proj_bias_tensor"]) if "gate_proj_bias_tensor" in t else 0.0)
            m = act(g) * u
        d = f(down)
        if kw.get("use_tkg_down_proj_optimized_layout"):
            d = d.reshape(I, lnc, H // PARTITIONS // lnc, PARTITIONS).transpose(0, 1, 3, 2).reshape(I, H)
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
                 "tp_out", "sink", "sliding_window", "cp_rank_id", "cp_degree"}
_ATTN_CHECK_LIMIT = 1 << 24  # bs * seqlen_q * seqlen_kv up to which the reference is computed
# The context-parallel lists name their columns after the test's arguments; the test passes
# them on as these (run_attention_cte_test: seqlen_q=q_seqlen_partial, seqlen_kv=kv_seqlen, ...).
_CP_RENAMES = {"q_seqlen_partial": "seqlen_q", "kv_seqlen": "seqlen_kv",
               "kv_seqlen_prior": "prior_len", "kv_prior_used_len": "prior_used_len"}


def attention_columns(v: dict[str, Any]) -> dict[str, Any]:
    """A record's columns under the no-CP lists' names. A context-parallel record (one with
    ``cp_degree``) is always causal (its test fixes ``causal_mask=True``); its Q slice is
    rank ``cp_rank_id``'s contiguous block (the test runs each record with
    ``cp_strided_q_slicing`` False and True and records one value; the calibration runs
    False)."""
    out = {_CP_RENAMES.get(k, k): x for k, x in v.items() if k not in ("tpbSgCyclesSum", "qor")}
    if "cp_degree" in out:
        out["causal_mask"] = True
    return out


def _run_attention_cte(v: dict[str, Any], rng: Any) -> tuple[Any, tuple, dict, Callable[[Any], Any]]:
    import numpy as np
    from nkilib_src.nkilib.core.attention import attention_cte as module
    _accept_section_params_keywords(module)
    attention_cte = module.attention_cte
    v = attention_columns(v)
    extra = sorted(set(v) - _ATTN_COLUMNS)
    if extra:
        raise ValueError(f"attention_cte: columns {extra} (e.g. sequence packing) are not "
                         "built by this script")
    dt = _bf16() if sym(v["dtype"]) == "bfloat16" else np.float16
    bs, bs_kv = v["bs"], v.get("bs_kv", v["bs"])
    sq, skv, d = v["seqlen_q"], v["seqlen_kv"], v["d"]
    tp_q, tp_k, tp_out = bool(v["tp_q"]), bool(v.get("tp_k", False)), bool(v["tp_out"])
    causal, scale = bool(v["causal_mask"]), float(v["softmax_scale"])
    # context parallelism: this rank's queries sit at global positions offset + i
    offset = int(v["cp_rank_id"]) * sq if v.get("cp_degree") else 0
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
    if v.get("cp_degree"):
        kw.update(cp_offset=np.full((1, 1), offset, dtype=np.int32),
                  global_cp_deg=int(v["cp_degree"]), cp_strided_q_slicing=False)
    checkable = (not prior and not v.get("sink") and not kw["sliding_window"] and bs == bs_kv
                 and (sq == skv or not causal or v.get("cp_degree"))
                 and bs * sq * skv <= _ATTN_CHECK_LIMIT)

    def reference(out: Any) -> tuple[bool, float]:
        if not checkable:
            return True, float("nan")
        f = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
        qq = f(q) if tp_q else f(q).transpose(0, 2, 1)
        kk = f(k) if tp_k else f(k).transpose(0, 2, 1)
        s = np.einsum("bqd,bkd->bqk", qq, kk) * scale
        if causal:  # key j is visible to query i at global position offset + i if j <= it
            visible = np.arange(skv)[None, :] <= offset + np.arange(sq)[:, None]
            s = np.where(visible, s, -np.inf)
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


BUILDERS = {"qkv_tkg": _run_qkv_tkg, "mlp_tkg": _run_mlp_tkg,
           "mlp_cte": _run_mlp_tkg, "attention_cte": _run_attention_cte}  # mlp() dispatches to CTE for batch*seqlen > 96


def lnc_of(v: dict[str, Any]) -> int:
    """The LNC column, else 2: the test harness's default on trn2 (its CompilerArgs)."""
    return int(v.get("lnc_degree", v.get("vnc_degree", 2)))
