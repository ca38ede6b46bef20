"""The emulated ``nki.lnc`` namespace (NKI 0.8): communication between the paired physical
NeuronCores that share an HBM stack.

https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html and
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/_modules/nki/lnc.html (signatures).
Implemented in :mod:`nkilib_msda.simulator.isa.sync` (which also holds the deprecated
``nki.isa`` wrappers).
"""

from __future__ import annotations

from nkilib_msda.simulator.isa.sync import lnc_core_barrier as core_barrier
from nkilib_msda.simulator.isa.sync import lnc_sendrecv as sendrecv
from nkilib_msda.simulator.isa.sync import lnc_sendrecv_compute as sendrecv_compute

__all__ = ["core_barrier", "sendrecv", "sendrecv_compute"]
