"""The docs are true of the code.

(a) Every ```python block of README.md, examples/README.md and docs/*.md runs as written
    (``NOT_RUN`` lists the blocks that cannot run here, each with its reason; it is empty: no
    block needs a GPU or a Neuron device). Blocks elide some inputs (``value, spatial_shapes,
    ...``, ``query, ...``); the harness below supplies small random ones, chosen by what the
    block calls, and then checks the block's results against the float64 reference. One
    textual substitution is made, for the literal ``...`` argument list of docs/emulator.md's
    API sketch: ``(value, ...)`` -> ``(value)``. ``from_pretrained`` (network) is monkeypatched
    to build a tiny randomly initialised model from a config. A new block that needs an input
    the harness does not know fails with NameError: extend ``_placeholders``.
(b) The public signatures written in docs/api.md (parameter names, order, kinds, defaults) are
    parsed from api.md itself and compared with ``inspect.signature`` of the code.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.workloads import QUANTITIES, max_relative_error, tolerance

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = ("README.md", "examples/README.md",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
# (file, index of its python block) -> why the block cannot run in the test suite. Keep it short:
# only blocks that need hardware (a GPU, a Neuron device) belong here.
NOT_RUN: dict[tuple[str, int], str] = {}


# ----------------------------------------------------------------------------- (a) snippets


def _python_blocks(relpath: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / relpath).read_text(), re.S)


SNIPPETS = [(path, i, code) for path in DOC_FILES
            for i, code in enumerate(_python_blocks(path)) if (path, i) not in NOT_RUN]

# The tiny problem the elided MSDA inputs use: 2 levels, L = 80, 3 query tiles' worth of samples.
_SHAPES = ((8, 8), (4, 4))
_STARTS = (0, 64)
_B, _NQ, _NH, _CH, _NP = 1, 12, 2, 16, 2


def _msda_numpy_inputs(rng: np.random.Generator) -> dict[str, Any]:
    """Kernel-style inputs: bf16 value/weights, fp32 locations (some outside [0, 1])."""
    loc_shape = (_B, _NQ, _NH, len(_SHAPES), _NP)
    return dict(
        value=rng.standard_normal((_B, _STARTS[-1] + 16, _NH, _CH)).astype(ml_dtypes.bfloat16),
        spatial_shapes=_SHAPES, level_start_index=_STARTS,
        sampling_locations=rng.uniform(-0.1, 1.1, (*loc_shape, 2)).astype(np.float32),
        attention_weights=rng.random(loc_shape).astype(ml_dtypes.bfloat16),
        grad_output=rng.standard_normal((_B, _NQ, _NH * _CH)).astype(ml_dtypes.bfloat16))


def _max_rel(got: Any, ref: np.ndarray) -> float:
    return max_relative_error(got, ref)


def _tiny_detr_config():
    transformers = pytest.importorskip("transformers")
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                                         depths=[1, 1, 1, 1], out_features=["stage2", "stage3", "stage4"])
    return transformers.DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_feature_levels=4,
        encoder_n_points=2, decoder_n_points=2, num_labels=3)


def _copy_kernel():
    """An ``nki.jit`` kernel returning a copy of its input, staged through SBUF (the emulator is
    imported only when a test asks for it)."""
    from nkilib_msda._nki import nki, nl, nisa

    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(tile, x)
        nisa.dma_copy(out, tile)
        return out

    return copy


def _placeholders(code: str, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator,
                  tmp_path: Path) -> tuple[str, dict[str, Any], Callable[[dict[str, Any]], None]]:
    """(code to run, the elided names it needs, a check of its results)."""
    checks: list[Callable[[dict[str, Any]], None]] = []
    names: dict[str, Any] = {}

    if "simulate(ms_deformable_attention" in code:
        from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
        from nkilib_msda.simulator.report import CostReport

        names.update(_msda_numpy_inputs(rng))  # a block that builds its own inputs overrides them

        def check_kernels(ns: dict[str, Any]) -> None:
            args = {k: ns[k] for k in ("value", "spatial_shapes", "level_start_index",
                                       "sampling_locations", "attention_weights")}
            assert ns["out"].dtype == ml_dtypes.bfloat16
            out_tol = tolerance("output", "bfloat16")
            assert _max_rel(ns["out"], ms_deformable_attention_ref(**args)) <= out_tol
            refs = ms_deformable_attention_bwd_ref(ns["grad_output"], **args)
            for name, got, ref in zip(QUANTITIES[1:], (ns["grad_value"], ns["grad_loc"], ns["grad_attn"]), refs):
                assert got.shape == ref.shape and _max_rel(got, ref) <= tolerance(name, "bfloat16")
            if "report" in ns:
                assert isinstance(ns["report"], CostReport) and ns["report"].to_dict()["engines"]
        checks.append(check_kernels)

    elif "ms_deformable_attention_ref(" in code:
        inputs = _msda_numpy_inputs(rng)
        names.update(value=inputs["value"], spatial_shapes=_SHAPES, loc=inputs["sampling_locations"],
                     attn=inputs["attention_weights"])

        padding = re.search(r"padding_mode=[\"'](\w+)", code)

        def check_reference(ns: dict[str, Any]) -> None:
            assert ns["out"].dtype == np.float64 and ns["out"].shape == (_B, _NQ, _NH * _CH)
            torch = pytest.importorskip("torch")
            import nkilib_msda

            # cross-check with the torch `reference` backend (float64, its own implementation)
            as_torch = {k: torch.from_numpy(np.asarray(names[k], dtype=np.float64))
                        for k in ("value", "loc", "attn")}
            other = nkilib_msda.multi_scale_deformable_attention(
                as_torch["value"], _SHAPES, None, as_torch["loc"], as_torch["attn"],
                padding_mode=padding.group(1) if padding else "zeros", backend="reference")
            np.testing.assert_allclose(ns["out"], other.numpy(), rtol=1e-10, atol=1e-12)
        checks.append(check_reference)

    per_level_points = "num_points=(3, 6, 3)" in code  # checked by its own branch below
    if "nkilib_msda.multi_scale_deformable_attention(" in code and not per_level_points:
        def check_functional(ns: dict[str, Any]) -> None:
            from nkilib_msda.reference import ms_deformable_attention_ref

            ref = ms_deformable_attention_ref(ns["value"].detach().numpy(), ns["shapes"], None,
                                              ns["loc"].detach().numpy(), ns["attn"].numpy())
            assert tuple(ns["out"].shape) == ref.shape == (2, 100, 256)
            assert _max_rel(ns["out"].detach().numpy(), ref) <= 1e-5
            for t in (ns["value"], ns["loc"]):
                assert t.grad is not None and bool(t.grad.isfinite().all()) and t.grad.abs().max() > 0
        checks.append(check_functional)

    if "MSDeformAttn(" in code and not per_level_points:
        import torch

        levels = ((8, 8), (4, 4), (2, 2), (1, 1))
        length = sum(h * w for h, w in levels)
        names.update(query=torch.randn(2, 5, 256), reference_points=torch.rand(2, 5, 4, 2),
                     input_flatten=torch.randn(2, length, 256),
                     input_spatial_shapes=torch.tensor(levels),
                     input_level_start_index=torch.tensor([0, 64, 80, 84]),
                     input_padding_mask=torch.rand(2, length) < 0.1)

        def check_module(ns: dict[str, Any]) -> None:
            assert tuple(ns["out"].shape) == (2, 5, 256) and bool(ns["out"].isfinite().all())
        checks.append(check_module)

    if "kernelize(" in code:
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("kernels")
        import torch

        from nkilib_msda.backends.reference import backend as reference_torch
        from nkilib_msda.pytorch import hf_kernels

        model = transformers.DeformableDetrModel(_tiny_detr_config()).eval()
        # The snippet alone must make kernelize swap the layer: take off any hub hook that an
        # earlier register_hf_kernels() in this process added (transformers' own stays).
        for cls in list(hf_kernels.HOOKED_BY_US):
            for attr in ("kernel_layer_name", "kernel_condition"):
                if attr in vars(cls):
                    delattr(cls, attr)
        hf_kernels.HOOKED_BY_US.clear()
        names["model"] = model

        def check_kernelized(ns: dict[str, Any]) -> None:
            calls = []
            original = reference_torch.msda_forward

            def counting(*args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                return original(*args, **kwargs)

            monkeypatch.setattr(reference_torch, "msda_forward", counting)
            with torch.no_grad():
                ns["model"].eval()(pixel_values=torch.randn(2, 3, 32, 32))
            assert len(calls) == 3  # every hooked layer (1 encoder + 2 decoder) runs nkilib_msda
        checks.append(check_kernelized)

    if "from_pretrained(" in code:
        transformers = pytest.importorskip("transformers")
        config = _tiny_detr_config()
        monkeypatch.setattr(transformers.DeformableDetrForObjectDetection, "from_pretrained",
                            classmethod(lambda cls, name, **kwargs: cls(config)))

        def check_patch(ns: dict[str, Any]) -> None:
            from nkilib_msda.pytorch.modules import MultiScaleDeformableAttention

            swapped = [m for m in ns["model"].modules() if isinstance(m, MultiScaleDeformableAttention)]
            assert ns["n"] == len(swapped) == 3  # 1 encoder + 2 decoder layers
        checks.append(check_patch)

    if "block_attn_res(" in code:
        import torch

        b, t, d = 1, 4, 64
        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        names.update(blocks=[torch.randn(b, t, d, generator=g).bfloat16() for _ in range(3)],
                     proj_weight=torch.randn(d, generator=g).bfloat16(),
                     partial_block=torch.randn(b, t, d, generator=g).bfloat16(),
                     gamma=(1 + 0.1 * torch.randn(d, generator=g)).bfloat16())

        def check_block_attn_res(ns: dict[str, Any]) -> None:
            from nkilib_msda.reference import block_attn_res_ref

            def arr(t):
                return t.detach().float().numpy()

            h_ref, rms_ref, alpha_ref = block_attn_res_ref(
                [arr(x) for x in names["blocks"]], arr(names["proj_weight"]),
                arr(names["partial_block"]), rmsnorm_gamma=arr(names["gamma"]))
            assert ns["h"].dtype == torch.bfloat16 and _max_rel(arr(ns["h"]), h_ref) <= 1.6e-2
            assert _max_rel(ns["rms"].numpy(), rms_ref) <= 1e-5
            assert _max_rel(ns["alpha"].numpy(), alpha_ref) <= 1e-5
            if ".sum().backward()" in code:  # d(sum h)/d(inputs): grad_h = ones
                from nkilib_msda.reference import block_attn_res_backward_ref

                grads = block_attn_res_backward_ref(
                    np.ones(h_ref.shape), [arr(x) for x in names["blocks"]], arr(names["proj_weight"]),
                    arr(names["partial_block"]), rmsnorm_gamma=arr(names["gamma"]))
                leaves = [*names["blocks"], names["partial_block"], names["proj_weight"], names["gamma"]]
                for leaf, ref in zip(leaves, [*grads[0], *grads[1:]]):
                    assert leaf.grad is not None and _max_rel(arr(leaf.grad), ref) <= 2e-2
        checks.append(check_block_attn_res)

    if "simulate(kernel" in code and "(*args)" in code:  # docs/timing.md: any kernel, its args
        from nkilib_msda.experimental.deformable_attention import ms_deformable_attention
        from nkilib_msda.reference import ms_deformable_attention_ref

        inputs = _msda_numpy_inputs(rng)
        args = tuple(inputs[k] for k in ("value", "spatial_shapes", "level_start_index",
                                         "sampling_locations", "attention_weights"))
        names.update(kernel=ms_deformable_attention, args=args)
        monkeypatch.chdir(tmp_path)  # the block writes kernel.trace.json

        def check_timing(ns: dict[str, Any]) -> None:
            assert _max_rel(ns["out"], ms_deformable_attention_ref(*args)) <= tolerance("output", "bfloat16")
            t = ns["t"]
            assert t.low_us <= t.estimate_us <= t.high_us and t.bound_by
            assert ns["report"].to_dict()["num_programs"] == 2  # lnc=2
            trace = __import__("json").loads((tmp_path / "kernel.trace.json").read_text())
            assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
        checks.append(check_timing)

    elif "simulate(kernel" in code:
        names.update(kernel=_copy_kernel(), value=rng.standard_normal((4, 8)).astype(np.float32))
        code = code.replace("(value, ...)", "(value)")

        def check_simulate(ns: dict[str, Any]) -> None:
            np.testing.assert_array_equal(ns["out"], names["value"])
            assert ns["report"].to_dict()["num_programs"] == 1
        checks.append(check_simulate)

    if per_level_points:  # docs/torch.md, "Per-level point counts"
        import torch

        import nkilib_msda

        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        levels = ((8, 8), (4, 4), (2, 2))
        names.update(nkilib_msda=nkilib_msda, spatial_shapes=levels,
                     value=torch.randn(2, 84, 8, 32, generator=g),
                     sampling_locations=torch.rand(2, 5, 8, 12, 2, generator=g),
                     attention_weights=torch.rand(2, 5, 8, 12, generator=g))

        def check_points(ns: dict[str, Any]) -> None:
            per_level = nkilib_msda.multi_scale_deformable_attention(
                names["value"], levels, None, names["sampling_locations"],
                names["attention_weights"], num_points=(3, 6, 3))
            assert ns["out"].shape == (2, 5, 256)
            torch.testing.assert_close(ns["out"], per_level, rtol=1e-5, atol=1e-5)  # v2 == functional
            assert ns["attn"].n_points == (3, 6, 3)
        checks.append(check_points)

    if "bk.bucket_grid(" in code:  # docs/torch.md, "Static shapes on Trainium"
        import torch

        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        # 420 x 440 at most: the (448, 448) bucket; a 4-level stride-8..64 backbone on it
        names.update(list_of_chw_images=[torch.randn(3, 400, 300, generator=g),
                                         torch.randn(3, 420, 440, generator=g)],
                     shapes=((56, 56), (28, 28), (14, 14), (7, 7)),
                     box_or_point_refs=torch.rand(2, 10, 2, generator=g))

        def check_buckets(ns: dict[str, Any]) -> None:
            length = 56 * 56 + 28 * 28 + 14 * 14 + 7 * 7
            assert len(ns["buckets"]) == 9 and ns["images"].shape == (2, 3, 448, 448)
            assert ns["padding"].shape == (2, length) and ns["ratios"].shape == (2, 4, 2)
            assert ns["enc_ref"].shape == (2, length, 4, 2) and ns["dec_ref"].shape == (2, 10, 4, 2)
            assert bool(ns["padding"][0].any()) and not bool(ns["mask"][1, :420, :440].any())
        checks.append(check_buckets)

    def check_all(ns: dict[str, Any]) -> None:
        for check in checks:
            check(ns)
    return code, names, check_all


@pytest.mark.parametrize("path,index,code", SNIPPETS, ids=[f"{p}[{i}]" for p, i, _ in SNIPPETS])
def test_doc_snippet_runs(path, index, code, monkeypatch, tmp_path):
    if re.search(r"\btorch\b|nkilib_msda\.(multi_scale|patch)|MSDeformAttn|block_attn_res\(|"
                 r"bucket_grid|num_points=", code):
        pytest.importorskip("torch")
    monkeypatch.setenv("NKILIB_MSDA_NKI", "emulator")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("NKILIB_MSDA_BACKEND", "NKILIB_MSDA_SIM_LNC"):
        monkeypatch.delenv(var, raising=False)
    code, namespace, check = _placeholders(code, monkeypatch, np.random.default_rng(index), tmp_path)
    exec(compile(code, f"{path}[python block {index}]", "exec"), namespace)  # noqa: S102
    check(namespace)


def test_every_python_block_of_the_docs_runs_or_says_why_not():
    """Every ```python block of README.md, examples/README.md and docs/*.md is collected above,
    except the NOT_RUN entries, which name existing blocks and give a reason."""
    blocks = {(p, i) for p in DOC_FILES for i, _ in enumerate(_python_blocks(p))}
    assert {(p, i) for p, i, _ in SNIPPETS} | set(NOT_RUN) == blocks
    assert set(NOT_RUN) <= blocks and all(reason.strip() for reason in NOT_RUN.values())
    assert {"README.md", "docs/timing.md", "docs/torch.md"} <= {p for p, _ in blocks}


def test_readme_starts_with_the_quick_start_and_its_kernel_inputs():
    """A stranger sees the quick start on the first screen, and its NKI block builds every
    input it passes (no elided names)."""
    readme = (ROOT / "README.md").read_text()
    assert readme.index("\n## Quick start\n") < len("\n".join(readme.splitlines()[:40]))
    quick = readme.split("\n## Quick start\n")[1].split("\n## ")[0]
    kernel_block = next(b for b in re.findall(r"```python\n(.*?)```", quick, re.S)
                        if "simulate(ms_deformable_attention" in b)
    for name in ("value", "spatial_shapes", "level_start_index", "sampling_locations",
                 "attention_weights", "grad_output"):
        assert re.search(rf"^{name} = ", kernel_block, re.M), f"quick start does not build {name}"


def test_ci_runs_the_readme_quick_start():
    """README, Quick start: CI (.ci/run) builds a fresh virtual environment in a temporary
    directory and runs the two commands in it, each part (``&&``) spelled
    ``python -m pip install -q`` and ``python -m pytest ...``; the CPU quick start installs no
    ``gpu`` extra (Triton is for NVIDIA GPUs only)."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("\n## Quick start\n")[1].split("\n## ")[0]
    commands = [line.split("#")[0].strip() for line in
                re.search(r"```bash\n(.*?)```", quick, re.S).group(1).splitlines() if line.strip()]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 2
    assert not any("gpu" in c for c in commands), commands
    found = []
    for command in (part.strip() for c in commands for part in c.split("&&")):
        spelled = (command.replace("pip install", "python -m pip install -q")
                   .replace("pytest", "python -m pytest"))
        at = [i for i, line in enumerate(ci_lines) if spelled in line]
        assert at, f".ci/run lacks: {spelled}"
        found.append(at[0])
    # the venv is made in a fresh temporary directory and activated before the first install
    tmp = next(i for i, line in enumerate(ci_lines) if re.fullmatch(r'(\w+)="\$\(mktemp -d\)"', line))
    name = re.fullmatch(r'(\w+)=.*', ci_lines[tmp]).group(1)
    venv = ci_lines.index(f'python3 -m venv "${name}/venv"')
    activate = next(i for i, line in enumerate(ci_lines) if line.startswith(f'. "${name}/venv/bin/activate"'))
    assert tmp < venv < activate < min(found), ci_lines
    assert found == sorted(found), "the commands run in the README's order"


# ---------------------------------------------------------------------------- (b) api.md

_API = (ROOT / "docs" / "api.md").read_text()


def _documented_arguments(call: str) -> ast.arguments:
    """The parsed arguments of the first ``call(...)`` written in api.md (balanced parens)."""
    match = re.search(rf"(?<![\w.]){re.escape(call)}\(", _API)
    assert match, f"api.md does not write {call}(...)"
    depth, start = 1, match.end()
    for end in range(start, len(_API)):
        depth += {"(": 1, ")": -1}.get(_API[end], 0)
        if depth == 0:
            break
    func = ast.parse(f"def f({_API[start:end].replace('`', '')}): pass").body[0]
    assert isinstance(func, ast.FunctionDef)
    return func.args


def _documented_params(call: str) -> list[tuple[str, str, Any]]:
    """(name, kind, default) of the first ``call(...)`` written in api.md."""
    a = _documented_arguments(call)
    positional = [(p.arg, "positional") for p in a.args]
    defaults = [inspect.Parameter.empty] * (len(a.args) - len(a.defaults)) + [
        ast.literal_eval(d) for d in a.defaults]
    params = [(n, k, d) for (n, k), d in zip(positional, defaults)]
    params += [(p.arg, "keyword_only", inspect.Parameter.empty if d is None else ast.literal_eval(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params


def _code_params(func: Any) -> list[tuple[str, str, Any]]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword_only"}
    params = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    return [(p.name, kinds.get(p.kind, str(p.kind)), p.default) for p in params]


def _kernels():
    from nkilib_msda.experimental.deformable_attention import (ms_deformable_attention,
                                                               ms_deformable_attention_bwd)
    return ms_deformable_attention, ms_deformable_attention_bwd


def test_api_nki_kernels():
    """§1; the kernels are JitKernel objects whose signature is the wrapped function's."""
    forward, backward = _kernels()
    documented = _documented_params("ms_deformable_attention")
    code = _code_params(forward)
    assert code[:len(documented)] == documented
    extras = code[len(documented):]  # "optional tuning keywords may follow"
    assert {"gather_method", "max_indices_per_indirect"} <= {name for name, _, _ in extras}
    assert all(default is not inspect.Parameter.empty for _, _, default in extras)
    assert _code_params(backward) == _documented_params("ms_deformable_attention_bwd")


def test_api_references_take_the_kernels_first_arguments():
    """§2: "same positional/keyword arguments as the kernels' first nine"."""
    from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref

    forward_doc = _documented_params("ms_deformable_attention")
    assert len(forward_doc) == 9
    assert _code_params(ms_deformable_attention_ref) == forward_doc
    assert _code_params(ms_deformable_attention_bwd_ref) == [
        ("grad_output", "positional", inspect.Parameter.empty), *forward_doc]


def test_api_simulate(monkeypatch):
    """§3. api.md writes simulate's whole signature as the code has it; its None defaults behave
    as documented (lnc: NEURON_LOGICAL_NC_CONFIG else 1; target: trn2)."""
    from nkilib_msda.simulator import NkiError, simulate

    assert _code_signature(simulate) == _documented_signature("simulate")
    assert issubclass(NkiError, Exception)

    copy = _copy_kernel()
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    out, report = simulate(copy, report=True)(x)
    np.testing.assert_array_equal(out, x)
    info = report.to_dict()
    assert (info["num_programs"], info["target"]) == (1, "trn2") and str(report)


def test_api_torch_functional_and_drop_ins():
    """§4."""
    pytest.importorskip("torch")
    import nkilib_msda

    assert _code_signature(nkilib_msda.multi_scale_deformable_attention) == _documented_signature(
        "nkilib_msda.multi_scale_deformable_attention")
    documented_init = _documented_params("nkilib_msda.MSDeformAttn")
    init = _code_params(nkilib_msda.MSDeformAttn.__init__)
    assert init[:len(documented_init)] == documented_init
    assert all(kind == "keyword_only" for _, kind, _ in init[len(documented_init):])
    assert _code_params(nkilib_msda.patch_transformers_model) == _documented_params(
        "nkilib_msda.patch_transformers_model")
    assert _code_params(nkilib_msda.multi_scale_deformable_attention_v2) == _documented_params(
        "nkilib_msda.multi_scale_deformable_attention_v2")
    assert _code_signature(nkilib_msda.register_hf_kernels) == _documented_signature(
        "nkilib_msda.register_hf_kernels")
    # autograd.Function.apply is positional (as upstream's); the code keeps upstream's names
    # (value_spatial_shapes, value_level_start_index) where api.md writes spatial_shapes, ...
    apply_doc = _documented_params("nkilib_msda.MSDeformAttnFunction.apply")
    apply_code = _code_params(nkilib_msda.MSDeformAttnFunction.apply)
    assert len(apply_code) == len(apply_doc) == 6
    assert all(kind == "positional" for _, kind, _ in apply_code)


def test_api_hf_layer_matches_transformers():
    """§4: MultiScaleDeformableAttention has HF transformers' stateless layer signature."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import nkilib_msda
    from transformers.models.deformable_detr import modeling_deformable_detr

    ours = [n for n, _, _ in _code_params(nkilib_msda.MultiScaleDeformableAttention.forward)]
    theirs = [n for n, _, _ in _code_params(modeling_deformable_detr.MultiScaleDeformableAttention.forward)]
    assert ours == theirs, f"transformers {transformers.__version__}"


def test_api_block_attn_res():
    """§7."""
    pytest.importorskip("torch")
    from nkilib_msda import block_attn_res, block_attn_res_backward
    from nkilib_msda.reference import block_attn_res_backward_ref, block_attn_res_ref

    forward_doc = _documented_params("block_attn_res")
    assert _code_params(block_attn_res) == forward_doc
    assert _code_params(block_attn_res_backward) == _documented_params("block_attn_res_backward")
    assert _code_params(block_attn_res_backward_ref) == _documented_params("block_attn_res_backward_ref")
    # block_attn_res_ref(...): "same arguments minus the flags and backend"
    without_flags = [p for p in forward_doc if p[0] not in ("rms_out_flag", "alpha_out_flag", "backend")]
    assert _code_params(block_attn_res_ref) == without_flags


def _documented_signature(call: str) -> list[tuple[str, str, str | None]]:
    """(name, kind, default as source text or None) of the first ``call(...)`` in api.md, with
    ``*args`` / ``**kwargs`` as kinds ``var_positional`` / ``var_keyword``."""
    a = _documented_arguments(call)
    defaults = [None] * (len(a.args) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params = [(p.arg, "positional", d) for p, d in zip(a.args, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, "var_positional", None))
    params += [(p.arg, "keyword_only", None if d is None else ast.unparse(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "var_keyword", None))
    return params


def _code_signature(func: Any) -> list[tuple[str, str, str | None]]:
    kinds = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword_only",
             inspect.Parameter.VAR_POSITIONAL: "var_positional",
             inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    out = []
    for p in inspect.signature(func).parameters.values():
        if p.name in ("self", "cls"):
            continue
        default = None if p.default is inspect.Parameter.empty else (
            p.default if type(p.default).__module__ == "torch" else repr(p.default))
        out.append((p.name, kinds[p.kind], None if default is None else str(default)))
    return out


def test_api_mmcv_and_buckets():
    """§4: nkilib_msda.mmcv, nkilib_msda.buckets and the hub hook helper, as api.md writes them."""
    pytest.importorskip("torch")
    from nkilib_msda import buckets, mmcv
    from nkilib_msda.pytorch import hf_kernels

    documented = {
        "nkilib_msda.mmcv.MultiScaleDeformableAttnFunction.apply": mmcv.MultiScaleDeformableAttnFunction.apply,
        "nkilib_msda.mmcv.multi_scale_deformable_attn_pytorch": mmcv.multi_scale_deformable_attn_pytorch,
        "nkilib_msda.mmcv.MultiScaleDeformableAttention": mmcv.MultiScaleDeformableAttention.__init__,
        "forward": mmcv.MultiScaleDeformableAttention.forward,
        "nkilib_msda.mmcv.patch_mmcv": mmcv.patch_mmcv,
        "nkilib_msda.mmcv.unpatch_mmcv": mmcv.unpatch_mmcv,
        "nkilib_msda.pytorch.hf_kernels.hook_transformers_layers": hf_kernels.hook_transformers_layers,
        **{name: getattr(buckets, name) for name in buckets.__all__},
    }
    for call, func in documented.items():
        assert _code_signature(func) == _documented_signature(call), call


def test_api_block_attn_res_kernels():
    """§7: the Block AttnRes NKI kernels' whole signatures."""
    from nkilib_msda.experimental.block_attn_res import block_attn_res_bwd, block_attn_res_fwd

    assert _code_signature(block_attn_res_fwd) == _documented_signature("block_attn_res_fwd")
    assert _code_signature(block_attn_res_bwd) == _documented_signature("block_attn_res_bwd")


def test_api_registered_operator_schema():
    """§4: the registered forward operator's schema (names and defaults) as api.md writes it."""
    torch = pytest.importorskip("torch")
    import nkilib_msda  # noqa: F401 - registers the operators

    schema = torch.ops.nkilib_msda.ms_deformable_attention.default._schema
    code = [(a.name, "positional", repr(a.default_value) if a.has_default_value() else None)
            for a in schema.arguments]
    assert code == _documented_signature("torch.ops.nkilib_msda.ms_deformable_attention")


# Public callables whose api.md signature a test above compares with the code. Every public
# function or class of these modules that api.md writes with arguments must be listed here.
SIGNATURE_CHECKED = {
    "ms_deformable_attention", "ms_deformable_attention_bwd", "ms_deformable_attention_ref",
    "ms_deformable_attention_bwd_ref", "simulate", "multi_scale_deformable_attention",
    "MSDeformAttn", "MSDeformAttnFunction", "MultiScaleDeformableAttention",
    "patch_transformers_model", "register_hf_kernels", "block_attn_res", "block_attn_res_backward",
    "block_attn_res_ref", "block_attn_res_backward_ref", "block_attn_res_fwd", "block_attn_res_bwd",
    "patch_mmcv", "unpatch_mmcv", "multi_scale_deformable_attn_pytorch",
    "MultiScaleDeformableAttnFunction", "MultiScaleDeformableAttention", "hook_transformers_layers",
    "bucket_grid", "select_bucket", "pad_to_bucket", "level_masks", "get_valid_ratio",
    "valid_ratios", "flatten_level_masks", "encoder_reference_points",
    "multi_scale_deformable_attention_v2",
}


def test_every_public_function_written_in_api_md_has_its_signature_checked():
    """``name(arg...`` written in api.md for a public callable (``nki.jit(...)`` is NKI's
    decorator, not ours) means a test above compares that signature with the code."""
    pytest.importorskip("torch")
    import importlib

    modules = ("nkilib_msda", "nkilib_msda.pytorch", "nkilib_msda.reference",
               "nkilib_msda.simulator", "nkilib_msda.experimental.deformable_attention",
               "nkilib_msda.experimental.block_attn_res", "nkilib_msda.mmcv", "nkilib_msda.buckets")
    written = set()
    for name in modules:
        module = importlib.import_module(name)
        for public in getattr(module, "__all__", ()):
            if callable(getattr(module, public, None)) and re.search(
                    rf"(?<![\w])(?<!nki\.){re.escape(public)}(\.apply)?\((?!\.\.\.)\w", _API):
                written.add(public)
    assert written, "no public signature found in api.md"
    assert written <= SIGNATURE_CHECKED, sorted(written - SIGNATURE_CHECKED)


def _architecture_layout() -> tuple[str, str]:
    """(the top-level sentence, the layout code block) of docs/architecture.md, "Layout"."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layout"):]
    top = section[:section.index("```")]
    block = section[section.index("```") + 3:]
    return top, block[:block.index("```")]


def _ls(folder: Path) -> set[str]:
    """What ``ls folder`` shows in a checkout (no hidden entries, nothing git ignores: an
    editable install's ``*.egg-info``, caches), folders with a trailing slash."""
    paths = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != "__pycache__"]
    if (ROOT / ".git").exists() and paths:
        ignored = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, text=True,
                                 input="\n".join(str(p.relative_to(ROOT)) for p in paths),
                                 capture_output=True).stdout.split()
        paths = [p for p in paths if str(p.relative_to(ROOT)) not in set(ignored)]
    return {p.name + "/" if p.is_dir() else p.name for p in paths}


def test_architecture_layout_is_what_ls_shows():
    """docs/architecture.md names every entry of the top level and of every package folder,
    and every file or folder name it lists exists (names only: `ls`, not the prose)."""
    top, block = _architecture_layout()
    assert set(re.findall(r"`([^`]+)`", top.split(":", 1)[1])) == _ls(ROOT)
    package = [ROOT / "nkilib_msda", *sorted(p for p in (ROOT / "nkilib_msda").rglob("*")
                                             if p.is_dir() and p.name != "__pycache__")]
    entries = set().union(*(_ls(folder) for folder in package)) | {"nkilib_msda/"}
    listed = set(re.findall(r"(?<![\w/.])([A-Za-z_]\w*(?:\.py|\.json|\.typed)|[A-Za-z_]\w*/)",
                            block))
    missing = sorted(entries - listed)
    assert not missing, f"docs/architecture.md does not list {missing}"
    known = entries | _ls(ROOT) | set().union(*(_ls(p) for top_dir in ("tests", "simulator_tests",
                                                                        "benchmarks")
                                                for p in [ROOT / top_dir, *(ROOT / top_dir).rglob("*")]
                                                if p.is_dir() and p.name != "__pycache__"))
    stale = sorted(name for name in listed - known if name not in {"results.json"})
    assert not stale, f"docs/architecture.md lists {stale}, which ls does not show"
