"""Timing model: each modelled instruction group, run in a kernel, costs what its documented
formula says (trn2; N = 512 elements per partition on 128 partitions unless stated)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _core_helpers import in_kernel, load, store
from nkilib_msda.simulator import nisa, nl

RNG = np.random.default_rng(7)
OVERHEAD = 64  # nominal compute_overhead_cycles
BF16 = ml_dtypes.bfloat16


def _busy(body, *arrays):
    *_, report = in_kernel(body, *arrays, report=True)
    assert report.timing.params["compute_overhead_cycles"] == OVERHEAD
    return report.timing.engine_busy_us


def _x(shape=(128, 512), dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _to_psum(t):
    p = nl.ndarray(t.shape, t.dtype, buffer=nl.psum)
    nisa.tensor_copy(dst=p, src=t)
    return p


def test_tensor_tensor_sbuf_2n_psum_n():
    def sbuf(ha, hb):
        a, b = load(ha), load(hb)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=out, data1=a, data2=b, op=nl.add)
        return store(out)

    def psum(ha, hb, with_tt=True):
        a, b = load(ha)[:, 0:256], load(hb)[:, 0:256]  # one 2 KiB PSUM bank of fp32
        pa = _to_psum(a)
        out = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        if with_tt:
            nisa.tensor_tensor(dst=out, data1=pa, data2=b, op=nl.add)
        else:
            nisa.tensor_copy(dst=out, src=b)
        return store(out)

    x, y = _x(), _x()
    assert _busy(sbuf, x, y)["vector"] * 1e3 == pytest.approx((2 * 512 + OVERHEAD) / 0.96)
    with_psum = _busy(psum, x, y)["vector"]
    copy_only = _busy(lambda a, b: psum(a, b, with_tt=False), x, y)["vector"]
    tt = (with_psum - copy_only) * 1e3 + (256 + OVERHEAD) / 0.96  # minus the copy it replaced
    assert tt == pytest.approx((256 + OVERHEAD) / 0.96)  # N: one input in PSUM


@pytest.mark.parametrize("dtype, cycles", [(np.float32, 512), (BF16, 512 / 4)])
def test_tensor_copy_perf_mode(dtype, cycles):
    def body(h):
        a = load(h)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=a)
        return store(out)

    busy = _busy(body, _x(dtype=dtype))["vector"] * 1e3
    assert busy == pytest.approx((max(64, cycles) + OVERHEAD) / 0.96)


def test_scalar_activation_n_at_1_2_ghz():
    def body(h):
        a = load(h)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.activation(dst=out, op=nl.exp, data=a)
        return store(out)

    assert _busy(body, _x())["scalar"] * 1e3 == pytest.approx((512 + OVERHEAD) / 1.2)


def test_gpsimd_iota_150_plus_n():
    def body(h):
        out = nl.ndarray((128, 512), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=out, pattern=[[1, 512]], offset=0)
        return store(out)

    assert _busy(body, _x())["gpsimd"] * 1e3 == pytest.approx((150 + 512 + OVERHEAD) / 1.2)


def test_matmul_and_pe_transpose_on_the_tensor_engine():
    def matmul(hs, hm):
        s, m = load(hs), load(hm)
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=out, stationary=s, moving=m)
        return store(_sbuf(out))

    def transpose(h):
        a = load(h)
        out = nl.ndarray((64, 128), a.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=out, data=a)
        return store(_sbuf(out))

    def _sbuf(p):
        s = nl.ndarray(p.shape, p.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        return s

    bf = _busy(matmul, _x((128, 128), BF16), _x((128, 512), BF16))["tensor"] * 1e3
    assert bf == pytest.approx(512 / 2.4)  # max(min(64, 128), 512) cycles at 2.4 GHz
    f32 = _busy(matmul, _x((128, 128)), _x((128, 512)))["tensor"] * 1e3
    assert f32 == pytest.approx(4 * 512 / 2.4)  # fp32: 4x
    tr = _busy(transpose, _x((128, 64), BF16))["tensor"] * 1e3
    assert tr == pytest.approx(128 / 2.4)  # max(P, min(64, F)) = max(128, 64)


def test_hwdge_dma_costs_600_ns_on_its_queue_and_swdge_charges_gpsimd():
    def hwdge(h):
        t = nl.ndarray(h.shape, h.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
        return store(t)

    busy = _busy(hwdge, _x())
    assert busy["queue_act"] * 1e3 == pytest.approx(600.0)

    def gather(h, hi):
        idx = load(hi)
        t = nl.ndarray((128, 64), h.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h.ap([[64, 128], [1, 64]], offset=0, vector_offset=idx,
                                      indirect_dim=0))
        return store(t)

    table = _x((1000, 64))
    rows = RNG.integers(0, 1000, (128, 1)).astype(np.uint32)
    busy = _busy(gather, table, rows)
    # software DGE on GpSimd: swdge_fixed_ns + 128 descriptors x swdge_descriptor_ns
    assert busy["gpsimd"] * 1e3 == pytest.approx(300.0 + 128 * 2.0)


def _descriptor_ns_per_ns(body, *arrays, param="dma_descriptor_ns"):
    """Modelled ns added per ns of one per-descriptor parameter (the critical path's
    descriptors per DMA engine)."""
    *_, report = in_kernel(body, *arrays, report=True)
    t = report.timing
    return (t.evaluate({param: 101.0}) - t.evaluate({param: 1.0})) * 1e3 / 100.0


def test_dma_transpose_descriptors_follow_the_source_rows_not_its_elements():
    # The architecture guide prices a DMA transpose as a share of DMA throughput (0.9 from
    # HBM); its descriptors are those of the source rows as stored, whether or not the
    # source block is contiguous in HBM (the old rule charged one per 2-byte element).
    wide = _x((128, 1024), BF16)

    def strided(h):  # 128 source rows of 64 elements, 128 B each, inside 2 KiB rows
        t = nl.ndarray((64, 128), h.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=h[0:128, 0:64])
        return store(t)

    def contiguous(h):
        t = nl.ndarray((64, 128), h.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=h)
        return store(t)

    # 64 destination partitions use DMA engines 0..7; the store back is one descriptor per
    # partition row (64 / 8 = 8 per engine); the strided source has 128 rows (16 per engine)
    assert _descriptor_ns_per_ns(strided, wide) == pytest.approx(16 + 8)
    assert _descriptor_ns_per_ns(contiguous, np.ascontiguousarray(wide[:, :64])) == \
        pytest.approx(8 + 8)

    def into_part_of_a_tile(h):  # the destination is a block of a wider SBUF allocation
        big = nl.ndarray((128, 512), h.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=big[0:64, 0:128], src=h[0:128, 0:64])
        return store(big[0:64, 0:128])

    # the destination rows (64 partitions x 256 B) are runs too: same count as `strided`
    assert _descriptor_ns_per_ns(into_part_of_a_tile, wide) == pytest.approx(16 + 8)


def test_indirect_dma_transpose_descriptors_are_its_gathered_rows():
    def gather_transpose(v, ix):
        t = nl.ndarray((48, 128), v.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=v.ap([[48, 128], [1, 48]], vector_offset=load(ix)))
        return store(t)

    # 128 gathered rows (one descriptor each) over the 6 DMA engines of 48 partitions
    rows = RNG.integers(0, 500, (128, 1)).astype(np.uint32)
    per_ns = _descriptor_ns_per_ns(gather_transpose, _x((500, 48), BF16), rows,
                                   param="dma_indirect_descriptor_ns")
    assert per_ns == pytest.approx(128 / 6)


def test_skipped_rows_of_an_indirect_dma_cost_descriptors_but_no_bytes():
    # docs/timing.md, "Skipped rows": a row dropped by oob_mode.skip still costs its software
    # DGE descriptor (GpSimd) and the DMA engines' per-descriptor time.
    def gather(h, hi):
        idx = load(hi)
        t = nl.ndarray((128, 64), h.dtype, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        nisa.dma_copy(dst=t, src=h.ap([[64, 128], [1, 64]], vector_offset=idx),
                      oob_mode=nisa.oob_mode.skip)
        return store(t)

    table = _x((1000, 64))
    rows = RNG.integers(0, 1000, (128, 1)).astype(np.uint32)
    half = rows.copy()
    half[64:] = 1 << 20                                 # out of range: skipped
    busy = [_busy(gather, table, index)["gpsimd"] for index in (rows, half)]
    assert busy[1] == pytest.approx(busy[0])            # 128 SWDGE descriptors either way
    # the per-descriptor term sees all 128 rows over the index tile's 16 engines either way
    assert _descriptor_ns_per_ns(gather, table, half, param="dma_indirect_descriptor_ns") == \
        pytest.approx(_descriptor_ns_per_ns(gather, table, rows, param="dma_indirect_descriptor_ns"))
    stats = in_kernel(gather, table, half, report=True)[-1].to_dict()["dma"]["indirect_gather/hbm_to_sbuf"]
    assert stats["descriptors"] == 64 and stats["skipped_descriptors"] == 64


def test_a_dynamic_offset_dma_has_the_descriptors_of_its_static_twin():
    # The 4-byte runtime offset a dynamic-offset DMA reads moves no data: the descriptors
    # are the data's rows (64 partitions x one 256 B row), not one per 4 bytes of the offset.
    table = _x((512, 64))

    def dynamic(h, s):
        t = nl.ndarray((64, 64), h.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h.ap([[64, 64], [1, 64]], scalar_offset=load(s),
                                      indirect_dim=0))
        return store(t)

    def static(h, s):
        load(s)
        t = nl.ndarray((64, 64), h.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=h[100:164, :])
        return store(t)

    offset = np.array([[100]], np.int32)
    assert in_kernel(dynamic, table, offset).tolist() == table[100:164].tolist()
    per_ns = _descriptor_ns_per_ns(dynamic, table, offset)
    assert per_ns == pytest.approx(_descriptor_ns_per_ns(static, table, offset))
    assert per_ns == pytest.approx(64 / 8 + 64 / 8, rel=0.02)  # the load's and the store's rows


def test_a_dma_transpose_of_one_block_waits_only_for_that_block():
    # A DMA transpose reads its SBUF source through an address array across partitions; it
    # touches only its block's columns, so writing the tile's other block (Scalar) does not
    # wait for it (write-after-read), and the two chains overlap.
    def body(h):
        x = load(h)
        tile = nl.ndarray((128, 256), h.dtype, buffer=nl.sbuf)
        outs = []
        for b in range(2):
            blk = tile[:, b * 128:(b + 1) * 128]
            nisa.activation(dst=blk, op=nl.exp, data=x[:, b * 128:(b + 1) * 128])
            dst = nl.ndarray((128, 128), h.dtype, buffer=nl.sbuf)
            nisa.dma_transpose(dst=dst, src=blk)
            outs.append(dst)
        return store(outs[0]), store(outs[1])

    x = _x((128, 256), BF16)
    *outs, report = in_kernel(body, x, report=True)
    for b in range(2):
        want = np.exp(x[:, b * 128:(b + 1) * 128].astype(np.float32)).T
        np.testing.assert_allclose(np.asarray(outs[b], np.float32), want, rtol=2e-2)
    t = report.timing
    names = t.graph.names
    acts = [i for i, n in enumerate(names) if n == "activation"]
    transposes = [i for i, n in enumerate(names) if n == "dma_transpose"]
    # the second activation starts right after the first on Scalar, not after the first
    # transpose (which starts only once the first activation has ended plus the DMA latency)
    assert t._start[acts[1]] == pytest.approx(t._end[acts[0]])
    assert t._start[acts[1]] < t._start[transposes[0]]
