"""Threads that run ATen ops serially, for parallelism across independent blocks of work.

ATen parallelises a CPU op with one OpenMP region per op (elementwise ops of more than 32768
elements, gathers, ``embedding_bag``, sorts). A pipeline of many short ops therefore opens many
short regions, and on cores shared with other processes every region waits for its slowest
thread. :func:`map_blocks` instead runs whole blocks of the pipeline on a pool of
``torch.get_num_threads()`` Python threads (torch ops release the GIL) whose OpenMP thread count
is 1, so each op runs serially and the threads meet only when all blocks are done.

The OpenMP thread count is a per-thread setting (``omp_set_num_threads`` sets the calling
thread's ``nthreads-var``): it is set in the pool's own threads only, and nothing of torch's
global state changes. The OpenMP runtime is the one threadpoolctl reports loaded in this
process (its documented ``threadpool_info()``: each runtime's ``filepath`` and ``user_api``);
MKL's per-thread count (``MKL_Set_Num_Threads_Local``) is looked up in the MKL threadpoolctl
reports and in torch's own ``libtorch_cpu``, which links MKL statically. Where no runtime is
found (threadpoolctl not installed, torch without OpenMP) or the setting does not take effect,
blocks run in the calling thread, one after the other, with torch's own parallelism, and a
``RuntimeWarning`` says so once.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import warnings
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

__all__ = ["call_serial", "map_blocks", "pool_available"]

T = TypeVar("T")
R = TypeVar("R")

# Per-thread thread-count setters taking an int, by threadpoolctl's API name (MKL's C entry
# point is MKL_Set_Num_Threads_Local, the macro target of mkl_set_num_threads_local; the
# lower-case symbol is the Fortran one, which takes a pointer).
_OPENMP_SETTER = "omp_set_num_threads"
_MKL_SETTER = "MKL_Set_Num_Threads_Local"
_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
_coordinators: ThreadPoolExecutor | None = None
_available: bool | None = None
# In a coordinator thread (inside call_serial): the calling thread's torch thread count
# (``workers``) and the call's cancel event (``cancel``, set when the caller stops waiting).
_local = threading.local()


def _forget_pools() -> None:
    """After fork: the child has none of the parent's pool threads (an executor that believes
    it has them would never run a task), so it makes its own on first use."""
    global _lock, _coordinators
    _lock = threading.Lock()
    _pools.clear()
    _coordinators = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _setter(path: str, name: str) -> Callable[..., int] | None:
    """C function ``name`` of the shared library at ``path`` (already loaded: dlopen returns the
    same handle, hence the same settings), or None."""
    try:
        return getattr(ctypes.CDLL(path), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _serial_setters() -> list[Callable[..., int]]:
    """The per-thread setters of the OpenMP and MKL runtimes in this process (module docstring);
    empty without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    found = [(lib["filepath"], _OPENMP_SETTER if lib.get("user_api") == "openmp" else _MKL_SETTER)
             for lib in threadpool_info()
             if lib.get("user_api") == "openmp" or lib.get("internal_api") == "mkl"]
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    found += [(path, _MKL_SETTER) for path in sorted(glob.glob(os.path.join(torch_lib,
                                                                           "libtorch_cpu.*")))]
    return [setter for path, name in found if (setter := _setter(path, name)) is not None]


def _make_serial() -> None:
    """Pool thread initializer. ATen initialises a thread's counts on its first parallel op or
    thread-count query there (setting OpenMP's and MKL's per-thread counts to torch's global
    count), so query first, then set this thread's counts to 1: OpenMP's (ATen's own regions,
    oneDNN) and MKL's (float64 bmm)."""
    torch.get_num_threads()
    for setter in _serial_setters():
        setter(1)


def _check_serial() -> bool:
    return torch.get_num_threads() == 1


def pool_available() -> bool:
    """Whether pool threads really run ATen ops serially (checked once, in a pool thread)."""
    global _available
    with _lock:
        if _available is None:
            if "OpenMP" not in torch.__config__.parallel_info():
                _available, why = False, "torch was built without OpenMP"
            else:
                with ThreadPoolExecutor(1, initializer=_make_serial) as probe:
                    _available = probe.submit(_check_serial).result()
                why = ("no per-thread OpenMP setting took effect (is threadpoolctl installed? "
                       "pip install threadpoolctl)")
            if not _available:
                warnings.warn(f"nkilib_msda: the reference backend's CPU thread pool is off: "
                              f"{why}; blocks run one after another with torch's own "
                              f"parallelism", RuntimeWarning, stacklevel=2)
        return _available


def _pool(workers: int) -> ThreadPoolExecutor:
    with _lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="nkilib_msda_cpu",
                                                 initializer=_make_serial)
        return _pools[workers]


def _coordinator_pool() -> ThreadPoolExecutor:
    global _coordinators
    with _lock:
        if _coordinators is None:  # one thread per concurrent caller, made on demand
            _coordinators = ThreadPoolExecutor(8, thread_name_prefix="nkilib_msda_cpu_call",
                                               initializer=_make_serial)
        return _coordinators


def _caller_workers() -> int:
    workers = getattr(_local, "workers", None)
    return torch.get_num_threads() if workers is None else int(workers)


def call_serial(fn: Callable[[], R]) -> R:
    """``fn()`` in a thread whose ATen ops run serially (under ``torch.no_grad()``), its
    :func:`map_blocks` calls spread over as many pool threads as the caller has torch threads:
    the glue ops around the blocks (allocations, sorts, layout changes) then open no OpenMP
    regions either. In the calling thread when that has one torch thread or the pool is not
    available; exceptions propagate. When the caller stops waiting (Ctrl-C: KeyboardInterrupt)
    or ``fn`` fails, the blocks of its :func:`map_blocks` calls that have not started never run
    (a running block finishes its current ATen op: those cannot be interrupted)."""
    workers = _caller_workers()
    if workers <= 1 or getattr(_local, "workers", None) is not None or not pool_available():
        with torch.no_grad():
            return fn()

    cancel = threading.Event()

    def run() -> R:
        _local.workers, _local.cancel = workers, cancel
        try:
            with torch.no_grad():
                return fn()
        finally:
            _local.workers = _local.cancel = None

    future = _coordinator_pool().submit(run)
    try:
        return future.result()
    except BaseException:
        # Ctrl-C (KeyboardInterrupt) while waiting, or fn's own error: the blocks of fn's
        # map_blocks calls that have not started are dropped, so the pool stops at once
        cancel.set()
        future.cancel()
        raise


def map_blocks(fn: Callable[[T], R], blocks: Sequence[T]) -> list[R]:
    """``[fn(b) for b in blocks]``, run by as many serial pool threads as the caller has torch
    threads (inside :func:`call_serial`: its caller's), when that is more than 1 and the pool is
    available, else in the calling thread; under ``torch.no_grad()`` either way (grad mode is
    per thread, and ``fn`` computes, it is not differentiated). ``fn`` must not depend on which
    thread runs it or in which order the blocks run; exceptions propagate, and after one (or
    Ctrl-C) the blocks not yet started are skipped."""
    workers = min(_caller_workers(), len(blocks))
    if workers <= 1 or not pool_available():
        with torch.no_grad():
            return [fn(b) for b in blocks]
    # inside call_serial: its caller's cancel event (set on Ctrl-C there); else our own
    cancel = getattr(_local, "cancel", None) or threading.Event()
    pool = _pool(workers)
    futures = [pool.submit(_run_block, fn, block, cancel) for block in blocks]
    try:
        return [f.result() for f in futures]
    except BaseException:
        # a block failed, or Ctrl-C here: the blocks not yet started never run
        cancel.set()
        for f in futures:
            f.cancel()
        raise


def _run_block(fn: Callable[[T], R], block: T, cancel: threading.Event) -> R:
    """One block on a pool thread, without grad; skipped once ``cancel`` is set, and a failing
    block sets it itself, before its thread can take the next queued block."""
    if cancel.is_set():
        raise CancelledError("nkilib_msda: an earlier block failed or the call was interrupted")
    try:
        with torch.no_grad():
            return fn(block)
    except BaseException:
        cancel.set()
        raise
