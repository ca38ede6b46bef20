"""How the simulator tests run a kernel: through the official ``nki.simulate`` where
``nkilib_msda._nki`` selected a real ``nki`` (the Neuron SDK is importable and
``NKILIB_MSDA_NKI`` is not ``emulator``), else through the package's emulator.

docs/emulator.md, "Running the simulator tests under the official nki.simulate". Official API
(Neuron 2.34 / NKI 0.8, nki/api/generated/nki.simulate.html): ``nki.simulate(kernel)(*arrays)``
and, at LNC 2, ``nki.simulate(kernel[2])(*arrays)``. The cost report (``report=True``) and the
emulator's own options exist only in the emulator: a test that needs them carries the
``emulator_only`` marker, and asking for them on the official route raises.
"""

from __future__ import annotations

from typing import Any, Callable

from nkilib_msda._nki import USING_REAL_NKI, backend_name, nki
from nkilib_msda.simulator import simulate as emulator_simulate

__all__ = ["simulate", "ROUTE"]

# What runs the kernels in this session (printed in pytest's header by simulator_tests/conftest.py).
ROUTE = f"nki.simulate ({backend_name()})" if USING_REAL_NKI else "the nkilib_msda emulator"


def simulate(kernel: Any, lnc: int | None = None, report: bool = False, **options: Any) -> Callable[..., Any]:
    """``kernel`` ready to call with NumPy arrays on the session's route; ``lnc`` None reads
    ``NEURON_LOGICAL_NC_CONFIG`` on both routes."""
    if not USING_REAL_NKI:
        return emulator_simulate(kernel, lnc=lnc, report=report, **options)
    if report or options:
        asked = ["report=True"] * bool(report) + sorted(options)
        raise RuntimeError(f"simulate: {', '.join(asked)} exist only in the nkilib_msda emulator, not in "
                           f"nki.simulate; mark the test emulator_only or run with NKILIB_MSDA_NKI=emulator")
    return nki.simulate(kernel if lnc in (None, 1) else kernel[lnc])
