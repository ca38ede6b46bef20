"""The emulated ``nki.isa`` namespace: every instruction module contributes its ``__all__``."""

from nkilib_msda.simulator.isa.enums import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.dma import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.sync import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.vector import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.scalar import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.gpsimd import *  # noqa: F401,F403
from nkilib_msda.simulator.isa.tensor_engine import *  # noqa: F401,F403
