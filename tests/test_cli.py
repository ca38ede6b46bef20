"""The command line: `info`, argument parsing, and `check` on a tiny preset."""

import subprocess
import sys

import pytest

from nkilib_msda.cli import build_parser, main


def test_info_reports_versions_and_emulator(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "nkilib_msda" in out and "numpy" in out
    assert "emulator" in out  # conftest forces NKILIB_MSDA_NKI=emulator


def test_check_parser_defaults():
    args = build_parser().parse_args(["check"])
    assert (args.preset, args.dtype, args.lnc, args.padding_mode) == ("default", "bfloat16", 1, "zeros")


def test_check_rejects_unknown_preset():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "--preset", "no-such-preset"])


@pytest.mark.parametrize("lnc", [1, 2])
def test_check_runs_kernels_on_tiny_preset(capsys, lnc):
    rc = main(["check", "--preset", "tiny", "--lnc", str(lnc), "--value-layout", "BNLC"])
    out = capsys.readouterr().out
    assert "forward output" in out and "grad_value" in out and "cost report" in out
    assert "forward kernel: modelled time" in out and "backward kernel: modelled time" in out
    assert rc == 0, out


def test_profile_writes_trace_and_png(tmp_path, capsys):
    import json

    rc = main(["profile", "--preset", "tiny", "--kernel", "bwd", "--lnc", "2", "--target", "trn3",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "modelled time" in out and "critical path" in out
    trace = json.loads((tmp_path / "tiny_bwd_lnc2_trn3.trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    assert trace["otherData"]["target"] == "trn3"
    assert (tmp_path / "tiny_bwd_lnc2_trn3.png").read_bytes()[:4] == b"\x89PNG"


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "nkilib_msda", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "nkilib_msda" in proc.stdout


# ------------------------------------------------------------ bad input: one line, exit code 2


def _cli(*args, **env):
    import os

    full = {**os.environ, "PYTHONPATH": os.getcwd(), **env}
    return subprocess.run([sys.executable, "-m", "nkilib_msda", *args], capture_output=True,
                          text=True, env=full, timeout=300)


@pytest.mark.parametrize("args,env,needle", [
    (["check", "--seed", "-1"], {}, "--seed: expected a non-negative integer, got -1"),
    (["check", "--seed", "x"], {}, "--seed: expected a non-negative integer, got 'x'"),
    (["check", "--preset", "no-such-preset"], {}, "invalid choice: 'no-such-preset'"),
    (["check", "--lnc", "3"], {}, "--lnc"),
    (["frobnicate"], {}, "invalid choice: 'frobnicate'"),
    (["check", "--preset", "tiny"], {"NKILIB_MSDA_NKI": "emulatr"},
     "NKILIB_MSDA_NKI: expected one of ['auto', 'emulator'] (or unset), got 'emulatr'"),
    (["info"], {"NKILIB_MSDA_NKI": "yes"}, "NKILIB_MSDA_NKI: expected one of"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, env, needle):
    proc = _cli(*args, **env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0] and lines[0].startswith("nkilib-msda"), lines[0]


def test_check_help_describes_every_preset_with_a_time():
    from nkilib_msda.workloads import PRESET_DESCRIPTIONS, PRESET_EMULATOR_TIME, PRESETS

    assert set(PRESET_DESCRIPTIONS) == set(PRESET_EMULATOR_TIME) == set(PRESETS)
    proc = _cli("check", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse re-wraps lines
    for name in PRESETS:
        row = f"{name} {PRESET_EMULATOR_TIME[name]} {PRESET_DESCRIPTIONS[name]}"
        assert row in text, row


@pytest.mark.parametrize("kwargs,needle", [
    ({"preset": "nope"}, "preset: expected one of"),
    ({"lnc": 3}, "lnc: expected 1 or 2, got 3"),
    ({"seed": -1}, "seed: expected a non-negative integer, got -1"),
    ({"preset": "tiny", "dtype": "float8"}, "dtype: expected one of"),
])
def test_run_check_rejects_bad_arguments_with_value_error(kwargs, needle):
    from nkilib_msda.check import run_check

    with pytest.raises(ValueError, match=needle):
        run_check(echo=lambda *_: None, **kwargs)
