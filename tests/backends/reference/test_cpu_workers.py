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
