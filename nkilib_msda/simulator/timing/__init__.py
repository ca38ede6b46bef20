"""Timing model of the emulator: modelled Trainium time of a simulated kernel (docs/timing.md).

``simulate(kernel, report=True)(...)`` returns a :class:`~nkilib_msda.simulator.CostReport`
whose ``.timing`` is a :class:`Timing`. Constants and unknown parameters live in
:mod:`nkilib_msda.simulator.timing.constants`.
"""

from __future__ import annotations

from nkilib_msda.simulator.timing.constants import (HARDWARE, PARAM_NAMES, PARAMS, Hardware,
                                                    Param, nominal_params, params_for)
from nkilib_msda.simulator.timing.graph import TimingGraph
from nkilib_msda.simulator.timing.recorder import Timeline, TimingWarning
from nkilib_msda.simulator.timing.schedule import Timing

__all__ = ["Timing", "Timeline", "TimingGraph", "TimingWarning", "Param", "Hardware", "HARDWARE", "PARAMS", "PARAM_NAMES",
           "nominal_params", "params_for"]
