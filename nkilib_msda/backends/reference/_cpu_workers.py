"""Threads that run ATen ops serially, for parallelism across independent blocks of work.

ATen parallelises a CPU op with one OpenMP region per op (elementwise ops of more than 32768
elements, gathers, ``embedding_bag``, sorts). A pipeline of many short ops therefore opens many
short regions, and on cores shared with other processes every region waits for its slowest
thread. :func:`map_blocks` instead runs whole blocks of the pipeline on a pool of
``torch.get_num_threads()`` Python threads (torch ops release the GIL) whose OpenMP thread count
is 1, so each op runs serially and the threads meet only when all blocks are done.

The OpenMP thread count is a per-thread setting (``omp_set_num_threads`` sets the calling
thread's ``nthreads-var``): it is set in the pool's own threads only, through the OpenMP runtime
that torch has loaded, and nothing of torch's global state changes. Where that runtime cannot be
found (not Linux, torch without OpenMP) or the setting does not take effect, blocks run in the
calling thread, one after the other, with torch's own parallelism.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

__all__ = ["call_serial", "map_blocks", "pool_available"]

T = TypeVar("T")
R = TypeVar("R")

# (function, libraries that may hold it): per-thread thread-count setters taking an int (MKL's
# C entry point is MKL_Set_Num_Threads_Local, the macro target of mkl_set_num_threads_local; the
# lower-case symbol is the Fortran one, which takes a pointer).
_SERIAL_SETTERS = (("omp_set_num_threads", ("libgomp", "libiomp5", "libomp")),
                   ("MKL_Set_Num_Threads_Local", ("libtorch_cpu", "libmkl_rt")))
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


def _loaded_function(name: str, libraries: tuple[str, ...]) -> Callable[..., int] | None:
    """C function ``name`` of a shared library already mapped into this process whose file
    name starts with one of ``libraries`` (the copy torch uses), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if path.rsplit("/", 1)[-1].startswith(libraries):
            try:
                # already loaded: dlopen returns the same handle, hence the same settings
                return getattr(ctypes.CDLL(path), name)  # type: ignore[no-any-return]
            except (OSError, AttributeError):
                continue
    return None


def _make_serial() -> None:
    """Pool thread initializer. ATen initialises a thread's counts on its first parallel op or
    thread-count query there (setting OpenMP's and MKL's per-thread counts to torch's global
    count), so query first, then set this thread's counts to 1: OpenMP's (ATen's own regions,
    oneDNN) and MKL's (float64 bmm)."""
    torch.get_num_threads()
    for name, libraries in _SERIAL_SETTERS:
        setter = _loaded_function(name, libraries)
        if setter is not None:
            setter(1)


def _check_serial() -> bool:
    return torch.get_num_threads() == 1


def pool_available() -> bool:
    """Whether pool threads really run ATen ops serially (checked once, in a pool thread)."""
    global _available
    with _lock:
        if _available is None:
            if "OpenMP" not in torch.__config__.parallel_info():
                _available = False
            else:
                with ThreadPoolExecutor(1, initializer=_make_serial) as probe:
                    _available = probe.submit(_check_serial).result()
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
