"""The emulated ``nki.isa`` namespace: every instruction module contributes its ``__all__``."""

from nkilib_msda.simulator.isa.enums import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.dma import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.sync import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.vector import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.scalar import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.gpsimd import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.tensor_engine import *  # noqa: F401,F403

# Engine shorthands of the real ``nki.isa`` (``nisa.vector_engine`` ...). ``nisa.tensor_engine``
# stays the submodule (shadowing it breaks ``import ...isa.tensor_engine as m``): use
# ``nisa.engine.tensor``.
vector_engine = engine.vector  # noqa: F405
scalar_engine = engine.scalar  # noqa: F405
gpsimd_engine = engine.gpsimd  # noqa: F405
unknown_engine = engine.unknown  # noqa: F405
