"""The package's environment variables: one table (name, accepted values, default, doc) and
the one rule for words, shared by every reader.

Every variable the package reads is an :class:`EnvVar` in :data:`ENV_VARS` and is read with
:func:`read_env`; no other module touches ``os.environ``. The README's table of variables is
generated from this one (:func:`env_table_markdown`; a test keeps them equal).

The rule for the package's own words, for environment variables and the ``backend=`` /
``target=`` arguments alike (:func:`match_word`): case does not matter
(``NKILIB_MSDA_BACKEND=Reference`` and ``backend="NKI"`` both work) and the canonical spelling
is returned; any other word raises. The kernel API's layout and padding arguments keep the
exact spelling of AWS's kernels, whose API they mirror. In environment variables surrounding
spaces are ignored and an unset or empty variable means "use the default". A value that is not
accepted raises :class:`EnvironmentVariableError` (a ``ValueError``) naming the variable, the
accepted values and the value received, wherever the package reads any of its variables
(:func:`read_env` checks all of its own first). :func:`check_optional_bool` checks a public
``True``/``False``/``None`` argument such as ``deterministic=``.

This module imports nothing from the package, so any module (the emulator included) can use it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["EnvironmentVariableError", "TRUE_WORDS", "FALSE_WORDS", "EnvVar", "ENV_VARS",
           "RENAMED_FROM", "read_env", "validate_environment", "env_table_markdown", "match_word",
           "env_flag", "check_package_variables",
           "env_choice", "check_optional_bool", "environment_snapshot", "child_environment",
           "ONE_BLAS_THREAD"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class EnvironmentVariableError(ValueError):
    """An environment variable holds a value the package does not accept."""


def match_word(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` as one of ``choices`` in the canonical spelling, ignoring case; a non-string
    raises TypeError and an unknown word ValueError, both naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {list(choices)}, got {value!r}")
    folded = value.casefold()
    for choice in choices:
        if choice.casefold() == folded:
            return choice
    raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")


# Renamed variables, new name -> old name: when only the old one is set it is still read,
# with a DeprecationWarning ("emulator" is the package's one word for its NKI emulator).
RENAMED_FROM = {"NKILIB_MSDA_EMULATOR_STRICT": "NKILIB_MSDA_SIM_STRICT"}


def _raw(name: str) -> str:
    """The variable's stripped value, "" when unset. Read through ``os.environ``'s own dict
    when it has one (see :func:`_own_snapshot`): ``os.environ.get`` of an unset variable raises
    and catches a KeyError inside, a few µs on every eager MSDA call."""
    environ = os.environ
    data, encode = getattr(environ, "_data", None), getattr(environ, "encodekey", None)
    decode = getattr(environ, "decodevalue", None)
    if type(data) is not dict or encode is None or decode is None:
        return environ.get(name, "").strip()
    raw = data.get(encode(name))
    return "" if raw is None else decode(raw).strip()


def _lookup(name: str) -> tuple[str, str]:
    """(the variable actually read, its stripped value): ``name``, or its old name."""
    raw = _raw(name)
    old = RENAMED_FROM.get(name)
    if not raw and old and _raw(old):
        warnings.warn(f"{old} is deprecated: set {name} instead", DeprecationWarning, stacklevel=4)
        return old, _raw(old)
    return name, raw


def env_flag(name: str, default: bool | None = None) -> bool | None:
    """The boolean environment variable ``name``: ``default`` when unset or empty.

    Accepted (any case, surrounding spaces ignored): 1/true/yes/on and 0/false/no/off.
    """
    name, raw = _lookup(name)
    if not raw:
        return default
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvironmentVariableError(
        f"{name}: expected one of {'/'.join(TRUE_WORDS)} (on) or {'/'.join(FALSE_WORDS)} (off), "
        f"or unset, got {raw!r}")


def env_choice(name: str, choices: Sequence[str], default: str = "") -> str:
    """The environment variable ``name`` as one of ``choices`` (canonical spelling, any case
    accepted); ``default`` when unset or empty."""
    name, raw = _lookup(name)
    if not raw:
        return default
    try:
        return match_word(name, raw, choices)
    except ValueError:
        raise EnvironmentVariableError(
            f"{name}: expected one of {list(choices)} (or unset), got {raw!r}") from None


def _external_flag(name: str) -> bool:
    """A switch owned by another project, read the way that project reads it (no errors)."""
    return _raw(name).lower() in (*TRUE_WORDS, "y")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: how it is read, its default and what it does.

    ``values`` is the README's "values" column; ``owner`` is "" for the package's own
    variables, else the project that defines it (the package only reads those)."""

    name: str
    values: str
    doc: str
    read: Callable[[], Any]
    owner: str = ""
    legacy_for: str = ""


def _lnc(name: str) -> int | None:
    word = env_choice(name, ("1", "2"))
    return int(word) if word else None


def _legacy_lnc() -> int | None:
    """NKILIB_MSDA_SIM_LNC: still read, with a DeprecationWarning when set."""
    degree = _lnc("NKILIB_MSDA_SIM_LNC")
    if degree is not None:
        warnings.warn("NKILIB_MSDA_SIM_LNC is deprecated: set NEURON_LOGICAL_NC_CONFIG instead",
                      DeprecationWarning, stacklevel=4)
    return degree


_COMPILER_LNC_FLAGS = ("--lnc", "-lnc", "--logical-nc-config")


def _compiler_lnc() -> int | None:
    """The LNC degree NEURON_CC_FLAGS passes to neuronx-cc (``--lnc``, ``-lnc`` or
    ``--logical-nc-config``, with ``=`` or a space; the last one wins), None when it sets none.
    Other flags are neuronx-cc's business and ignored; an LNC value other than 1 or 2 raises."""
    words = _raw("NEURON_CC_FLAGS").split()
    degree = None
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag not in _COMPILER_LNC_FLAGS:
            continue
        if not value:
            value = words[i + 1] if i + 1 < len(words) else ""
        if value not in ("1", "2"):
            raise EnvironmentVariableError(
                f"NEURON_CC_FLAGS: expected {flag} 1 or 2 (or no {flag}), "
                f"got {_raw('NEURON_CC_FLAGS')!r}")
        degree = int(value)
    return degree


_BACKENDS = ("auto", "reference", "nki", "triton")

ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("NKILIB_MSDA_BACKEND", "`auto` (default), `reference`, `nki`, `triton`",
           "backend when `backend=None` (Block AttnRes: `reference`/`nki`; other values select by "
           "device)",
           lambda: env_choice("NKILIB_MSDA_BACKEND", _BACKENDS, default="auto")),
    EnvVar("NKILIB_MSDA_NKI", "`auto` (default), `emulator`",
           "`emulator`: use the package's NKI emulator even where the Neuron `nki` is installed "
           "(read once, at import)",
           lambda: env_choice("NKILIB_MSDA_NKI", ("auto", "emulator"), default="auto")),
    EnvVar("NKILIB_MSDA_EMULATOR_STRICT", "on/off (default off)",
           "emulator strict mode, see [docs/emulator.md](docs/emulator.md) (the old name "
           "`NKILIB_MSDA_SIM_STRICT` is still read, with a DeprecationWarning)",
           lambda: env_flag("NKILIB_MSDA_EMULATOR_STRICT", default=False)),
    EnvVar("NKILIB_MSDA_EMULATOR_FULL_INDIRECT", "on/off (default off)",
           "emulator: every indirect DMA's index tile must cover all 128 partitions from "
           "partition 0 and a multi-column one start 16-byte aligned (AWS's practice, not a "
           "documented rule; the kernel tests turn it on), see [docs/emulator.md](docs/emulator.md)",
           lambda: env_flag("NKILIB_MSDA_EMULATOR_FULL_INDIRECT", default=False)),
    EnvVar("NKILIB_MSDA_EMULATOR_TIMING", "on/off (default on)",
           "emulator timing model for `simulate(..., report=True)` (`report.timing`, "
           "[docs/timing.md](docs/timing.md)); off skips recording",
           lambda: env_flag("NKILIB_MSDA_EMULATOR_TIMING", default=True)),
    EnvVar("NEURON_LOGICAL_NC_CONFIG", "`1` (default), `2`",
           "LNC degree of every NKI launch, on Neuron devices and in the emulator; set it to the "
           "`--lnc` your graph is compiled with (neuronx-cc defaults to 2 on Trn2)",
           lambda: _lnc("NEURON_LOGICAL_NC_CONFIG"), owner="Neuron SDK"),
    EnvVar("NEURON_CC_FLAGS", "neuronx-cc's flags (default: none)",
           "only its `--lnc` / `--logical-nc-config` is read: on a Neuron device the nki backend "
           "refuses to launch when it differs from the kernels' LNC (unset: neuronx-cc uses 2 on "
           "Trn2 and Trn3), see [docs/kernels.md](docs/kernels.md#lnc-on-a-trainium-instance)",
           _compiler_lnc, owner="Neuron SDK"),
    EnvVar("NKILIB_MSDA_SIM_LNC", "`1`, `2`",
           "deprecated (DeprecationWarning when set): read when `NEURON_LOGICAL_NC_CONFIG` is unset",
           _legacy_lnc, legacy_for="NEURON_LOGICAL_NC_CONFIG"),
    EnvVar("NEURON_PLATFORM_TARGET_OVERRIDE", "`trn2` (default), `trn3`",
           "chip the emulator models (SBUF size, Trn3-only instructions)",
           lambda: env_choice("NEURON_PLATFORM_TARGET_OVERRIDE", ("trn2", "trn3"),
                              default="trn2"), owner="Neuron SDK"),
    EnvVar("NKILIB_MSDA_DETERMINISTIC",
           "on/off; unset: follows `torch.use_deterministic_algorithms`",
           "Triton backward: bitwise-reproducible grad_value when the call passes no "
           "`deterministic=`",
           lambda: env_flag("NKILIB_MSDA_DETERMINISTIC")),
    EnvVar("NKILIB_MSDA_TRITON_FAST_LAUNCH", "on/off (default on)",
           "Triton backend: launch compiled kernels directly, skipping Triton's Python launcher "
           "(off under `TRITON_INTERPRET`); read once, at import",
           lambda: env_flag("NKILIB_MSDA_TRITON_FAST_LAUNCH", default=True)),
    EnvVar("TRITON_INTERPRET", "`1` to enable",
           "Triton's CPU interpreter: the triton backend runs on CPU tensors (tests only)",
           lambda: _external_flag("TRITON_INTERPRET"), owner="Triton"),
    EnvVar("USE_HUB_KERNELS", "transformers' switch (default on)",
           "`0`/`no`/`false`/`off`: transformers' kernel-hub hook is off, so `register_hf_kernels` "
           "warns that `kernels.kernelize` will not swap in nkilib_msda",
           lambda: _raw("USE_HUB_KERNELS"), owner="transformers"),
    EnvVar("DISABLE_KERNEL_MAPPING", "the `kernels` package's switch (default unset)",
           "set (not `0`): `kernels.kernelize` keeps every original forward, so "
           "`register_hf_kernels` warns",
           lambda: _raw("DISABLE_KERNEL_MAPPING"), owner="kernels"),
)}


# The package's own variables (and their old names): the snapshot they were last checked in.
_OWN_NAMES = tuple(n for v in ENV_VARS.values() if not v.owner
                   for n in (v.name, *([RENAMED_FROM[v.name]] if v.name in RENAMED_FROM else [])))
_checked_snapshot: list[tuple[Any, ...] | None] = [None]


# Every variable of the table (and the old names): what :func:`environment_snapshot` reads.
_ALL_NAMES = tuple(n for v in ENV_VARS.values()
                   for n in (v.name, *([RENAMED_FROM[v.name]] if v.name in RENAMED_FROM else [])))


def _snapshot(names: tuple[str, ...]) -> tuple[Any, ...]:
    """The raw values of ``names`` (None when unset), as cheaply as possible. CPython's
    ``os.environ`` keeps its items in ``_data`` under ``encodekey(name)`` (POSIX and Windows,
    every supported version), which one ``map`` reads in under a microsecond, against ~15 µs
    for nine ``os.environ.get`` calls; any other mapping is read through ``get``."""
    environ = os.environ
    data, encode = getattr(environ, "_data", None), getattr(environ, "encodekey", None)
    if type(data) is not dict or encode is None:
        return tuple(environ.get(n) for n in names)
    known = _ENCODED_NAMES.get(id(names))  # names: a module constant, so its id is stable
    if known is None or known[0] is not encode:
        known = _ENCODED_NAMES[id(names)] = (encode, tuple(encode(n) for n in names))
    return tuple(map(data.get, known[1]))


def _own_snapshot() -> tuple[Any, ...]:
    """The raw values of the package's own variables (None when unset): this runs on every
    read (:func:`check_package_variables`)."""
    return _snapshot(_OWN_NAMES)


def environment_snapshot() -> tuple[Any, ...]:
    """The raw values (None when unset) of every variable in :data:`ENV_VARS` and of the old
    names: a memo that caches anything derived from the environment keys on it, so a changed
    variable (a new backend, a bad value that must raise) is a miss and is read again."""
    return _snapshot(_ALL_NAMES)


# id(names) -> (the encodekey used, the names encoded with it); hashing the names tuple itself
# on every call would cost more than the reads
_ENCODED_NAMES: dict[int, tuple[Any, tuple[Any, ...]]] = {}


def check_package_variables() -> None:
    """Read every one of the package's own variables (owner ""), so that a bad value of one
    that this code path does not use (e.g. NKILIB_MSDA_DETERMINISTIC on the reference backend)
    raises wherever the package reads its first variable, on every backend. Checked again only
    when one of them changes; deprecation warnings are left to the real reads."""
    snapshot = _own_snapshot()
    if snapshot == _checked_snapshot[0]:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for var in ENV_VARS.values():
            if not var.owner:
                var.read()
    _checked_snapshot[0] = snapshot


def read_env(name: str) -> Any:
    """The parsed value of the environment variable ``name`` (one of :data:`ENV_VARS`), after
    checking every one of the package's own variables (:func:`check_package_variables`)."""
    check_package_variables()
    return ENV_VARS[name].read()


def validate_environment() -> None:
    """Read every variable of the table: the first bad value raises EnvironmentVariableError
    (variables are otherwise read only where they matter, e.g. NKILIB_MSDA_DETERMINISTIC by
    the Triton backend)."""
    for var in ENV_VARS.values():
        var.read()


def env_table_markdown() -> str:
    """The README's table of environment variables."""
    rows = ["| environment variable | values | effect |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.values} | {v.doc} |" for v in ENV_VARS.values()]
    return "\n".join(rows)


def check_optional_bool(name: str, value: Any) -> bool | None:
    """A public argument that must be True, False or None (NumPy bools accepted)."""
    if value is None or isinstance(value, bool):
        return value
    if type(value).__name__ in ("bool_", "bool") and hasattr(value, "item"):  # NumPy bool
        return bool(value)
    raise TypeError(f"{name}: expected True, False or None, got {type(value).__name__} {value!r}")


# One BLAS thread per emulator child process (the calibration runner's and the side-by-side
# script's). The emulator's matmuls are small (at most [128, 128] x [128, 512]
# per nc_matmul, in float64) and the LNC programs take turns, so a second OpenBLAS thread only
# contends: on the shared 2-core machine with the other core busy it made each such product
# 4x slower (0.56 -> 2.3 ms) and an mlp_cte record's emulation 10x slower (docs/calibration.md,
# "Emulator speed"). Thread counts do not change a product's bits (OpenBLAS splits the output,
# not the contraction).
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def child_environment(overrides: dict[str, str]) -> dict[str, str]:
    """The environment for a child process: this process's variables with ``overrides`` set
    (the emulator's child processes get :data:`ONE_BLAS_THREAD` this way)."""
    return {**os.environ, **overrides}
