"""Launching compiled Triton kernels with little host work (the Triton backend's launcher).

:class:`Launcher` holds one kernel with its grid, scalars and constexprs. Its first launch goes
through Triton's JIT; later launches call the compiled kernel's C launcher directly
(:func:`_bare_launch`), which is what decoder-sized calls are bounded by on the host
(benchmarks/host_overhead.md has the profile). ``FAST_LAUNCH[0] = False`` (or
``NKILIB_MSDA_TRITON_FAST_LAUNCH=0``) keeps every launch on the JIT path.

The direct launch relies on Triton internals (``CompiledKernel.run`` and its argument order) and
on ``torch._C._cuda_getCurrentRawStream``, so it is guarded three ways: it is used only with
the Triton versions in :data:`BARE_LAUNCH_TRITON` (others launch through the JIT, with one
warning); the first direct launch of each launcher and alignment is checked against Triton's
own launch of the same compiled kernel on copies of the arguments (bitwise for every tensor
but those the kernel accumulates into with atomics, which agree to 1e-5 relative L2), and on a
mismatch the results of Triton's launch are kept and that launcher stays on it, with a warning;
an argument mismatch that raises falls back the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

from nkilib_msda._env import read_env
from nkilib_msda.backends.triton.plan import _interpreting

# Triton versions (major, minor), inclusive, whose compiled-kernel launcher takes the arguments
# _bare_launch passes: read in the sources of 3.4.0, 3.6.0 and 3.9.0 (CompiledKernel.__getitem__
# calls ``run(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook,
# exit_hook, *args)`` in each); run on a GPU with 3.6.0.
BARE_LAUNCH_TRITON = ((3, 4), (3, 9))
# Atomically accumulated outputs are compared to this relative L2 distance (the order of the
# additions differs between any two launches); every other tensor bitwise.
ATOMIC_CHECK_RTOL = 1e-5

_WARNED: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def triton_version() -> tuple[int, int] | None:
    """(major, minor) of the installed Triton, None when it does not parse."""
    try:
        import triton

        major, minor = str(triton.__version__).split(".")[:2]
        return int(major), int(minor)
    except (ImportError, ValueError):
        return None


def bare_launch_supported() -> bool:
    """Whether this Triton's version is in :data:`BARE_LAUNCH_TRITON` (warns once if not)."""
    version = triton_version()
    low, high = BARE_LAUNCH_TRITON
    if version is not None and low <= version <= high:
        return True
    found = f"Triton {version[0]}.{version[1]}" if version else "this Triton (unknown version)"
    _warn_once("version", f"nkilib_msda: {found} is outside the versions "
                          f"{low[0]}.{low[1]}-{high[0]}.{high[1]} that the Triton backend's direct "
                          f"kernel launch was written for; launching through Triton's JIT instead "
                          f"(same results, more host time per call)")
    return False


class Launcher:
    """One kernel with fixed grid, scalars and constexprs; launches re-use the compiled kernel.

    The first launch goes through Triton's JIT (``kernel[grid](...)``), which returns the
    compiled kernel; later launches with the same tensor dtypes and 16-byte alignment call
    that compiled kernel directly, skipping the JIT's per-call argument binding and cache-key
    work (host microseconds that decoder-sized calls are bounded by). The first direct launch
    of each alignment is checked against Triton's own launch (see the module docstring);
    ``atomic`` lists the positions of the tensors the kernel accumulates into with atomics.
    """

    def __init__(self, kernel, grid: tuple, scalars: tuple, kwargs: dict,
                 atomic: tuple[int, ...] = ()) -> None:
        self.kernel, self.grid, self.scalars, self.kwargs = kernel, grid, scalars, kwargs
        self.atomic = atomic
        names = list(kernel.arg_names)
        self._constexpr_tail = tuple(kwargs[n] for n in names[len(names) - self._n_constexpr(names):])
        self._runners: dict = {}
        self._verified: set = set()

    def _n_constexpr(self, names: list) -> int:
        n = 0
        for name in reversed(names):
            if name not in self.kwargs:
                break
            n += 1
        return n

    def __call__(self, *tensors) -> None:
        if not FAST_LAUNCH[0]:
            self.kernel[self.grid](*tensors, *self.scalars, **self.kwargs)
            return
        key = _alignment_key(tensors)
        runner = self._runners.get(key)
        if runner:
            if key in self._verified:
                runner(*tensors, *self.scalars, *self._constexpr_tail)
                return
            if not _capturing() and self._first_direct(runner, key, tensors):
                return
        compiled = self.kernel[self.grid](*tensors, *self.scalars, **self.kwargs)
        if runner is None:
            self._runners[key] = self._direct(compiled)

    def _first_direct(self, runner, key, tensors: tuple) -> bool:
        """The first direct launch of ``key``, checked against Triton's launch of the same
        compiled kernel on copies of the arguments (aliased arguments stay aliased). False when
        it raised (nothing ran then)."""
        standard = getattr(runner, "fallback", None)
        copies: dict = {}
        before = [copies.setdefault(id(t), t.clone()) for t in tensors] if standard else []
        args = (*self.scalars, *self._constexpr_tail)
        try:  # an argument mismatch raises before anything runs
            runner(*tensors, *args)
        except Exception:  # noqa: BLE001 - an unexpected Triton: its own runner from now on
            # (after a bare launch failed), else the JIT path for good
            self._runners[key] = standard or False
            self._verified.add(key)
            return False
        self._verified.add(key)
        if standard is None:  # ``runner`` is Triton's own runner: nothing to compare with
            return True
        standard(*before, *args)
        pairs: dict = {}
        for i, (got, expected) in enumerate(zip(tensors, before)):
            atomic = i in self.atomic or (id(got) in pairs and pairs[id(got)][2])
            pairs[id(got)] = (got, expected, atomic)
        if not _same_results(list(pairs.values())):
            for got, expected, _atomic in pairs.values():
                got.copy_(expected)
            self._runners[key] = standard
            _warn_once(f"mismatch {_kernel_name(self.kernel)}", (
                f"nkilib_msda: the direct launch of Triton kernel {_kernel_name(self.kernel)} "
                f"gave other results than Triton's own launch on its first call; this kernel "
                f"launches through Triton from now on (results are Triton's)"))
        return True

    def _direct(self, compiled):
        if not bare_launch_supported():
            return False
        grid = self.grid + (1,) * (3 - len(self.grid))
        try:
            runner = compiled[grid]
        except Exception:  # noqa: BLE001 - no compiled-kernel launcher in this Triton version
            return False
        return _bare_launch(compiled, grid, runner) or runner


def _kernel_name(kernel: Any) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no copies or host reads then)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _same_results(pairs: list) -> bool:
    """Whether every (got, expected, atomic) pair agrees: bitwise (NaNs included), or, for
    atomic ones, the same non-finite elements and a relative L2 distance of at most
    ATOMIC_CHECK_RTOL."""
    import torch

    for got, expected, atomic in pairs:
        if atomic and got.is_floating_point():
            finite = torch.isfinite(expected)
            if not torch.equal(torch.isfinite(got), finite):
                return False
            diff = (got[finite].double() - expected[finite].double()).norm()
            if diff > ATOMIC_CHECK_RTOL * expected[finite].double().norm():
                return False
        elif not torch.equal(got.reshape(-1).view(torch.uint8),
                             expected.reshape(-1).view(torch.uint8)):
            return False
    return True


def _alignment_key(tensors: tuple) -> Any:
    """What a compiled kernel is specialised on besides dtypes (fixed per launcher): which
    pointers are 16-byte aligned. One int OR for the common all-aligned case."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    if not bits & 15:
        return "aligned"
    return tuple([t.data_ptr() & 15 for t in tensors])


def _bare_launch(compiled, grid: tuple, runner):
    """The compiled kernel's C launcher called as Triton's own runner calls it, minus the
    per-call Python around it (current device and stream lookups through Triton's driver, the
    launch-metadata object): ``run(gx, gy, gz, stream, function, packed_metadata,
    launch_metadata, enter_hook, exit_hook, *args)`` (BARE_LAUNCH_TRITON; the C launcher skips
    hooks given as None). While a launch hook is set (profilers such as Proton), ``runner``
    launches instead, so hooks see every launch. None when this Triton's compiled kernel has not that shape."""
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    packed = getattr(compiled, "packed_metadata", None)
    if run is None or function is None or packed is None:
        return None
    try:
        import torch
        from triton import knobs

        hooks = knobs.runtime
        stream_of = torch._C._cuda_getCurrentRawStream
        current_device = torch.cuda.current_device
    except (ImportError, AttributeError):
        return None
    gx, gy, gz = grid

    def launch(*args) -> None:
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            runner(*args)
            return
        run(gx, gy, gz, stream_of(current_device()), function, packed, None, None, None, *args)

    launch.fallback = runner  # type: ignore[attr-defined]
    return launch


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: a callable (Triton 3.4-3.6), or a non-empty ``HookChain``
    (later versions always hold a chain, empty unless a profiler adds to it)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def raw_stream(device) -> int:
    """The handle of the current CUDA stream on ``device``."""
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher calls
    if get is not None:
        return get(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


# Direct launches of compiled kernels (see Launcher); off under the interpreter.
FAST_LAUNCH = [bool(read_env("NKILIB_MSDA_TRITON_FAST_LAUNCH")) and not _interpreting()]
