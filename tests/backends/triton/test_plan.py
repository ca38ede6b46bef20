"""Launch planning and dispatch rules of the Triton backend (pure Python, no kernels run)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nkilib_msda.backends.triton import backend as tb  # noqa: E402
from nkilib_msda.validation.msda import MSDAProblem, validate_msda_args  # noqa: E402
from nkilib_msda.workloads import DDETR_LEVELS as DDETR  # noqa: E402


def _needs_triton() -> None:
    """For the tests of reasons and launches that Triton's presence comes before (the CPU quick
    start installs no `gpu` extra)."""
    pytest.importorskip("triton", reason="triton is an optional dependency (the `gpu` extra)")


@pytest.fixture(autouse=True)
def _fresh_contexts():
    """Support reasons are cached per call signature; these tests change the environment."""
    tb.clear_contexts()
    yield
    tb.clear_contexts()


def problem(batch=2, queries=22223, heads=8, channels=32, levels=DDETR, points=4,
            padding_mode="zeros") -> MSDAProblem:
    """The validated problem of these sizes (BLNC, BQHLP2), from shape-only meta tensors."""
    pixels = sum(h * w for h, w in levels)
    value = torch.empty(batch, pixels, heads, channels, device="meta")
    loc = torch.empty(batch, queries, heads, len(levels), points, 2, device="meta")
    attn = torch.empty(batch, queries, heads, len(levels), points, device="meta")
    return validate_msda_args(value, levels, None, loc, attn, "BLNC", "BQHLP2", False, padding_mode=padding_mode)


def test_encoder_plan_uses_16_byte_vectors_per_thread():
    bf16 = tb.plan_launch(problem(), "bfloat16")
    fp32 = tb.plan_launch(problem(), "float32")
    assert bf16.forward_kernel == fp32.forward_kernel == "points"
    # one 16-byte vector per thread per corner: block_q * C_h / threads elements of 2 or 4 bytes
    assert bf16.forward.block_q * 32 // (32 * bf16.forward.num_warps) * 2 == 16
    assert fp32.forward.block_q * 32 // (32 * fp32.forward.num_warps) * 4 == 16
    assert bf16.head_slowest and bf16.grad_value_accumulator == "float32"
    assert not bf16.index64


def test_decoder_plan_uses_all_samples_kernel():
    plan = tb.plan_launch(problem(queries=300), "bfloat16")
    assert plan.forward_kernel == "samples"
    assert plan.forward.block_q * 16 * 32 <= 2048


def test_kept_grad_value_accumulator_is_on_by_default():
    tb.plan_launch.cache_clear()
    assert tb.plan_launch(problem(queries=300), "bfloat16").grad_value_scratch == "kept"


def test_16_bit_values_keep_a_small_grad_value_accumulator(monkeypatch):
    from nkilib_msda.backends.triton import plan as triton_plan

    monkeypatch.setattr(triton_plan, "KEEP_SCRATCH_BY_DEFAULT", True)
    tb.plan_launch.cache_clear()  # plans are memoized
    try:
        small = problem(queries=300)
        assert tb.plan_launch(small, "bfloat16").grad_value_scratch == "kept"
        assert tb.plan_launch(small, "float16").grad_value_scratch == "kept"
        assert tb.plan_launch(small, "float32").grad_value_scratch == "fresh"  # in place
        big = problem(queries=300, levels=((512, 512),))  # 2 * 512**2 * 8 * 32 fp32: 512 MiB
        assert tb.plan_launch(big, "bfloat16").grad_value_scratch == "fresh"
    finally:
        tb.plan_launch.cache_clear()


def test_int64_needed_only_beyond_int32():
    assert not tb.needs_int64(problem())
    big = problem(batch=5, queries=64, heads=4, channels=128, levels=((1024, 1024),))
    assert tb.needs_int64(big)  # 5 * 2**20 * 4 * 128 elements > 2**31
    assert tb.plan_launch(big, "bfloat16").index64


def test_non_power_of_two_channels_round_up():
    assert tb.plan_launch(problem(channels=24), "float32").block_c == 32
    assert tb.plan_launch(problem(channels=1), "float32").block_c == 1


def test_reflection_padding_is_unsupported():
    value = torch.zeros(1, 1, 1, 1)
    reason = tb.unsupported_reason(problem(padding_mode="reflection"), value, value)
    assert reason is not None and "reflection" in reason


def test_float64_value_is_unsupported(monkeypatch):
    _needs_triton()  # without it the first reason is "triton is not installed"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    value = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
    reason = tb.unsupported_reason(problem(), value, value.float())
    assert reason is not None and "float64" in reason


def test_cpu_tensors_need_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    value = torch.zeros(1, 1, 1, 1)
    if not torch.cuda.is_available():
        assert tb.unsupported_reason(problem(), value, value) is not None


@pytest.mark.parametrize("env,expected", [("1", True), ("true", True), ("0", False), ("off", False)])
def test_deterministic_env_variable(monkeypatch, env, expected):
    monkeypatch.setenv(tb.DETERMINISTIC_ENV, env)
    assert tb._resolve_deterministic(None) is expected
    assert tb._resolve_deterministic(not expected) is (not expected)  # the argument wins


def test_deterministic_defaults_to_torch_setting(monkeypatch):
    monkeypatch.delenv(tb.DETERMINISTIC_ENV, raising=False)
    assert tb._resolve_deterministic(None) is torch.are_deterministic_algorithms_enabled()


def test_cpu_reason_says_cuda_tensors_and_interpreter(monkeypatch):
    _needs_triton()  # without it the first reason is "triton is not installed"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    value = torch.zeros(1, 1, 1, 1)
    reason = tb.unsupported_reason(problem(), value, value)
    assert "CUDA tensors" in reason and "TRITON_INTERPRET=1" in reason and "cpu" in reason


def test_missing_triton_reason_says_not_installed(monkeypatch):
    monkeypatch.setattr(tb, "_import_error", lambda: "triton is not installed (test)")
    value = torch.zeros(1, 1, 1, 1)
    assert tb.unsupported_reason(problem(), value, value) == "triton is not installed (test)"
    assert not tb.is_available() and tb.unavailable_reason() == "triton is not installed (test)"


def test_forward_on_cpu_without_interpreter_raises_value_error(monkeypatch):
    _needs_triton()  # without it the first reason is "triton is not installed"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    value = torch.zeros(1, 20, 1, 4)
    loc = torch.zeros(1, 3, 1, 1, 1, 2)
    attn = torch.zeros(1, 3, 1, 1, 1)
    p = MSDAProblem(batch=1, num_queries=3, num_heads=1, head_dim=4, num_levels=1, num_points=1,
                    spatial_shapes=((4, 5),), level_start_index=(0,), value_layout="BLNC",
                    sampling_locations_layout="BQHLP2", align_corners=False, padding_mode="zeros")
    with pytest.raises(ValueError, match="needs CUDA tensors.*TRITON_INTERPRET=1"):
        tb.msda_forward(value, p, loc, attn)


def test_reason_is_computed_once_per_call_signature(monkeypatch):
    calls = []
    real = tb._compute_reason

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(tb, "_compute_reason", counting)
    p = problem(padding_mode="reflection")
    value = torch.zeros(1, 1, 1, 1)
    first = tb.unsupported_reason(p, value, value)
    assert tb.unsupported_reason(p, value, value) == first and "reflection" in first
    assert len(calls) == 1
    assert tb.unsupported_reason(problem(padding_mode="reflection"), value, value) == first
    assert len(calls) == 1  # an equal problem object built anew shares the context
    tb.unsupported_reason(p, value.double(), value)  # another dtype: another signature
    assert len(calls) == 2


@pytest.mark.parametrize("queries,points", [(22223, 4), (300, 4), (18000, 8)])
def test_fast_backward_uses_the_samples_kernel_and_deterministic_the_points_kernel(queries, points):
    _needs_triton()  # without it the first reason is "triton is not installed"
    from nkilib_msda.backends.triton.kernels.backward import (msda_backward_kernel,
                                                              msda_backward_samples_kernel)

    p = problem(queries=queries, points=points)
    plan = tb.plan_launch(p, "float32")
    assert plan.backward_kernel == "samples"
    assert tb.uses_samples_backward(plan, deterministic=False)
    assert not tb.uses_samples_backward(plan, deterministic=True)
    kernel, grid, scalars, kwargs = tb._backward_launch(p, plan, (True, True, True), False)
    assert kernel is msda_backward_samples_kernel
    assert kwargs["BLOCK_Q"] == plan.samples_backward.block_q == 1
    assert kwargs["BLOCK_S"] == 4 * points and "DETERMINISTIC" not in kwargs
    assert grid == (p.batch * p.num_heads * queries,) and len(scalars) == 4
    # 2 warps for 16 samples x 32 channels; more threads for wider (BLOCK_S x BLOCK_C) tiles
    assert kwargs["num_warps"] == (2 if points == 4 else 4)
    kernel, grid, scalars, kwargs = tb._backward_launch(p, plan, (True, True, True), True)
    assert kernel is msda_backward_kernel and kwargs["DETERMINISTIC"] is True
    assert kwargs["BLOCK_Q"] == plan.backward.block_q and len(scalars) == 5


@pytest.mark.parametrize("dtype,block_q", [("float32", 2), ("bfloat16", 4)])
def test_few_samples_per_query_put_several_queries_in_a_backward_program(dtype, block_q):
    # BEV TSA: 4 samples per query -> 8 (fp32) / 16 (bf16) samples per program; the encoder
    # (16 samples) and decoder-sized problems keep one query per program.
    tsa = problem(batch=1, queries=40000, levels=((200, 200),), points=4)
    assert tb.plan_launch(tsa, dtype).samples_backward.block_q == block_q
    assert tb.plan_launch(problem(), dtype).samples_backward.block_q == 1
    decoder = problem(batch=1, queries=900, levels=((200, 200),), points=4)
    assert tb.plan_launch(decoder, dtype).samples_backward.block_q == 1
    _needs_triton()  # the launch arguments come from the kernel module
    kernel, grid, _, kwargs = tb._backward_launch(tsa, tb.plan_launch(tsa, dtype), (True,) * 3, False)
    assert kwargs["BLOCK_Q"] == block_q and grid == (8 * -(-40000 // block_q),)


def test_flat_head_slowest_grid():
    """One flat grid, head-slowest (the (query blocks, batch, heads) grid and the backward's
    register cap were measured within noise on an H200 and removed, docs/triton.md)."""
    plan = tb.plan_launch(problem(), "float32")
    assert plan.head_slowest and not hasattr(plan, "grid_3d")
    _needs_triton()
    _kernel, grid, _scalars, kwargs = tb._backward_launch(problem(), plan, (True,) * 3, False)
    assert grid == (2 * 8 * 22223,) and "GRID_3D" not in kwargs and "maxnreg" not in kwargs
