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
    assert rc == 0, out


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "nkilib_msda", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "nkilib_msda" in proc.stdout
