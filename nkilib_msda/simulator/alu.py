"""ALU operators, activation functions and the experimental ``nl.*`` math wrappers.

One object per NKI name: ``nl.add`` is both the ALU identity passed as ``op=`` to
``nisa.tensor_tensor`` & co. and, when called, the experimental wrapper
``nl.add(x, y, dtype=None)`` that returns a NEW tile (nki-subset.md §5).

ALU kinds (nki.api.shared "Supported Math Operators"):
- ``bitvec``: invert, bitwise_and/or/xor, left_shift, logical right_shift; integer dtypes only,
  computed on raw bit patterns (here: zero-extended to uint64, truncated on write).
- ``arithmetic``: everything else; inputs are cast to fp32, the op runs in fp32 and comparisons
  / logical ops return 1.0 / 0.0.

Activation functions are evaluated in float64 and rounded to fp32. The hardware evaluates
piecewise polynomials that are valid only inside the documented ranges; outside them the
emulator still returns the exact value but emits one :class:`NkiWarning` per function
(hardware returns garbage there, e.g. ``sin(9) ~ 27.65``).

Wrapper lowering (what the cost report sees):
- tile (op) tile -> ``tensor_tensor`` (shapes must be equal: no broadcasting);
  tile (op) scalar -> ``tensor_scalar`` (scalar (op) tile uses ``reverse0``);
- unary activation functions and ``nl.copy`` -> ``activation`` (ScalarE);
- ``nl.negative`` -> ``tensor_scalar(multiply, -1)``; ``nl.invert`` / ``nl.logical_not`` ->
  ``tensor_scalar`` with the unary ALU op;
- ``nl.sum/max/min`` -> ``tensor_reduce``; ``nl.mean`` -> ``tensor_reduce`` + ``tensor_scalar``;
- ``nl.transpose`` -> ``nc_transpose`` into a PSUM tile; ``nl.matmul(transpose_x=True)`` ->
  ``nc_matmul`` into a fresh fp32 PSUM tile;
- ``nl.where`` -> one Vector "select" instruction;
- ``nl.floor`` / ``nl.ceil``: the hardware lowering is undocumented. The emulator computes the
  exact floor/ceil of the fp32 value (exact for every fp32 input, so also for bf16/fp16
  inputs) and casts it to ``dtype`` with the NKI rules (saturating for ints); it is
  recorded as ONE Vector instruction named "floor"/"ceil".
- ``nl.divide``, ``nl.mod``, ``nl.fmod``, scalar-exponent ``nl.power`` and
  ``nl.matmul(transpose_x=False)`` raise NkiError: they "work in simulation but fail on
  hardware".
Default result dtype: ``dtype`` if given, else the input dtype (for two tiles: the float one
beats an int one, then the wider one, then x's); comparisons default to ``nl.uint8`` (0/1).
"""

from __future__ import annotations

import builtins as _builtins
import math as _math
import warnings as _warnings
from typing import Any, Callable

import numpy as np

from nkilib_msda.simulator.errors import NkiWarning, nki_error

BITVEC = "bitvec"
ARITHMETIC = "arithmetic"

_PI = float(np.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:  # scipy is optional: fall back to the (slower) math.erf
        return np.vectorize(_math.erf, otypes=[np.float64])(x)
    return scipy_erf(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    cdf = 0.5 * (1.0 + _erf(x / np.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    return cdf + x * pdf


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


class NkiOp:
    """An ``nl.*`` name: ALU operator and/or activation function and/or math wrapper.

    Attributes: ``name``; ``alu_kind`` (``"bitvec"``, ``"arithmetic"`` or None when the
    name is not an ALU op); ``arity`` (1 or 2 for ALU ops); ``is_compare``; ``reducible``
    (legal ``tensor_reduce`` op); ``trn3_only``; ``activation_fn`` and ``valid_range``
    (``(lo, hi, symmetric)``: with ``symmetric`` the range applies to ``|x|``);
    ``alias_of`` (``nl.max`` -> ``nl.maximum`` when used as a reduce op).
    """

    def __init__(self, name: str, *, alu_kind: str | None = None, arity: int = 0,
                 alu_fn: Callable | None = None, is_compare: bool = False,
                 reducible: bool = False, trn3_only: bool = False,
                 activation_fn: Callable | None = None,
                 valid_range: tuple[float, float, bool] | None = None,
                 wrapper: Callable | None = None, alias_of: "NkiOp | None" = None,
                 fails_on_hardware: bool = False) -> None:
        self.name = name
        self.alu_kind = alu_kind
        self.arity = arity
        self._alu_fn = alu_fn
        self.is_compare = is_compare
        self.reducible = reducible
        self.trn3_only = trn3_only
        self.activation_fn = activation_fn
        self.valid_range = valid_range
        self._wrapper = wrapper
        self.alias_of = alias_of
        self.fails_on_hardware = fails_on_hardware

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fails_on_hardware:
            raise nki_error(f"nl.{self.name}", "fails on hardware",
                            f"nl.{self.name} works in simulation but fails on hardware; "
                            "multiply by nl.reciprocal / use nisa.reciprocal instead")
        if self._wrapper is None:
            raise nki_error(f"nl.{self.name}", "not callable",
                            f"nl.{self.name} is an operator identity (pass it as op=), "
                            "not a tile function")
        return self._wrapper(self, *args, **kwargs)

    # --- ALU evaluation -------------------------------------------------------------
    @property
    def is_alu(self) -> bool:
        return self.alu_kind is not None

    def apply(self, a: np.ndarray, b: np.ndarray | float | None = None) -> np.ndarray:
        """Evaluate the ALU op: fp32 arrays for arithmetic ops, uint64 bit patterns for bitvec."""
        if self._alu_fn is None:
            raise nki_error(repr(self), "not an ALU op", f"{self!r} is not an ALU operator")
        with np.errstate(all="ignore"):
            if self.arity == 1:
                out = self._alu_fn(a)
            else:
                out = self._alu_fn(a, b)
        if self.alu_kind == ARITHMETIC:
            return np.asarray(out, dtype=np.float32)
        return np.asarray(out, dtype=np.uint64)

    # --- activation evaluation --------------------------------------------------------
    def activate(self, x: np.ndarray) -> np.ndarray:
        """Exact activation of fp32 ``x`` (float64 math, rounded to fp32)."""
        if self.activation_fn is None:
            raise nki_error("activation", "not an activation function",
                            f"op={self!r} is not a Scalar Engine activation function")
        with np.errstate(all="ignore"):
            return np.asarray(self.activation_fn(np.asarray(x, dtype=np.float64)),
                              dtype=np.float32)

    def out_of_range(self, x: np.ndarray) -> bool:
        """Whether any non-NaN value of ``x`` lies outside the documented valid input range."""
        if self.valid_range is None:
            return False
        lo, hi, symmetric = self.valid_range
        v = np.abs(x) if symmetric else x
        with np.errstate(invalid="ignore"):
            bad = ((v < lo) | (v > hi)) & ~np.isnan(v)
        return bool(np.any(bad))


def resolve_alu(op: Any, instruction: str) -> NkiOp:
    """Return the ALU op behind ``op`` (``nl.max`` -> ``nl.maximum``) or raise NkiError."""
    if isinstance(op, NkiOp):
        if op.fails_on_hardware:
            raise nki_error(instruction, "unsupported ALU op",
                            f"op={op!r}: NKI has no divide/mod ALU op (fails on hardware); "
                            "multiply by a reciprocal instead")
        if op.alias_of is not None:
            return op.alias_of
        if op.is_alu:
            return op
    raise nki_error(instruction, "unsupported ALU op",
                    f"op={op!r} is not an nl.* ALU operator (expected e.g. nl.add, "
                    "nl.multiply, nl.maximum, nl.bitwise_and)")


def warn_out_of_range(op: NkiOp, x: np.ndarray) -> None:
    """Emit one NkiWarning per activation function and kernel run whose input left the
    function's valid range."""
    from nkilib_msda.simulator.context import current

    ctx = current()
    warned = getattr(ctx, "_warned_activation_ranges", None)
    if warned is None:
        warned = ctx._warned_activation_ranges = set()
    if op.name in warned or not op.out_of_range(x):
        return
    warned.add(op.name)
    lo, hi, symmetric = op.valid_range  # type: ignore[misc]
    rng = f"+-[{lo:g}, {hi:g}]" if symmetric else f"[{lo:g}, {hi:g}]"
    _warnings.warn(f"activation: valid input range: {op!r} is only valid on {rng}; the "
                   "hardware returns garbage outside it (the emulator returns the exact "
                   "value)", NkiWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------
# Wrappers (lazy imports: language and isa import this module)
# ----------------------------------------------------------------------------------------

def _nl():
    from nkilib_msda.simulator import language
    return language


def _isa():
    from nkilib_msda.simulator import isa
    return isa


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, np.ndarray)


def _dtype(dtype: Any):
    from nkilib_msda.simulator.dtypes import to_nki_dtype
    return to_nki_dtype(dtype)


def _promote(x: Any, y: Any):
    """Result dtype of two tiles: float beats int, then the wider type, then x's."""
    dx, dy = _dtype(x.dtype), _dtype(y.dtype)
    if dx.is_float != dy.is_float:
        return dx if dx.is_float else dy
    return dy if dy.itemsize > dx.itemsize else dx


def _new_tile(shape: tuple[int, ...], dtype: Any, buffer: str = "sbuf"):
    nl = _nl()
    return nl.ndarray(tuple(shape), dtype=dtype, buffer=getattr(nl, buffer))


def _require_tile(name: str, arg: str, x: Any) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "buffer") or _is_scalar(x):
        raise nki_error(f"nl.{name}", "operand type",
                        f"{arg} must be an on-chip tile (NkiTensor), got {type(x).__name__}")


def _binary_wrapper(op: NkiOp, x: Any, y: Any, dtype: Any = None) -> Any:
    """``nl.<op>(x, y, dtype=None)``: tile-tile (equal shapes) or tile-scalar; new SBUF tile."""
    isa = _isa()
    x_scalar, y_scalar = _is_scalar(x), _is_scalar(y)
    if x_scalar and y_scalar:
        raise nki_error(f"nl.{op.name}", "operand type", "at least one operand must be a tile")
    if op is power and (x_scalar or y_scalar):
        raise nki_error("nl.power", "scalar exponent",
                        "nl.power with a scalar operand fails on hardware; "
                        "use two tiles (GpSimd tensor_tensor) or nl.multiply")
    if x_scalar or y_scalar:
        tile, scalar, reverse = (y, x, True) if x_scalar else (x, y, False)
        _require_tile(op.name, "x" if not x_scalar else "y", tile)
        default = _dtype(tile.dtype)
        out_dtype = _dtype(dtype) if dtype is not None else (
            _dtype("uint8") if op.is_compare else default)
        out = _new_tile(tile.shape, out_dtype)
        operand = scalar if op.alu_kind == BITVEC else float(scalar)
        isa.tensor_scalar(out, tile, op, operand, reverse0=reverse)
        return out
    _require_tile(op.name, "x", x)
    _require_tile(op.name, "y", y)
    if tuple(x.shape) != tuple(y.shape):
        raise nki_error(f"nl.{op.name}", "no broadcasting",
                        f"x.shape {tuple(x.shape)} != y.shape {tuple(y.shape)}; the nl.* "
                        "binary wrappers do not broadcast (use nisa.tensor_scalar or a "
                        ".broadcast() view)")
    out_dtype = _dtype(dtype) if dtype is not None else (
        _dtype("uint8") if op.is_compare else _promote(x, y))
    out = _new_tile(x.shape, out_dtype)
    isa.tensor_tensor(out, x, y, op)
    return out


def _unary_alu_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """Unary ALU wrappers (invert, logical_not, negative): one tensor_scalar instruction."""
    _require_tile(op.name, "x", x)
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    if op is negative:
        _isa().tensor_scalar(out, x, multiply, -1.0)
    else:
        _isa().tensor_scalar(out, x, op, None)
    return out


def _activation_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.exp(x, dtype=None)`` & co.: one ScalarE activation into a new SBUF tile."""
    _require_tile(op.name, "x", x)
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    _isa().activation(out, op, x)
    return out


def _rounding_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.floor`` / ``nl.ceil``: exact on the fp32 value, then cast (see module doc)."""
    from nkilib_msda.simulator import access
    from nkilib_msda.simulator.context import current

    instruction = f"nl.{op.name}"
    _require_tile(op.name, "x", x)
    if x.buffer not in ("sbuf", "psum"):
        raise nki_error(instruction, "operand buffer",
                        f"x must be in SBUF or PSUM, got {x.buffer}")
    out = _new_tile(x.shape, _dtype(dtype) if dtype is not None else _dtype(x.dtype))
    access.check_compute_partitions(instruction, x, out)
    values = access.read_f32(x, instruction)
    rounded = np.floor(values) if op is floor else np.ceil(values)
    access.write(out, rounded.astype(np.float32), instruction)
    current().report.add_instruction("vector", op.name, int(x.size))
    return out


def _copy_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.copy(x, dtype=None)``: ScalarE ``activation(copy)`` into a new SBUF tile."""
    return _activation_wrapper(op, x, dtype)


def _check_reduce_axis(name: str, x: Any, axis: Any) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = len(x.shape)
    norm = tuple(sorted(int(a) % nd if -nd <= int(a) < nd else int(a) for a in axes))
    if not norm or 0 in norm or norm != tuple(range(nd - len(norm), nd)):
        raise nki_error(f"nl.{name}", "reduce axis",
                        f"axis={axis!r} on a {nd}-D tile: must be the trailing contiguous free "
                        f"dims ending at {nd - 1}, never the partition dim 0")
    return norm


def _reduce_wrapper(op: NkiOp, x: Any, axis: Any, dtype: Any = None,
                    keepdims: bool = False) -> Any:
    """``nl.sum/max/min/mean(x, axis, dtype=None, keepdims=False)`` via tensor_reduce."""
    isa = _isa()
    _require_tile(op.name, "x", x)
    axes = _check_reduce_axis(op.name, x, axis)
    if keepdims:
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
        shape = shape + (1,) * (2 - len(shape))  # on-chip tiles stay at least 2-D
    out_dtype = _dtype(dtype) if dtype is not None else _dtype(x.dtype)
    alu = {"sum": add, "mean": add, "max": maximum, "min": minimum}[op.name]
    if op.name != "mean":
        out = _new_tile(shape, out_dtype)
        isa.tensor_reduce(out, alu, x, axes, keepdims=keepdims)
        return out
    count = int(np.prod([x.shape[a] for a in axes]))
    total = _new_tile(shape, _dtype("float32"))
    isa.tensor_reduce(total, add, x, axes, keepdims=keepdims)
    out = _new_tile(shape, out_dtype)
    isa.tensor_scalar(out, total, multiply, 1.0 / count)
    return out


def _where_wrapper(op: NkiOp, condition: Any, x: Any, y: Any, dtype: Any = None) -> Any:
    """``nl.where(cond, x, y)``: ``x`` where ``cond != 0`` else ``y`` (tile or scalar)."""
    from nkilib_msda.simulator import access
    from nkilib_msda.simulator.context import current

    instruction = "nl.where"
    _require_tile("where", "condition", condition)
    _require_tile("where", "x", x)
    tiles = [condition, x] + ([] if _is_scalar(y) else [y])
    for name, t in zip(("condition", "x", "y"), tiles):
        if t.buffer not in ("sbuf", "psum"):
            raise nki_error(instruction, "operand buffer",
                            f"{name} must be in SBUF or PSUM, got {t.buffer}")
        if tuple(t.shape) != tuple(x.shape):
            raise nki_error(instruction, "no broadcasting",
                            f"{name}.shape {tuple(t.shape)} != x.shape {tuple(x.shape)}")
    if _builtins.sum(t.buffer == "psum" for t in tiles) > 1:
        raise nki_error(instruction, "two PSUM inputs",
                        "at most one Vector input may be in PSUM")
    out_dtype = _dtype(dtype) if dtype is not None else _dtype(x.dtype)
    out = _new_tile(x.shape, out_dtype)
    access.check_compute_partitions(instruction, *tiles, out)
    cond = access.read_f32(condition, instruction)
    xv = access.read_f32(x, instruction)
    yv = np.float32(y) if _is_scalar(y) else access.read_f32(y, instruction)
    access.write(out, np.where(cond != 0, xv, yv).astype(np.float32), instruction)
    current().report.add_instruction("vector", "select", int(x.size))
    return out


def _transpose_wrapper(op: NkiOp, x: Any, dtype: Any = None) -> Any:
    """``nl.transpose(x)``: ``nc_transpose`` of a 2-D tile into a new PSUM tile."""
    isa = _isa()
    _require_tile("transpose", "x", x)
    if len(x.shape) != 2:
        raise nki_error("nl.transpose", "2-D tile", f"x must be 2-D, got shape {tuple(x.shape)}")
    out = _new_tile((x.shape[1], x.shape[0]), _dtype(x.dtype), "psum")
    isa.nc_transpose(out, x)
    if dtype is None or _dtype(dtype) == _dtype(x.dtype):
        return out
    cast = _new_tile(out.shape, _dtype(dtype))
    isa.tensor_copy(cast, out)
    return cast


def _matmul_wrapper(op: NkiOp, x: Any, y: Any, transpose_x: bool = False) -> Any:
    """``nl.matmul(x, y, transpose_x=True)``: ``x.T @ y`` into a new fp32 PSUM tile."""
    if not transpose_x:
        raise nki_error("nl.matmul", "transpose_x",
                        "nl.matmul(transpose_x=False) fails on hardware; pass x already "
                        "transposed ([K, M]) with transpose_x=True, or use nisa.nc_matmul")
    _require_tile("matmul", "x", x)
    _require_tile("matmul", "y", y)
    m = int(np.prod(x.shape[1:]))
    n_shape = tuple(y.shape[1:])
    out = _new_tile((m,) + n_shape, _dtype("float32"), "psum")
    _isa().nc_matmul(out, x, y, accumulate=False)
    return out


# ----------------------------------------------------------------------------------------
# The names
# ----------------------------------------------------------------------------------------

def _cmp(fn: Callable) -> Callable:
    return lambda a, b: fn(a, b).astype(np.float32)


def _logical(fn: Callable) -> Callable:
    return lambda a, b: fn(a != 0, b != 0).astype(np.float32)


def _shift_left(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.uint64)
    return np.where(b < 64, np.left_shift(a, np.minimum(b, 63)), 0)


def _shift_right(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.uint64)
    return np.where(b < 64, np.right_shift(a, np.minimum(b, 63)), 0)


def _arith(name: str, fn: Callable, reducible: bool = False, **kw: Any) -> NkiOp:
    return NkiOp(name, alu_kind=ARITHMETIC, arity=2, alu_fn=fn, reducible=reducible,
                 wrapper=_binary_wrapper, **kw)


add = _arith("add", np.add, reducible=True)
subtract = _arith("subtract", np.subtract, reducible=True)
multiply = _arith("multiply", np.multiply, reducible=True)
maximum = _arith("maximum", np.maximum, reducible=True)
minimum = _arith("minimum", np.minimum, reducible=True)
equal = _arith("equal", _cmp(np.equal), is_compare=True)
not_equal = _arith("not_equal", _cmp(np.not_equal), is_compare=True)
greater = _arith("greater", _cmp(np.greater), is_compare=True)
greater_equal = _arith("greater_equal", _cmp(np.greater_equal), is_compare=True)
less = _arith("less", _cmp(np.less), is_compare=True)
less_equal = _arith("less_equal", _cmp(np.less_equal), is_compare=True)
logical_and = _arith("logical_and", _logical(np.logical_and), reducible=True, is_compare=True)
logical_or = _arith("logical_or", _logical(np.logical_or), reducible=True, is_compare=True)
logical_xor = _arith("logical_xor", _logical(np.logical_xor), reducible=True, is_compare=True)
power = _arith("power", np.power)
abs_max = _arith("abs_max", lambda a, b: np.maximum(np.abs(a), np.abs(b)), trn3_only=True)
abs_min = _arith("abs_min", lambda a, b: np.minimum(np.abs(a), np.abs(b)), trn3_only=True)

bitwise_and = NkiOp("bitwise_and", alu_kind=BITVEC, arity=2, alu_fn=np.bitwise_and,
                    reducible=True, wrapper=_binary_wrapper)
bitwise_or = NkiOp("bitwise_or", alu_kind=BITVEC, arity=2, alu_fn=np.bitwise_or,
                   reducible=True, wrapper=_binary_wrapper)
bitwise_xor = NkiOp("bitwise_xor", alu_kind=BITVEC, arity=2, alu_fn=np.bitwise_xor,
                    reducible=True, wrapper=_binary_wrapper)
left_shift = NkiOp("left_shift", alu_kind=BITVEC, arity=2, alu_fn=_shift_left,
                   wrapper=_binary_wrapper)
right_shift = NkiOp("right_shift", alu_kind=BITVEC, arity=2, alu_fn=_shift_right,
                    wrapper=_binary_wrapper)
invert = NkiOp("invert", alu_kind=BITVEC, arity=1, alu_fn=np.invert, wrapper=_unary_alu_wrapper)
logical_not = NkiOp("logical_not", alu_kind=ARITHMETIC, arity=1,
                    alu_fn=lambda a: (a == 0).astype(np.float32), is_compare=True,
                    wrapper=_unary_alu_wrapper)
negative = NkiOp("negative", alu_kind=ARITHMETIC, arity=1, alu_fn=np.negative,
                 wrapper=_unary_alu_wrapper)

# Unary ALU ops that are also activation functions (the wrapper uses ScalarE).
abs = NkiOp("abs", alu_kind=ARITHMETIC, arity=1, alu_fn=np.abs,  # noqa: A001
            activation_fn=np.abs, wrapper=_activation_wrapper)
square = NkiOp("square", alu_kind=ARITHMETIC, arity=1, alu_fn=np.square,
               activation_fn=np.square, wrapper=_activation_wrapper)
relu = NkiOp("relu", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: np.maximum(a, 0),
             activation_fn=lambda x: np.maximum(x, 0.0), wrapper=_activation_wrapper)
rsqrt = NkiOp("rsqrt", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: 1.0 / np.sqrt(a),
              activation_fn=lambda x: 1.0 / np.sqrt(x), valid_range=(2.0 ** -87, 2.0 ** 97, False),
              wrapper=_activation_wrapper)
reciprocal = NkiOp("reciprocal", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: 1.0 / a,
                   activation_fn=lambda x: 1.0 / x, valid_range=(2.0 ** -42, 2.0 ** 42, True),
                   wrapper=_activation_wrapper)


def _act(name: str, fn: Callable, valid_range: tuple[float, float, bool] | None = None) -> NkiOp:
    return NkiOp(name, activation_fn=fn, valid_range=valid_range, wrapper=_activation_wrapper)


copy = NkiOp("copy", activation_fn=lambda x: x, wrapper=_copy_wrapper)
identity = NkiOp("identity", activation_fn=lambda x: x, wrapper=_copy_wrapper)
exp = _act("exp", np.exp)
log = _act("log", np.log, (2.0 ** -64, 2.0 ** 64, False))
sqrt = _act("sqrt", np.sqrt, (2.0 ** -116, 2.0 ** 118, False))
sigmoid = _act("sigmoid", _sigmoid)
gelu = _act("gelu", _gelu)
gelu_dx = _act("gelu_dx", _gelu_dx)
gelu_apprx_tanh = _act("gelu_apprx_tanh", _gelu_tanh)
gelu_apprx_sigmoid = _act("gelu_apprx_sigmoid", lambda x: x * _sigmoid(1.702 * x))
silu = _act("silu", lambda x: x * _sigmoid(x))
silu_dx = _act("silu_dx", _silu_dx)
tanh = _act("tanh", np.tanh)
softplus = _act("softplus", _softplus)
mish = _act("mish", lambda x: x * np.tanh(_softplus(x)))
erf = _act("erf", _erf)
erf_dx = _act("erf_dx", lambda x: 2.0 / np.sqrt(np.pi) * np.exp(-x * x))
sin = _act("sin", np.sin, (-_PI, _PI, False))
arctan = _act("arctan", np.arctan, (-_PI / 2, _PI / 2, False))
sign = _act("sign", np.sign)

floor = NkiOp("floor", wrapper=_rounding_wrapper)
ceil = NkiOp("ceil", wrapper=_rounding_wrapper)
where = NkiOp("where", wrapper=_where_wrapper)
transpose = NkiOp("transpose", wrapper=_transpose_wrapper)
matmul = NkiOp("matmul", wrapper=_matmul_wrapper)

sum = NkiOp("sum", wrapper=_reduce_wrapper)  # noqa: A001
mean = NkiOp("mean", wrapper=_reduce_wrapper)
max = NkiOp("max", wrapper=_reduce_wrapper, alias_of=maximum)  # noqa: A001
min = NkiOp("min", wrapper=_reduce_wrapper, alias_of=minimum)  # noqa: A001

divide = NkiOp("divide", fails_on_hardware=True)
mod = NkiOp("mod", fails_on_hardware=True)
fmod = NkiOp("fmod", fails_on_hardware=True)

# Only nl.* names: language.py star-imports this module.
__all__ = [
    "add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "power", "abs_max", "abs_min", "bitwise_and", "bitwise_or", "bitwise_xor",
    "left_shift", "right_shift", "invert", "negative", "abs", "square", "relu", "rsqrt",
    "reciprocal", "copy", "identity", "exp", "log", "sqrt", "sigmoid", "gelu", "gelu_dx",
    "gelu_apprx_tanh", "gelu_apprx_sigmoid", "silu", "silu_dx", "tanh", "softplus", "mish",
    "erf", "erf_dx", "sin", "arctan", "sign", "floor", "ceil", "where", "transpose", "matmul",
    "sum", "mean", "max", "min", "divide", "mod", "fmod",
]
