"""Package surface: lazy torch imports and kernel names that are kernels in any import order."""

import subprocess
import sys

import pytest

SNIPPETS = {
    "numpy parts never import torch": (
        "import sys, nkilib_msda\n"
        "from nkilib_msda.reference import ms_deformable_attention_ref\n"
        "from nkilib_msda.experimental.deformable_attention import ms_deformable_attention\n"
        "from nkilib_msda.experimental.block_attn_res import block_attn_res_fwd\n"
        "from nkilib_msda.simulator import simulate\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"),
    "kernel names bind the kernels after a submodule import": (
        "import nkilib_msda.experimental.deformable_attention.ms_deformable_attention\n"
        "import nkilib_msda.experimental.deformable_attention.ms_deformable_attention_bwd\n"
        "import nkilib_msda.experimental.block_attn_res.block_attn_res_fwd\n"
        "from nkilib_msda.experimental.deformable_attention import ms_deformable_attention, ms_deformable_attention_bwd\n"
        "from nkilib_msda.experimental.block_attn_res import block_attn_res_fwd\n"
        "from types import ModuleType\n"
        "for k in (ms_deformable_attention, ms_deformable_attention_bwd, block_attn_res_fwd):\n"
        "    assert not isinstance(k, ModuleType) and callable(k), k\n"),
    # mmcv.py and buckets.py moved under pytorch/: the old names import the same module objects.
    "moved modules answer their old names (old name first)": (
        "import sys, importlib.util, nkilib_msda\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "if importlib.util.find_spec('torch') is not None:\n"
        "    import nkilib_msda.mmcv\n"
        "    from nkilib_msda.mmcv import MultiScaleDeformableAttention\n"
        "    from nkilib_msda import buckets\n"
        "    from nkilib_msda.pytorch import buckets as moved_buckets, mmcv as moved_mmcv\n"
        "    assert nkilib_msda.mmcv is moved_mmcv is sys.modules['nkilib_msda.mmcv']\n"
        "    assert buckets is moved_buckets is nkilib_msda.buckets is sys.modules['nkilib_msda.buckets']\n"
        "    assert MultiScaleDeformableAttention is moved_mmcv.MultiScaleDeformableAttention\n"
        "    assert moved_mmcv.__spec__.name == 'nkilib_msda.pytorch.mmcv'\n"),
    "moved modules answer their old names (new name first)": (
        "import sys, importlib.util\n"
        "if importlib.util.find_spec('torch') is not None:\n"
        "    import nkilib_msda.pytorch.mmcv, nkilib_msda.pytorch.buckets\n"
        "    import nkilib_msda.mmcv, nkilib_msda.buckets\n"
        "    assert nkilib_msda.mmcv is nkilib_msda.pytorch.mmcv\n"
        "    assert nkilib_msda.buckets is nkilib_msda.pytorch.buckets\n"),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_import_behaviour_in_a_fresh_interpreter(name):
    proc = subprocess.run([sys.executable, "-c", SNIPPETS[name]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_public_torch_names_resolve():
    pytest.importorskip("torch")
    import nkilib_msda

    for name in ("multi_scale_deformable_attention", "MSDeformAttn", "MSDeformAttnFunction",
                 "MultiScaleDeformableAttention", "patch_transformers_model"):
        assert callable(getattr(nkilib_msda, name))
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(nkilib_msda, "no_such_name")


def test_block_attn_res_torch_api_is_exported_like_msda():
    pytest.importorskip("torch")
    import nkilib_msda
    import nkilib_msda.pytorch

    for name in ("block_attn_res", "block_attn_res_backward"):
        assert getattr(nkilib_msda, name) is getattr(nkilib_msda.pytorch, name)
        assert callable(getattr(nkilib_msda, name))


def test_kernel_package_answers_the_old_torch_path_with_a_deprecation_warning():
    pytest.importorskip("torch")
    import nkilib_msda
    import nkilib_msda.experimental.block_attn_res as kernels

    assert set(kernels.__all__) == {"block_attn_res_fwd", "block_attn_res_bwd"}
    with pytest.warns(DeprecationWarning, match="import it from nkilib_msda"):
        old = kernels.block_attn_res
    assert old is nkilib_msda.block_attn_res


# Top-level names of the dependencies (required and optional): a test folder on sys.path must
# not hold a folder or module of one of these names.
_DEPENDENCY_NAMES = ("numpy", "ml_dtypes", "tqdm", "torch", "triton", "transformers", "kernels",
                     "scipy", "PIL", "matplotlib", "hypothesis", "pytest", "xdist")


def test_no_test_folder_shadows_a_dependency(pytestconfig):
    """A test folder on sys.path that holds a folder or module named like a dependency (e.g.
    tests/backends, whose triton/ would become an importable namespace package where triton is
    not installed: ``importorskip("triton")`` then does not skip, and transformers, which looks
    for triton, fails; seen on the CPU quick start, no gpu extra). pytest runs in importlib
    mode, which puts no test folder on sys.path; the root conftest.py puts this checkout and
    the helper modules' folders there: none of them may hold such a name."""
    from pathlib import Path

    assert pytestconfig.getoption("importmode") == "importlib"
    root = Path(__file__).resolve().parents[1]
    on_path = {Path(entry).resolve() for entry in sys.path if entry}
    test_folders = {d for d in on_path if d.is_relative_to(root / "tests")
                    or d.is_relative_to(root / "simulator_tests")}
    assert test_folders, "the root conftest.py puts the helper folders on sys.path"
    shadows = sorted(str((d / name).relative_to(root)) for d in test_folders | {root}
                     for name in _DEPENDENCY_NAMES
                     if (d / name).is_dir() or (d / f"{name}.py").is_file())
    assert not shadows, shadows
