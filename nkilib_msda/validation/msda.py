"""Argument normalization and checking shared by every MSDA backend.

`validate_msda_args` is the single entry point: it accepts NumPy arrays, torch
tensors or anything with ``.shape`` and ``.dtype``, checks every argument against
the others and returns an immutable :class:`MSDAProblem` describing the call.
Errors are ``ValueError`` (bad values/shapes) or ``TypeError`` (bad types) whose
message names the argument, what was expected and what was received.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

from nkilib_msda.validation.layouts import (LOCATION_DIMS, LOCATION_LAYOUTS, VALUE_DIMS, VALUE_LAYOUTS,
                                            arrange, dims_text, level_starts)

# The padding modes the device kernels (NKI, Triton) implement; reflection is the references' alone.
KERNEL_PADDING_MODES = ("zeros", "border")
PADDING_MODES = (*KERNEL_PADDING_MODES, "reflection")
# Every float dtype the host API takes (the device kernels' are nkilib_msda.hardware.KERNEL_DTYPES).
FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")

# The NKI kernels call `validate_msda_args` while tracing, and NKI before 0.7 rejects the `is`
# operator in code a kernel runs, so None checks here use isinstance.
_NoneType = type(None)


@dataclass(frozen=True)
class MSDAProblem:
    """Static description of one MSDA call (all plain Python values)."""

    batch: int
    num_queries: int
    num_heads: int
    head_dim: int
    num_levels: int
    num_points: int
    spatial_shapes: tuple[tuple[int, int], ...]
    level_start_index: tuple[int, ...]
    value_layout: str
    sampling_locations_layout: str
    align_corners: bool
    padding_mode: str

    @property
    def total_pixels(self) -> int:
        """L = sum(H_l * W_l)."""
        return sum(h * w for h, w in self.spatial_shapes)

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension name -> size, the names of :mod:`nkilib_msda.validation.layouts`."""
        return {"B": self.batch, "L": self.total_pixels, "N_h": self.num_heads, "C_h": self.head_dim,
                "N_q": self.num_queries, "N_l": self.num_levels, "N_p": self.num_points, "2": 2}

    @property
    def value_shape(self) -> tuple[int, ...]:
        return arrange(self.value_layout, self.sizes)

    @property
    def sampling_locations_shape(self) -> tuple[int, ...]:
        return arrange(self.sampling_locations_layout, self.sizes)

    @property
    def attention_weights_shape(self) -> tuple[int, ...]:
        return (self.batch, self.num_queries, self.num_heads, self.num_levels, self.num_points)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.num_queries, self.num_heads * self.head_dim)

    @property
    def num_samples(self) -> int:
        """B * N_q * N_h * N_l * N_p."""
        return self.batch * self.num_queries * self.num_heads * self.num_levels * self.num_points


def dtype_name(dtype: Any) -> str:
    """Canonical name of a NumPy / ml_dtypes / torch / NKI dtype ('float32', 'bfloat16', ...)."""
    name = str(dtype)
    for prefix in ("torch.", "nl.", "nki.language."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name.startswith("<class '") and name.endswith("'>"):  # numpy scalar types
        name = name[len("<class '"):-2].rsplit(".", 1)[-1]
    return {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)


def _describe(x: Any) -> str:
    if hasattr(x, "shape"):
        shape = x.shape
        return f"{type(x).__name__} of shape {tuple(shape)} and dtype {dtype_name(x.dtype)}"
    return f"{type(x).__name__} {x!r}"


def check_float_tensor(name: str, x: Any, ndim: int | None = None) -> tuple[int, ...]:
    """Check that ``x`` is an array/tensor with a float dtype (and ``ndim`` dims); return its shape."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name}: expected an array or tensor with a float dtype, got {_describe(x)}")
    if dtype_name(x.dtype) not in FLOAT_DTYPE_NAMES:
        raise TypeError(
            f"{name}: expected a float dtype ({', '.join(FLOAT_DTYPE_NAMES)}), "
            f"got dtype {dtype_name(x.dtype)}")
    shape = tuple(symbolic_or_int(s) for s in x.shape)
    if isinstance(ndim, int) and len(shape) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d tensor, got shape {shape}")
    return shape


def symbolic_or_int(size: Any) -> Any:
    """A dimension as a Python int, except a symbolic one (torch's ``SymInt`` while tracing with
    dynamic shapes), which stays symbolic: ``int()`` would specialize the traced graph to the
    example's size. The checks below only compare sizes, which works on both."""
    return size if _is_symint(size) else int(size)


def _is_symint(v: Any) -> bool:
    """torch's symbolic int (no torch import here: NumPy callers must not need it)."""
    return type(v).__name__ == "SymInt" and hasattr(v, "node")


def _to_python(x: Any) -> Any:
    """Turn tensors/arrays into nested Python lists (a no-op for sequences)."""
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        return x.tolist()
    return x


def _is_int(v: Any) -> bool:
    """An int; a symbolic one too (torch.compile(dynamic=True) makes int arguments symbolic):
    spatial shapes and level starts are compile-time constants of the kernels, and ``int()``
    below specializes the graph to them."""
    return (isinstance(v, numbers.Integral) and not isinstance(v, bool)) or _is_symint(v)


def normalize_spatial_shapes(spatial_shapes: Any) -> tuple[tuple[int, int], ...]:
    """Pairs (H, W) of positive ints from a tuple/list/array/tensor of shape (N_l, 2)."""
    if isinstance(spatial_shapes, (str, bytes)) or isinstance(spatial_shapes, _NoneType):
        raise TypeError(
            f"spatial_shapes: expected a sequence of (H, W) int pairs or an int tensor of shape (N_l, 2), "
            f"got {_describe(spatial_shapes)}")
    if hasattr(spatial_shapes, "dtype") and "float" in dtype_name(spatial_shapes.dtype):
        raise TypeError(f"spatial_shapes: expected integers, got dtype {dtype_name(spatial_shapes.dtype)}")
    raw = _to_python(spatial_shapes)
    if not isinstance(raw, (list, tuple)):  # a dict, set or generator has no reliable order/length
        raise TypeError(
            f"spatial_shapes: expected a tuple/list of (H, W) int pairs or an int tensor of shape "
            f"(N_l, 2), got {_describe(spatial_shapes)}")
    if len(raw) == 0:
        raise ValueError(f"spatial_shapes: expected at least one (H, W) pair, got {raw!r}")
    shapes = []
    for i, pair in enumerate(raw):
        pair = _to_python(pair)
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"spatial_shapes: expected (H, W) pairs, entry {i} is {pair!r}")
        if not all(_is_int(v) for v in pair):
            raise TypeError(f"spatial_shapes: expected integer (H, W), entry {i} is {pair!r}")
        h, w = int(pair[0]), int(pair[1])
        if h <= 0 or w <= 0:
            raise ValueError(f"spatial_shapes: expected positive (H, W), entry {i} is ({h}, {w})")
        shapes.append((h, w))
    return tuple(shapes)


def normalize_level_start_index(level_start_index: Any, spatial_shapes: tuple[tuple[int, int], ...]
                                ) -> tuple[int, ...]:
    """Level start offsets; derived when None, otherwise checked against ``spatial_shapes``."""
    expected = level_starts(spatial_shapes)
    if isinstance(level_start_index, _NoneType):
        return tuple(expected)
    if isinstance(level_start_index, (str, bytes)):
        raise TypeError(f"level_start_index: expected a sequence of ints or None, got {level_start_index!r}")
    if hasattr(level_start_index, "dtype") and "float" in dtype_name(level_start_index.dtype):
        raise TypeError(f"level_start_index: expected integers, got dtype {dtype_name(level_start_index.dtype)}")
    raw = _to_python(level_start_index)
    if not isinstance(raw, (list, tuple)):
        raise TypeError(f"level_start_index: expected a sequence of ints or None, got {_describe(level_start_index)}")
    if not all(_is_int(v) for v in raw):
        raise TypeError(f"level_start_index: expected integers, got {raw!r}")
    got = tuple(int(v) for v in raw)
    if got != tuple(expected):
        raise ValueError(
            f"level_start_index: expected {tuple(expected)} (cumulative H*W of spatial_shapes), got {got}")
    return got


def check_shape_tensors(spatial_shapes: Any, level_start_index: Any, value: Any) -> None:
    """Run-time checks of spatial shapes (N_l, 2) and level starts (N_l,) or None passed as
    tensors (the tensor-shapes operators' untrusted boundary), before their values are read:
    an integer dtype (a float start would be truncated) and, unless ``value`` is a ``meta``
    tensor too (a shapes-only call), values to read: with a ``meta`` shapes tensor the
    dispatcher runs the shapes-only kernel, whose output is uninitialised memory. The values
    themselves are checked by :func:`validate_msda_args`."""
    value_device = getattr(getattr(value, "device", None), "type", None)
    for name, x in (("spatial_shapes", spatial_shapes), ("level_start_index", level_start_index)):
        if isinstance(x, _NoneType) or not hasattr(x, "dtype"):
            continue
        if not dtype_name(x.dtype).startswith(("int", "uint")):
            raise TypeError(f"{name}: expected an integer tensor, got dtype {dtype_name(x.dtype)}")
        device = getattr(getattr(x, "device", None), "type", None)
        if device == "meta" and value_device != "meta":
            raise ValueError(f"{name}: expected a tensor holding values (not on the meta device), "
                             f"got one on {device} (value is on {value_device})")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {list(choices)}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value


def validate_msda_args(
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    value_layout: str,
    sampling_locations_layout: str,
    align_corners: bool,
    padding_mode: str,
    *,
    grad_output: Any = None,
    padding_modes: Sequence[str] = PADDING_MODES,
) -> MSDAProblem:
    """Check and normalize the MSDA arguments; return the call's :class:`MSDAProblem`.

    Every option is passed explicitly: the defaults are those of the public entry points.

    ``padding_modes`` narrows the accepted modes for backends without reflection.
    ``grad_output`` (backward only) must be (B, N_q, N_h*C_h).
    """
    value_layout = _check_choice("value_layout", value_layout, VALUE_LAYOUTS)
    sampling_locations_layout = _check_choice(
        "sampling_locations_layout", sampling_locations_layout, LOCATION_LAYOUTS)
    padding_mode = _check_choice("padding_mode", padding_mode, tuple(padding_modes))
    # NumPy's bool scalar type is named "bool" in NumPy 2 and "bool_" in NumPy 1.
    if not isinstance(align_corners, bool) and type(align_corners).__name__ not in ("bool", "bool_"):
        raise TypeError(f"align_corners: expected a bool, got {align_corners!r}")
    align_corners = bool(align_corners)

    shapes = normalize_spatial_shapes(spatial_shapes)
    starts = normalize_level_start_index(level_start_index, shapes)
    total_pixels = sum(h * w for h, w in shapes)

    vshape = check_float_tensor("value", value, 4)
    vsizes = dict(zip(VALUE_DIMS[value_layout], vshape))
    batch, length, heads, channels = vsizes["B"], vsizes["L"], vsizes["N_h"], vsizes["C_h"]
    dims = dims_text(value_layout)
    if min(vshape) <= 0:
        raise ValueError(f"value: expected non-empty dims {dims} for layout {value_layout}, got shape {vshape}")
    if length != total_pixels:
        raise ValueError(
            f"value: expected L = sum(H*W) = {total_pixels} (from spatial_shapes) in layout "
            f"{value_layout} {dims}, got shape {vshape}")

    lshape = check_float_tensor("sampling_locations", sampling_locations, 6)
    lsizes = dict(zip(LOCATION_DIMS[sampling_locations_layout], lshape))
    lb, queries, lh = lsizes["B"], lsizes["N_q"], lsizes["N_h"]
    levels, points, two = lsizes["N_l"], lsizes["N_p"], lsizes["2"]
    ldims = dims_text(sampling_locations_layout)
    num_levels = len(shapes)
    expect_loc = {"B": (lb, batch), "N_h": (lh, heads), "N_l": (levels, num_levels), "2": (two, 2)}
    for dim, (got, want) in expect_loc.items():
        if got != want:
            raise ValueError(
                f"sampling_locations: expected {ldims} with {dim} = {want} (layout "
                f"{sampling_locations_layout}, value {vshape}, {num_levels} levels), got shape {lshape}")
    # (the torch layer validates B = 0 or N_q = 0 on size-1 stand-ins: only kernels get here)
    for dim, size in (("N_p", points), ("N_q", queries)):
        if size <= 0:
            raise ValueError(f"sampling_locations: expected {dim} >= 1 in {ldims}, got shape {lshape}")

    wshape = check_float_tensor("attention_weights", attention_weights, 5)
    want_w = (batch, queries, heads, num_levels, points)
    if wshape != want_w:
        raise ValueError(
            f"attention_weights: expected shape (B, N_q, N_h, N_l, N_p) = {want_w}, got {wshape}")

    if not isinstance(grad_output, _NoneType):
        gshape = check_float_tensor("grad_output", grad_output, 3)
        want_g = (batch, queries, heads * channels)
        if gshape != want_g:
            raise ValueError(f"grad_output: expected shape (B, N_q, N_h*C_h) = {want_g}, got {gshape}")

    return MSDAProblem(
        batch=batch, num_queries=queries, num_heads=heads, head_dim=channels,
        num_levels=num_levels, num_points=points, spatial_shapes=shapes, level_start_index=starts,
        value_layout=value_layout, sampling_locations_layout=sampling_locations_layout,
        align_corners=align_corners, padding_mode=padding_mode)
