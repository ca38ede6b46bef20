"""nkilib_msda._env: environment variables and public boolean switches reject invalid values
with an error naming the variable, the accepted values and the value received."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
import warnings

import pytest

import nkilib_msda._env as _env_mod
from nkilib_msda._env import (ENV_VARS, RENAMED_FROM, EnvironmentVariableError, check_optional_bool, env_choice,
                              env_flag, env_table_markdown, match_word, read_env,
                              validate_environment)

VAR = "NKILIB_MSDA_TEST_FLAG"


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("true", True), (" TRUE ", True), ("yes", True), ("On", True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", None), ("  ", None)])
def test_env_flag_accepts(monkeypatch, raw, expected):
    monkeypatch.setenv(VAR, raw)
    assert env_flag(VAR) is expected
    assert env_flag(VAR, default=True) is (True if expected is None else expected)


def test_env_flag_unset_is_default(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert env_flag(VAR) is None and env_flag(VAR, default=False) is False


@pytest.mark.parametrize("raw", ["2", "enable", "tru", "-1", "yes please"])
def test_env_flag_rejects(monkeypatch, raw):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(EnvironmentVariableError) as info:
        env_flag(VAR)
    message = str(info.value)
    assert message.startswith(f"{VAR}:") and "expected" in message and repr(raw.strip()) in message
    assert "1" in message and "off" in message  # the accepted values
    assert isinstance(info.value, ValueError)


def test_env_choice(monkeypatch):
    monkeypatch.setenv(VAR, " Emulator ")
    assert env_choice(VAR, ("auto", "emulator")) == "emulator"
    monkeypatch.setenv(VAR, "")
    assert env_choice(VAR, ("auto", "emulator"), default="auto") == "auto"
    monkeypatch.setenv(VAR, "emulater")
    with pytest.raises(EnvironmentVariableError, match=rf"^{VAR}: expected one of \['auto', "
                                                       r"'emulator'\] \(or unset\), got 'emulater'"):
        env_choice(VAR, ("auto", "emulator"))


@pytest.mark.parametrize("value", [None, True, False])
def test_check_optional_bool_accepts(value):
    assert check_optional_bool("deterministic", value) is value


def test_check_optional_bool_accepts_numpy_bool():
    np = pytest.importorskip("numpy")
    assert check_optional_bool("deterministic", np.bool_(True)) is True


@pytest.mark.parametrize("bad", [1, 0, "true", "yes", 1.0, [True]])
def test_check_optional_bool_rejects(bad):
    with pytest.raises(TypeError, match=r"^deterministic: expected True, False or None, got"):
        check_optional_bool("deterministic", bad)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.getcwd(), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=300)


def test_bad_nkilib_msda_nki_fails_at_import():
    proc = _python("import nkilib_msda._nki", NKILIB_MSDA_NKI="emulatr")
    assert proc.returncode != 0
    assert "NKILIB_MSDA_NKI: expected one of ['auto', 'emulator'] (or unset), got 'emulatr'" in proc.stderr
    ok = _python("import nkilib_msda._nki as n; print(n.backend_name())", NKILIB_MSDA_NKI="AUTO")
    assert ok.returncode == 0, ok.stderr


# ---------------------------------------------------------------- call sites (torch)


def _tiny_msda():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    value = torch.randn(1, 5, 2, 4, generator=g, requires_grad=True)
    loc = torch.rand(1, 3, 2, 1, 2, 2, generator=g)
    attn = torch.rand(1, 3, 2, 1, 2, generator=g)
    return value, ((1, 5),), loc, attn


@pytest.mark.parametrize("bad", [1, "yes", 0.5])
def test_deterministic_argument_is_checked(bad):
    import nkilib_msda

    value, shapes, loc, attn = _tiny_msda()
    with pytest.raises(TypeError, match="^deterministic: expected True, False or None"):
        nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn,
                                                     backend="reference", deterministic=bad)


def test_backend_variable_typo_is_rejected(monkeypatch):
    import nkilib_msda

    value, shapes, loc, attn = _tiny_msda()
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "refrence")
    with pytest.raises(ValueError, match=r"^NKILIB_MSDA_BACKEND: expected one of \[.*'reference'.*\]"
                                         r" \(or unset\), got 'refrence'"):
        nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn)


def test_backend_variable_typo_is_rejected_by_block_attn_res(monkeypatch):
    torch = pytest.importorskip("torch")
    from nkilib_msda import block_attn_res

    blocks = [torch.randn(1, 2, 8) for _ in range(2)]
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "nkki")
    with pytest.raises(ValueError, match="^NKILIB_MSDA_BACKEND: .*got 'nkki'"):
        block_attn_res(blocks, torch.zeros(8), rmsnorm_gamma=torch.ones(8))
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "triton")  # an MSDA backend: Block AttnRes selects by device
    assert block_attn_res(blocks, torch.zeros(8), rmsnorm_gamma=torch.ones(8)).shape == (1, 2, 8)


def test_deterministic_variable_is_parsed(monkeypatch):
    pytest.importorskip("torch")
    from nkilib_msda.backends.triton import backend as triton_backend

    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "off")
    assert triton_backend._resolve_deterministic(None) is False
    assert triton_backend._resolve_deterministic(True) is True
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "ON")
    assert triton_backend._resolve_deterministic(None) is True
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "sure")
    with pytest.raises(ValueError, match="^NKILIB_MSDA_DETERMINISTIC: expected .*got 'sure'"):
        triton_backend._resolve_deterministic(None)


# ---------------------------------------------------------------- the one table


_PKG = Path(__file__).resolve().parents[1] / "nkilib_msda"
_ROOT = _PKG.parent
_VAR = re.compile(r"\b(NKILIB_MSDA_[A-Z0-9_]*[A-Z0-9]|NEURON_[A-Z0-9_]*[A-Z0-9]|TRITON_[A-Z_]*[A-Z])\b")
_NOT_VARIABLES = {"NEURON_DEVICE_TYPES", "NEURON_CORES"}  # Python names, not variables
_DOCS = [_ROOT / "README.md", *sorted((_ROOT / "docs").glob("*.md")), _ROOT / "examples" / "README.md"]


def test_no_module_reads_the_environment_directly():
    offenders = [f"{p.relative_to(_ROOT)}:{i}" for p in sorted(_PKG.rglob("*.py")) if p.name != "_env.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"os\.environ|getenv\(", line)]
    assert not offenders, f"read environment variables through nkilib_msda._env.read_env: {offenders}"


def test_every_variable_the_package_names_is_in_the_table():
    named = {m for p in _PKG.rglob("*.py") for m in _VAR.findall(p.read_text())} - _NOT_VARIABLES
    known = set(ENV_VARS) | set(RENAMED_FROM.values())  # old names, still read with a warning
    assert named <= known, sorted(named - known)


def test_docs_name_only_variables_of_the_table():
    named = {m for p in _DOCS for m in _VAR.findall(p.read_text())} - _NOT_VARIABLES
    known = set(ENV_VARS) | set(RENAMED_FROM.values())
    assert named <= known, sorted(named - known)


def test_readme_table_is_generated_from_the_table():
    readme = (_ROOT / "README.md").read_text()
    block = re.search(r"<!-- env-table:[^\n]*-->\n(.*?)\n<!-- env-table end -->", readme, re.S)
    assert block, "README.md: the generated environment-variable table is missing"
    assert block.group(1) == env_table_markdown(), \
        "README.md's table differs from nkilib_msda._env.ENV_VARS: paste env_table_markdown()"
    for name in ENV_VARS:
        assert f"`{name}`" in block.group(1)


def test_backend_choices_are_the_registered_backends():
    pytest.importorskip("torch")
    from nkilib_msda.backends import BACKEND_NAMES

    assert set(_env_mod._BACKENDS) == {"auto", *BACKEND_NAMES}


@pytest.mark.parametrize("name,raw", [
    ("NKILIB_MSDA_DETERMINISTIC", "2"), ("NKILIB_MSDA_EMULATOR_STRICT", "maybe"),
    ("NKILIB_MSDA_TRITON_FAST_LAUNCH", "fast"), ("NEURON_LOGICAL_NC_CONFIG", "3"),
    ("NEURON_LOGICAL_NC_CONFIG", "abc"), ("NKILIB_MSDA_SIM_LNC", "4"),
    ("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1"), ("NEURON_PLATFORM_TARGET_OVERRIDE", "inf2"),
    ("NKILIB_MSDA_BACKEND", "cuda"), ("NKILIB_MSDA_NKI", "real"),
    ("NEURON_CC_FLAGS", "-O2 --lnc=4"), ("NEURON_CC_FLAGS", "--logical-nc-config")])
def test_every_bad_value_is_one_error_type_naming_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(EnvironmentVariableError, match=rf"^{name}: expected .*got {raw!r}"):
        read_env(name)
    with pytest.raises(EnvironmentVariableError, match=rf"^{name}: "):
        validate_environment()


def test_defaults_and_case(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert {n: read_env(n) for n in ENV_VARS} == {
        "NKILIB_MSDA_BACKEND": "auto", "NKILIB_MSDA_NKI": "auto", "NKILIB_MSDA_EMULATOR_STRICT": False,
            "NKILIB_MSDA_EMULATOR_FULL_INDIRECT": False,
        "NEURON_LOGICAL_NC_CONFIG": None, "NEURON_CC_FLAGS": None, "NKILIB_MSDA_SIM_LNC": None,
        "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NKILIB_MSDA_DETERMINISTIC": None,
        "NKILIB_MSDA_TRITON_FAST_LAUNCH": True, "TRITON_INTERPRET": False,
        "NKILIB_MSDA_EMULATOR_TIMING": True, "USE_HUB_KERNELS": "", "DISABLE_KERNEL_MAPPING": ""}
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", " Reference ")
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "TRN3")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert read_env("NKILIB_MSDA_BACKEND") == "reference"
    assert read_env("NEURON_PLATFORM_TARGET_OVERRIDE") == "trn3"
    assert read_env("NEURON_LOGICAL_NC_CONFIG") == 2


def test_match_word_is_the_rule_for_arguments():
    assert match_word("backend", "NKI", ("auto", "nki")) == "nki"
    with pytest.raises(ValueError, match=r"^backend: expected one of \['auto', 'nki'\], got 'nkk'"):
        match_word("backend", "nkk", ("auto", "nki"))
    with pytest.raises(TypeError, match="^backend: "):
        match_word("backend", 3, ("auto", "nki"))


def test_backend_argument_and_variable_follow_the_same_case_rule(monkeypatch):
    torch = pytest.importorskip("torch")
    from nkilib_msda.pytorch import dispatch

    cpu = torch.device("cpu")
    monkeypatch.delenv("NKILIB_MSDA_BACKEND", raising=False)
    assert dispatch.requested_backend("NKI", cpu) == dispatch.BackendChoice("nki", "argument")
    assert dispatch.requested_backend("Auto", cpu).source == "device"
    monkeypatch.setenv("NKILIB_MSDA_BACKEND", "Reference")
    assert dispatch.requested_backend(None, cpu) == dispatch.BackendChoice("reference", dispatch.ENV_VAR)
    with pytest.raises(ValueError, match="^backend: expected None or one of"):
        dispatch.requested_backend("nkki", cpu)


def test_emulator_variable_errors_are_both_nki_errors_and_environment_errors(monkeypatch):
    import numpy as np

    from nkilib_msda.simulator import NkiError, jit, simulate
    from nkilib_msda.simulator import language as nl
    from nkilib_msda.simulator.targets import get_target

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(EnvironmentVariableError, match="NEURON_PLATFORM_TARGET_OVERRIDE.*'trn1'") as info:
        get_target()
    assert isinstance(info.value, NkiError) and info.value.rule == "unsupported target"
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")

    @jit
    def noop(x):
        return nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "abc")
    with pytest.raises(EnvironmentVariableError, match="^nki.jit: LNC degree: NEURON_LOGICAL_NC_CONFIG") as info:
        simulate(noop)(np.zeros((1, 1), np.float32))
    assert isinstance(info.value, NkiError)


def test_torch_layer_lnc_errors_are_environment_errors(monkeypatch):
    pytest.importorskip("torch")
    from nkilib_msda.backends import nki_backend

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    with pytest.raises(EnvironmentVariableError, match="^NEURON_LOGICAL_NC_CONFIG: .*got '3'"):
        nki_backend.lnc_degree()
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")
    monkeypatch.setenv("NKILIB_MSDA_SIM_LNC", "2")
    with pytest.warns(DeprecationWarning, match="NKILIB_MSDA_SIM_LNC is deprecated"):
        assert nki_backend.lnc_degree() == 2


@pytest.mark.parametrize("name,raw", [("NEURON_LOGICAL_NC_CONFIG", "3"),
                                      ("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9"),
                                      ("NKILIB_MSDA_DETERMINISTIC", "2")])
def test_cli_rejects_a_bad_variable_with_one_line_and_exit_2(name, raw):
    proc = subprocess.run([sys.executable, "-m", "nkilib_msda", "check", "--preset", "tiny"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), name: raw})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"nkilib-msda: error: {name}: ")


def test_cli_lnc_follows_the_variable(monkeypatch):
    from nkilib_msda.tools.cli import build_parser

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert build_parser().parse_args(["check"]).lnc == 2
    assert build_parser().parse_args(["check", "--lnc", "1"]).lnc == 1
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG")
    assert build_parser().parse_args(["check"]).lnc == 1


def test_renamed_emulator_strict_variable_keeps_the_old_name_with_a_warning(monkeypatch):
    from nkilib_msda._env import env_flag

    monkeypatch.delenv("NKILIB_MSDA_EMULATOR_STRICT", raising=False)
    monkeypatch.setenv("NKILIB_MSDA_SIM_STRICT", "1")
    with pytest.warns(DeprecationWarning, match="NKILIB_MSDA_SIM_STRICT is deprecated"):
        assert env_flag("NKILIB_MSDA_EMULATOR_STRICT", default=False) is True
    monkeypatch.setenv("NKILIB_MSDA_SIM_STRICT", "maybe")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="^NKILIB_MSDA_SIM_STRICT: "):
        env_flag("NKILIB_MSDA_EMULATOR_STRICT")
    monkeypatch.setenv("NKILIB_MSDA_EMULATOR_STRICT", "0")  # the new name wins, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert env_flag("NKILIB_MSDA_EMULATOR_STRICT", default=True) is False


def test_old_emulated_lnc_variable_warns(monkeypatch):
    pytest.importorskip("torch")
    from nkilib_msda.backends.nki_backend import lnc_degree

    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    monkeypatch.setenv("NKILIB_MSDA_SIM_LNC", "2")
    with pytest.warns(DeprecationWarning, match="set NEURON_LOGICAL_NC_CONFIG"):
        assert lnc_degree() == 2


# ------------------------------------------- every package variable, wherever one is first read

_OWN_BAD = [("NKILIB_MSDA_DETERMINISTIC", "2"), ("NKILIB_MSDA_TRITON_FAST_LAUNCH", "fast"),
            ("NKILIB_MSDA_EMULATOR_TIMING", "sometimes"), ("NKILIB_MSDA_EMULATOR_STRICT", "maybe")]


@pytest.mark.parametrize("name,raw", _OWN_BAD)
@pytest.mark.parametrize("backend", ["reference", "nki"])
def test_a_bad_package_variable_fails_every_backend(monkeypatch, name, raw, backend):
    """A package variable that this call does not use (e.g. NKILIB_MSDA_DETERMINISTIC, used
    only by the Triton backward) is still an error on every backend, not silently accepted."""
    import nkilib_msda

    value, shapes, loc, attn = _tiny_msda()
    monkeypatch.setenv(name, raw)
    with pytest.raises(EnvironmentVariableError, match=rf"^{name}: expected .*got {raw!r}$"):
        nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn,
                                                     backend=backend)
    monkeypatch.delenv(name)
    assert nkilib_msda.multi_scale_deformable_attention(value, shapes, None, loc, attn,
                                                        backend=backend).shape == (1, 3, 8)


@pytest.mark.parametrize("name,raw", _OWN_BAD)
def test_a_bad_package_variable_fails_block_attn_res_and_the_emulator(monkeypatch, name, raw):
    torch = pytest.importorskip("torch")
    from nkilib_msda import block_attn_res
    import numpy as np

    from nkilib_msda.simulator import simulate
    from nkilib_msda.simulator import isa as nisa
    from nkilib_msda.simulator import jit, language as nl

    @jit
    def copy(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, x)
        return out

    monkeypatch.setenv(name, raw)
    with pytest.raises(EnvironmentVariableError, match=rf"^{name}: "):
        block_attn_res([torch.randn(1, 2, 8)], torch.zeros(8), rmsnorm_gamma=torch.ones(8),
                       backend="reference")
    with pytest.raises(EnvironmentVariableError, match=rf"^{name}: "):
        simulate(copy)(np.zeros((2, 4), np.float32))
    monkeypatch.delenv(name)
    assert simulate(copy)(np.ones((2, 4), np.float32)).sum() == 8


def test_package_variable_snapshot_follows_every_change(monkeypatch):
    """The check's snapshot (read through os.environ's own dict) sees a variable set, changed
    and removed after a first check, so a bad value raises on the next read."""
    read_env("NKILIB_MSDA_BACKEND")
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "maybe")
    with pytest.raises(EnvironmentVariableError, match="NKILIB_MSDA_DETERMINISTIC"):
        read_env("NKILIB_MSDA_BACKEND")
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "on")
    assert read_env("NKILIB_MSDA_DETERMINISTIC") is True
    monkeypatch.delenv("NKILIB_MSDA_DETERMINISTIC")
    assert read_env("NKILIB_MSDA_DETERMINISTIC") is None
    # raw values (bytes on POSIX): unset exactly where os.environ has no value
    assert ([v is None for v in _env_mod._own_snapshot()]
            == [os.environ.get(n) is None for n in _env_mod._OWN_NAMES])


def test_package_variable_snapshot_without_os_environ_internals(monkeypatch):
    """An os.environ replaced by a plain mapping (no ``_data``) is read through ``get``."""
    fake = {"NKILIB_MSDA_DETERMINISTIC": "maybe"}
    monkeypatch.setattr(os, "environ", fake)
    assert _env_mod._own_snapshot() == tuple(fake.get(n) for n in _env_mod._OWN_NAMES)
    with pytest.raises(EnvironmentVariableError, match="NKILIB_MSDA_DETERMINISTIC"):
        _env_mod.check_package_variables()


def test_child_environment_keeps_the_environment_and_sets_the_overrides(monkeypatch):
    from nkilib_msda._env import child_environment
    monkeypatch.setenv("NKILIB_MSDA_TEST_CHILD_KEPT", "kept")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    env = child_environment({"OPENBLAS_NUM_THREADS": "1"})
    assert env["NKILIB_MSDA_TEST_CHILD_KEPT"] == "kept" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["OPENBLAS_NUM_THREADS"] == "8"  # this process's environment is untouched
