"""Allocation, poisoning, uninitialised reads, capacity and the shared operand checks."""

import gc

import numpy as np
import pytest

from nkilib_msda.simulator import NkiError, access, nisa, nl
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.targets import TARGETS

from _core_helpers import in_kernel, raises_rule


def test_new_buffers_are_poisoned_and_unwritten_reads_raise():
    def body(a):
        f = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        i = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf)
        h = nl.ndarray((16,), nl.bfloat16, buffer=nl.private_hbm)
        assert np.isnan(f.storage.data.view(np.float32)[:32]).all()
        assert (i.storage.data.view(np.int32)[:32] == 4).all()
        assert np.isnan(h.storage.data.view(nl.bfloat16.np)[:16].astype(np.float32)).all()
        with raises_rule("probe", "uninitialized read"):
            access.read(f, "probe")
        access.write(f[:, 0:4], np.ones(16), "probe")
        access.read(f[:, 0:4], "probe")  # the written half is fine
        with raises_rule("probe", "uninitialized read"):
            access.read(f[:, 3:5], "probe")
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        with raises_rule("dma_copy", "uninitialized read"):
            nisa.dma_copy(dst=out, src=f)
    in_kernel(body, np.zeros(1, np.float32))


def test_partial_bytes_of_a_wider_reinterpretation_are_uninitialised():
    def body(a):
        t = nl.ndarray((2, 4), nl.bfloat16, buffer=nl.sbuf)
        access.write(t[:, 0:1], np.ones(2), "probe")  # first half of each fp32 word
        with raises_rule("probe", "uninitialized read"):
            access.read(t.view(nl.float32)[:, 0:1], "probe")
    in_kernel(body, np.zeros(1, np.float32))


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_sbuf_capacity_per_target(target):
    budget = TARGETS[target].usable_sbuf_bytes_per_partition

    def body(a):
        assert nl.tile_size.total_available_sbuf_size == budget
        big = nl.ndarray((128, budget // 4), nl.float32, buffer=nl.sbuf)  # exactly the budget
        with raises_rule("ndarray", "SBUF capacity"):
            nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        del big
        gc.collect()
        nl.ndarray((128, 1024), nl.float32, buffer=nl.sbuf)  # freed memory is reusable
    in_kernel(body, np.zeros(1, np.float32), target=target)


def test_sbuf_budget_numbers():
    assert TARGETS["trn2"].usable_sbuf_bytes_per_partition == 212_992
    assert TARGETS["trn3"].usable_sbuf_bytes_per_partition == 256 * 1024 - 16 * 1024
    assert TARGETS["trn2"].psum_bytes_per_partition == 16 * 1024


def test_psum_capacity_and_bank_alignment():
    def body(a):
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        with raises_rule("ndarray", "PSUM capacity"):
            nl.ndarray((128, 1), nl.float32, buffer=nl.psum)
        del tiles
        with raises_rule("ndarray", "PSUM address"):
            nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=1024)
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=2048)
    in_kernel(body, np.zeros(1, np.float32))


def test_peak_memory_is_reported():
    def body(a):
        t1 = nl.ndarray((128, 1000), nl.float32, buffer=nl.sbuf)  # 4000 B / partition
        t2 = nl.ndarray((64, 500), nl.bfloat16, buffer=nl.sbuf)  # 1000 B / partition
        del t1, t2
        nl.ndarray((128, 100), nl.float32, buffer=nl.sbuf)
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
    (rep,) = in_kernel(body, np.zeros(1, np.float32), report=True)  # no outputs: (report,)
    assert rep.peak_sbuf_bytes_per_partition == 5000
    assert rep.peak_psum_bytes_per_partition == 2048
    assert rep.to_dict()["peak_sbuf_bytes_per_partition"] == 5000


def test_allocation_rules():
    def body(a):
        with raises_rule("ndarray", "partition limit"):
            nl.ndarray((129, 4), nl.float32, buffer=nl.sbuf)
        with raises_rule("ndarray", "on-chip rank"):
            nl.ndarray((128,), nl.float32, buffer=nl.sbuf)
        with raises_rule("ndarray", "buffer"):
            nl.ndarray((4, 4), nl.float32, buffer="sbuf")
        with raises_rule("ndarray", "shape"):
            nl.ndarray([4, 4], nl.float32, buffer=nl.sbuf)
        with raises_rule("dtype", "unsupported dtype"):
            nl.ndarray((4, 4), np.float64, buffer=nl.sbuf)
        assert nl.hbm is nl.private_hbm
        z = nl.zeros((4, 4), nl.int32, buffer=nl.sbuf)
        assert access.read(z, "t").tolist() == [[0] * 4] * 4
        f = nl.full((2, 3), 2.5, nl.float32, buffer=nl.sbuf)
        assert access.read(f, "t").tolist() == [[2.5] * 3] * 2
        o = nl.ones((3,), nl.float32, buffer=nl.private_hbm)
        assert access.read(o, "t").tolist() == [1.0] * 3
        e = nl.empty_like(f)
        assert e.shape == f.shape and e.buffer == "sbuf"
        zl = nl.zeros_like(f, dtype=nl.bfloat16)
        assert zl.dtype == nl.bfloat16
        eye = nl.shared_identity_matrix(4, dtype=nl.bfloat16)
        assert access.read(eye, "t").astype(np.float32).tolist() == np.eye(4).tolist()
        c = nl.shared_constant(np.arange(6, dtype=np.int32).reshape(2, 3))
        assert c.buffer == "shared_hbm" and access.read(c, "t").tolist() == [[0, 1, 2], [3, 4, 5]]
    in_kernel(body, np.zeros(1, np.float32))


def test_no_kernel_context_outside_a_kernel():
    with pytest.raises(NkiError, match="no running kernel"):
        nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
    with pytest.raises(NkiError, match="no running kernel"):
        current()


@pytest.mark.parametrize("start, count, ok", [
    (0, 128, True), (32, 32, True), (64, 64, True), (96, 32, True),
    (32, 33, False), (32, 64, False), (100, 4, False), (1, 1, False), (16, 16, False),
])
def test_compute_start_partition_rule(start, count, ok):
    def body(a):
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        view = t[start:start + count]
        if ok:
            access.check_compute_partitions("tensor_copy", view)
        else:
            with raises_rule("tensor_copy", "start partition"):
                access.check_compute_partitions("tensor_copy", view)
    in_kernel(body, np.zeros(1, np.float32))


def test_operand_agreement_and_buffer_checks():
    def body(a):
        x = nl.ndarray((64, 4, 8), nl.float32, buffer=nl.sbuf)
        y = nl.ndarray((64, 32), nl.bfloat16, buffer=nl.psum)
        z = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
        access.check_same_shape_per_partition("tensor_tensor", x, y)
        with raises_rule("tensor_tensor", "operand agreement"):
            access.check_same_shape_per_partition("tensor_tensor", x, z)
        with raises_rule("tensor_tensor", "operand agreement"):
            access.check_same_shape_per_partition("tensor_tensor", x, y[:, 0:16])
        assert access.partition_info(x[:, 1]) == (0, 64, 8)
        assert access.partition_info(z[32 - 32 + 16:32]) == (16, 16, 32)
        access.check_buffer("iota", "dst", x, {"sbuf"})
        with raises_rule("iota", "buffer access"):
            access.check_buffer("iota", "dst", y, {"sbuf"})
        with raises_rule("tensor_copy", "engine access"):
            access.check_compute_partitions("tensor_copy", a)
    in_kernel(body, np.zeros((4, 4), np.float32))


def test_storages_are_created_on_first_use_and_read_as_if_poisoned_at_allocation():
    """A tile's bytes and "written" mask come into being on first use (untouched tiles cost
    no memory); what a first read sees is the poison applied at allocation, and a tile
    written in part keeps the other part unwritten. Random values and shapes per run."""
    rng = np.random.default_rng()
    cols = int(rng.integers(3, 40))
    values = rng.standard_normal((4, cols)).astype(np.float32)

    def body(a):
        untouched = nl.ndarray((128, 4096), nl.float32, buffer=nl.sbuf)
        f = nl.ndarray((4, cols), nl.float32, buffer=nl.sbuf)
        i = nl.ndarray((4, cols), nl.int32, buffer=nl.sbuf)
        assert not untouched.storage.materialised and not f.storage.materialised
        assert not f.storage.fully_initialised
        access.write(f[:, 0:cols - 1], values[:, :cols - 1], "probe")
        assert f.storage.materialised
        got = access.read(f[:, 0:cols - 1], "probe")
        np.testing.assert_array_equal(np.asarray(got, np.float32).reshape(4, cols - 1),
                                      values[:, :cols - 1])
        with raises_rule("probe", "uninitialized read"):
            access.read(f[:, cols - 1:cols], "probe")  # the unwritten column
        raw = f.storage.data.view(np.float32)[:4 * cols].reshape(4, cols)
        assert np.isnan(raw[:, cols - 1]).all()  # poison applied when the bytes were created
        assert (i.storage.data.view(np.int32)[:4 * cols] == 4).all()
        assert not untouched.storage.materialised  # never used: never created
    in_kernel(body, np.zeros(1, np.float32))


def test_poisoning_a_used_storage_refills_it_and_forgets_what_was_written():
    from nkilib_msda.simulator.dtypes import to_nki_dtype

    def body(a):
        f = nl.ndarray((2, 8), nl.float32, buffer=nl.sbuf)
        access.write(f, np.ones(16), "probe")
        assert f.storage.fully_initialised
        f.storage.poison(to_nki_dtype(nl.float32))
        assert np.isnan(f.storage.data.view(np.float32)[:16]).all()
        assert not f.storage.init.any() and not f.storage.fully_initialised
        with raises_rule("probe", "uninitialized read"):
            access.read(f, "probe")
    in_kernel(body, np.zeros(1, np.float32))


def test_a_storage_without_bytes_yet_has_no_other_missing_attributes():
    from nkilib_msda.simulator.memory import Storage
    s = Storage("sbuf", 64, partitions=2, bytes_per_partition=32)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        s.nope  # noqa: B018
    assert not s.materialised
    assert s.data.size == s.init.size == s.padded == 64 and not s.init.any()
    assert s.materialised
