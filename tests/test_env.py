"""nkilib_msda._env: environment variables and public boolean switches reject invalid values
with an error naming the variable, the accepted values and the value received."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from nkilib_msda._env import (EnvironmentVariableError, check_optional_bool, env_choice,
                              env_flag)

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
    from nkilib_msda.backends import triton_backend

    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "off")
    assert triton_backend._resolve_deterministic(None) is False
    assert triton_backend._resolve_deterministic(True) is True
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "ON")
    assert triton_backend._resolve_deterministic(None) is True
    monkeypatch.setenv("NKILIB_MSDA_DETERMINISTIC", "sure")
    with pytest.raises(ValueError, match="^NKILIB_MSDA_DETERMINISTIC: expected .*got 'sure'"):
        triton_backend._resolve_deterministic(None)


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
