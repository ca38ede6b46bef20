"""Triton backend for CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``).

Public surface used by the op layer (``nkilib_msda.backends``): ``NAME``, ``CAPABILITIES``,
``is_available`` (triton imports), ``unavailable_reason`` (why not), ``unsupported_reason`` and
``backward_unsupported_reason`` (why this call cannot run: padding mode, dtypes, CPU tensors
without the interpreter, ...), ``msda_forward``, ``msda_backward``. Direct calls of ``msda_forward``/``msda_backward`` raise ``ValueError`` with
the same reason.

Everything about a launch (tile sizes, warps, 64-bit indexing, accumulator dtype) is decided
in plain Python by :func:`plan_launch` before any kernel runs. Coordinates are fp32 inside the
kernels for every value dtype; accumulation is fp32.

Host path (what a decoder-sized call is bounded by): the support check, plan, level tables on
the device and kernel arguments are cached per call signature (:class:`_Context`, keyed on the
validated problem object, dtypes and devices), and kernels are launched through the compiled
kernel once Triton has compiled it (:mod:`.launch`): no synchronisation and no host -> device
copy per call. For 16-bit values the plan can keep the fp32 grad_value accumulator per signature
and stream, cleared by the cast that ends each backward (``_Context.take_scratch``; off by
default, see ``plan.KEEP_SCRATCH_BY_DEFAULT``): it stays allocated until
:func:`clear_contexts`. Measurements: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import functools
from typing import Any

from nkilib_msda._env import read_env
from nkilib_msda.backends.protocol import Capabilities, capability_reason
from nkilib_msda.backends.triton.launch import FAST_LAUNCH as _FAST_LAUNCH  # noqa: F401 - benchmarks switch it
from nkilib_msda.backends.triton.launch import Launcher as _Launcher
from nkilib_msda.backends.triton.launch import raw_stream as _raw_stream
from nkilib_msda.backends.triton.plan import (  # noqa: F401 - the planning names belong to this backend's surface
    INT32_MAX, KernelConfig, LaunchPlan, _interpreting, needs_int64, next_pow2, plan_launch,
    uses_samples_backward, with_configs)
from nkilib_msda.hardware import KERNEL_DTYPES
from nkilib_msda.validation.msda import KERNEL_PADDING_MODES, MSDAProblem, dtype_name

DETERMINISTIC_ENV = "NKILIB_MSDA_DETERMINISTIC"

NAME = "triton"
CAPABILITIES = Capabilities(
    # CPU tensors only under the Triton interpreter (tests): see _device_reason.
    device_types=("cuda", "cpu"), default_for=("cuda",), dtypes=KERNEL_DTYPES,
    padding_modes=KERNEL_PADDING_MODES,
    always_deterministic=False,  # atomics by default; deterministic=True sorts and reduces
    level_tables=True)  # the kernels read shapes and starts through shapes_ptr / starts_ptr


@functools.lru_cache(maxsize=1)
def _import_error() -> str | None:
    """Why triton cannot be imported (None when it can)."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return (f"triton is not installed ({exc}); install it (pip install triton, or this "
                f"package's 'gpu' extra) to use backend='triton'")
    return None


def is_available() -> bool:
    """True when triton imports. Which calls it can run (CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``) is :func:`unsupported_reason`'s answer."""
    return _import_error() is None


def unavailable_reason() -> str | None:
    """Why the backend cannot run at all in this process (None when triton imports)."""
    return _import_error()


def _device_reason(device: Any) -> str | None:
    if device is None:
        return "the triton backend needs torch tensors"
    if device.type == "cuda" or (device.type == "cpu" and _interpreting()):
        return None
    if device.type == "cpu":
        return (f"the triton backend needs CUDA tensors, got value on {device}; to run its "
                f"kernels on CPU tensors (tests only, slow) set TRITON_INTERPRET=1 before "
                f"triton is imported")
    return f"the triton backend needs CUDA tensors, got value on {device}"


def _compute_reason(problem: MSDAProblem, value: Any, sampling_locations: Any) -> str | None:
    if problem.padding_mode not in CAPABILITIES.padding_modes:
        return capability_reason(NAME, CAPABILITIES, problem, value, check_device=False)
    missing = _import_error()
    if missing is not None:
        return missing
    reason = capability_reason(NAME, CAPABILITIES, problem, value, check_device=False)
    if reason is not None:
        return reason
    loc_name = dtype_name(sampling_locations.dtype)
    if loc_name not in CAPABILITIES.dtypes:
        return (f"sampling_locations dtype {loc_name} is not supported by the triton backend "
                f"(supported: {list(CAPABILITIES.dtypes)})")
    device = getattr(value, "device", None)
    reason = _device_reason(device)
    if reason is not None:
        return reason
    if getattr(sampling_locations, "device", device) != device:
        return f"value is on {device} but sampling_locations is on {sampling_locations.device}"
    return None


def unsupported_reason(problem: MSDAProblem, value: Any, sampling_locations: Any) -> str | None:
    """Why this backend cannot run the call (None when it can). Memoized per call signature
    (problem, dtypes, devices), so repeated calls cost one dict lookup."""
    return _context(problem, value, sampling_locations).reason


def backward_unsupported_reason(problem: MSDAProblem, value: Any, sampling_locations: Any
                                ) -> str | None:
    """The backward kernels have the forward's limits and no others."""
    return _context(problem, value, sampling_locations).reason


# ----------------------------------------------------------------------------- call contexts


@functools.lru_cache(maxsize=64)
def _level_tables(shapes: tuple, starts: tuple, device: Any):
    """Cached int32 device tensors (N_l, 2) and (N_l,): built once per (device, shapes), so no
    call copies them host -> device (and graph capture never sees a copy)."""
    import torch

    flat = [v for hw in shapes for v in hw]
    return (torch.tensor(flat, dtype=torch.int32, device=device),
            torch.tensor(list(starts), dtype=torch.int32, device=device))


def _static_args(problem: MSDAProblem, plan: LaunchPlan) -> dict:
    return dict(
        NUM_HEADS=problem.num_heads, HEAD_DIM=problem.head_dim, NUM_LEVELS=problem.num_levels,
        NUM_POINTS=problem.num_points, VALUE_BNLC=problem.value_layout == "BNLC",
        LOC_B2QHLP=problem.sampling_locations_layout == "B2QHLP",
        ALIGN_CORNERS=bool(problem.align_corners), BORDER=problem.padding_mode == "border",
        INDEX64=plan.index64, BLOCK_C=plan.block_c, HEAD_SLOWEST=plan.head_slowest)


def _grid(problem: MSDAProblem, plan: LaunchPlan, n_blocks: int) -> tuple[int, ...]:
    """The launch grid of a kernel with ``n_blocks`` query blocks per (batch, head): flat,
    (B * N_h * n_blocks,), in the plan's program order (kernels/sampling.py)."""
    return (problem.batch * problem.num_heads * n_blocks,)


def _launch_options(cfg: KernelConfig) -> dict:
    """Triton launch options of a kernel config."""
    return dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _forward_launch(problem: MSDAProblem, plan: LaunchPlan):
    """(kernel, grid, keyword arguments) of the forward."""
    from nkilib_msda.backends.triton.kernels.forward import (
        msda_forward_kernel, msda_forward_samples_kernel)

    cfg = plan.forward
    n_blocks = -(-problem.num_queries // cfg.block_q)
    kwargs = dict(BLOCK_Q=cfg.block_q, **_launch_options(cfg), **_static_args(problem, plan))
    kernel = msda_forward_kernel
    if plan.forward_kernel == "samples":
        kernel = msda_forward_samples_kernel
        kwargs["BLOCK_S"] = next_pow2(problem.num_levels * problem.num_points)
    scalars = (problem.num_queries, problem.total_pixels, n_blocks, problem.batch)
    return kernel, _grid(problem, plan, n_blocks), scalars, kwargs


def _backward_launch(problem: MSDAProblem, plan: LaunchPlan, compute: tuple[bool, bool, bool],
                     deterministic: bool):
    """(kernel, grid, scalars, keyword arguments) of the backward. The points kernel takes
    (grad_out, value, loc, attn, shapes, starts, grad_value, grad_loc, grad_attn, keys, coefs);
    the samples kernel the same without keys and coefs."""
    from nkilib_msda.backends.triton.kernels.backward import (
        msda_backward_kernel, msda_backward_samples_kernel)

    samples = uses_samples_backward(plan, deterministic)
    cfg = plan.samples_backward if samples else plan.backward
    n_blocks = -(-problem.num_queries // cfg.block_q)
    kwargs = dict(COMPUTE_VALUE=compute[0], COMPUTE_LOC=compute[1], COMPUTE_ATTN=compute[2],
                  BLOCK_Q=cfg.block_q, **_launch_options(cfg), **_static_args(problem, plan))
    grid = _grid(problem, plan, n_blocks)
    scalars: tuple = (problem.num_queries, problem.total_pixels, n_blocks, problem.batch)
    if samples:
        kwargs["BLOCK_S"] = next_pow2(problem.num_levels * problem.num_points)
        return msda_backward_samples_kernel, grid, scalars, kwargs
    num_rows = problem.batch * problem.total_pixels * problem.num_heads if deterministic else 0
    kwargs["DETERMINISTIC"] = deterministic
    return msda_backward_kernel, grid, scalars + (num_rows,), kwargs


_CAST_BLOCK = 4096  # elements per program of the grad_value cast


def _cast_launch(numel: int, clear: bool):
    """(kernel, grid, scalars, keyword arguments) of the grad_value cast (acc, out)."""
    from nkilib_msda.backends.triton.kernels.backward import msda_grad_value_cast_kernel

    kwargs = dict(CLEAR=clear, INDEX64=numel + _CAST_BLOCK > INT32_MAX, BLOCK=_CAST_BLOCK,
                  num_warps=8)
    return msda_grad_value_cast_kernel, (-(-numel // _CAST_BLOCK),), (numel,), kwargs


class _Context:
    """Everything about one call signature that does not depend on tensor contents: the
    reason it cannot run (or None), the default plan, the level tables on the device and the
    prepared launchers."""

    def __init__(self, problem: MSDAProblem, value: Any, sampling_locations: Any) -> None:
        self.problem = problem
        self.reason = _compute_reason(problem, value, sampling_locations)
        self.plan: LaunchPlan | None = None
        self._launchers: dict = {}
        self._tables = None
        self._scratch: dict = {}  # stream handle -> zeroed fp32 accumulator (kept scratch)
        if self.reason is None:
            device = value.device
            self.device = device
            self.plan = plan_launch(problem, dtype_name(value.dtype), device.index or 0)

    def for_problem(self, problem: MSDAProblem) -> "_Context":
        """This context for an equal problem object (shares tables and launchers)."""
        twin = object.__new__(_Context)
        twin.__dict__.update(self.__dict__)
        twin.problem = problem
        return twin

    def tables(self):
        if self._tables is None:
            self._tables = _level_tables(self.problem.spatial_shapes,
                                         self.problem.level_start_index, self.device)
        return self._tables

    def take_scratch(self, value, keep: bool) -> tuple[Any, int | None]:
        """A zeroed fp32 tensor of value's shape and the stream it may be given back under
        (None: not to be kept). A kept one is taken out of the pool while in use, so a call on
        another thread gets its own; one per stream, since only calls on one stream are ordered;
        none while a CUDA graph is captured (its zeroing would run only on replay)."""
        import torch

        stream = None
        if keep:
            if value.device.type == "cpu":
                stream = 0  # interpreter: every kernel has finished when its launch returns
            elif not torch.cuda.is_current_stream_capturing():
                stream = _raw_stream(value.device)
            scratch = self._scratch.pop(stream, None)
            if scratch is not None:
                return scratch, stream
        return torch.zeros(value.shape, dtype=torch.float32, device=value.device), stream

    def give_back_scratch(self, stream: int | None, scratch) -> None:
        """Keep ``scratch`` for the next call on ``stream`` (its clearing is enqueued there)."""
        if stream is not None:
            self._scratch[stream] = scratch

    def launcher(self, key: tuple, build, atomic: tuple[int, ...] = ()) -> _Launcher:
        launcher = self._launchers.get(key)
        if launcher is None:
            kernel, grid, scalars, kwargs = build()
            launcher = self._launchers[key] = _Launcher(kernel, grid, scalars, kwargs, atomic)
        return launcher


_MAX_CONTEXTS = 256
_CONTEXTS: dict[tuple, _Context] = {}
_CONTEXTS_BY_VALUE: dict[tuple, _Context] = {}


def _context(problem: MSDAProblem, value: Any, sampling_locations: Any) -> _Context:
    """The cached :class:`_Context` of this call signature. Keyed on the problem object's
    identity (validation hands out one object per signature) plus dtypes and devices; the
    context keeps the problem alive, so its id cannot be reused by another object."""
    facts = (getattr(value, "dtype", None), getattr(sampling_locations, "dtype", None),
             getattr(value, "device", None), getattr(sampling_locations, "device", None))
    key = (id(problem), *facts)
    ctx = _CONTEXTS.get(key)
    if ctx is None or ctx.problem is not problem:
        # An equal problem built anew (callers that do not memoize validation) shares the
        # context of the first one; the comparison by value costs a few µs, hence the id key.
        if len(_CONTEXTS) >= _MAX_CONTEXTS:
            _CONTEXTS.clear()
            _CONTEXTS_BY_VALUE.clear()
        by_value = (problem, *facts)
        ctx = _CONTEXTS_BY_VALUE.get(by_value)
        if ctx is None:
            ctx = _CONTEXTS_BY_VALUE[by_value] = _Context(problem, value, sampling_locations)
        elif ctx.problem is not problem:
            ctx = _CONTEXTS_BY_VALUE[by_value] = ctx.for_problem(problem)
        _CONTEXTS[key] = ctx
    return ctx


def clear_contexts() -> None:
    """Forget every cached call context (tests that change the environment)."""
    _CONTEXTS.clear()
    _CONTEXTS_BY_VALUE.clear()


def _checked_context(problem: MSDAProblem, value, sampling_locations) -> _Context:
    ctx = _context(problem, value, sampling_locations)
    if ctx.reason is not None:
        raise ValueError(f"backend='triton' cannot run this call: {ctx.reason}")
    return ctx


def _resolve_deterministic(deterministic: bool | None) -> bool:
    if deterministic is not None:
        return bool(deterministic)
    env = read_env(DETERMINISTIC_ENV)
    if env is not None:
        return env
    import torch

    return torch.are_deterministic_algorithms_enabled()


# ----------------------------------------------------------------------------- forward


def msda_forward(value, problem: MSDAProblem, sampling_locations, attention_weights,
                 plan: LaunchPlan | None = None, level_tables=None):
    """Output (B, N_q, N_h*C_h) in value's dtype. Inputs in the layouts named by ``problem``.
    ``level_tables``: (shapes int32 (N_l, 2), starts int32 (N_l,)) on value's device, read by
    the kernel instead of the cached tables built from ``problem`` (``Capabilities.level_tables``).

    Host work per call: one dict lookup for the cached context, the output allocation and one
    kernel launch (no device synchronisation, no host -> device copy)."""
    import torch

    ctx = _checked_context(problem, value, sampling_locations)
    value = value.contiguous()
    sampling_locations = sampling_locations.contiguous()
    attention_weights = attention_weights.contiguous()
    out = torch.empty(problem.output_shape, dtype=value.dtype, device=value.device)
    shapes, starts = ctx.tables() if level_tables is None else level_tables
    default = ctx.plan
    assert default is not None  # set whenever ctx.reason is None
    if plan is None or plan == default:
        launch = ctx.launcher(("fwd",), lambda: _forward_launch(problem, default))
    else:
        launch = _Launcher(*_forward_launch(problem, plan))
    launch(value, sampling_locations, attention_weights, out, shapes, starts)
    return out


# ----------------------------------------------------------------------------- backward


def msda_backward(grad_output, value, problem: MSDAProblem, sampling_locations, attention_weights,
                  compute: tuple[bool, bool, bool] = (True, True, True),
                  deterministic: bool | None = None, plan: LaunchPlan | None = None,
                  level_tables=None):
    """(grad_value, grad_sampling_locations, grad_attention_weights); ``level_tables`` as in
    :func:`msda_forward`.

    grad_value in value's layout and dtype; grad_sampling_locations in the locations' layout
    and dtype; grad_attention_weights (B, N_q, N_h, N_l, N_p) in the weights' dtype; zeros
    where ``compute`` is False. ``deterministic=None`` reads env NKILIB_MSDA_DETERMINISTIC
    (else torch.are_deterministic_algorithms_enabled()); True gives a bitwise-reproducible
    grad_value (sort + ordered per-row reduction) at extra cost. grad_value is always
    accumulated in fp32: for 16-bit value dtypes in an fp32 scratch buffer that one kernel casts
    to grad_value; with the plan's kept scratch that kernel also clears it for the next call
    on the same stream (two launches per backward, as for fp32 values: no zero-fill).
    """
    import torch
    import triton

    from nkilib_msda.backends.triton.kernels.backward import msda_grad_value_rows_kernel

    ctx = _checked_context(problem, value, sampling_locations)
    default_plan = plan is None or plan == ctx.plan
    plan = ctx.plan if plan is None else plan
    assert plan is not None  # set whenever ctx.reason is None
    want_value, want_loc, want_attn = (bool(c) for c in compute)
    deterministic = _resolve_deterministic(deterministic) and want_value
    device = value.device
    grad_output = grad_output.contiguous()
    value = value.contiguous()
    sampling_locations = sampling_locations.contiguous()
    attention_weights = attention_weights.contiguous()

    grad_loc = (torch.empty_like if want_loc else torch.zeros_like)(sampling_locations)
    grad_attn = (torch.empty_like if want_attn else torch.zeros_like)(attention_weights)
    native = plan.grad_value_accumulator == "native" or value.dtype == torch.float32
    grad_value: torch.Tensor | None
    if deterministic:
        grad_value = torch.empty_like(value)
        accumulator = grad_value  # unused by the kernel in this mode
        num_rows = problem.batch * problem.total_pixels * problem.num_heads
        key_dtype = torch.int64 if plan.index64 else torch.int32
        keys = torch.empty(problem.num_samples * 4, dtype=key_dtype, device=device)
        coefs = torch.empty(problem.num_samples * 4, dtype=torch.float32, device=device)
    else:
        grad_value = torch.zeros_like(value) if (native or not want_value) else None
        if grad_value is None:
            accumulator, scratch_stream = ctx.take_scratch(value, plan.grad_value_scratch == "kept")
        else:
            accumulator = grad_value
        keys = coefs = accumulator  # placeholders, never touched when not DETERMINISTIC

    if want_value or want_loc or want_attn:
        flags = (want_value, want_loc, want_attn)
        build = lambda: _backward_launch(problem, plan, flags, deterministic)  # noqa: E731
        atomic = () if deterministic else (6,)  # the accumulator (argument 6) takes atomics
        if default_plan:
            launch = ctx.launcher(("bwd", flags, deterministic), build, atomic)
        else:
            kernel, grid, scalars, kwargs = build()
            launch = _Launcher(kernel, grid, scalars, kwargs, atomic)
        shapes, starts = ctx.tables() if level_tables is None else level_tables
        tensors: tuple = (grad_output, value, sampling_locations, attention_weights, shapes,
                          starts, accumulator, grad_loc, grad_attn)
        if not uses_samples_backward(plan, deterministic):
            tensors += (keys, coefs)
        launch(*tensors)

    if deterministic:
        sorted_keys, perm = torch.sort(keys, stable=True)
        row_ids = torch.arange(num_rows + 1, dtype=key_dtype, device=device)
        row_start = torch.searchsorted(sorted_keys, row_ids)
        static = _static_args(problem, plan)
        msda_grad_value_rows_kernel[(triton.cdiv(num_rows, plan.rows_block),)](
            grad_output, perm, coefs, row_start, grad_value, problem.total_pixels, num_rows,
            NUM_HEADS=problem.num_heads, HEAD_DIM=problem.head_dim,
            LP=problem.num_levels * problem.num_points, VALUE_BNLC=static["VALUE_BNLC"],
            INDEX64=plan.index64, BLOCK_R=plan.rows_block, BLOCK_C=plan.block_c,
            num_warps=plan.rows_warps)
    elif grad_value is None:
        grad_value = torch.empty_like(value)
        clear = scratch_stream is not None
        ctx.launcher(("cast", clear), lambda: _cast_launch(value.numel(), clear))(
            accumulator, grad_value)
        ctx.give_back_scratch(scratch_stream, accumulator)
    return grad_value, grad_loc, grad_attn
