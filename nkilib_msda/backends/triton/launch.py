"""Launching compiled Triton kernels with little host work (the Triton backend's launcher).

:class:`Launcher` holds one kernel with its grid, scalars and constexprs. Its first launch goes
through Triton's JIT; later launches call the compiled kernel's C launcher directly
(:func:`_bare_launch`), which is what decoder-sized calls are bounded by on the host
(benchmarks/host_overhead.md has the profile). ``FAST_LAUNCH[0] = False`` (or
``NKILIB_MSDA_TRITON_FAST_LAUNCH=0``) keeps every launch on the JIT path.
"""

from __future__ import annotations

from typing import Any

from nkilib_msda._env import read_env
from nkilib_msda.backends.triton.plan import _interpreting


class Launcher:
    """One kernel with fixed grid, scalars and constexprs; launches re-use the compiled kernel.

    The first launch goes through Triton's JIT (``kernel[grid](...)``), which returns the
    compiled kernel; later launches with the same tensor dtypes and 16-byte alignment call
    that compiled kernel directly, skipping the JIT's per-call argument binding and cache-key
    work (host microseconds that decoder-sized calls are bounded by). Any failure of the direct
    path falls back to the JIT path for good.
    """

    def __init__(self, kernel, grid: tuple, scalars: tuple, kwargs: dict) -> None:
        self.kernel, self.grid, self.scalars, self.kwargs = kernel, grid, scalars, kwargs
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
            try:  # first direct launch: an argument mismatch raises before anything runs
                runner(*tensors, *self.scalars, *self._constexpr_tail)
                self._verified.add(key)
                return
            except Exception:  # noqa: BLE001 - an unexpected Triton version: Triton's own
                # runner next time (after a bare launch failed), else the JIT path for good
                self._runners[key] = getattr(runner, "fallback", None) or False
        compiled = self.kernel[self.grid](*tensors, *self.scalars, **self.kwargs)
        if runner is None:
            self._runners[key] = self._direct(compiled)

    def _direct(self, compiled):
        grid = self.grid + (1,) * (3 - len(self.grid))
        try:
            runner = compiled[grid]
        except Exception:  # noqa: BLE001 - no compiled-kernel launcher in this Triton version
            return False
        return _bare_launch(compiled, grid, runner) or runner


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
    launch_metadata, enter_hook, exit_hook, *args)`` (Triton 3.4 to 3.9; the C launcher skips
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
