"""The command line: `info`, argument parsing, and `check` on a tiny preset."""

import subprocess
import sys
from pathlib import Path

import pytest

from nkilib_msda.tools.cli import build_parser, main


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
    rc = main(["check", "--preset", "tiny", "--lnc", str(lnc), "--value-layout", "BNLC",
               "--report"])
    out = capsys.readouterr().out
    assert "forward output" in out and "grad_value" in out and "cost report" in out
    assert "forward kernel: modelled time" in out and "backward kernel: modelled time" in out
    assert rc == 0, out
    # the detail comes after the short summary, which ends with the verdict
    assert out.index("CHECK PASSED") < out.index("== forward kernel cost report ==")


def test_check_shows_the_verdict_errors_and_modelled_times_first():
    """First contact: a short summary (shape, the error table, modelled times, the verdict)
    and one line saying how to get the cost reports; no cost report unless --report."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = main(["check", "--preset", "tiny"])
    lines = buffer.getvalue().splitlines()
    assert rc == 0, lines
    assert not any("cost report" in line for line in lines[:-1]), lines
    assert len(lines) <= 18, lines  # was 63, both cost reports in the middle
    assert lines[-2] == "CHECK PASSED", lines
    assert lines[-1] == "(cost reports of both kernels: nkilib-msda check --report)", lines
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 1 + 4 and all(line.endswith("| ok |") for line in table[1:]), table
    modelled = [line for line in lines if "kernel: modelled time" in line]
    assert [line.split(":")[0] for line in modelled] == ["forward kernel", "backward kernel"]


def test_profile_writes_trace_and_png(tmp_path, capsys):
    import json

    pytest.importorskip("matplotlib", reason="the PNG needs the `bench` extra (matplotlib)")
    rc = main(["profile", "--preset", "tiny", "--kernel", "bwd", "--lnc", "2", "--target", "trn3",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "modelled time" in out and "critical path" in out
    trace = json.loads((tmp_path / "tiny_bwd_lnc2_trn3.trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    assert trace["otherData"]["target"] == "trn3"
    assert (tmp_path / "tiny_bwd_lnc2_trn3.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_without_matplotlib_writes_the_trace_and_says_why_no_png(tmp_path, capsys,
                                                                          monkeypatch):
    """The trace needs nothing optional; the PNG needs matplotlib (the `bench` extra): without
    it, one line says so and the command still succeeds."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rc = main(["profile", "--preset", "tiny", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (tmp_path / "tiny_fwd_lnc1_trn2.trace.json").is_file()
    assert not (tmp_path / "tiny_fwd_lnc1_trn2.png").exists()
    notes = [line for line in out.splitlines() if "matplotlib" in line]
    assert notes == ["  no PNG: the picture needs matplotlib, the `bench` extra "
                     "(pip install -e \".[bench]\")"], out


def test_profile_help_names_the_png_dependency():
    proc = _cli("profile", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "matplotlib" in text and "`bench` extra" in text


@pytest.mark.parametrize("make,needle", [
    (lambda p: _file(p / "taken"), "is a file, not a directory"),
    (lambda p: _file(p / "file") / "sub", "is a file, not a directory"),
    (lambda p: (p / "locked").mkdir(mode=0o500) or p / "locked" / "out", "cannot create"),
], ids=["existing-file", "file-as-parent", "unwritable"])
def test_profile_checks_out_before_simulating(tmp_path, make, needle, monkeypatch):
    """A bad --out is one line and exit code 2, before the (slow) simulation starts."""
    import os

    from nkilib_msda.tools import profile

    if needle == "cannot create" and os.geteuid() == 0:
        # root writes anywhere: a directory under /proc is not writable for anyone
        out = "/proc/nkilib_msda_profile_out"
    else:
        out = str(make(tmp_path))
    monkeypatch.setattr(profile, "_simulate", lambda *a: pytest.fail("simulated before checking --out"))
    proc_err = _run_main_capturing(["profile", "--preset", "tiny", "--out", out])
    rc, stderr = proc_err
    assert rc == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nkilib-msda: error: --out: "), stderr
    assert needle in lines[0] and out in lines[0], lines[0]


def _file(path):
    path.write_text("x")
    return path


def _run_main_capturing(argv):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def test_profile_with_the_timing_model_off_is_one_line(tmp_path):
    proc = _cli("profile", "--preset", "tiny", "--out", str(tmp_path),
                NKILIB_MSDA_EMULATOR_TIMING="0")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines == ["nkilib-msda: error: profile needs the timing model, which "
                     "NKILIB_MSDA_EMULATOR_TIMING=0 switches off: unset it or set it to 1"], proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_profile_picture_colours_time_by_the_bound_the_text_names(kernel):
    """The trace's (so the PNG's) categories are the vocabulary of ``bound_by``: a transfer is
    ``dma_descriptors`` where its per-descriptor cost dominates, else ``dma_bandwidth``. On the
    default preset the text says "bound by dma_descriptors" (the PNG used to show only
    dma_bandwidth), and the legend marks the bounding category."""
    from nkilib_msda.tools.profile import _simulate, timeline_rows

    timing = _simulate(kernel, "tiny", 1, None, 0).timing
    rows = timeline_rows(timing)
    categories = {cat for row in rows.values() for _, _, cat in row}
    if timing.bound_by in ("dma_descriptors", "dma_bandwidth", "vector", "gpsimd", "scalar",
                           "tensor", "dma_issue", "barrier"):
        assert timing.bound_by in categories, (timing.bound_by, categories)
    trace = {e["cat"] for e in timing.trace_events() if e.get("ph") == "X"}
    assert trace == categories
    assert "dma_descriptors" in trace  # tiny: per-descriptor cost dominates its gathers


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


def test_check_help_describes_every_preset_with_a_time_and_memory():
    from nkilib_msda.workloads import (PRESET_DESCRIPTIONS, PRESET_EMULATOR_MEMORY,
                                       PRESET_EMULATOR_TIME, PRESETS)

    assert set(PRESET_DESCRIPTIONS) == set(PRESET_EMULATOR_TIME) == set(PRESETS)
    assert set(PRESET_EMULATOR_MEMORY) == set(PRESETS)
    proc = _cli("check", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse re-wraps lines
    for name in PRESETS:
        row = (f"{name} {PRESET_EMULATOR_TIME[name]} {PRESET_EMULATOR_MEMORY[name]} "
               f"{PRESET_DESCRIPTIONS[name]}")
        assert row in text, row


@pytest.mark.parametrize("kwargs,needle", [
    ({"preset": "nope"}, "preset: expected one of"),
    ({"lnc": 3}, "lnc: expected 1 or 2, got 3"),
    ({"seed": -1}, "seed: expected a non-negative integer, got -1"),
    ({"preset": "tiny", "dtype": "float8"}, "dtype: expected one of"),
])
def test_run_check_rejects_bad_arguments_with_value_error(kwargs, needle):
    from nkilib_msda.tools.check import run_check

    with pytest.raises(ValueError, match=needle):
        run_check(echo=lambda *_: None, **kwargs)


def test_bench_runs_the_packaged_harness(capsys):
    """`bench` runs the harness that ships in the package (nkilib_msda.bench.gpu)."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    assert "--shapes" in capsys.readouterr().out


def test_the_benchmark_script_is_the_packaged_harness():
    """benchmarks/bench_gpu.py only imports the packaged harness and calls it."""
    import runpy

    from nkilib_msda.bench import gpu

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"
    assert runpy.run_path(str(script), run_name="bench_gpu_under_test")["main"] is gpu.main


# ------------------------------------------------ pipes, Ctrl-C, `info`, --quiet, progress


@pytest.mark.parametrize("args,code", [
    (["info"], 141), (["check", "--preset", "tiny", "--forward-only", "--no-report"], 141),
    (["--help"], 0), (["check", "--help"], 0),  # argparse ignores write errors of its help
])
def test_closed_stdout_pipe_exits_quietly(args, code):
    """`nkilib-msda ... | head -n 1`: the reader is gone; exit 141 (128 + SIGPIPE), stderr empty."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away before the first write: deterministic EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "nkilib_msda", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    finally:
        os.close(write_end)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr == "", proc.stderr


_INTERRUPTIBLE = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell, whatever the parent set
from nkilib_msda.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("lnc", [1, 2])
def test_ctrl_c_exits_130_with_one_line(lnc):
    import os
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTIBLE, "check", "--preset", "upstream", "--lnc", str(lnc)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONUNBUFFERED": "1"})
    try:
        first = proc.stdout.readline()  # printed before the kernels start
        assert first.startswith("preset upstream"), first
        time.sleep(1.0)  # inside the forward or backward kernel (upstream runs for seconds)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "CHECK PASSED" not in out, "the run ended before the interrupt: use a longer preset"
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["nkilib-msda: interrupted"], err


def test_info_imports_no_torch_triton_or_transformers():
    import os

    code = ("import sys; from nkilib_msda.tools.cli import main; main(['info']); "
            "print(sorted(m for m in ('torch', 'triton', 'transformers', 'ml_dtypes') "
            "if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]", proc.stderr
    assert "nkilib_msda" in proc.stdout and "torch backends:" in proc.stdout


@pytest.mark.parametrize("devices,needle", [
    (0, "triton: installed, no CUDA device (CPU tensors only under TRITON_INTERPRET=1"),
    (2, "triton: available (2 CUDA devices)"),
])
def test_info_says_whether_triton_has_a_cuda_device(monkeypatch, capsys, devices, needle):
    import importlib.util

    from nkilib_msda.tools import cli

    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch and triton installed")
    monkeypatch.setattr(cli, "cuda_device_count", lambda: devices)
    assert main(["info"]) == 0
    assert needle in capsys.readouterr().out


def test_cuda_device_count_is_a_count():
    from nkilib_msda.tools.cli import cuda_device_count

    count = cuda_device_count()
    assert isinstance(count, int) and count >= 0


def test_check_quiet_prints_only_the_result(capsys):
    assert main(["check", "--preset", "tiny", "--forward-only", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "CHECK PASSED\n" and captured.err == ""


class _Terminal:
    """A stderr stand-in that says it is a terminal and keeps what was written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("lnc", [1, 2])
def test_progress_bar_counts_every_query_of_both_kernels(monkeypatch, lnc):
    """The bar reads progress off attention_weights; both kernels read it exactly once."""
    from nkilib_msda.tools.check import run_backward, run_forward
    from nkilib_msda.simulator import progress as progress_module
    from nkilib_msda.workloads import PRESETS, make_grad_output, make_inputs

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress_module.Progress, "__init__", _fast_progress_init(
        progress_module.Progress.__init__))
    finals = []
    exit_display = progress_module.ProgressDisplay.__exit__

    def record(self, *exc):
        finals.append((self.desc, self.done(), self.spec.total))
        return exit_display(self, *exc)

    monkeypatch.setattr(progress_module.ProgressDisplay, "__exit__", record)
    case = PRESETS["tiny"]
    args = make_inputs(case, seed=3)
    run_forward(args, lnc=lnc, progress=True)
    run_backward(make_grad_output(case, seed=3), args, lnc=lnc, progress=True)
    queries = case.batch * case.num_queries
    assert finals == [("forward", queries, queries), ("backward", queries, queries)]
    assert "forward" in terminal.text and "query" in terminal.text, terminal.text


def _fast_progress_init(init):
    """Progress with no start delay and a short poll interval, so a tiny run draws a bar."""
    def fast(self, *args, **kwargs):
        init(self, *args, **kwargs)
        object.__setattr__(self, "delay_s", 0.0)
        object.__setattr__(self, "interval_s", 0.01)
    return fast


def test_no_progress_bar_when_stderr_is_not_a_terminal(capsys):
    from nkilib_msda.tools.check import run_forward
    from nkilib_msda.workloads import PRESETS, make_inputs

    run_forward(make_inputs(PRESETS["tiny"], seed=0), progress=True)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("progress,error,needle", [
    (3, TypeError, "progress must be True, False, the name of a kernel argument or a Progress"),
    ("attention_weight", ValueError, "progress names 'attention_weight', which is not an array "
                                     "argument of ms_deformable_attention"),
])
def test_simulate_rejects_a_bad_progress_argument(progress, error, needle):
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention
    from nkilib_msda.simulator import simulate
    from nkilib_msda.workloads import PRESETS, make_inputs

    with pytest.raises(error, match=needle):
        simulate(ms_deformable_attention, progress=progress)(**make_inputs(PRESETS["tiny"]))


@pytest.mark.slow
def test_check_ddetr_decoder_shows_progress_in_a_terminal_only():
    """The acceptance run: a real pseudo-terminal on stderr gets the bar; --quiet gets none."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    def run(*extra):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        proc = subprocess.Popen([sys.executable, "-m", "nkilib_msda", "check", "--preset",
                                 "ddetr-decoder", "--no-report", *extra],
                                stdout=subprocess.DEVNULL, stderr=slave,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        assert proc.wait(timeout=900) == 0
        return b"".join(chunks).decode(errors="replace")

    shown = run()
    assert "backward:" in shown and "/600 [" in shown, shown[-500:]  # B*N_q = 2*300 queries
    assert run("--quiet") == ""
