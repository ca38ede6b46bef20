"""ALU operators and activation functions (the ``nl.*`` operator names).

Layer: ALU semantics, below the instructions. The ``nl.add(x, y)`` tile functions are
implemented one layer above the instructions (simulator/wrappers.py) and installed with
:func:`register_wrappers`.

One object per NKI name: ``nl.add`` is both the ALU identity passed as ``op=`` to
``nisa.tensor_tensor`` & co. and, when called, the experimental wrapper
``nl.add(x, y, dtype=None)`` that returns a NEW tile (docs/emulator.md).

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

import math as _math
import warnings as _warnings
from typing import Any, Callable

import numpy as np

from nkilib_msda.hardware import SQRT_VALID_INPUT
from nkilib_msda.simulator.context import current
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
                 wrapper: str | None = None, alias_of: "NkiOp | None" = None,
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
        impl = _WRAPPERS.get(self._wrapper)
        if impl is None:
            raise nki_error(f"nl.{self.name}", "not callable",
                            f"the nl.{self.name} tile wrapper is not registered (import "
                            "nkilib_msda.simulator.language, which installs the wrappers)")
        return impl(self, *args, **kwargs)

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


# Tile-function implementations by wrapper kind, installed by the ``nl`` wrapper layer
# (simulator/wrappers.py), which sits above the instructions this module must not import.
_WRAPPERS: dict[str, Callable[..., Any]] = {}


def register_wrappers(impls: dict[str, Callable[..., Any]]) -> None:
    """Install the ``nl.<op>(...)`` tile functions by wrapper kind (called once by wrappers.py)."""
    _WRAPPERS.update(impls)


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
    ctx = current()
    warned = getattr(ctx, "_warned_activation_ranges", None)
    if warned is None:
        warned = ctx._warned_activation_ranges = set()
    if op.name in warned or not op.out_of_range(x):
        return
    warned.add(op.name)
    lo, hi, symmetric = op.valid_range  # type: ignore[misc]
    rng = f"+-[{lo:g}, {hi:g}]" if symmetric else f"[{lo:g}, {hi:g}]"
    _warnings.warn(NkiWarning(f"activation: valid input range: {op!r} is only valid on {rng}; "
                              "the hardware returns garbage outside it (the emulator returns "
                              "the exact value)", instruction="activation",
                              rule="valid input range"), stacklevel=3)


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
                 wrapper="binary", **kw)


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
                    reducible=True, wrapper="binary")
bitwise_or = NkiOp("bitwise_or", alu_kind=BITVEC, arity=2, alu_fn=np.bitwise_or,
                   reducible=True, wrapper="binary")
bitwise_xor = NkiOp("bitwise_xor", alu_kind=BITVEC, arity=2, alu_fn=np.bitwise_xor,
                    reducible=True, wrapper="binary")
left_shift = NkiOp("left_shift", alu_kind=BITVEC, arity=2, alu_fn=_shift_left,
                   wrapper="binary")
right_shift = NkiOp("right_shift", alu_kind=BITVEC, arity=2, alu_fn=_shift_right,
                    wrapper="binary")
invert = NkiOp("invert", alu_kind=BITVEC, arity=1, alu_fn=np.invert, wrapper="unary_alu")
logical_not = NkiOp("logical_not", alu_kind=ARITHMETIC, arity=1,
                    alu_fn=lambda a: (a == 0).astype(np.float32), is_compare=True,
                    wrapper="unary_alu")
negative = NkiOp("negative", alu_kind=ARITHMETIC, arity=1, alu_fn=np.negative,
                 wrapper="unary_alu")

# Unary ALU ops that are also activation functions (the wrapper uses ScalarE).
abs = NkiOp("abs", alu_kind=ARITHMETIC, arity=1, alu_fn=np.abs,  # noqa: A001
            activation_fn=np.abs, wrapper="activation")
square = NkiOp("square", alu_kind=ARITHMETIC, arity=1, alu_fn=np.square,
               activation_fn=np.square, wrapper="activation")
relu = NkiOp("relu", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: np.maximum(a, 0),
             activation_fn=lambda x: np.maximum(x, 0.0), wrapper="activation")
rsqrt = NkiOp("rsqrt", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: 1.0 / np.sqrt(a),
              activation_fn=lambda x: 1.0 / np.sqrt(x), valid_range=(2.0 ** -87, 2.0 ** 97, False),
              wrapper="activation")
reciprocal = NkiOp("reciprocal", alu_kind=ARITHMETIC, arity=1, alu_fn=lambda a: 1.0 / a,
                   activation_fn=lambda x: 1.0 / x, valid_range=(2.0 ** -42, 2.0 ** 42, True),
                   wrapper="activation")


def _act(name: str, fn: Callable, valid_range: tuple[float, float, bool] | None = None) -> NkiOp:
    return NkiOp(name, activation_fn=fn, valid_range=valid_range, wrapper="activation")


copy = NkiOp("copy", activation_fn=lambda x: x, wrapper="copy")
identity = NkiOp("identity", activation_fn=lambda x: x, wrapper="copy")
exp = _act("exp", np.exp)
log = _act("log", np.log, (2.0 ** -64, 2.0 ** 64, False))
sqrt = _act("sqrt", np.sqrt, (*SQRT_VALID_INPUT, False))
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

floor = NkiOp("floor", wrapper="rounding")
ceil = NkiOp("ceil", wrapper="rounding")
where = NkiOp("where", wrapper="where")
transpose = NkiOp("transpose", wrapper="transpose")
matmul = NkiOp("matmul", wrapper="matmul")

sum = NkiOp("sum", wrapper="reduce")  # noqa: A001
mean = NkiOp("mean", wrapper="reduce")
max = NkiOp("max", wrapper="reduce", alias_of=maximum)  # noqa: A001
min = NkiOp("min", wrapper="reduce", alias_of=minimum)  # noqa: A001

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
