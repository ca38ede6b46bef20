"""``nki.jit``, ``kernel[lnc]`` and ``simulate``: run a kernel eagerly on NumPy data.

LNC degree (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html,
announce-intent-eos-nki-spmd-launch-grid.html, compiler/error-codes/EVRF066.html): the
``NEURON_LOGICAL_NC_CONFIG`` environment variable (1 or 2; default 1), or a bracket launch
``kernel[2](...)`` (accepted with a ``DeprecationWarning``; a bracket value that differs from an
explicitly set environment variable is an error, as the compiler rejects a mismatching SPMD
dimension), or the package's ``simulate(kernel, lnc=...)``. The kernel always runs on every core
of the LNC, with or without a grid: ``nl.num_programs()`` is the degree and ``nl.program_id(0)``
the core; ``nl.program_ndim()`` is 1 with a grid (bracket launch, or ``simulate(lnc=...)``,
which the package defines as equivalent) and 0 without one.

Each program (physical core) runs the kernel function in its own thread with its own
context; with LNC=2 the two programs share the input tensors and every ``shared_hbm``
allocation (the k-th allocation of each program is one storage). Only one program runs at a
time; the baton passes at ``core_barrier`` / ``sendrecv`` and at program end (see context.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import threading
import warnings
from typing import Any, Callable

import numpy as np

from nkilib_msda._env import EnvironmentVariableError, check_package_variables, read_env
from nkilib_msda.simulator.context import (ExecutionContext, ProgramScheduler, SharedState,
                                           SimOptions, activate, current_or_none)
from nkilib_msda.simulator.kernel_io import (check_signature, flatten_outputs, KernelInputs,
                                             same_output, output_to_numpy, to_torch)
from nkilib_msda.simulator.errors import (NkiError, OtherProgramAborted, env_error,
                                          nki_error)
from nkilib_msda.simulator.progress import Progress, ProgressDisplay, progress_spec
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.source_rules import SOURCE_RULE_MODES, check_kernel_source
from nkilib_msda.simulator.targets import get_target
from nkilib_msda.simulator.timing import Timeline, Timing, TimingWarning
from nkilib_msda.simulator.tensor import NkiTensor

__all__ = ["jit", "JitKernel", "simulate", "lnc_degree"]

_REMOVED_JIT_OPTIONS = ("platform_target",)
# nki.jit(func=None, mode='auto', **kwargs) (latest nki/api/generated/nki.jit.html) and
# nki.jit(fn=None, *, compile_config=None, specialization_config=None, **kwargs) (v2.33.1 page).
_JIT_MODES = ("auto", "jax", "torchxla")
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


def lnc_degree() -> int | None:
    """The LNC degree set by ``NEURON_LOGICAL_NC_CONFIG`` (1 or 2), None when unset."""
    check_package_variables()  # another variable's error is not an LNC error
    try:
        degree: int | None = read_env(LNC_ENV)
    except EnvironmentVariableError as exc:
        raise env_error("nki.jit", "LNC degree", exc, "the LNC degree must be 1 or 2") from None
    return degree


# Where JitKernel.set_argument_check keeps a kernel's argument check (on its Python function).
_ARGUMENT_CHECK = "emulator_argument_check"


class JitKernel:
    """A ``@nki.jit`` kernel. ``kernel[lnc]`` sets the LNC degree; calling it with NumPy
    arrays outside a running kernel simulates it; inside a kernel it is a plain call."""

    def __init__(self, func: Callable[..., Any], lnc: int | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.func = func
        self.lnc = lnc
        self.options = dict(options or {})
        functools.update_wrapper(self, func)

    def set_argument_check(self, check: Callable[..., Any]) -> None:
        """Give this kernel an argument check that :func:`simulate` calls with the caller's
        arguments when it cannot turn them into kernel tensors (e.g. an empty array), so the
        kernel's own error explains the call; valid calls never run it. Kept on the Python
        function, so ``kernel[2]`` and ``simulate(kernel)`` share it."""
        setattr(self.func, _ARGUMENT_CHECK, check)

    def __getitem__(self, lnc: Any) -> "JitKernel":
        if isinstance(lnc, tuple) or isinstance(lnc, bool) or not isinstance(lnc, (int, np.integer)) \
                or int(lnc) not in (1, 2):
            raise nki_error("nki.jit", "launch grid",
                            f"kernel[lnc] takes lnc = 1 or 2 (one grid dim, the LNC degree), got {lnc!r}")
        warnings.warn("the launch-grid bracket syntax kernel[lnc] is being deprecated; set "
                      f"{LNC_ENV}=1 or 2 instead", DeprecationWarning, stacklevel=2)
        return JitKernel(self.func, int(lnc), self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_or_none() is not None:
            return self.func(*args, **kwargs)  # nested jit calls are inlined
        return simulate(self)(*args, **kwargs)

    def __repr__(self) -> str:
        suffix = f"[{self.lnc}]" if self.lnc else ""
        return f"nki.jit({getattr(self.func, '__qualname__', self.func)}){suffix}"


def jit(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``@nki.jit`` or ``@nki.jit(**options)``.

    ``mode`` ("auto", "jax", "torchxla"), ``compile_config`` (``nki.compiler.CompileConfig``),
    ``specialization_config`` (``nki.compiler.SpecializationConfig``) and any further keyword
    (``**kwargs`` on both doc pages, e.g. ``debug_kernel=``, ``experimental_flags=``) are
    accepted and do not change what the kernel computes; ``platform_target=`` was removed in
    0.3 (the target comes from NEURON_PLATFORM_TARGET_OVERRIDE)."""
    from nkilib_msda.simulator.compiler import CompileConfig, SpecializationConfig

    for key in _REMOVED_JIT_OPTIONS:
        if key in kwargs:
            raise nki_error("nki.jit", "removed option",
                            f"{key}= was removed in NKI 0.3; set NEURON_PLATFORM_TARGET_OVERRIDE "
                            "or pass target= to simulate()")
    mode = kwargs.get("mode", "auto")
    if mode not in _JIT_MODES:
        raise nki_error("nki.jit", "mode", f"mode must be one of {_JIT_MODES}, got {mode!r}")
    for key, cls in (("compile_config", CompileConfig),
                     ("specialization_config", SpecializationConfig)):
        value = kwargs.get(key)
        if value is not None and not isinstance(value, cls):
            raise nki_error("nki.jit", key, f"{key} must be an nki.compiler.{cls.__name__} or "
                            f"None, got {type(value).__name__}")
    if func is None:
        return lambda f: JitKernel(f, options=kwargs)
    if isinstance(func, JitKernel):
        return func
    return JitKernel(func, options=kwargs)


class _Runner:
    def __init__(self, kernel: JitKernel, lnc: int, program_ndim: int, target: Any,
                 report: bool, options: SimOptions, progress: Progress | None = None) -> None:
        self.kernel = kernel
        self.progress = progress
        self.lnc = lnc
        self.program_ndim = program_ndim
        self.target = get_target(target)
        self.want_report = report
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_or_none() is not None:
            raise nki_error("simulate", "nested simulate", "simulate() cannot run inside a kernel")
        func = self.kernel.func
        sig = check_signature(func)
        check_kernel_source(func, self.options.source_rules)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{func.__qualname__}: {exc}") from None
        inputs = KernelInputs()
        try:
            kargs = {name: inputs.convert(v, name) for name, v in bound.arguments.items()}
        except NkiError:
            # the kernel's own check, where it has one, explains a rejected argument better
            # (JitKernel.set_argument_check)
            check = getattr(func, _ARGUMENT_CHECK, None)
            if check is not None:
                check(*bound.args, **bound.kwargs)
            raise
        shared = SharedState(self.lnc, self.target, self.options,
                             ProgramScheduler(self.lnc, self.options.barrier_timeout_s),
                             timeline=Timeline(self.target.name, self.lnc)
                             if self.want_report and timing_enabled() else None)
        contexts = [ExecutionContext(shared, pid, self.program_ndim) for pid in range(self.lnc)]
        results: list[Any] = [None] * self.lnc
        errors: list[BaseException | None] = [None] * self.lnc

        def run_program(pid: int) -> None:
            ctx = contexts[pid]
            failed = False
            try:
                shared.scheduler.wait_turn(pid)
                if shared.scheduler.aborted:
                    raise OtherProgramAborted(f"program {pid}: another program failed")
                with activate(ctx):
                    results[pid] = func(**kargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                errors[pid] = exc
                failed = True
            finally:
                shared.scheduler.finish(pid, failed)

        with self._progress_display(kargs, contexts, shared.scheduler):
            if self.lnc == 1:
                run_program(0)
            else:
                shared.race_tracking = True
                try:
                    _run_threads(run_program, self.lnc, shared.scheduler)
                finally:
                    shared.race_tracking = False  # reading the outputs back is not an access
        first_error = next((e for e in errors if e is not None and not _is_abort(e)), None)
        first_error = first_error or next((e for e in errors if e is not None), None)
        if first_error is not None:
            raise first_error
        outputs = [flatten_outputs(r, pid) for pid, r in enumerate(results)]
        tensors, is_tuple, is_none = outputs[0]
        for pid, (other, other_tuple, _) in enumerate(outputs[1:], start=1):
            if len(other) != len(tensors) or other_tuple != is_tuple or not all(
                    same_output(a, b) for a, b in zip(tensors, other)):
                raise nki_error("kernel return", "LNC outputs differ",
                                f"program {pid} returned a different output set than program 0; "
                                "all programs must return the same shared_hbm tensors")
        with activate(contexts[0]):  # the run's strictness decides unwritten-output reads
            arrays: list[Any] = [output_to_numpy(t, i) for i, t in enumerate(tensors)]
        inputs.write_back()
        if inputs.torch_in:  # torch tensors in -> torch tensors out (nki.simulate, 2.32 docs)
            arrays = [to_torch(a) for a in arrays]
        report = CostReport.merged(ctx.report for ctx in contexts)
        report.programs = [ctx.report for ctx in contexts]
        if shared.timeline is not None:
            if shared.timeline.failure is None:
                report.timing = Timing.from_timeline(shared.timeline)
            else:
                warnings.warn(f"the timing model failed ({shared.timeline.failure}); "
                              "report.timing is None", TimingWarning, stacklevel=2)
        if is_none:
            return (report,) if self.want_report else None
        if is_tuple and isinstance(results[0], list):
            return (list(arrays), report) if self.want_report else list(arrays)
        if is_tuple:
            return tuple(arrays) + ((report,) if self.want_report else ())
        return (arrays[0], report) if self.want_report else arrays[0]


    def _progress_display(self, kargs: dict[str, Any], contexts: list[ExecutionContext],
                          scheduler: ProgramScheduler) -> Any:
        """The progress bar of this run (progress.py), or a no-op context."""
        spec = self.progress
        if spec is None:
            return contextlib.nullcontext()
        name = getattr(self.kernel.func, "__name__", "kernel")
        streamed = None
        if spec.streamed_input is not None:
            arrays = [k for k, v in kargs.items() if isinstance(v, NkiTensor)]
            if spec.streamed_input not in arrays:
                raise ValueError(f"simulate: progress names {spec.streamed_input!r}, which is not "
                                 f"an array argument of {name}; its array arguments: {arrays}")
            streamed = kargs[spec.streamed_input].storage
        return ProgressDisplay(spec, name, streamed, contexts, scheduler)


def _resolve_strict(strict: bool | None, kernel: JitKernel) -> bool:
    """``strict=`` if given, else ``@nki.jit(strict=...)``, else NKILIB_MSDA_EMULATOR_STRICT."""
    if strict is None:
        strict = kernel.options.get("strict")
    if strict is None:
        strict = read_env(STRICT_ENV)
    if not isinstance(strict, bool):
        raise ValueError(f"simulate: strict must be True, False or None, got {strict!r}")
    return strict


STRICT_ENV = "NKILIB_MSDA_EMULATOR_STRICT"  # old name NKILIB_MSDA_SIM_STRICT: see _env
TIMING_ENV = "NKILIB_MSDA_EMULATOR_TIMING"
FULL_INDIRECT_ENV = "NKILIB_MSDA_EMULATOR_FULL_INDIRECT"


def timing_enabled() -> bool:
    """The timing model runs with ``report=True`` unless ``NKILIB_MSDA_EMULATOR_TIMING=0``."""
    return bool(read_env(TIMING_ENV))


def _is_abort(exc: BaseException) -> bool:
    return isinstance(exc, OtherProgramAborted)


def _run_threads(run_program: Callable[[int], None], n: int, scheduler: ProgramScheduler) -> None:
    """Run ``n`` programs in threads. Ctrl-C (KeyboardInterrupt in the caller's thread) aborts
    the run: waiting programs wake with OtherProgramAborted and the running one gets it raised
    asynchronously at its next bytecode, so both stop promptly; then KeyboardInterrupt
    propagates."""
    threads = [threading.Thread(target=run_program, args=(pid,), daemon=True,
                                name=f"nki-program-{pid}") for pid in range(n)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.05)
    except KeyboardInterrupt:
        scheduler.abort()
        for th in threads:
            if th.is_alive() and th.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(th.ident),
                                                           ctypes.py_object(OtherProgramAborted))
        for th in threads:
            th.join(5.0)
        raise


def simulate(kernel: Any, lnc: int | None = None, target: Any = None, report: bool = False,
             duplicate_scatter: str = "error",
             barrier_timeout_s: float | None = None, source_rules: str = "error",
             is_operator: str = "off", strict: bool | None = None,
             progress: bool | str | Progress = False) -> Callable[..., Any]:
    """``simulate(kernel, lnc=None, target="trn2", report=False)(*args, **kwargs)``; also
    ``nki.simulate(kernel)(...)`` / ``nki.simulate(kernel[2])(...)`` as the official simulator.

    - lnc: 1 or 2 (the LNC degree). None: the kernel's ``kernel[lnc]``, else
      ``NEURON_LOGICAL_NC_CONFIG``, else 1. ``lnc=`` or ``kernel[lnc]`` is a one-dim launch grid
      (``nl.program_ndim() == 1``); otherwise ``program_ndim() == 0``. ``nl.num_programs()`` is
      the degree in every form. A bracket value that contradicts an explicitly set
      ``NEURON_LOGICAL_NC_CONFIG`` raises NkiError ("LNC degree").
    - target: "trn2" (default, or NEURON_PLATFORM_TARGET_OVERRIDE) or "trn3".
    - report: also return a :class:`CostReport` as the last element.
    - duplicate_scatter: "error" (default) or "last_writer_wins" (emulate the race).
    - source_rules: "error" (default), "warn" or "off" for the AST rules on the kernel's code
      (no neuronxcc imports, no nl.divide/mod/fmod; see source_rules.py).
    - is_operator: accepted for compatibility and ignored (NKI 0.7 allows `is` / `is not`).
    - strict: uninitialised reads and hazard warnings raise NkiError (default: the kernel's
      ``@nki.jit(strict=...)``, else ``NKILIB_MSDA_EMULATOR_STRICT=1``, else off; read at call time).
    - progress: a progress bar on stderr for runs longer than 2 s, when stderr is a terminal
      (see progress.py): True counts instructions; the name of an argument the kernel reads
      once, front to back, shows the share read with an ETA; a :class:`Progress` sets both and
      the units. Default False.
    Arguments: NumPy arrays, or CPU torch tensors (then outputs are torch tensors too).
    """
    if not isinstance(kernel, JitKernel):
        if not callable(kernel):
            shape = getattr(kernel, "shape", None)
            got = type(kernel).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
            raise TypeError(f"simulate: kernel must be an @nki.jit function, got {got}; "
                            "call simulate(kernel)(*arguments)")
        kernel = JitKernel(kernel)
    if duplicate_scatter not in ("error", "last_writer_wins"):
        raise ValueError(f"simulate: duplicate_scatter must be 'error' or 'last_writer_wins', "
                         f"got {duplicate_scatter!r}")
    if lnc is not None and (isinstance(lnc, bool) or lnc not in (1, 2)):
        raise ValueError(f"simulate: lnc must be 1 or 2, got {lnc!r}")
    if lnc is not None and kernel.lnc is not None and lnc != kernel.lnc:
        raise ValueError(f"simulate: lnc={lnc} contradicts kernel[{kernel.lnc}]")
    options_lnc = lnc
    return _Launcher(kernel, options_lnc, target, report, duplicate_scatter, barrier_timeout_s,
                     source_rules, is_operator, strict, progress_spec(progress))


class _Launcher:
    """``simulate(...)``'s callable: resolves the LNC degree (env var read at call time)."""

    def __init__(self, kernel: JitKernel, lnc: int | None, target: Any, report: bool,
                 duplicate_scatter: str, barrier_timeout_s: float | None, source_rules: str,
                 is_operator: str, strict: bool | None, progress: Progress | None = None) -> None:
        for arg, mode in (("source_rules", source_rules), ("is_operator", is_operator)):
            if mode not in SOURCE_RULE_MODES:
                raise ValueError(f"simulate: {arg} must be one of {SOURCE_RULE_MODES}, got {mode!r}")
        self.kernel = kernel
        self.lnc = lnc
        self.target = target
        self.report = report
        self.strict = strict
        self.progress = progress
        self.options = SimOptions(duplicate_scatter=duplicate_scatter,
                                  barrier_timeout_s=barrier_timeout_s, source_rules=source_rules)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        env = lnc_degree()
        bracket = self.kernel.lnc
        if bracket is not None and env is not None and bracket != env:
            raise nki_error("nki.jit", "LNC degree",
                            f"kernel[{bracket}] launches an SPMD dimension of {bracket} but "
                            f"{LNC_ENV}={env}; the launch-grid dimension must equal the LNC degree")
        degree = self.lnc or bracket or env or 1
        ndim = 1 if (self.lnc is not None or bracket is not None) else 0
        options = dataclasses.replace(self.options, strict=_resolve_strict(self.strict, self.kernel),
                                      full_indirect=bool(read_env(FULL_INDIRECT_ENV)))
        return _Runner(self.kernel, degree, ndim, self.target, self.report,
                       options, self.progress)(*args, **kwargs)
