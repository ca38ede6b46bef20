"""nc_stream_shuffle, bn_stats / bn_aggr and range_select, from the pages' stated semantics
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/):
- nki.isa.nc_stream_shuffle.html: within each 32-partition quadrant, output partition i copies
  input partition shuffle_mask[i]; 255 leaves output partition i unmodified; the same mask is
  used for every quadrant; dtypes and elements per partition must match.
- nki.isa.bn_stats.html: 6 values per partition: count, mean, variance*count of the even
  elements, then of the odd elements; at most 512 elements per partition.
- nki.isa.bn_aggr.html: (count, mean, variance*count) triples -> (mean, variance).
- nki.isa.range_select.html: keep element j where comp_op0(j + range_start, bound0) and
  comp_op1(j + range_start, bound1) hold, else on_false_value; reduce_res gets the max.
"""

import numpy as np
import pytest

from nkilib_msda.simulator import nisa, nl

from _core_helpers import raises_rule
from _isa_helpers import load, randn, run, store

RNG = np.random.default_rng(19)


def test_nc_stream_shuffle_permutes_within_each_quadrant_and_255_keeps():
    src, old = randn(RNG, (64, 5), (64, 5))
    mask = list(RNG.permutation(32))
    mask[3] = 255

    def body(hs, hd):
        s, d = load(hs), load(hd)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=[int(m) for m in mask])
        return store(d)

    got = run(body, src, old)
    want = old.copy()
    for q in range(2):
        for i, m in enumerate(mask):
            if m != 255:
                want[q * 32 + i] = src[q * 32 + m]
    np.testing.assert_array_equal(got, want)


def test_nc_stream_shuffle_broadcasts_one_partition():
    src = RNG.standard_normal((1, 7)).astype(np.float32)

    def body(hs):
        s = load(hs)
        d = nl.ndarray((20, 7), nl.float32, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=[0] * 32)
        return store(d)

    np.testing.assert_array_equal(run(body, src), np.repeat(src, 20, axis=0))


def test_nc_stream_shuffle_rules():
    src = RNG.standard_normal((32, 4)).astype(np.float32)

    def wrong_dtype(hs):
        d = nl.ndarray((32, 4), nl.bfloat16, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=load(hs), shuffle_mask=list(range(32)))

    def short_mask(hs):
        d = nl.ndarray((32, 4), nl.float32, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=load(hs), shuffle_mask=[0] * 31)

    def missing_source(hs):
        s = load(hs)
        d = nl.ndarray((32, 4), nl.float32, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=s[0:4, :], shuffle_mask=list(range(32)))

    with raises_rule("nc_stream_shuffle", "dtype"):
        run(wrong_dtype, src)
    with raises_rule("nc_stream_shuffle", "shuffle_mask"):
        run(short_mask, src)
    with raises_rule("nc_stream_shuffle", "source partition"):
        run(missing_source, src)


@pytest.mark.parametrize("free", [1, 7, 512])
def test_bn_stats_even_odd_statistics(free):
    x = RNG.standard_normal((16, free)).astype(np.float32) * 3 + 1

    def body(h):
        d = nl.ndarray((16, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=d, data=load(h))
        return store(d)

    got = run(body, x)
    x64 = x.astype(np.float64)
    for k, half in enumerate((x64[:, 0::2], x64[:, 1::2])):
        n = half.shape[1]
        np.testing.assert_array_equal(got[:, 3 * k], n)
        if n:
            np.testing.assert_allclose(got[:, 3 * k + 1], half.mean(1), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got[:, 3 * k + 2], half.var(1) * n, rtol=1e-5, atol=1e-5)


def test_bn_stats_then_bn_aggr_gives_mean_and_variance_of_many_tiles():
    x = RNG.standard_normal((8, 3 * 512 - 100)).astype(np.float32) * 2 - 0.5
    chunks = [(0, 512), (512, 1024), (1024, x.shape[1])]

    def body(h):
        t = load(h)
        stats = nl.ndarray((8, 6 * len(chunks)), nl.float32, buffer=nl.sbuf)
        for i, (a, b) in enumerate(chunks):
            nisa.bn_stats(dst=stats[:, 6 * i:6 * i + 6], data=t[:, a:b])
        out = nl.ndarray((8, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=out, data=stats)
        return store(out)

    got = run(body, x)
    np.testing.assert_allclose(got[:, 0], x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 1], x.astype(np.float64).var(1), rtol=1e-5)


def test_bn_stats_and_bn_aggr_rules():
    x = RNG.standard_normal((4, 513)).astype(np.float32)

    def too_wide(h):
        d = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=d, data=load(h))

    def not_triples(h):
        d = nl.ndarray((4, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=d, data=load(h)[:, 0:5])

    with raises_rule("bn_stats", "free size"):
        run(too_wide, x)
    with raises_rule("bn_aggr", "data shape"):
        run(not_triples, x)


def test_range_select_keeps_the_index_window_and_reduces_max():
    x = RNG.standard_normal((8, 40)).astype(np.float32)
    lo = RNG.integers(0, 20, (8, 1)).astype(np.float32)
    hi = lo + RNG.integers(1, 20, (8, 1)).astype(np.float32)
    start = 5.0

    def body(hx, hlo, hhi):
        d = nl.ndarray((8, 40), nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=d, on_true_tile=load(hx), comp_op0=nl.greater_equal,
                          comp_op1=nl.less, bound0=load(hlo), bound1=load(hhi),
                          reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=r,
                          range_start=start, on_false_value=-1e30)
        return store(d), store(r)

    d, r = run(body, x, lo, hi)
    idx = np.arange(40)[None, :] + start
    keep = (idx >= lo) & (idx < hi)
    want = np.where(keep, x, np.float32(-1e30))
    np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(r[:, 0], want.max(1))


# -- forms AWS's hardware-tested kernels use that the docs do not promise (hazard warnings) --
def test_nc_version_ordering_is_by_value_with_a_hazard_warning():
    """nki.isa.nc_version is documented as a plain Enum (``_modules/nki/isa.html``)."""
    from nkilib_msda.simulator import NkiHazardWarning

    with pytest.warns(NkiHazardWarning, match="nc_version ordering"):
        assert nisa.nc_version.gen4 >= nisa.nc_version.gen3
    with pytest.warns(NkiHazardWarning, match="nc_version ordering"):
        assert not nisa.nc_version.gen2 >= 3
    with pytest.warns(NkiHazardWarning):
        assert nisa.nc_version.gen3 < nisa.nc_version.gen4
    assert nisa.nc_version.gen3 == nisa.nc_version.gen3
    with pytest.raises(TypeError):
        nisa.nc_version.gen3 < "gen4"  # noqa: B015


def test_onchip_ap_with_the_views_row_length_as_partition_stride():
    """nki/deep-dives/nki-aps.html: the partition pair steps partitions; a stride equal to the
    view's row length (not the tile's) is accepted with a hazard warning, anything else is an
    error."""
    from nkilib_msda.simulator import NkiHazardWarning

    x = RNG.standard_normal((8, 64)).astype(np.float32)

    def body(h):
        t = load(h)
        view = t[:, 16:32]
        a = view.ap([[16, 8], [1, 16]])  # row length of the view, not 64
        d = nl.ndarray((8, 16), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=d, src=a)
        return store(d)

    with pytest.warns(NkiHazardWarning, match="partition stride"):
        got = run(body, x, strict=False)
    np.testing.assert_array_equal(got, x[:, 16:32])

    def bad(h):
        load(h)[:, 16:32].ap([[5, 8], [1, 16]])

    with raises_rule("ap", "partition stride"):
        run(bad, x)


def test_new_vector_instructions_are_timed_on_the_vector_engine():
    """Each of the four runs on the Vector engine (their pages), so the timing model charges
    Vector time for them and nothing to the other compute engines."""
    from nkilib_msda.simulator import nki, simulate

    x = RNG.standard_normal((32, 96)).astype(np.float32)

    def kernel(h):
        t = load(h)
        s = nl.ndarray((32, 96), nl.float32, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=s, src=t, shuffle_mask=list(range(31, -1, -1)))
        st = nl.ndarray((32, 6), nl.float32, buffer=nl.sbuf)
        nisa.bn_stats(dst=st, data=s)
        ag = nl.ndarray((32, 2), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=ag, data=st)
        r = nl.ndarray((32, 96), nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=r, on_true_tile=s, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=4.0, bound1=50.0)
        return store(ag), store(r)

    *_, report = simulate(nki.jit(kernel), report=True)(x)
    counts = report.to_dict()["engines"]["vector"]
    busy = report.timing.engine_busy_us
    assert busy["vector"] > 0
    assert busy["tensor"] == busy["scalar"] == busy["gpsimd"] == 0
    assert {"nc_stream_shuffle", "bn_stats", "bn_aggr", "range_select"} <= set(
        counts["by_opcode"])
