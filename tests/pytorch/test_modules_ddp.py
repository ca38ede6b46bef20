"""Two gloo processes train a model containing MSDeformAttn under DistributedDataParallel."""

from __future__ import annotations

import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import _torch_ddp_worker

TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_ddp_gloo_two_ranks_end_with_identical_parameters(tmp_path):
    steps = 4
    context = mp.start_processes(_torch_ddp_worker.train, args=(2, _free_port(), str(tmp_path), steps),
                                 nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"DDP workers did not finish within {TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(len(r["losses"]) == steps for r in results)
    assert results[0]["losses"] != results[1]["losses"]  # each rank saw its own data
    assert results[0]["moved"] > 0 and results[1]["moved"] > 0  # training changed the weights
    for p0, p1 in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(p0, p1)
