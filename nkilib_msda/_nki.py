"""Single import point for NKI: ``from nkilib_msda._nki import nki, nl, nisa``.

The real Neuron ``nki`` package (``import nki``) is used when it is importable and
complete; otherwise, or when ``NKILIB_MSDA_NKI=emulator`` is set, the package's own NumPy
emulator (:mod:`nkilib_msda.simulator`) provides the same API. The kernels are written for
NKI 0.7+ (Neuron 2.33+: specialization by Python tracing, the LNC idiom of
``nl.num_programs()``/``nl.program_id(0)``); a real ``nki`` older than 0.7 is refused with an
ImportError naming the version found. See docs/kernels.md, "Supported NKI".
"""

from __future__ import annotations

import re
from types import ModuleType

from nkilib_msda._env import read_env

__all__ = ["nki", "nl", "nisa", "USING_REAL_NKI", "backend_name", "MIN_NKI_VERSION",
           "require_supported_nki"]

MIN_NKI_VERSION = (0, 7)


def _parse_version(version: str) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def require_supported_nki(version: str | None, where: str = "nki") -> None:
    """Raise ImportError when ``version`` (the real nki's) is older than 0.7.

    An unknown version (no ``__version__`` and no package metadata) is accepted: only a
    version known to predate 0.7 is refused.
    """
    if version is None:
        return
    parsed = _parse_version(version)
    if parsed is not None and parsed < MIN_NKI_VERSION:
        need = ".".join(map(str, MIN_NKI_VERSION))
        raise ImportError(
            f"nkilib_msda needs NKI >= {need} (Neuron SDK >= 2.33), found nki {version} at "
            f"{where}; upgrade the Neuron SDK, or set NKILIB_MSDA_NKI=emulator to use the "
            "package's emulator instead")


def _real_nki_version(module: ModuleType) -> str | None:
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("nki")
    except PackageNotFoundError:
        return None


def _load_real_nki() -> tuple[ModuleType, ModuleType, ModuleType] | None:
    try:
        import nki as real_nki  # type: ignore[import-not-found]
        import nki.isa as real_isa  # type: ignore[import-not-found]
        import nki.language as real_language  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - absent, a PyPI placeholder, or a broken install
        return None
    if not hasattr(real_nki, "jit") or not hasattr(real_isa, "dma_copy"):
        return None  # a placeholder package, not the Neuron SDK
    require_supported_nki(_real_nki_version(real_nki), getattr(real_nki, "__file__", "nki"))
    return real_nki, real_language, real_isa


_real = None if read_env("NKILIB_MSDA_NKI") == "emulator" else _load_real_nki()

if _real is not None:
    nki, nl, nisa = _real
    USING_REAL_NKI = True
else:
    from nkilib_msda.simulator import nki, nl, nisa  # noqa: E402

    USING_REAL_NKI = False


def backend_name() -> str:
    """'neuron nki <version>' or 'nkilib_msda emulator'."""
    if USING_REAL_NKI:
        return f"neuron nki {getattr(nki, '__version__', '?')}"
    return "nkilib_msda emulator"
