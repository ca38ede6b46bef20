"""The serial pool threads of backends/_cpu_workers.py: blocks run on other threads whose ATen
ops are serial, in block order of results, without grad, with exceptions propagated; one torch
thread (or a block inside a pool thread) runs inline; the caller's thread count is untouched."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from nkilib_msda.backends.reference import _cpu_workers


@pytest.fixture
def threads():
    """Set torch's thread count for the test, restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _where(_block: object) -> tuple[int, int, bool]:
    return threading.get_native_id(), torch.get_num_threads(), torch.is_grad_enabled()


def test_pool_is_available_on_linux_with_openmp():
    if sys.platform != "linux" or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("the pool needs Linux and torch's OpenMP runtime")
    assert _cpu_workers.pool_available()


def test_blocks_run_on_serial_pool_threads_in_order(threads):
    if not _cpu_workers.pool_available():
        pytest.skip("no serial pool on this platform")
    threads(2)
    caller = threading.get_native_id()
    assert _cpu_workers.map_blocks(lambda b: b * b, list(range(50))) == [b * b for b in range(50)]
    where = _cpu_workers.map_blocks(_where, list(range(8)))
    assert all(tid != caller and n == 1 and not grad for tid, n, grad in where)
    assert torch.get_num_threads() == 2  # the caller's count is untouched


def test_one_thread_or_one_block_runs_inline(threads):
    caller = threading.get_native_id()
    threads(2)
    assert [w[0] for w in _cpu_workers.map_blocks(_where, [0])] == [caller]
    threads(1)
    assert [w[0] for w in _cpu_workers.map_blocks(_where, [0, 1, 2])] == [caller] * 3
    assert _cpu_workers.call_serial(lambda: _where(None))[0] == caller


def test_call_serial_spreads_its_blocks_over_the_callers_thread_count(threads):
    if not _cpu_workers.pool_available():
        pytest.skip("no serial pool on this platform")
    threads(2)
    caller = threading.get_native_id()

    def coordinate() -> tuple[tuple[int, int, bool], list[tuple[int, int, bool]]]:
        return _where(None), _cpu_workers.map_blocks(_where, list(range(6)))

    (tid, n, grad), blocks = _cpu_workers.call_serial(coordinate)
    assert tid != caller and n == 1 and not grad
    assert all(b[0] not in (tid, caller) and b[1] == 1 for b in blocks)
    assert torch.get_num_threads() == 2


def test_exceptions_propagate(threads):
    threads(2)

    def fail(block: int) -> int:
        if block == 3:
            raise ValueError("block 3")
        return block

    with pytest.raises(ValueError, match="block 3"):
        _cpu_workers.map_blocks(fail, list(range(6)))
    with pytest.raises(ValueError, match="block 3"):
        _cpu_workers.call_serial(lambda: fail(3))


def _blocks_in_child(queue) -> None:
    torch.set_num_threads(2)
    queue.put(_cpu_workers.map_blocks(lambda b: b + 1, [1, 2, 3]))


def test_a_forked_child_makes_its_own_pool(threads):
    if not _cpu_workers.pool_available():
        pytest.skip("no serial pool on this platform")
    import multiprocessing

    threads(2)
    _cpu_workers.map_blocks(lambda b: b, [0, 1])  # the parent's pool threads exist
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_blocks_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == [2, 3, 4]
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_a_failing_block_cancels_the_blocks_not_yet_started(threads):
    """Block 0 fails while blocks 0 and 1 hold both pool threads: the queued blocks 2.. never
    run (the caller is not kept waiting for work whose result it will not use)."""
    if not _cpu_workers.pool_available():
        pytest.skip("no serial pool on this platform")
    threads(2)
    started, release, ran = threading.Barrier(2), threading.Event(), []

    def block(i: int) -> int:
        ran.append(i)
        if i < 2:
            started.wait(timeout=60)  # both threads busy: the other blocks are queued
            if i == 0:
                raise ValueError("block 0 failed")
            release.wait(timeout=60)
        return i

    def release_after_failure():
        try:
            return _cpu_workers.map_blocks(block, list(range(20)))
        finally:
            release.set()

    with pytest.raises(ValueError, match="block 0 failed"):
        release_after_failure()
    _drain_pool(2)
    assert sorted(ran) == [0, 1], ran


def _drain_pool(workers: int) -> None:
    """Wait until every task queued on the pool before this call has been taken."""
    pool = _cpu_workers._pool(workers)
    for f in [pool.submit(lambda: None) for _ in range(workers)]:
        f.result(timeout=60)


_CTRL_C = """
import signal, threading, torch
from nkilib_msda.backends.reference import _cpu_workers

signal.signal(signal.SIGINT, signal.default_int_handler)
torch.set_num_threads(2)
assert _cpu_workers.pool_available()
main = threading.main_thread().ident
started, release, ran = threading.Barrier(2), threading.Event(), []

def block(i):
    ran.append(i)
    if i < 2:
        if started.wait(timeout=60) == 0:  # both pool threads busy, blocks 2.. queued
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, delivered to the waiting caller
        release.wait(timeout=60)
    return i

try:
    _cpu_workers.call_serial(lambda: _cpu_workers.map_blocks(block, list(range(20))))
    print("not interrupted")
except KeyboardInterrupt:
    release.set()
pool = _cpu_workers._pool(2)
for f in [pool.submit(lambda: None) for _ in range(2)]:
    f.result(timeout=60)
print("ran", sorted(ran))
"""


def test_ctrl_c_while_waiting_cancels_the_blocks_not_yet_started():
    """Ctrl-C in a caller waiting on call_serial: KeyboardInterrupt reaches the caller at once,
    and the blocks not yet started never run (they used to run to the end, for seconds, after
    the call had returned). A real SIGINT to the main thread, in a subprocess."""
    import os
    import subprocess

    if not _cpu_workers.pool_available():
        pytest.skip("no serial pool on this platform")
    proc = subprocess.run([sys.executable, "-c", _CTRL_C], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == ["ran [0, 1]"], proc.stdout


def test_the_pool_finds_torchs_openmp_through_threadpoolctl():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch without OpenMP")
    openmp = [lib for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "openmp"]
    assert openmp, "threadpoolctl reports no OpenMP runtime although torch uses one"
    names = {setter.__name__ for setter in _cpu_workers._serial_setters()}
    assert "omp_set_num_threads" in names


def test_a_pool_that_cannot_be_made_serial_is_off_with_one_warning(monkeypatch, threads):
    monkeypatch.setattr(_cpu_workers, "_serial_setters", lambda: [])
    monkeypatch.setattr(_cpu_workers, "_available", None)
    threads(2)
    with pytest.warns(RuntimeWarning, match="thread pool is off") as caught:
        assert not _cpu_workers.pool_available()
        assert not _cpu_workers.pool_available()  # decided once, warned once
    assert len(caught) == 1
    caller = threading.get_native_id()
    assert [w[0] for w in _cpu_workers.map_blocks(_where, [0, 1])] == [caller] * 2
