"""Command line: ``nkilib-msda check | profile | bench | info`` (also ``python -m nkilib_msda``)."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import inspect
import os
import platform
import sys
from typing import Any, Callable, Sequence

from nkilib_msda._env import EnvironmentVariableError, read_env, validate_environment
from nkilib_msda._version import __version__
from nkilib_msda.hardware import KERNEL_DTYPES
from nkilib_msda.tools.argtypes import OneLineErrorParser, int_at_least
from nkilib_msda.validation.layouts import LOCATION_LAYOUTS, VALUE_LAYOUTS
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES


def _version_of(distribution: str) -> str:
    """The installed version from package metadata: nothing is imported, so `info` stays fast."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cmd_info(args: argparse.Namespace) -> int:
    print(f"nkilib_msda {__version__}")
    print(f"python {platform.python_version()} on {platform.machine()} ({platform.system()})")
    for distribution in ("numpy", "ml_dtypes", "tqdm", "torch", "triton", "transformers"):
        print(f"{distribution:<13} {_version_of(distribution)}")
    print(f"nki          {_nki_name()}")
    print("torch backends:")
    for line in _available_backends():
        print(f"  {line}")
    return 0


def _nki_name() -> str:
    """Which NKI the kernels use; the real ``nki`` is imported only where it is installed."""
    if read_env("NKILIB_MSDA_NKI") == "emulator" or importlib.util.find_spec("nki") is None:
        return "nkilib_msda emulator"
    from nkilib_msda import _nki

    return _nki.backend_name()


def _available_backends() -> list[str]:
    """What each torch backend can run on, from installed packages and a CUDA driver query
    (torch, triton and the kernels are not imported: `info` answers in well under a second)."""
    if importlib.util.find_spec("torch") is None:
        return ["none: install the `torch` extra (the NKI kernels still run in the emulator on "
                "NumPy arrays)"]
    lines = ["reference: available (CPU and any torch device)",
             "nki: available (" + ("Neuron devices and " if _nki_name() != "nkilib_msda emulator"
                                   else "") + "CPU tensors through the emulator)"]
    if importlib.util.find_spec("triton") is None:
        lines.append("triton: not installed (install the `gpu` extra on a CUDA machine)")
    else:
        devices = cuda_device_count()
        if devices:
            lines.append(f"triton: available ({devices} CUDA device{'s' * (devices > 1)})")
        else:
            lines.append("triton: installed, no CUDA device (CPU tensors only under "
                         "TRITON_INTERPRET=1, for tests)")
    return lines


def cuda_device_count() -> int:
    """CUDA devices visible to this process, asked of the NVIDIA driver (libcuda) directly,
    as torch would, without importing torch; 0 without a driver or device."""
    import ctypes
    import ctypes.util

    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Run the NKI forward and backward kernels in the NumPy emulator on one shape preset,
    print their errors against the float64 reference, their modelled Trainium times and
    CHECK PASSED or CHECK FAILED (with --report, then the emulator's cost reports), and exit 1
    if a tolerance is exceeded. Times are rough (forward + backward on one laptop core)."""
    from nkilib_msda.tools.check import run_check

    ok = run_check(preset=args.preset, dtype=args.dtype, param_dtype=args.param_dtype,
                   value_layout=args.value_layout, sampling_locations_layout=args.locations_layout,
                   align_corners=args.align_corners, padding_mode=args.padding_mode, lnc=args.lnc,
                   gather_method=args.gather_method, backward=not args.forward_only, seed=args.seed,
                   show_report=args.report, progress=not args.quiet,
                   echo=_quiet_echo if args.quiet else print)
    return 0 if ok else 1


def _quiet_echo(line: str = "") -> None:
    """`check --quiet`: the CHECK PASSED / CHECK FAILED line and the rows that failed."""
    if line.startswith("CHECK ") or line.endswith("| FAIL |"):
        print(line)


def cmd_profile(args: argparse.Namespace) -> int:
    """Run one NKI kernel in the emulator and write the timing model's Chrome trace and a PNG
    timeline (docs/timing.md). The trace needs nothing more; the PNG needs matplotlib, the
    `bench` extra (pip install -e ".[bench]"): without it only the trace is written, and a
    line says so."""
    from nkilib_msda.tools.profile import (ProfileError, check_out_dir, check_timing_enabled,
                                           run_profile)

    try:  # before the (slow) simulation
        check_timing_enabled()
        check_out_dir(args.out, name="--out")
    except ProfileError as exc:
        print(f"nkilib-msda: error: {exc}", file=sys.stderr)
        return 2
    run_profile(preset=args.preset, kernel=args.kernel, lnc=args.lnc, target=args.target,
                out=args.out, seed=args.seed)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from nkilib_msda.bench.gpu import main as bench_main

    return int(bench_main(args.bench_args))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="nkilib-msda", description=__doc__, epilog=EXIT_CODES_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"nkilib_msda {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions, NKI (real or emulator), available backends")
    info.set_defaults(func=cmd_info)

    check = _emulator_command(sub, cmd_check, "see the list below", epilog=_preset_table(),
                              help="run the NKI kernels in the emulator and compare with the reference")
    check.add_argument("--dtype", default="bfloat16", choices=KERNEL_DTYPES,
                       help="value dtype (default: %(default)s)")
    check.add_argument("--param-dtype", default="float16", choices=KERNEL_DTYPES,
                       help="locations/weights dtype (default: %(default)s)")
    check.add_argument("--value-layout", choices=VALUE_LAYOUTS, help="default: the preset's")
    check.add_argument("--locations-layout", choices=LOCATION_LAYOUTS, help="default: the preset's")
    check.add_argument("--align-corners", action="store_true")
    check.add_argument("--padding-mode", default="zeros", choices=KERNEL_PADDING_MODES)
    check.add_argument("--gather-method", choices=["transpose", "copy"], help="default: the kernel's choice")
    check.add_argument("--forward-only", action="store_true", help="skip the backward kernel")
    check.add_argument("--report", action="store_true",
                       help="after the result, print both kernels' cost reports (instructions "
                            "and elements per engine, DMA traffic, descriptors, SBUF/PSUM use)")
    check.add_argument("--no-report", dest="report", action="store_false",
                       help=argparse.SUPPRESS)  # the default now; still accepted
    check.add_argument("--quiet", "-q", action="store_true",
                       help="print only the result line (and failed rows), no progress bar; "
                            "without it, runs longer than 2 s show a "
                            "progress bar on stderr when stderr is a terminal")

    profile = _emulator_command(sub, cmd_profile, "as for `check`",
                                help="modelled Trainium timeline of one kernel (Chrome trace + PNG)")
    profile.add_argument("--kernel", default="fwd", choices=["fwd", "bwd"])
    profile.add_argument("--target", default=None, choices=["trn2", "trn3"],
                         help="default: trn2 (or NEURON_PLATFORM_TARGET_OVERRIDE)")
    profile.add_argument("--out", default="profile",
                         help="output directory, created if missing and checked before the "
                              "simulation (default: %(default)s)")

    # `bench` is dispatched in main() before parsing; listed here for --help.
    sub.add_parser("bench", help="GPU timing table (Triton, reference, Deformable-DETR CUDA op); "
                                 "`nkilib-msda bench --help` for its options")
    return parser


def _emulator_command(sub: argparse._SubParsersAction, func: Callable[[argparse.Namespace], int],
                      preset_list: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand that runs kernels in the emulator on a shape preset (``check``,
    ``profile``): named after ``func`` (``cmd_NAME``), described by its docstring, with
    ``--preset`` (a name of :data:`nkilib_msda.workloads.PRESETS` or an older alias),
    ``--lnc`` and ``--seed``; ``kwargs`` go to ``add_parser`` (help, epilog)."""
    from nkilib_msda.workloads import PRESET_ALIASES, PRESETS

    parser = sub.add_parser(func.__name__.removeprefix("cmd_"),
                            description=inspect.cleandoc(func.__doc__ or ""),
                            formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS), metavar="PRESET",
                        type=lambda name: PRESET_ALIASES.get(name, name),
                        help=f"shape preset, {preset_list} (default: %(default)s)")
    parser.add_argument("--lnc", type=int, default=read_env("NEURON_LOGICAL_NC_CONFIG") or 1,
                        choices=[1, 2], help="logical NeuronCores (default: NEURON_LOGICAL_NC_CONFIG, "
                                             "else 1; now %(default)s)")
    parser.add_argument("--seed", type=int_at_least(0), default=0,
                        help="random seed of the inputs, >= 0 (default: %(default)s)")
    parser.set_defaults(func=func)
    return parser


def _preset_table() -> str:
    from nkilib_msda.workloads import (PRESET_ALIASES, PRESET_DESCRIPTIONS, PRESET_EMULATOR_MEMORY,
                                       PRESET_EMULATOR_TIME, PRESETS)

    lines = ["presets (emulator time and peak memory for forward + backward at LNC 1, roughly;",
             "--lnc 2 takes about as long and up to ~1.5x the memory):"]
    for name in sorted(PRESETS):
        lines.append(f"  {name:<19} {PRESET_EMULATOR_TIME[name]:>6} {PRESET_EMULATOR_MEMORY[name]:>7}"
                     f"  {PRESET_DESCRIPTIONS[name]}")
    lines.append("older names still accepted: " + ", ".join(
        f"{old} = {new}" for old, new in sorted(PRESET_ALIASES.items())))
    return "\n".join(lines)


# Exit codes, listed by `nkilib-msda --help`. 130 and 141 are what a shell reports for a
# program ended by SIGINT / SIGPIPE (128 + signal number), so pipelines and `set -o pipefail`
# treat nkilib-msda like any Unix tool.
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_CODES_HELP = """exit codes:
  0    success (check: every tolerance met)
  1    check: a tolerance was exceeded
  2    bad arguments or environment variables (one line on stderr)
  130  interrupted (Ctrl-C; one line on stderr)
  141  the reader of stdout went away (e.g. `| head -n 1`); nothing more is printed
       (--help and --version exit 0 then, as argparse ignores that write error)"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; bad input (arguments, environment variables) exits 2 with one line on
    stderr, Ctrl-C exits 130 with one line, a closed stdout pipe exits 141 quietly."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            validate_environment()
            if argv[:1] == ["bench"]:  # the rest belongs to the benchmark's own parser
                return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
            args = build_parser().parse_args(argv)  # --help / --version exit from here
            return int(args.func(args))
        finally:
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
    except EnvironmentVariableError as exc:
        print(f"nkilib-msda: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nkilib-msda: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of the unwritable
    pipe does not print a second error (the recipe of Python's ``signal`` docs)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in tests)
        pass


if __name__ == "__main__":
    sys.exit(main())
