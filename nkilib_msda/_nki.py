"""Single import point for NKI: ``from nkilib_msda._nki import nki, nl, nisa``.

The real Neuron ``nki`` package (NKI beta 2, ``import nki``) is used when it is importable
and complete; otherwise, or when ``NKILIB_MSDA_NKI=emulator`` is set, the package's own
NumPy emulator (:mod:`nkilib_msda.simulator`) provides the same API.
"""

from __future__ import annotations

from types import ModuleType

from nkilib_msda._env import env_choice

__all__ = ["nki", "nl", "nisa", "USING_REAL_NKI", "backend_name"]


def _load_real_nki() -> tuple[ModuleType, ModuleType, ModuleType] | None:
    try:
        import nki as real_nki  # type: ignore[import-not-found]
        import nki.isa as real_isa  # type: ignore[import-not-found]
        import nki.language as real_language  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - absent, a PyPI placeholder, or a broken install
        return None
    if not hasattr(real_nki, "jit") or not hasattr(real_isa, "dma_copy"):
        return None  # a placeholder package, not the Neuron SDK
    return real_nki, real_language, real_isa


_real = None if env_choice("NKILIB_MSDA_NKI", ("auto", "emulator")) == "emulator" else _load_real_nki()

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
