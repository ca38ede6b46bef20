"""Audit of the emulator against docs/emulator.md: rules added by the audit, and spot checks
of documented semantics against hand-computed results (docs/emulator.md "Rule coverage")."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from _compute_helpers import load as _load, store as _store
from _core_helpers import gather_inputs, in_kernel, raises_rule, randn
from nkilib_msda.simulator import NkiError, access, nisa, nki, nl, simulate

RNG = np.random.default_rng(77)


def _filled(shape, value=1.0, dtype=nl.float32, buffer=None):
    t = nl.ndarray(shape, dtype, buffer=buffer or nl.sbuf)
    nisa.memset(t, value)
    return t


def _expect_rule(body, instruction, rule):
    """A kernel running ``body`` (one dummy input) fails with ``instruction: rule``."""
    with raises_rule(instruction, rule):
        in_kernel(body, np.ones(1, np.float32))


# -- §7a.5 kernel-level rules checked on the kernel source (source_rules.py) ----------------
def _helper_with_is(x):
    return x is None


@nki.jit
def _kernel_is(a):
    if a is None:
        return None
    return a


@nki.jit
def _kernel_calls_helper(a):
    _helper_with_is(a)
    return a


@nki.jit
def _kernel_divide_dead_branch(a, flag):
    if flag:
        nl.divide(a, a)
    return a


@nki.jit
def _kernel_neuronxcc(a, flag):
    if flag:
        import neuronxcc.nki.language  # noqa: F401
    return a


@nki.jit
def _kernel_clean(a):
    if a == None:  # noqa: E711 - the NKI 0.3-0.6 spelling
        return None
    return a


def test_is_operator_allowed_since_nki_0_7():
    # NKI 0.7 tracing allows `is` / `is not` (release notes 0.7.0); is_operator= is ignored.
    x = np.ones((2, 2), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in ("error", "warn", "off"):
            np.testing.assert_array_equal(simulate(_kernel_is, is_operator=mode)(x), x)
        np.testing.assert_array_equal(_kernel_is(x), x)
        simulate(_kernel_clean)(x)
        simulate(_kernel_calls_helper)(x)


def test_divide_reference_rejected_even_on_an_untaken_branch():
    with pytest.raises(NkiError, match=r"^_kernel_divide_dead_branch: fails on hardware: `nl.divide`"):
        simulate(_kernel_divide_dead_branch)(np.ones((2, 2), np.float32), False)
    simulate(_kernel_divide_dead_branch, source_rules="off")(np.ones((2, 2), np.float32), False)


def test_neuronxcc_import_rejected():
    with pytest.raises(NkiError, match=r"^_kernel_neuronxcc: neuronxcc import"):
        simulate(_kernel_neuronxcc)(np.ones((2, 2), np.float32), False)


def test_source_rule_modes_are_validated():
    with pytest.raises(ValueError, match="is_operator"):
        simulate(_kernel_clean, is_operator="maybe")


# -- §7a.6 target rules ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["activate2", "exponential"])
def test_trn3_only_instructions(name):
    def body(a):
        getattr(nisa, name)(_filled((2, 2)), nl.exp, _filled((2, 2)))

    _expect_rule(body, name, "trn3-only instruction")
    with raises_rule(name, "not modelled"):
        in_kernel(body, np.ones(1, np.float32), target="trn3")


def test_indirect_is_trn3_only():
    with raises_rule("indirect", "trn3-only"):
        in_kernel(lambda a: a.indirect(0), np.ones((4, 4), np.float32))
    with raises_rule("indirect", "not modelled"):
        in_kernel(lambda a: a.indirect(0), np.ones((4, 4), np.float32), target="trn3")


# -- §3 dynamic views: one indirection, indirect dim not sliced afterwards -----------------
def test_dynamic_views_cannot_be_re_viewed():
    table = np.zeros((8, 4), np.float32)
    idx = np.zeros((4, 1), np.int32)

    def indexed(v, ix):
        v.ap([[4, 4], [1, 4]], vector_offset=_load(ix))[0:2]

    def re_ap(v, ix):
        v.ap([[4, 4], [1, 4]], vector_offset=_load(ix)).ap([[4, 4], [1, 4]])

    def dyn_select(v, ix):
        v.select(0, _load(ix[0:1, 0:1].reshape((1, 1)))).reshape((2, 2))

    with raises_rule("tensor indexing", "dynamic view"):
        in_kernel(indexed, table, idx)
    with raises_rule("ap", "dynamic view"):
        in_kernel(re_ap, table, idx)
    with raises_rule("reshape", "dynamic view"):
        in_kernel(dyn_select, table, idx)


# -- raw-int enums -------------------------------------------------------------------------
def test_raw_int_enums_rejected():
    # NKI 0.8 accepts an enum's raw value (reduce_cmd=3); values outside the enum are rejected.
    def select_reduce(a):
        nisa.select_reduce(_filled((2, 4)), _filled((2, 4), 1, nl.uint8), _filled((2, 4)), 0.0,
                           reduce_res=_filled((2, 1)), reduce_cmd=9)

    def matmul(a):
        nisa.nc_matmul(nl.ndarray((4, 4), nl.float32, buffer=nl.psum), _filled((4, 4)),
                       _filled((4, 4)), perf_mode=0)

    _expect_rule(select_reduce, "select_reduce", "enum argument")
    _expect_rule(matmul, "nc_matmul", "enum argument")


# -- §7a.4: at most one PSUM tensor input of a Vector instruction -----------------------------
def test_vector_psum_inputs_including_operand_tiles():
    def ts(a):
        nisa.tensor_scalar(_filled((4, 8)), _filled((4, 8), buffer=nl.psum), nl.add,
                           _filled((4, 1), buffer=nl.psum))

    def stt(a):
        nisa.scalar_tensor_tensor(_filled((4, 8)), _filled((4, 8), buffer=nl.psum), nl.multiply,
                                  _filled((4, 1), buffer=nl.psum), nl.add, _filled((4, 8)))

    _expect_rule(ts, "tensor_scalar", "two PSUM inputs")
    _expect_rule(stt, "scalar_tensor_tensor", "two PSUM inputs")


def test_tensor_scalar_one_psum_input_is_fine():
    def body(a):
        t = _filled((4, 8), 2.0, buffer=nl.psum)
        out = _filled((4, 8), 0.0)
        nisa.tensor_scalar(out, t, nl.add, _filled((4, 1), 3.0))
        return _store(out)

    assert (in_kernel(body, np.ones(1, np.float32)) == 5.0).all()


# -- §3 / §7a.4: free access-pattern levels of compute operands -------------------------------
def test_compute_operands_at_most_three_free_levels():
    def body(a, strided):
        t = _filled((4, 2, 3, 5, 7), 1.0)
        view = t[:, :, 0:2, 0:4, 0:6] if strided else t  # 4 unmergeable free levels vs 1
        out = nl.ndarray(view.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(out, view)
        return _store(out)

    with raises_rule("tensor_copy", "free levels"):
        in_kernel(body, np.ones(1, np.float32), True)
    assert in_kernel(body, np.ones(1, np.float32), False).shape == (4, 2, 3, 5, 7)


def test_free_levels_merges_contiguous_dims():
    levels = []

    def probe(a):
        t = nl.ndarray((4, 2, 3, 5, 8), nl.float32, buffer=nl.sbuf)
        levels.extend([access.free_levels(t), access.free_levels(t[:, :, :, :, 0:4]),
                       access.free_levels(t[:, 0:1, :, 1:3, :]),
                       access.free_levels(t[:, :, 0, 0, 0:1])])

    in_kernel(probe, np.ones(1, np.float32))
    assert levels == [1, 2, 2, 1]


# -- §7a.7 writes to a loop induction register ------------------------------------------------
def test_fori_loop_register_is_a_scalar_offset_and_read_only():
    table = RNG.standard_normal((6, 4)).astype(np.float32)

    def body(v):
        out = nl.ndarray((6, 4), nl.float32, buffer=nl.sbuf)

        def step(reg):
            row = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=row, src=v.ap([[4, 1], [1, 4]], scalar_offset=reg))
            nisa.dma_copy(dst=out.ap([[4, 1], [1, 4]], scalar_offset=reg), src=row)

        nl.fori_loop(0, 6, step)
        return _store(out)

    np.testing.assert_array_equal(in_kernel(body, table), table)

    def writes_register(v):
        nl.fori_loop(0, 2, lambda reg: nisa.memset(reg, 7))

    with raises_rule("memset", "loop induction register"):
        in_kernel(writes_register, table)


# -- duplicate detection of interleaved scatter rows (fast path is exact) -------------------
@pytest.mark.parametrize("rows,dup", [([0, 1, 4, 5], False), ([0, 2, 4, 6], True),
                                      ([1, 0, 5, 4], False)])
def test_interleaved_pair_rows_scatter(rows, dup):
    # each index row writes rows r and r + 2 of a (12, 3) table: rows 0 and 2 collide
    def body(d, ix):
        data = _filled((4, 2, 3), 1.0)
        dst = d.ap([[3, 4], [6, 2], [1, 3]], vector_offset=_load(ix))
        nisa.dma_compute(dst=dst, srcs=[dst, data], reduce_op=nl.add)
        return d

    idx = np.array(rows, np.int32).reshape(4, 1)
    if dup:
        with raises_rule("dma_compute", "duplicate scatter indices"):
            in_kernel(body, np.zeros((12, 3), np.float32), idx)
        return
    out = in_kernel(body, np.zeros((12, 3), np.float32), idx)
    expected = np.zeros((12, 3), np.float32)
    for r in rows:
        expected[[r, r + 2]] += 1.0
    np.testing.assert_array_equal(out, expected)


# -- faithfulness spot checks (hand-computed from docs/emulator.md) ------------------------
def test_vector_offset_from_a_column_of_a_multi_column_index_tile():
    table, idx = gather_inputs(RNG, (30, 5), (8, 3))

    def body(v, ix):
        tile = _load(ix)
        a = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((8, 5), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=v.ap([[5, 8], [1, 5]], vector_offset=tile[:, 2:3]))
        column = tile.ap([[3, 8], [1, 1]], offset=1)  # nki-library's column view
        nisa.dma_copy(dst=b, src=v.ap([[5, 8], [1, 5]], vector_offset=column))
        return _store(a), _store(b)

    a, b = in_kernel(body, table, idx)
    np.testing.assert_array_equal(a, table[idx[:, 2]])
    np.testing.assert_array_equal(b, table[idx[:, 1]])


def test_gather_rmw_with_skip_leaves_skipped_rows_unchanged():
    table, acc0 = randn(RNG, (10, 4), (3, 4))
    idx = np.array([[7], [-1], [2]], np.int32)

    def body(v, acc_h, ix):
        acc = _load(acc_h)
        src = v.ap([[4, 3], [1, 4]], vector_offset=_load(ix))
        nisa.dma_compute(dst=acc, srcs=[src, acc], reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)
        return _store(acc)

    out = in_kernel(body, table, acc0, idx)
    np.testing.assert_allclose(out[0], acc0[0] + table[7], rtol=1e-6)
    np.testing.assert_array_equal(out[1], acc0[1])
    np.testing.assert_allclose(out[2], acc0[2] + table[2], rtol=1e-6)


def test_ap_ignores_receiver_geometry_and_inherits_offset():
    x = np.arange(48, dtype=np.float32).reshape(6, 8)

    def body(a):
        t = _load(a)
        on_chip = t[0:2, 3:8].ap([[8, 2], [2, 2]])  # offset 3 inherited, strides replaced
        hbm = a[1:3, 1:3].ap([[8, 2], [1, 3]])  # HBM: same rule on the linear storage
        return _store(_copy(on_chip)), _load_hbm(hbm)

    def _copy(view):
        out = nl.ndarray(view.shape, view.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(out, view)
        return out

    def _load_hbm(view):
        out = nl.ndarray(view.shape, view.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=out, src=view)
        return _store(out)

    on_chip, hbm = in_kernel(body, x)
    assert on_chip.tolist() == [[3, 5], [11, 13]]
    assert hbm.tolist() == [[9, 10, 11], [17, 18, 19]]


def test_iota_casts_with_nki_rules():
    def body(a):
        f = nl.ndarray((3, 4), nl.float32, buffer=nl.sbuf)
        u = nl.ndarray((3, 4), nl.uint8, buffer=nl.sbuf)
        nisa.iota(f, [[3, 4]], offset=-2, channel_multiplier=10)
        nisa.iota(u, [[100, 4]], offset=-50, channel_multiplier=0)
        return _store(f), _store(u)

    f, u = in_kernel(body, np.ones(1, np.float32))
    assert f.tolist() == [[10 * p - 2 + 3 * i for i in range(4)] for p in range(3)]
    assert u.tolist() == [[0, 50, 150, 250]] * 3  # int32 -> uint8 saturates (-50 -> 0)


def test_tensor_reduce_axes_are_real_tensor_dims():
    x = RNG.standard_normal((4, 2, 3, 5)).astype(np.float32)

    def body(a):
        t = _load(a)
        last = nl.ndarray((4, 2, 3), nl.float32, buffer=nl.sbuf)
        two = nl.ndarray((4, 2), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(last, nl.add, t, axis=3)
        nisa.tensor_reduce(two, nl.maximum, t, axis=(2, 3))
        return _store(last), _store(two)

    last, two = in_kernel(body, x)
    np.testing.assert_allclose(last, x.sum(axis=3), rtol=1e-5)
    np.testing.assert_array_equal(two, x.max(axis=(2, 3)))
    with raises_rule("tensor_reduce", "reduce axis"):  # dim 2 alone is not trailing
        in_kernel(lambda a: nisa.tensor_reduce(nl.ndarray((4, 2, 5), nl.float32), nl.add,
                                               _load(a), axis=2), x)


def test_activation_scale_and_bias_forms():
    x, s, b = randn(RNG, (4, 6), (4, 1), (4, 1))

    def body(a, sh, bh):
        t = _load(a)
        o1 = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        o2 = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        nisa.activation(o1, nl.copy, t, bias=_load(bh), scale=_load(sh))
        nisa.activation(o2, nl.exp, t, bias=0.5, scale=2.0)
        return _store(o1), _store(o2)

    o1, o2 = in_kernel(body, x, s, b)
    np.testing.assert_allclose(o1, x * s + b, rtol=1e-6)
    np.testing.assert_allclose(o2, np.exp(2.0 * x + 0.5), rtol=1e-6)
    with raises_rule("activation", "operand dtype"):  # scale tiles must be fp32
        in_kernel(lambda a: nisa.activation(nl.ndarray((4, 6), nl.float32), nl.copy, _load(a),
                                            scale=_filled((4, 1), 1.0, nl.bfloat16)), x)


def test_matmul_output_bank_crossing_and_strided_accumulate():
    a, m = randn(RNG, (8, 4), (8, 6))

    def crossing(sa, mv):
        out = nl.ndarray((4, 1024), nl.float32, buffer=nl.psum)  # two banks per partition
        nisa.nc_matmul(out[:, 510:516], _load(sa), _load(mv))

    def strided(sa, mv):
        out = nl.ndarray((4, 12), nl.float32, buffer=nl.psum)
        dst = out[:, 0:12:2]  # strided destination: flags and values through NumPy strides
        nisa.nc_matmul(dst, _load(sa), _load(mv), accumulate=False)
        nisa.nc_matmul(dst, _load(sa), _load(mv), accumulate=True)
        res = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(res, dst)
        return _store(res)

    with raises_rule("nc_matmul", "PSUM bank"):
        in_kernel(crossing, a, m)
    np.testing.assert_allclose(in_kernel(strided, a, m), 2 * a.T @ m, rtol=1e-5, atol=1e-5)


def test_strided_reads_check_initialisation():
    def body(a):
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.memset(t[:, 0:8:2], 1.0)  # even columns only
        ok = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(ok, t[:, 0:8:2])
        bad = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(bad, t[:, 1:8:2])

    _expect_rule(body, "tensor_copy", "uninitialized read")


@pytest.mark.parametrize("target,ok_bytes", [("trn2", 212_992), ("trn3", 245_760)])
def test_capacity_per_target(target, ok_bytes):
    def body(a, extra):
        t = nl.ndarray((128, ok_bytes // 4 + extra), nl.float32, buffer=nl.sbuf)
        del t

    in_kernel(body, np.ones(1, np.float32), 0, target=target)
    with raises_rule("ndarray", "SBUF capacity"):
        in_kernel(body, np.ones(1, np.float32), 1, target=target)


def test_program_ndim_and_write_back():
    @nki.jit
    def k(a):
        nisa.dma_copy(dst=a[0:1, :], src=nl.full((1, 3), nl.program_ndim() + 5.0, nl.float32))
        return None

    x = np.zeros((2, 3), np.float32)
    k(x)
    assert x.tolist() == [[5.0] * 3, [0.0] * 3]  # no grid: program_ndim() == 0, written back
    k[1](x)
    assert x.tolist() == [[6.0] * 3, [0.0] * 3]  # kernel[1]: program_ndim() == 1


def test_on_chip_scalar_offset_moves_partitions_but_not_across_a_partition_end():
    x = RNG.standard_normal((4, 3)).astype(np.float32)

    def body(a, row, dim, skip):
        t = _load(a)
        reg = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(reg, row)
        out = nl.full((1, 3), -1.0, nl.float32)
        src = t.ap([[3, 1], [1, 3]], scalar_offset=reg, indirect_dim=dim)
        nisa.dma_copy(dst=out, src=src,
                      oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
        return _store(out)

    np.testing.assert_array_equal(in_kernel(body, x, 2, 0, False), x[2:3])  # partition 2
    with raises_rule("dma_copy", "out-of-bounds index"):  # past the last partition
        in_kernel(body, x, 4, 0, False)
    with raises_rule("dma_copy", "out-of-bounds index"):  # free offset 1: row leaves partition 0
        in_kernel(body, x, 1, 1, False)
    assert in_kernel(body, x, 1, 1, True).tolist() == [[-1.0] * 3]  # skip: dst unchanged


def test_pe_transpose_output_within_one_psum_bank():
    def body(a, start):
        data = _filled((4, 8), 1.0)
        out = nl.ndarray((8, 1024), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(out[:, start:start + 4], data, engine=nisa.engine.tensor)

    in_kernel(body, np.ones(1, np.float32), 508)  # bytes 2032..2047: bank 0
    with raises_rule("nc_transpose", "PSUM bank"):
        in_kernel(body, np.ones(1, np.float32), 510)  # bytes 2040..2055 cross into bank 1


@pytest.mark.parametrize("instruction,call", [
    ("tensor_copy_predicated", lambda: nisa.tensor_copy_predicated(
        _filled((4, 8)), _filled((4, 8), buffer=nl.psum), _filled((4, 8), 1, nl.uint8, nl.psum))),
    ("select_reduce", lambda: nisa.select_reduce(
        _filled((4, 8)), _filled((4, 8), 1, nl.uint8, nl.psum), _filled((4, 8), buffer=nl.psum),
        0.0)),
    ("tensor_scalar_reduce", lambda: nisa.tensor_scalar_reduce(
        _filled((4, 8)), _filled((4, 8), buffer=nl.psum), nl.add, _filled((4, 1), buffer=nl.psum),
        nl.add)),
    ("nl.where", lambda: nl.where(_filled((4, 8), buffer=nl.psum), _filled((4, 8), buffer=nl.psum),
                                  0.0)),
])
def test_two_psum_inputs_of_other_vector_instructions(instruction, call):
    with raises_rule(instruction, "two PSUM inputs"):
        in_kernel(lambda a: call(), np.ones(1, np.float32))


def test_trn1_is_not_a_target():
    # §7a.6 "no ScalarE tensor_copy on v2" is vacuous: NC-v2 (trn1) is not modelled at all.
    with raises_rule("simulate", "unsupported target"):
        in_kernel(lambda a: None, np.ones(1, np.float32), target="trn1")


def test_matmul_tiling_mode_checks_and_keeps_semantics():
    a, m = randn(RNG, (32, 16), (32, 8))

    def body(sa, mv, position, size):
        out = nl.ndarray((16, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(out, _load(sa), _load(mv), tile_position=position, tile_size=size)
        res = nl.ndarray((16, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(res, out)
        return _store(res)

    got = in_kernel(body, a, m, (32, 64), (32, 32))
    np.testing.assert_allclose(got, a.T @ m, rtol=1e-5, atol=1e-5)
    with raises_rule("nc_matmul", "tiling mode"):  # start not a multiple of the size
        in_kernel(body, a, m, (16, 0), (32, 32))
    with raises_rule("nc_matmul", "tiling mode"):  # 16 is not a PE tile size (32, 64, 128)
        in_kernel(body, a, m, (0, 0), (16, 32))


def test_dma_is_exempt_from_the_start_partition_rule():
    x = RNG.standard_normal((3, 4)).astype(np.float32)

    def body(a, compute):
        t = nl.ndarray((16, 4), nl.float32, buffer=nl.sbuf)
        if compute:
            nisa.tensor_copy(t[5:8, :], _load(a))
        else:
            nisa.dma_copy(dst=t[5:8, :], src=a)  # partitions 5..7: fine for a DMA
        out = nl.ndarray((3, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t[5:8, :])
        return out

    np.testing.assert_array_equal(in_kernel(body, x, False), x)
    with raises_rule("tensor_copy", "start partition"):
        in_kernel(body, x, True)


def test_iota_channel_multiplier_needs_partition_0():
    def body(a, start, multiplier):
        t = nl.ndarray((64, 2), nl.int32, buffer=nl.sbuf)
        nisa.iota(t[start:start + 32, :], [[1, 2]], offset=0, channel_multiplier=multiplier)
        return _store(t[start:start + 32, :])

    assert in_kernel(body, np.ones(1, np.float32), 32, 0).tolist() == [[0, 1]] * 32
    with raises_rule("iota", "ambiguous partition index"):
        in_kernel(body, np.ones(1, np.float32), 32, 1)
    got = in_kernel(body, np.ones(1, np.float32), 0, 2)
    assert got.tolist() == [[2 * p, 2 * p + 1] for p in range(32)]


def test_predicated_copy_writes_only_selected_elements():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    pred = (RNG.random((4, 8)) > 0.5).astype(np.uint8)

    def body(a, ph):
        dst = _filled((4, 8), -3.0)
        nisa.tensor_copy_predicated(dst, _load(a), _load(ph))
        return _store(dst)

    np.testing.assert_array_equal(in_kernel(body, x, pred), np.where(pred != 0, x, -3.0))

    def broadcast_dst(a, ph):
        dst = _filled((4, 1), 0.0).broadcast(1, 8)  # every element written 8 times
        nisa.tensor_copy_predicated(dst, _load(a), _load(ph))

    with raises_rule("tensor_copy_predicated", "overlapping destination"):
        in_kernel(broadcast_dst, x, pred)


def test_broadcast_never_dim_0_even_in_hbm():
    with raises_rule("broadcast", "dim 0"):
        in_kernel(lambda a: a.broadcast(0, 4), np.ones((1, 3), np.float32))


@pytest.mark.parametrize("name", ["arange", "mgrid", "par_dim", "spmd_dim", "nc"])
def test_beta_1_names_are_removed(name):
    with raises_rule(f"nl.{name}", "removed in beta 2"):
        getattr(nl, name)


def test_fori_loop_not_inside_no_reorder():
    def body(a):
        with nl.no_reorder():
            nl.fori_loop(0, 2, lambda reg: None)

    _expect_rule(body, "fori_loop", "inside no_reorder")
    in_kernel(lambda a: nl.fori_loop(0, 2, lambda reg: None), np.ones(1, np.float32))
