"""nki.jit / kernel[lnc] / simulate: arguments, returns, write-back, LNC=2, barrier, report."""

import dataclasses
import enum

import ml_dtypes
import numpy as np
import pytest

from nkilib_msda.simulator import CostReport, NkiError, nki, nisa, nl, simulate
from nkilib_msda.simulator.jit import JitKernel

from _core_helpers import load, raises_rule

RNG = np.random.default_rng(5)


@nki.jit
def add_one(a):
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    u[...] = 1.0
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_compute(dst=out, srcs=[t, u], reduce_op=nl.add)
    return out


def test_simulate_returns_numpy_and_calling_a_jit_kernel_simulates():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(simulate(add_one)(x), x + 1)
    np.testing.assert_allclose(add_one(x), x + 1)
    np.testing.assert_allclose(add_one[1](a=x), x + 1)
    assert isinstance(add_one, JitKernel) and add_one.__name__ == "add_one"


def test_bfloat16_inputs_and_tuple_outputs_with_report():
    x = RNG.standard_normal((3, 5)).astype(ml_dtypes.bfloat16)

    @nki.jit
    def two(a):
        t = load(a)
        o1 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=t)
        nisa.dma_copy(dst=o2, src=t)
        return o1, o2

    o1, o2 = simulate(two)(x)
    assert o1.dtype == np.float32 and o2.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(o1, x.astype(np.float32))
    o1, o2, rep = simulate(two, report=True)(x)
    assert isinstance(rep, CostReport) and rep.instruction_count("dma", "dma_copy") == 3


def test_argument_rules():
    @nki.jit
    def k(a, n, flag, name, opt, shape, mode, cfg):
        # == / != rather than `is`: NKI before 0.7 rejects `is` (source_rules.py)
        assert isinstance(n, int) and isinstance(flag, bool) and flag == True  # noqa: E712
        assert name == "x" and opt == None and shape == (2, 3)  # noqa: E711
        assert mode == Mode.B and cfg.k == 4
        return a

    class Mode(enum.Enum):
        A = 1
        B = 2

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        k: int

    @dataclasses.dataclass
    class Mutable:
        k: int

    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(k(x, 3, True, "x", None, (2, 3), Mode.B, Cfg(4)), x)
    with raises_rule("kernel arguments", "list argument"):
        k(x, 3, True, "x", None, [2, 3], Mode.B, Cfg(4))
    with raises_rule("kernel arguments", "argument type"):
        k(x, 3, True, "x", None, (2, 3), Mode.B, Mutable(4))
    with raises_rule("kernel arguments", "argument type"):
        k(x, 3, True, "x", None, (2, 3), Mode.B, {"k": 4})
    with raises_rule("kernel arguments", "unsupported dtype"):
        k(x.astype(np.float64), 3, True, "x", None, (2, 3), Mode.B, Cfg(4))


def _each_raises_its_rule(x, *cases):
    """Each (run, opcode, reason): ``run(x)`` (a kernel, or a ``simulate(...)`` runner) raises
    that rule."""
    for run, opcode, reason in cases:
        with raises_rule(opcode, reason):
            run(x)


def test_signature_and_jit_option_rules():
    @nki.jit
    def star(a, *rest):
        return a

    @nki.jit
    def kwonly(a, *, b=1):
        return a

    _each_raises_its_rule(np.ones((2, 2), np.float32), (star, "nki.jit", "kernel signature"),
                          (kwonly, "nki.jit", "kernel signature"))
    with raises_rule("nki.jit", "mode"):
        nki.jit(mode="simulation")
    with raises_rule("nki.jit", "removed option"):
        nki.jit(platform_target="trn2")
    with raises_rule("nki.jit", "launch grid"):
        add_one[3]


def test_outputs_must_be_shared_hbm_and_fully_written():
    @nki.jit
    def private_out(a):
        o = nl.ndarray(a.shape, a.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=o, src=a)
        return o

    @nki.jit
    def half_written(a):
        o = nl.ndarray((4, 2), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o[0:2], src=a)
        return o

    @nki.jit
    def returns_int(a):
        return 3

    _each_raises_its_rule(np.ones((2, 2), np.float32), (private_out, "kernel return", "output buffer"),
                          (half_written, "kernel return", "output not written"),
                          (returns_int, "kernel return", "output type"))


def test_inputs_modified_in_place_are_written_back():
    @nki.jit
    def scale_in_place(a, b):
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=b)
        nisa.dma_copy(dst=a[1:3], src=t[1:3])  # writes rows 1..2 of a only

    a = np.zeros((4, 3), np.float32)
    b = RNG.standard_normal((4, 3)).astype(np.float32)
    b0 = b.copy()
    assert simulate(scale_in_place)(a, b) is None
    np.testing.assert_array_equal(a[1:3], b[1:3])
    assert (a[[0, 3]] == 0).all()
    np.testing.assert_array_equal(b, b0)  # untouched input not rewritten


def test_nested_jit_call_is_a_plain_call():
    @nki.jit
    def inner(a):
        t = load(a)
        return t

    @nki.jit
    def outer(a):
        t = inner(a)  # returns an SBUF tile: only possible as a plain call
        o = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(outer(x), x)


def test_program_queries_without_and_with_a_grid():
    @nki.jit
    def ids(a):
        o = nl.ndarray((1, 3), nl.int32, buffer=nl.shared_hbm)
        ndim = nl.program_ndim()
        n = nl.num_programs(0) if ndim else 1
        pid = nl.program_id(0) if ndim else 0
        t = nl.ndarray((1, 3), nl.int32, buffer=nl.sbuf)
        t[...] = 0
        t[:, 0:1] = ndim
        t[:, 1:2] = n
        t[:, 2:3] = pid
        if pid == 0:
            nisa.dma_copy(dst=o, src=t)
        else:
            nisa.core_barrier(a, (0, 1))
        if pid == 0 and n == 2:
            nisa.core_barrier(a, (0, 1))
        return o

    x = np.zeros((1, 1), np.float32)
    assert simulate(ids)(x).tolist() == [[0, 1, 0]]
    assert simulate(ids, lnc=1)(x).tolist() == [[1, 1, 0]]
    assert ids[2](x).tolist() == [[1, 2, 0]]

    @nki.jit
    def no_guard(a):  # NKI 0.7+: program_id(0) works without a grid; the LNC has one axis
        assert nl.program_id(0) == 0 and nl.num_programs() == 1
        nl.program_id(1)

    with raises_rule("program_id", "axis"):
        simulate(no_guard)(x)


def test_lnc2_distinct_program_ids_shared_hbm_and_barrier():
    x = RNG.standard_normal((2, 4)).astype(np.float32)

    @nki.jit
    def swap(a):
        pid = nl.program_id(0)
        scratch = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)  # one storage for both
        out = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
        mine = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=mine, src=a[pid:pid + 1])
        nisa.dma_copy(dst=scratch[pid:pid + 1], src=mine)
        nisa.core_barrier(scratch, (0, 1))  # the other program's row is now in scratch
        theirs = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=theirs, src=scratch[1 - pid:2 - pid])
        nisa.dma_copy(dst=out[pid:pid + 1], src=theirs)
        return out

    out, rep = simulate(swap[2], report=True)(x)
    np.testing.assert_array_equal(out, x[::-1])
    assert rep.num_programs == 2 and len(rep.programs) == 2
    assert rep.instruction_count("sync", "core_barrier") == 2
    assert rep.instruction_count("dma", "dma_copy") == 8


def _shared_filled_by(owner, src, shape, rows):
    """(shared, tile): a new fp32 shared_hbm tensor of ``shape`` and an SBUF tile of src's
    shape; only program ``owner`` copies ``src`` through the tile into ``shared[rows]``."""
    pid = nl.program_id(0)
    shared = nl.ndarray(shape, nl.float32, buffer=nl.shared_hbm)
    tile = nl.ndarray(src.shape, nl.float32, buffer=nl.sbuf)
    if pid == owner:
        nisa.dma_copy(dst=tile, src=src)
        nisa.dma_copy(dst=shared[rows], src=tile)
    return shared, tile


def test_without_barrier_program_1_cannot_see_program_0s_later_writes():
    # Programs run one at a time between barriers (program 0 first): a read of data that
    # the other program writes without a barrier in between is uninitialised.
    @nki.jit
    def racy(a):
        scratch, t = _shared_filled_by(1, a[1:2], (2, 4), slice(1, 2))
        nisa.dma_copy(dst=t, src=scratch[1:2])
        return scratch

    with raises_rule("dma_copy", "uninitialized read"):
        simulate(racy, lnc=2)(np.ones((2, 4), np.float32))


def test_barrier_deadlock_and_core_rules():
    @nki.jit
    def only_program_0_waits(a):
        s = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(s, (0, 1))
        return a

    @nki.jit
    def bad_data(a):
        nisa.core_barrier(nl.ndarray((1, 1), nl.float32, buffer=nl.hbm), (0, 1))

    @nki.jit
    def lnc1_barrier(a):  # NKI 0.8: the barrier is valid at LNC 1; only cores=(0, 1) is
        nisa.core_barrier(a, (0, 1))
        nisa.core_barrier(a, [0, 1])
        nisa.core_barrier(a, (0, 2))

    _each_raises_its_rule(np.ones((1, 1), np.float32),
                          (simulate(only_program_0_waits, lnc=2), "core_barrier", "barrier deadlock"),
                          (simulate(bad_data, lnc=2), "core_barrier", "shared_hbm data"),
                          (simulate(lnc1_barrier, lnc=1), "core_barrier", "cores"))


def test_lnc2_outputs_must_agree_and_shared_allocations_must_match():
    @nki.jit
    def different_outputs(a):
        o1 = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:  # one writer: both writing would be a cross-core race
            nisa.dma_copy(dst=o1, src=a)
            nisa.dma_copy(dst=o2, src=a)
        return o1 if nl.program_id(0) == 0 else o2

    @nki.jit
    def mismatched(a):
        shape = (1, 1) if nl.program_id(0) == 0 else (2, 2)
        return nl.ndarray(shape, nl.float32, buffer=nl.shared_hbm)

    _each_raises_its_rule(np.ones((1, 1), np.float32),
                          (simulate(different_outputs, lnc=2), "kernel return", "LNC outputs differ"),
                          (simulate(mismatched, lnc=2), "ndarray", "LNC shared_hbm mismatch"))


def test_private_buffers_are_per_program():
    @nki.jit
    def k(a):
        pid = nl.program_id(0)
        scratch = nl.ndarray((1, 1), nl.float32, buffer=nl.private_hbm)
        t = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        t[...] = float(pid + 1)
        nisa.dma_copy(dst=scratch, src=t)
        nisa.core_barrier(a, (0, 1))
        out = nl.ndarray((2, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=t, src=scratch)
        nisa.dma_copy(dst=out[pid:pid + 1], src=t)
        return out

    assert simulate(k, lnc=2)(np.zeros((1, 1), np.float32)).tolist() == [[1.0], [2.0]]


def test_errors_propagate_and_target_selection(monkeypatch):
    x = np.ones((2, 2), np.float32)

    @nki.jit
    def usable(a):
        o = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        t[...] = nl.tile_size.total_available_sbuf_size
        nisa.dma_copy(dst=o, src=t)
        return o

    assert usable(x)[0, 0] == 212_992
    assert simulate(usable, target="trn3")(x)[0, 0] == 245_760
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert usable(x)[0, 0] == 245_760
    with pytest.raises(NkiError, match="unsupported target"):
        simulate(usable, target="trn9")(x)
    with pytest.raises(ValueError, match="lnc"):
        simulate(usable, lnc=3)


def test_report_to_dict_and_merge():
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    out, rep = simulate(add_one, report=True)(x)
    d = rep.to_dict()
    assert d["engines"]["dma"]["instructions"] == 2
    assert d["engines"]["vector"]["by_opcode"]["memset"] == {"instructions": 1, "elements": 8192}
    assert d["dma"]["direct/hbm_to_sbuf"]["bytes"] == 128 * 64 * 4
    assert d["dma"]["compute/sbuf_to_hbm"]["hbm_bytes"] == 128 * 64 * 4
    assert d["peak_sbuf_bytes_per_partition"] == 2 * 64 * 4
    merged = CostReport.merged([rep, rep])
    assert merged.instruction_count("dma") == 4 and merged.num_programs == 2
    assert merged.peak_sbuf_bytes_per_partition == rep.peak_sbuf_bytes_per_partition
    text = str(rep)
    assert "dma_compute" in text and "peak SBUF" in text


def test_repeated_barriers_ping_pong():
    @nki.jit
    def ping_pong(a):
        pid = nl.program_id(0)
        box, t = _shared_filled_by(0, a, (1, 1), slice(0, 1))
        for step in range(4):
            nisa.core_barrier(box, (0, 1))
            if step % 2 == pid:  # the owner of this step adds 1 to the shared value
                nisa.dma_copy(dst=t, src=box)
                one = nl.full((1, 1), 1.0, nl.float32)
                nisa.dma_compute(dst=box, srcs=[t, one], reduce_op=nl.add)
        nisa.core_barrier(box, (0, 1))
        return box

    assert simulate(ping_pong, lnc=2)(np.full((1, 1), 10.0, np.float32)).tolist() == [[14.0]]


# ----------------------------------------------- caller mistakes: errors that say the reason


def _msda_inputs(**changes):
    from nkilib_msda.workloads import PRESETS, make_inputs

    return {**make_inputs(PRESETS["tiny"], seed=1), **changes}


def test_numpy_spatial_shapes_error_says_pass_a_tuple():
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention
    from nkilib_msda.simulator import NkiArgumentError

    args = _msda_inputs()
    args["spatial_shapes"] = np.array(args["spatial_shapes"])  # int64
    with pytest.raises(NkiArgumentError, match=r"spatial_shapes has dtype int64, which NKI does "
                                               r"not have .*pass a tuple .*\(H, W\) pairs"):
        simulate(ms_deformable_attention)(**args)


def test_forgotten_kernel_is_a_short_type_error():
    value = _msda_inputs()["value"]
    with pytest.raises(TypeError) as err:
        simulate(value)
    message = str(err.value)
    assert message.startswith("simulate: kernel must be an @nki.jit function, got ndarray of "
                              f"shape {value.shape}")
    assert len(message) < 200, message  # no array repr


def test_zero_levels_is_a_value_error():
    """N_l = 0 leaves empty location/weight arrays, which the emulator rejects before the
    kernel runs: the MSDA kernel's own argument check explains why (a ValueError naming
    spatial_shapes); a kernel without one gets the emulator's NkiArgumentError (a ValueError)."""
    from nkilib_msda.experimental.deformable_attention import ms_deformable_attention

    args = _msda_inputs()
    args.update(spatial_shapes=(), level_start_index=(),
                sampling_locations=args["sampling_locations"][:, :, :, :0],
                attention_weights=args["attention_weights"][:, :, :, :0])
    with pytest.raises(ValueError, match="^spatial_shapes: expected at least one"):
        simulate(ms_deformable_attention)(**args)

    @nki.jit
    def first_row(x):
        out = nl.ndarray((1, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x[0:1, :])
        return out

    with pytest.raises(ValueError, match="empty tensor") as err:
        simulate(first_row)(np.zeros((0, 4), np.float32))
    assert isinstance(err.value, NkiError)
