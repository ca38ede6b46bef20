"""The reference backend's CPU path (backends/_cpu_sampling.py: embedding_bag forward, sorted
segmented-sum grad_value, blocked gathers) against its general path (gather + index_add_), on
random inputs with out-of-map corners, NaN/inf coordinates, every padding mode, align_corners
and layout; plus chunking, index dtypes, partial gradients and bitwise reproducibility."""

from __future__ import annotations

import itertools

import pytest
import torch

from nkilib_msda.backends.reference import _cpu_sampling
from nkilib_msda.backends.reference import backend as reference_torch
from nkilib_msda.reference import ms_deformable_attention_bwd_ref, ms_deformable_attention_ref
from nkilib_msda.validation.msda import validate_msda_args
from _torch_inputs import make_inputs

MODES = list(itertools.product(("BLNC", "BNLC"), ("BQHLP2", "B2QHLP"), (False, True),
                               ("zeros", "border", "reflection")))
SHAPES = ((5, 7), (3, 2), (1, 1), (2, 4))


def _case(value_layout="BLNC", loc_layout="BQHLP2", seed=0, dtype=torch.float64, queries=9):
    """Inputs with corners outside the map, NaN and +-inf coordinates and an inf grad_output
    row for a query whose samples all miss the map."""
    inputs = make_inputs(batch=2, queries=queries, heads=3, channels=5, points=3,
                         spatial_shapes=SHAPES, value_layout=value_layout,
                         sampling_locations_layout=loc_layout, low=-0.4, high=1.4, seed=seed,
                         dtype=dtype)
    loc = inputs.sampling_locations
    xy = loc if loc_layout == "BQHLP2" else loc.permute(0, 2, 3, 4, 5, 1)  # a view: edits land in loc
    xy[0, 0, 0, 0, 0, 0] = float("nan")
    xy[1, 1, 2, 1, 1, 1] = float("nan")
    xy[0, 2, 1, 3, 2, 0] = float("inf")
    xy[1, 3, 0, 0, 0, 1] = -float("inf")
    xy[0, 4, 2, 2, 1, 0] = 1e30
    xy[:, 5, ..., 0] = float("nan")  # query 5 reads nothing in any padding mode ...
    inputs.grad_output[:, 5] = float("inf")  # ... so its inf grad_output must not leak
    problem = validate_msda_args(inputs.value, SHAPES, None, loc, inputs.attention_weights,
                                 value_layout, loc_layout, False, "zeros")
    return inputs, problem


def _both_paths(monkeypatch, inputs, problem, compute=(True, True, True)):
    args = (inputs.value, problem, inputs.sampling_locations, inputs.attention_weights)
    results = []
    for cpu_path in (True, False):
        monkeypatch.setattr(reference_torch, "_CPU_PATH", cpu_path)
        results.append((reference_torch.msda_forward(*args),
                        reference_torch.msda_backward(inputs.grad_output, *args, compute=compute)))
    return results


def _problem(problem, align_corners, padding_mode):
    return validate_msda_args(
        torch.empty(problem.value_shape), problem.spatial_shapes, None,
        torch.empty(problem.sampling_locations_shape), torch.empty(problem.attention_weights_shape),
        problem.value_layout, problem.sampling_locations_layout, align_corners, padding_mode)


@pytest.mark.parametrize("value_layout,loc_layout,align_corners,padding_mode", MODES)
def test_cpu_path_matches_general_path_float64(monkeypatch, value_layout, loc_layout,
                                               align_corners, padding_mode):
    inputs, problem = _case(value_layout, loc_layout, seed=MODES.index(
        (value_layout, loc_layout, align_corners, padding_mode)))
    problem = _problem(problem, align_corners, padding_mode)
    (out, grads), (want_out, want_grads) = _both_paths(monkeypatch, inputs, problem)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    for name, got, want in zip(("grad_value", "grad_loc", "grad_attn"), grads, want_grads):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)
    # NaN coordinates contribute nothing and get zero gradient.
    nan = torch.isnan(inputs.sampling_locations).any(-1 if loc_layout == "BQHLP2" else 1)
    assert nan.sum() == 2 + 2 * 3 * len(SHAPES) * 3
    assert (grads[2][nan] == 0).all() and (grads[1].movedim(1 if loc_layout == "B2QHLP" else -1, -1)[nan] == 0).all()


def test_cpu_path_matches_the_numpy_oracle_float64():
    inputs, problem = _case(seed=21)
    args = (inputs.value, problem, inputs.sampling_locations, inputs.attention_weights)
    out = reference_torch.msda_forward(*args)
    grads = reference_torch.msda_backward(inputs.grad_output, *args)
    numpy_args = (inputs.value.numpy(), SHAPES, None, inputs.sampling_locations.numpy(),
                  inputs.attention_weights.numpy())
    torch.testing.assert_close(out, torch.from_numpy(ms_deformable_attention_ref(*numpy_args)),
                               rtol=1e-12, atol=1e-12)
    want = ms_deformable_attention_bwd_ref(inputs.grad_output.numpy(), *numpy_args)
    # grad_value gets the inf grad_output of query 5 from no corner: finite and exact.
    for got, ref in zip(grads, want):
        torch.testing.assert_close(got, torch.from_numpy(ref), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_cpu_path_float32_close_to_general_path(monkeypatch, padding_mode):
    inputs, problem = _case(seed=5, dtype=torch.float32)
    problem = _problem(problem, False, padding_mode)
    (out, grads), (want_out, want_grads) = _both_paths(monkeypatch, inputs, problem)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_chunks_blocks_and_int64_indices_give_the_same_results(monkeypatch):
    inputs, problem = _case("BNLC", "B2QHLP", seed=8, queries=11)
    problem = _problem(problem, True, "border")
    args = (inputs.value, problem, inputs.sampling_locations, inputs.attention_weights)
    whole = (reference_torch.msda_forward(*args),
             reference_torch.msda_backward(inputs.grad_output, *args))
    monkeypatch.setattr(reference_torch, "_GATHER_ELEMENTS_PER_CHUNK", 3 * 2 * 3 * 4 * 3 * 4 * 2)
    monkeypatch.setattr(_cpu_sampling, "_GATHER_BYTES_PER_BLOCK", 7)
    monkeypatch.setattr(_cpu_sampling, "_index_dtype", lambda rows: torch.int64)
    assert len(reference_torch._cpu_chunks(problem)) == 4
    chunked = (reference_torch.msda_forward(*args),
               reference_torch.msda_backward(inputs.grad_output, *args))
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-14)
    for got, want in zip(chunked[1], whole[1]):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_partial_gradients_are_zeros_and_the_rest_unchanged(dtype):
    inputs, problem = _case(seed=3, dtype=dtype)
    args = (inputs.grad_output, inputs.value, problem, inputs.sampling_locations,
            inputs.attention_weights)
    full = reference_torch.msda_backward(*args)
    for compute in itertools.product((False, True), repeat=3):
        part = reference_torch.msda_backward(*args, compute=compute)
        for wanted, got, want in zip(compute, part, full):
            assert torch.equal(got, want) if wanted else (got == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_is_bitwise_reproducible_across_runs_and_thread_counts(dtype):
    inputs, problem = _case(seed=4, dtype=dtype, queries=40)
    args = (inputs.grad_output, inputs.value, problem, inputs.sampling_locations,
            inputs.attention_weights)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            runs.append((reference_torch.msda_forward(*args[1:]), *reference_torch.msda_backward(*args)))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for got, want in zip(other, runs[0]):
            assert torch.equal(got, want)


def test_non_finite_value_read_only_by_out_of_map_corners_falls_back(monkeypatch):
    """The embedding_bag forward weights clamped out-of-map corners by 0, so an inf there
    turns into NaN; the CPU path reports it and the general path gives the exact result."""
    inputs = make_inputs(batch=1, queries=3, heads=1, channels=2, points=1, spatial_shapes=((2, 2),),
                         seed=1)
    inputs.value[0, 0] = float("inf")  # pixel (0, 0)
    inputs.sampling_locations[..., 0] = -1.0  # x far left: corners x0, x1 both outside
    inputs.sampling_locations[..., 1] = 0.25  # row 0
    problem = validate_msda_args(inputs.value, ((2, 2),), None, inputs.sampling_locations,
                                 inputs.attention_weights, "BLNC", "BQHLP2", False, "zeros")
    args = (inputs.value, problem, inputs.sampling_locations, inputs.attention_weights)
    u, v = inputs.sampling_locations[..., 0], inputs.sampling_locations[..., 1]
    out = torch.empty(1, 3, 1, 2, dtype=torch.float64)
    levels = reference_torch.level_tables(problem, torch.float64, out.device)
    assert not _cpu_sampling.forward(_cpu_sampling.value_matrix(inputs.value, torch.float64), problem,
                                     levels, u, v, inputs.attention_weights, out,
                                     reference_torch._cpu_chunks(problem))
    result = reference_torch.msda_forward(*args)
    assert torch.equal(result, torch.zeros_like(result))
    grads = reference_torch.msda_backward(inputs.grad_output, *args)
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 2 queries and chunks of 5 (the _case problem: 288 corners per query), so the
    pool threads get many blocks and grad_value several chunks and row ranges."""
    monkeypatch.setattr(_cpu_sampling, "_CORNERS_PER_BLOCK", 2 * 288)
    monkeypatch.setattr(reference_torch, "_GATHER_ELEMENTS_PER_CHUNK", 5 * 288 * 2)


def _poisoned(monkeypatch):
    """torch.empty / empty_like return NaN (floats) or -7 (integers): whatever the CPU path
    leaves unwritten shows up."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan") if t.is_floating_point() else -7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(empty_like(*a, **k)))


def _run(inputs, problem, threads):
    args = (inputs.value, problem, inputs.sampling_locations, inputs.attention_weights)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return reference_torch.msda_forward(*args), reference_torch.msda_backward(inputs.grad_output, *args)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pool_threads_give_bitwise_the_same_results_as_one_thread(monkeypatch, small_blocks, dtype):
    inputs, problem = _case("BNLC", "BQHLP2", seed=31, dtype=dtype, queries=23)
    assert len(reference_torch._cpu_chunks(problem)) == 5
    assert len(_cpu_sampling._query_blocks(reference_torch._cpu_chunks(problem), problem)) == 14
    _poisoned(monkeypatch)
    runs = [_run(inputs, problem, n) for n in (1, 2, 3, 2)]
    for out, grads in runs[1:]:
        assert torch.equal(out, runs[0][0])
        for got, want in zip(grads, runs[0][1]):
            assert torch.equal(got, want)
    out, grads = runs[0]
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    if dtype == torch.float64:
        monkeypatch.setattr(reference_torch, "_CPU_PATH", False)
        want_out, want_grads = _run(inputs, problem, 1)
        torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_pool_threads_match_the_general_path_in_every_mode(monkeypatch, small_blocks, padding_mode):
    inputs, problem = _case("BLNC", "B2QHLP", seed=32, queries=13)
    problem = _problem(problem, True, padding_mode)
    _poisoned(monkeypatch)
    out, grads = _run(inputs, problem, 2)
    monkeypatch.setattr(reference_torch, "_CPU_PATH", False)
    want_out, want_grads = _run(inputs, problem, 1)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    for got, want in zip(grads, want_grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_pool_threads_write_zeros_where_nothing_is_read(monkeypatch, small_blocks):
    """Every sample outside the map (zeros padding) or NaN: the output and all gradients are
    exactly 0, every grad_value row written by the (empty) row ranges."""
    inputs, problem = _case(seed=33, queries=11)
    loc = inputs.sampling_locations
    loc[..., 0] = 7.0
    loc[:, ::2, ..., 1] = float("nan")
    _poisoned(monkeypatch)
    out, grads = _run(inputs, problem, 2)
    assert torch.equal(out, torch.zeros_like(out))
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))
