"""The emulated ``nki.isa`` namespace: every instruction module contributes its ``__all__``.

Documented names without an implementation resolve to stand-ins that raise NkiError
"not modelled" (:mod:`nkilib_msda.simulator.unmodelled`); never AttributeError.
"""

from typing import Any

from nkilib_msda.simulator.isa.enums import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.dma import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.sync import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.vector import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.vector_reduce import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.scalar import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.gpsimd import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.tensor_engine import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.scalars import *  # noqa: F401,F403
from nkilib_msda.simulator.isa import constants  # noqa: F401
from nkilib_msda.simulator.unmodelled import ISA_UNMODELLED, unmodelled

# Engine shorthands of the real ``nki.isa`` (deprecated there: use ``engine.<name>``).
# ``nisa.tensor_engine`` stays the submodule (shadowing it breaks
# ``import ...isa.tensor_engine as m``): use ``nisa.engine.tensor``.
vector_engine = engine.vector  # noqa: F405
scalar_engine = engine.scalar  # noqa: F405
gpsimd_engine = engine.gpsimd  # noqa: F405
unknown_engine = engine.unknown  # noqa: F405


class NkiValidationError(Exception):
    """Documented in ``nki.isa``; the emulator raises ``NkiError`` for rule violations."""


def __getattr__(name: str) -> Any:
    if name in ISA_UNMODELLED:
        return unmodelled(f"nisa.{name}")
    raise AttributeError(f"module 'nki.isa' has no attribute {name!r}")
