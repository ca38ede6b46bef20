"""Memoized validation for torch tensors: the torch layer's one hand-off between the places
that bind a call (public functions, operators, their ``setup_context`` and backward), for MSDA
(:func:`validated_problem`, :func:`~nkilib_msda.validation.msda.validate_msda_args`) and Block
AttnRes (:func:`memoized` with :func:`tensor_facts` keys, in :mod:`.block_attn_res_ops`). Each
place binds from its own arguments; the validation behind the binding runs once per set of
static facts.

Validation only reads static facts: the spatial shapes and level starts (their values), the
shape and dtype of each tensor, the layouts and the flags. :func:`validated_problem` keys a
small dict on exactly those facts and runs the full validation on a miss, so a hit returns the
very :class:`MSDAProblem` the full validation returned for the same facts, and anything invalid
still raises the full validation's error (errors are never cached: a failing call stores
nothing).

A key is only built when every fact has an exact, hashable Python form: tensors, ``str``
layouts and padding mode, a ``bool`` flag, and shapes/starts made of plain ``int``s (``True``
and ``4.0`` compare equal to ``1`` and ``4``, so their types are checked, not just their
values). Anything else (NumPy ints, symbolic sizes while tracing, ...) goes to the full
validation every time.

Empty inputs (B = 0 or N_q = 0, which the shared validation rejects as kernel inputs) are
validated on size-1 stand-ins after checking that B and N_q agree across the tensors; the
problem then carries the real B and N_q, and the operators return empty results for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor

from nkilib_msda.validation.layouts import LOCATION_LAYOUTS, level_starts, location_axis
from nkilib_msda.validation.msda import MSDAProblem, normalize_spatial_shapes, validate_msda_args

__all__ = ["validated_problem", "memoized", "cached", "store", "tensor_facts", "spatial_shapes_tuple",
           "clear_problem_cache", "check_readable", "check_static", "MAX_CACHED_PROBLEMS"]

MAX_CACHED_PROBLEMS = 256
# MSDA problems and Block AttnRes problems (their keys start with the operator's name)
_PROBLEMS: dict[tuple, Any] = {}
P = TypeVar("P")


def clear_problem_cache() -> None:
    """Forget every cached problem (tests; the cache also clears itself when full)."""
    _PROBLEMS.clear()


def _int_list(items: Any) -> tuple[int, ...] | None:
    """``items`` as a tuple when it is a tuple/list of plain ints, else None."""
    if type(items) is not tuple and type(items) is not list:
        return None
    for item in items:
        if type(item) is not int:
            return None
    return tuple(items)


def _python_form(x: Any) -> Any:
    """A tensor's values as nested lists (one host copy); None when that is not possible."""
    if isinstance(x, Tensor):
        try:
            return x.tolist()
        except Exception:  # noqa: BLE001 - meta/fake tensors: the full validation reports it
            return None
    return x


def _shapes_key(spatial_shapes: Any) -> tuple[tuple[int, ...], ...] | None:
    """(H, W) pairs of plain ints (not yet checked for being positive or non-empty)."""
    raw = _python_form(spatial_shapes)
    if type(raw) is not tuple and type(raw) is not list:
        return None
    pairs = []
    for pair in raw:
        ints = _int_list(pair)
        if ints is None or len(ints) != 2:
            return None
        pairs.append(ints)
    return tuple(pairs)


def check_readable(name: str, x: Any) -> None:
    """Spatial shapes and level starts are values: a meta tensor of them cannot be read."""
    if isinstance(x, Tensor) and x.is_meta:
        raise ValueError(f"{name}: expected values (a sequence of ints or a tensor with data), "
                         f"got a meta tensor of shape {tuple(x.shape)}, whose values cannot be "
                         "read; pass Python ints (meta value/locations/weights are fine)")


def check_static(name: str, x: Any) -> None:
    """While torch.compile / torch.export traces, a tensor's values are not known (reading
    them is a graph break, and fullgraph compile and export fail). The MSDA entry points send
    a traced shapes tensor to the tensor-shapes operator before reaching this; a route that
    needs the values while tracing (``method="discrete"``) asks for Python ints here."""
    if isinstance(x, Tensor) and torch.compiler.is_compiling():
        raise ValueError(
            f"{name}: got a tensor while torch.compile/torch.export traces, where its values "
            "cannot be read; pass the (H, W) pairs as Python ints, e.g. [(H0, W0), (H1, W1), ...] "
            "(the HF layer reads value_spatial_shapes_list)")


def spatial_shapes_tuple(spatial_shapes: Any, name: str = "spatial_shapes"
                         ) -> tuple[tuple[int, int], ...]:
    """:func:`normalize_spatial_shapes` with a short cut for well-formed input (one host copy
    for a tensor); anything else gets the full checks and their errors. ``name``: the
    argument's name in errors."""
    check_readable(name, spatial_shapes)
    check_static(name, spatial_shapes)
    if torch.compiler.is_compiling():
        return normalize_spatial_shapes(spatial_shapes)
    pairs = _shapes_key(spatial_shapes)
    if pairs and all(h > 0 and w > 0 for h, w in pairs):
        return pairs  # type: ignore[return-value]
    return normalize_spatial_shapes(spatial_shapes)


def _starts_key(level_start_index: Any, shapes: tuple[tuple[int, ...], ...]
                ) -> tuple[int, ...] | str | None:
    """"derived" for None and for the starts None derives (so the operators' explicit starts
    hit the entry the functional API's None made), else the starts; None when not plain ints."""
    if level_start_index is None:
        return "derived"
    starts = _int_list(_python_form(level_start_index))
    if starts is not None and len(starts) == len(shapes) and starts == level_starts(shapes):
        return "derived"
    return starts


def _problem_key(value: Any, spatial_shapes: Any, level_start_index: Any,
                 sampling_locations: Any, attention_weights: Any, value_layout: Any,
                 sampling_locations_layout: Any, align_corners: Any, padding_mode: Any,
                 grad_output: Any) -> tuple | None:
    for x in (value, sampling_locations, attention_weights):
        if not isinstance(x, Tensor):
            return None
    if grad_output is None:
        grad_key = None
    elif isinstance(grad_output, Tensor):
        grad_key = (grad_output.shape, grad_output.dtype)
    else:
        return None
    if (type(value_layout) is not str or type(sampling_locations_layout) is not str
            or type(padding_mode) is not str or type(align_corners) is not bool):
        return None
    shapes = _shapes_key(spatial_shapes)
    if shapes is None:
        return None
    starts = _starts_key(level_start_index, shapes)
    if starts is None:
        return None
    return (shapes, starts, value.shape, value.dtype, sampling_locations.shape,
            sampling_locations.dtype, attention_weights.shape, attention_weights.dtype,
            value_layout, sampling_locations_layout, align_corners, padding_mode, grad_key)


def cached(key: tuple) -> Any:
    """The entry stored under ``key`` (:func:`store`), None when there is none."""
    return _PROBLEMS.get(key)


def store(key: tuple, entry: Any) -> None:
    """Keep ``entry`` under ``key`` in the memo (cleared when full, and by
    :func:`clear_problem_cache`): the eager fast path's bound calls (:mod:`.eager`)."""
    if len(_PROBLEMS) >= MAX_CACHED_PROBLEMS:
        _PROBLEMS.clear()
    _PROBLEMS[key] = entry


def memoized(key: tuple | None, validate: Callable[[], P]) -> P:
    """``validate()``'s result, run only on a miss of ``key``: the one hand-off between the
    torch layer's binding places (the public functions, the operators, their setup_context and
    backward), for MSDA and Block AttnRes alike. ``key``: the exact static facts the validation
    reads, or None (no exact form, e.g. while tracing): validate every time. An error is
    raised again every time (never cached)."""
    if key is not None:
        try:
            problem = _PROBLEMS.get(key)
        except TypeError:  # an unhashable (symbolic) size
            key, problem = None, None
        if problem is not None:
            return problem
    problem = validate()
    if key is not None:
        if len(_PROBLEMS) >= MAX_CACHED_PROBLEMS:
            _PROBLEMS.clear()
        _PROBLEMS[key] = problem
    return problem


def tensor_facts(*tensors: Any) -> tuple | None:
    """(shape, dtype, device) of each tensor (None for an absent optional one), or None when
    an argument is not a tensor or torch.compile traces (symbolic sizes): a memo key part."""
    if torch.compiler.is_compiling():
        return None
    facts: list[tuple | None] = []
    for t in tensors:
        if t is None:
            facts.append(None)
        elif isinstance(t, Tensor):
            facts.append((t.shape, t.dtype, t.device))
        else:
            return None
    return tuple(facts)


def validated_problem(value: Any, spatial_shapes: Any, level_start_index: Any,
                      sampling_locations: Any, attention_weights: Any, value_layout: str = "BLNC",
                      sampling_locations_layout: str = "BQHLP2", align_corners: bool = False,
                      padding_mode: str = "zeros", *, grad_output: Any = None) -> MSDAProblem:
    """Same result and errors as :func:`validate_msda_args` (default ``padding_modes``), plus
    empty inputs (see the module docstring) and a clear error for meta shape tensors."""
    check_readable("spatial_shapes", spatial_shapes)
    check_readable("level_start_index", level_start_index)
    check_static("spatial_shapes", spatial_shapes)
    key = None
    if torch.compiler.is_compiling():
        # Symbolic sizes while tracing: validate fully. Level starts in a tensor cannot be
        # read there either; they are derived from the (static) spatial shapes instead.
        if isinstance(level_start_index, Tensor):
            level_start_index = None
    else:
        key = _problem_key(value, spatial_shapes, level_start_index, sampling_locations,
                           attention_weights, value_layout, sampling_locations_layout,
                           align_corners, padding_mode, grad_output)
    return memoized(key, lambda: _validate(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        value_layout, sampling_locations_layout, align_corners, padding_mode, grad_output))


# ------------------------------------------------------------------ empty inputs

# The locations' (B, N_q) axes per layout.
_LOC_DIMS = {layout: (location_axis(layout, "B"), location_axis(layout, "N_q")) for layout in LOCATION_LAYOUTS}


def _validate(value: Any, spatial_shapes: Any, level_start_index: Any, sampling_locations: Any,
              attention_weights: Any, value_layout: Any, sampling_locations_layout: Any,
              align_corners: Any, padding_mode: Any, grad_output: Any) -> MSDAProblem:
    sizes = _empty_sizes(value, sampling_locations, attention_weights, sampling_locations_layout,
                         grad_output)
    if sizes is None:
        return validate_msda_args(value, spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights, value_layout, sampling_locations_layout,
                                  align_corners, padding_mode, grad_output=grad_output)
    batch, queries = sizes
    loc_b, loc_q = _LOC_DIMS[sampling_locations_layout]
    stand_ins = [_stand_in(value, {0: 1}),
                 _stand_in(sampling_locations, {loc_b: 1, loc_q: 1}),
                 _stand_in(attention_weights, {0: 1, 1: 1})]
    grad = None if grad_output is None else _stand_in(grad_output, {0: 1, 1: 1})
    problem = validate_msda_args(stand_ins[0], spatial_shapes, level_start_index, stand_ins[1],
                                 stand_ins[2], value_layout, sampling_locations_layout,
                                 align_corners, padding_mode, grad_output=grad)
    return replace(problem, batch=batch, num_queries=queries)


def _stand_in(t: Tensor, sizes: dict[int, int]) -> Tensor:
    shape = [sizes.get(i, d) for i, d in enumerate(t.shape)]
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _empty_sizes(value: Any, sampling_locations: Any, attention_weights: Any,
                 sampling_locations_layout: Any, grad_output: Any) -> tuple[int, int] | None:
    """(B, N_q) when the call is well-formed enough to read them and one of them is 0, after
    checking they agree across the tensors; None otherwise (full validation decides)."""
    tensors = (value, sampling_locations, attention_weights)
    if not all(isinstance(t, Tensor) for t in tensors) or sampling_locations_layout not in _LOC_DIMS:
        return None
    if value.dim() != 4 or sampling_locations.dim() != 6 or attention_weights.dim() != 5:
        return None
    if grad_output is not None and (not isinstance(grad_output, Tensor) or grad_output.dim() != 3):
        return None
    loc_b, loc_q = _LOC_DIMS[sampling_locations_layout]
    # Symbolic sizes (dynamic-shape tracing) stay symbolic; the shape environment answers these
    # tests without pinning B or N_q to the example's values (0 and 1 are specialized anyway).
    batch = value.shape[0]
    queries = sampling_locations.shape[loc_q]
    if batch != 0 and queries != 0:
        return None
    checks = [("sampling_locations", sampling_locations, loc_b, loc_q),
              ("attention_weights", attention_weights, 0, 1)]
    if grad_output is not None:
        checks.append(("grad_output", grad_output, 0, 1))
    for name, t, b_dim, q_dim in checks:
        if t.shape[b_dim] != batch:
            raise ValueError(f"{name}: expected batch B={batch} (value's) at dim {b_dim}, got "
                             f"shape {tuple(t.shape)}")
        if t.shape[q_dim] != queries:
            raise ValueError(f"{name}: expected N_q={queries} (sampling_locations') at dim "
                             f"{q_dim}, got shape {tuple(t.shape)}")
    return batch, queries
