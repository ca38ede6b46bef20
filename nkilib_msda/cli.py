"""Command line: ``nkilib-msda check | profile | bench | info`` (also ``python -m nkilib_msda``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import platform
import sys
from typing import NoReturn, Sequence

from nkilib_msda._env import EnvironmentVariableError, read_env, validate_environment
from nkilib_msda._version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``prog: error: ...``) and exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _version_of(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except Exception as exc:  # noqa: BLE001 - report, don't crash `info`
        return f"import failed ({type(exc).__name__})"


def cmd_info(args: argparse.Namespace) -> int:
    from nkilib_msda import _nki

    print(f"nkilib_msda {__version__}")
    print(f"python {platform.python_version()} on {platform.machine()} ({platform.system()})")
    for module in ("numpy", "ml_dtypes", "torch", "triton", "transformers"):
        print(f"{module:<13} {_version_of(module)}")
    print(f"nki          {_nki.backend_name()}")
    print("torch backends:")
    for line in _available_backends():
        print(f"  {line}")
    return 0


def _available_backends() -> list[str]:
    if importlib.util.find_spec("torch") is None:
        return ["nki kernels via the simulator (install the `torch` extra for the torch backends)"]
    from nkilib_msda.backends import backend_availability

    return [f"{name}: {status}" for name, status in backend_availability().items()]


def cmd_check(args: argparse.Namespace) -> int:
    from nkilib_msda.check import run_check

    ok = run_check(preset=args.preset, dtype=args.dtype, param_dtype=args.param_dtype,
                   value_layout=args.value_layout, sampling_locations_layout=args.locations_layout,
                   align_corners=args.align_corners, padding_mode=args.padding_mode, lnc=args.lnc,
                   gather_method=args.gather_method, backward=not args.forward_only, seed=args.seed,
                   show_report=not args.no_report)
    return 0 if ok else 1


def cmd_profile(args: argparse.Namespace) -> int:
    from nkilib_msda.profile import run_profile

    run_profile(preset=args.preset, kernel=args.kernel, lnc=args.lnc, target=args.target,
                out=args.out, seed=args.seed)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from nkilib_msda.bench_gpu import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    from nkilib_msda.workloads import PRESET_ALIASES, PRESETS

    parser = _Parser(prog="nkilib-msda", description=__doc__)
    parser.add_argument("--version", action="version", version=f"nkilib_msda {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions, NKI (real or emulator), available backends")
    info.set_defaults(func=cmd_info)

    check = sub.add_parser(
        "check", help="run the NKI kernels in the emulator and compare with the reference",
        description="Run the NKI forward and backward kernels in the NumPy emulator on one shape "
                    "preset, print their errors against the float64 reference and the emulator's "
                    "cost report, and exit 1 if a tolerance is exceeded. Times are rough "
                    "(forward + backward on one laptop core).",
        epilog=_preset_table(), formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--preset", default="default", choices=sorted(PRESETS), metavar="PRESET",
                       type=lambda name: PRESET_ALIASES.get(name, name),
                       help="shape preset, see the list below (default: %(default)s)")
    check.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                       help="value dtype (default: %(default)s)")
    check.add_argument("--param-dtype", default="float16", choices=["bfloat16", "float16", "float32"],
                       help="locations/weights dtype (default: %(default)s)")
    check.add_argument("--value-layout", choices=["BLNC", "BNLC"], help="default: the preset's")
    check.add_argument("--locations-layout", choices=["BQHLP2", "B2QHLP"], help="default: the preset's")
    check.add_argument("--align-corners", action="store_true")
    check.add_argument("--padding-mode", default="zeros", choices=["zeros", "border"])
    check.add_argument("--lnc", type=int, default=read_env("NEURON_LOGICAL_NC_CONFIG") or 1,
                       choices=[1, 2], help="logical NeuronCores (default: NEURON_LOGICAL_NC_CONFIG, "
                                            "else 1; now %(default)s)")
    check.add_argument("--gather-method", choices=["transpose", "copy"], help="default: the kernel's choice")
    check.add_argument("--forward-only", action="store_true", help="skip the backward kernel")
    check.add_argument("--no-report", action="store_true", help="do not print the cost reports")
    check.add_argument("--seed", type=_non_negative_int, default=0,
                       help="random seed of the inputs, >= 0 (default: %(default)s)")
    check.set_defaults(func=cmd_check)

    profile = sub.add_parser(
        "profile", help="modelled Trainium timeline of one kernel (Chrome trace + PNG)",
        description="Run one NKI kernel in the emulator and write the timing model's Chrome "
                    "trace and a PNG timeline (docs/timing.md).")
    profile.add_argument("--preset", default="default", choices=sorted(PRESETS), metavar="PRESET")
    profile.add_argument("--kernel", default="fwd", choices=["fwd", "bwd"])
    profile.add_argument("--lnc", type=int, default=1, choices=[1, 2])
    profile.add_argument("--target", default=None, choices=["trn2", "trn3"],
                         help="default: trn2 (or NEURON_PLATFORM_TARGET_OVERRIDE)")
    profile.add_argument("--out", default="profile", help="output directory (default: %(default)s)")
    profile.add_argument("--seed", type=_non_negative_int, default=0)
    profile.set_defaults(func=cmd_profile)

    # `bench` is dispatched in main() before parsing; listed here for --help.
    sub.add_parser("bench", help="GPU timing table (Triton, reference, Deformable-DETR CUDA op); "
                                 "`nkilib-msda bench --help` for its options")
    return parser


def _preset_table() -> str:
    from nkilib_msda.workloads import (PRESET_ALIASES, PRESET_DESCRIPTIONS, PRESET_EMULATOR_TIME,
                                       PRESETS)

    lines = ["presets (emulator time for forward + backward, roughly):"]
    for name in sorted(PRESETS):
        lines.append(f"  {name:<19} {PRESET_EMULATOR_TIME[name]:>9}  {PRESET_DESCRIPTIONS[name]}")
    lines.append("older names still accepted: " + ", ".join(
        f"{old} = {new}" for old, new in sorted(PRESET_ALIASES.items())))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; bad input (arguments, environment variables) exits 2 with one line on stderr."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        validate_environment()
        if argv[:1] == ["bench"]:  # everything after `bench` belongs to the benchmark's own parser
            return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except EnvironmentVariableError as exc:
        print(f"nkilib-msda: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
