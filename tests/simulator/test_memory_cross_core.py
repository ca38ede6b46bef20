"""Cross-core races on shared HBM at LNC 2 (docs/emulator.md, "Memory, hazards and strict
mode"): unordered accesses of the two programs to one element in the same barrier phase."""

import warnings

import numpy as np

from nkilib_msda.simulator import NkiHazardWarning, nki, nisa, nl, simulate

from _core_helpers import raises_rule

RNG = np.random.default_rng()


def _exchange(barrier: bool):
    """Each program writes its row of ``a`` (+1) to a shared scratch, then reads the other
    program's row: the nki.lnc.core_barrier pattern, with or without the barrier."""

    @nki.jit
    def kernel(a):
        pid = nl.program_id(0)
        scratch = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        mine = nl.ndarray((1, a.shape[1]), a.dtype, buffer=nl.sbuf)
        one = nl.ndarray((1, a.shape[1]), a.dtype, buffer=nl.sbuf)
        one[...] = 1.0
        nisa.dma_copy(dst=mine, src=a[pid:pid + 1])
        nisa.dma_compute(dst=scratch[pid:pid + 1], srcs=[mine, one], reduce_op=nl.add)
        if barrier:
            nki.lnc.core_barrier(scratch, (0, 1))
        theirs = nl.ndarray((1, a.shape[1]), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=theirs, src=scratch[1 - pid:2 - pid])
        nisa.dma_copy(dst=out[pid:pid + 1], src=theirs)
        return out

    return kernel


def _races(caught):
    return [w for w in caught if issubclass(w.category, NkiHazardWarning)
            and w.message.rule == "cross-core race"]


def _producer_consumer(barrier: bool):
    """Program 0 writes ``a + 1`` to a shared scratch; program 1 copies it to the output."""

    @nki.jit
    def kernel(a):
        pid = nl.program_id(0)
        scratch = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm, name="scratch")
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        one = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        one[...] = 1.0
        if pid == 0:
            nisa.dma_copy(dst=t, src=a)
            nisa.dma_compute(dst=scratch, srcs=[t, one], reduce_op=nl.add)
        if barrier:
            nki.lnc.core_barrier(scratch, (0, 1))
        if pid == 1:
            nisa.dma_copy(dst=t, src=scratch)
            nisa.dma_copy(dst=out, src=t)
        return out

    return kernel


def test_read_after_write_without_barrier_warns_and_raises_in_strict_mode():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(_producer_consumer(False), lnc=2, strict=False)(x)
    races = _races(caught)
    assert len(races) == 1
    message = str(races[0].message)
    assert message.startswith("dma_copy: cross-core race: program 1 reads 32 elements of scratch")
    assert "program 0 wrote" in message and "read-after-write" in message
    with raises_rule("dma_copy", "cross-core race"):
        simulate(_producer_consumer(False), lnc=2, strict=True)(x)


def test_exchange_without_barrier_reports_both_directions():
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(_exchange(False), lnc=2, strict=False)(x)
    kinds = sorted(k for w in _races(caught) for k in ("read-after-write", "write-after-read")
                   if k in str(w.message))
    assert kinds == ["read-after-write", "write-after-read"]


def test_barrier_between_write_and_read_is_clean_and_correct():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiHazardWarning)
        out = simulate(_producer_consumer(True), lnc=2, strict=True)(x)
        np.testing.assert_array_equal(out, x + np.float32(1.0))
        y = RNG.standard_normal((2, 8)).astype(np.float32)
        out = simulate(_exchange(True), lnc=2, strict=True)(y)
    np.testing.assert_array_equal(out, (y + np.float32(1.0))[::-1])


def test_write_after_read_in_the_same_phase_is_detected():
    x = RNG.standard_normal((4, 8)).astype(np.float32)

    @nki.jit
    def war(a):
        # Program 0 runs its phase first: it reads all of ``a``; program 1 then overwrites
        # row 2 of the input in the same phase (on hardware it may land before the read).
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out, src=t)
        else:
            nisa.dma_copy(dst=a[2:3], src=t[0:1])
        return out

    with raises_rule("dma_copy", "cross-core race"):
        simulate(war, lnc=2, strict=True)(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(war, lnc=2, strict=False)(x)
    races = _races(caught)
    assert len(races) == 1 and "write-after-read" in str(races[0].message)


def test_accumulate_from_both_programs_into_one_element_is_a_race():
    x = RNG.standard_normal((2, 8)).astype(np.float32)

    @nki.jit
    def both_accumulate(a):
        out = nl.ndarray((1, 8), a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 8), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:1])
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out, src=t)
        nki.lnc.core_barrier(out, (0, 1))
        nisa.dma_copy(dst=t, src=a[nl.program_id(0):nl.program_id(0) + 1])
        nisa.dma_compute(dst=out, srcs=[out, t], reduce_op=nl.add)  # read-modify-write
        return out

    with raises_rule("dma_compute", "cross-core race"):
        simulate(both_accumulate, lnc=2, strict=True)(x)


def test_write_after_write_reports_only_changed_bytes():
    x = RNG.standard_normal((2, 8)).astype(np.float32)

    def both_write(same: bool):
        @nki.jit
        def kernel(a):
            out = nl.ndarray((1, 8), a.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((1, 8), a.dtype, buffer=nl.sbuf)
            row = 0 if same else nl.program_id(0)
            nisa.dma_copy(dst=t, src=a[row:row + 1])
            nisa.dma_copy(dst=out, src=t)  # both programs, one phase
            return out

        return kernel

    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiHazardWarning)
        np.testing.assert_array_equal(simulate(both_write(True), lnc=2, strict=True)(x), x[:1])
    with raises_rule("dma_copy", "cross-core race"):
        simulate(both_write(False), lnc=2, strict=True)(x)


def test_disjoint_writes_then_barrier_then_reading_both_halves_is_clean():
    x = RNG.standard_normal((4, 16)).astype(np.float32)

    @nki.jit
    def halves(a):
        pid = nl.program_id(0)
        part = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[:, pid * 8:pid * 8 + 8])
        nisa.activation(dst=t, op=nl.exp, data=t)
        nisa.dma_copy(dst=part[:, pid * 8:pid * 8 + 8], src=t)
        nki.lnc.core_barrier(part, (0, 1))
        both = nl.ndarray((4, 16), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=both, src=part)  # both halves, after the barrier
        if pid == 0:
            nisa.dma_copy(dst=out, src=both)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiHazardWarning)
        out = simulate(halves, lnc=2, strict=True)(x)
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-5)


def test_lnc1_tracks_nothing():
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    seen = []

    @nki.jit
    def one_core(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        nisa.dma_copy(dst=t, src=out)
        seen.append((a.storage.race, out.storage.race))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiHazardWarning)
        out = simulate(one_core, lnc=1, strict=True)(x)
    np.testing.assert_array_equal(out, x)
    assert seen == [(None, None)]
