"""nkilib_msda.workloads: one definition of the named shapes, the input makers, the error
metric and the tolerance table, and the places that use them."""

from __future__ import annotations

import re
import runpy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nkilib_msda import workloads as wl

ROOT = Path(wl.__file__).resolve().parents[1]


def test_every_preset_has_a_description_and_a_time_and_every_alias_a_preset():
    assert set(wl.PRESET_DESCRIPTIONS) == set(wl.PRESETS) == set(wl.PRESET_EMULATOR_TIME)
    assert all(name == case.name for name, case in wl.PRESETS.items())
    assert set(wl.PRESET_ALIASES.values()) <= set(wl.PRESETS)
    assert not set(wl.PRESET_ALIASES) & set(wl.PRESETS)
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) for name in wl.PRESETS)  # one scheme


@pytest.mark.parametrize("name,canonical", [("ddetr_enc", "ddetr-encoder"), ("bev_tsa", "bevformer-tsa"),
                                            ("m2f", "mask2former-encoder"), ("tiny", "tiny")])
def test_resolve_preset(name, canonical):
    assert wl.resolve_preset(name) == canonical


def test_unknown_preset_is_a_value_error_naming_the_argument():
    with pytest.raises(ValueError, match=r"^preset: expected one of \[.*'ddetr-encoder'.*got 'ddetr'"):
        wl.resolve_preset("ddetr")


def test_benchmark_shapes_are_the_workloads():
    pytest.importorskip("torch")
    bench = runpy.run_path(str(ROOT / "benchmarks" / "bench_gpu.py"), run_name="bench_gpu_under_test")
    SHAPES, shape_name = bench["SHAPES"], bench["shape_name"]

    assert set(SHAPES) <= set(wl.PRESETS)
    for name, shape in SHAPES.items():
        case = wl.PRESETS[name]
        assert (shape.batch, shape.num_queries, tuple(shape.levels), shape.points, shape.heads,
                shape.channels) == (case.batch, case.num_queries, case.spatial_shapes,
                                    case.num_points, case.num_heads, case.head_dim)
        assert shape.decoder == name.endswith("decoder")
    assert {shape_name(old) for old in wl.PRESET_ALIASES} <= set(SHAPES)


# workloads.py defines the tables; the side-by-side test holds its own transcription of
# nki-library's test shapes as the oracle that the benchmark's shape list is checked against.
_OWN_TRANSCRIPTIONS = {"workloads.py", "test_msda_side_by_side.py"}


def test_level_tables_are_defined_once():
    """The named shapes' level tables appear as literals only in workloads.py."""
    literal = re.compile(r"\(\s*100\s*,\s*167\s*\)|\(\s*113\s*,\s*200\s*\),\s*\(\s*57")
    found = [str(p.relative_to(ROOT)) for folder in ("nkilib_msda", "benchmarks", "tests", "examples")
             for p in (ROOT / folder).rglob("*.py")
             if p.name not in _OWN_TRANSCRIPTIONS and literal.search(p.read_text())]
    assert not found, f"use nkilib_msda.workloads.DDETR_LEVELS / BEV_SCA_LEVELS: {found}"


@pytest.mark.parametrize("value_dtype,param_dtype", [("bfloat16", "float16"), ("float32", "bfloat16")])
@pytest.mark.parametrize("layouts", [("BLNC", "BQHLP2"), ("BNLC", "B2QHLP")])
def test_torch_inputs_hold_the_numpy_inputs(value_dtype, param_dtype, layouts):
    torch = pytest.importorskip("torch")
    case = replace(wl.PRESETS["tiny"], value_dtype=value_dtype, param_dtype=param_dtype,
                   value_layout=layouts[0], locations_layout=layouts[1])
    arrays, grad = wl.make_inputs(case, seed=5), wl.make_grad_output(case, seed=5)
    tensors = wl.make_torch_inputs(case, seed=5)
    for key, want in (("value", arrays["value"]), ("sampling_locations", arrays["sampling_locations"]),
                      ("attention_weights", arrays["attention_weights"]), ("grad_output", grad)):
        got = tensors[key]
        assert got.dtype == getattr(torch, str(want.dtype) if want.dtype.name != "bfloat16" else "bfloat16")
        np.testing.assert_array_equal(got.double().numpy(), want.astype(np.float64))
    for key in ("spatial_shapes", "level_start_index", "value_layout", "sampling_locations_layout"):
        assert tensors[key] == arrays[key]


def test_inputs_follow_the_convention():
    case = replace(wl.PRESETS["default"], value_dtype="float32", param_dtype="float32")
    args = wl.make_inputs(case, seed=1)
    loc, attn = args["sampling_locations"], args["attention_weights"]
    assert 0 <= loc.min() and loc.max() < 1
    np.testing.assert_allclose(attn.sum(axis=(3, 4)), 1.0, rtol=1e-6)
    assert attn.min() > 0.1 / (case.num_levels * case.num_points) / 1.01
    assert abs(float(args["value"].mean())) < 0.01 and abs(float(args["value"].std()) - 1) < 0.01
    other = wl.make_inputs(case, seed=2)
    assert not np.array_equal(args["value"], other["value"])


def test_the_metric():
    ref = np.array([[1.0, -2.0], [4.0, 0.5]])
    out = ref + np.array([[0.0, 0.03], [0.0, 0.0]])
    result = wl.compare("x", out, ref, 1e-2)
    assert result.max_rel == pytest.approx(0.03 / 4) and result.ok
    assert result.rel_l2 == pytest.approx(0.03 / np.linalg.norm(ref))
    assert not wl.compare("x", out, ref, 7e-3).ok
    assert wl.max_relative_error(out, ref) == result.max_rel and wl.relative_l2(out, ref) == result.rel_l2
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = out.copy()
        poisoned[1, 1] = bad
        assert wl.compare("x", poisoned, ref, 1.0).max_rel == np.inf and not wl.compare("x", poisoned, ref, 1e9).ok
    with pytest.raises(ValueError, match=r"^x: output shape \(2,\) != reference shape \(2, 2\)"):
        wl.compare("x", out[0], ref, 1.0)


def test_the_metric_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    ref = np.linspace(-1, 1, 12).reshape(3, 4)
    out = torch.tensor(ref).to(torch.bfloat16)
    assert 0 < wl.max_relative_error(out, ref) <= 2 ** -8


def test_one_tolerance_per_quantity_and_dtype():
    assert set(wl.TOLERANCES) == {(q, d) for q in wl.QUANTITIES for d in ("bfloat16", "float16", "float32")}
    assert wl.tolerance("grad_value", "bfloat16") == wl.tolerance("grad_value", "bf16") == 1e-2
    assert wl.tolerance("output", "float32") == 1e-5
    with pytest.raises(ValueError, match="^tolerance: no entry for quantity 'grad_x'"):
        wl.tolerance("grad_x", "float32")


def test_no_other_module_defines_tolerances_or_the_metric():
    """check and the kernel tests read the table; no second table of kernel tolerances."""
    pattern = re.compile(r"\b(FORWARD_TOLERANCE|BACKWARD_TOLERANCE|GRAD_TOL)\s*=\s*\{\s*\"|"
                         r"\"grad_value\":\s*[0-9.e-]+\s*,")
    found = [str(p.relative_to(ROOT)) for folder in ("nkilib_msda", "benchmarks", "tests")
             for p in (ROOT / folder).rglob("*.py") if p.name != "workloads.py" and pattern.search(p.read_text())]
    assert not found, found


def test_cli_accepts_old_preset_names():
    from nkilib_msda.tools.cli import build_parser

    assert build_parser().parse_args(["check", "--preset", "ddetr_dec"]).preset == "ddetr-decoder"
    assert build_parser().parse_args(["check", "--preset", "ddetr-decoder"]).preset == "ddetr-decoder"


def test_nki_library_shapes_are_named_and_reuse_the_presets_they_equal():
    assert set(wl.NKI_LIBRARY_SHAPES) == set(wl.NKI_LIBRARY_SHAPE_DESCRIPTIONS)
    assert all(name == case.name for name, case in wl.NKI_LIBRARY_SHAPES.items())
    same = {"sca-base": "bevformer-sca", "tsa-base": "bevformer-tsa", "decoder-base": "bevformer-decoder"}
    for name, preset in same.items():
        assert wl.NKI_LIBRARY_SHAPES[name] == wl.PRESETS[preset]  # the name is not compared
    assert wl.NKI_LIBRARY_SHAPES["basic"] == replace(wl.PRESETS["upstream"], locations_layout="B2QHLP")
    # nki-library's tests draw bf16 values and float16 locations / weights.
    assert {(c.value_dtype, c.param_dtype) for c in wl.NKI_LIBRARY_SHAPES.values()} == {("bfloat16", "float16")}


def test_gpu_tolerances_cover_the_kernel_dtypes():
    from nkilib_msda.hardware import KERNEL_DTYPES

    assert set(wl.GPU_TOLERANCES) == set(KERNEL_DTYPES)
    assert wl.GPU_TOLERANCES["float32"] < wl.GPU_ACCUMULATED_BF16_TOLERANCE < wl.GPU_TOLERANCES["bfloat16"]
