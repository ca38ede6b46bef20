"""Cross-core synchronisation: ``core_barrier``."""

from __future__ import annotations

from typing import Any

from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.tensor import NkiTensor

__all__ = ["core_barrier"]


def core_barrier(data: Any, cores: Any = (0, 1), name: str | None = None) -> None:
    """Block until every program in ``cores`` reached this barrier (LNC=2 cross-core sync).

    ``data`` must be a ``shared_hbm`` tensor; ``cores`` must name every running program
    (a barrier that waits for a core that does not exist, or that skips one, deadlocks or is
    meaningless on hardware, so both are rejected).
    """
    ins = "core_barrier"
    ctx = current()
    if not isinstance(data, NkiTensor) or data.buffer != "shared_hbm":
        raise nki_error(ins, "shared_hbm data",
                        f"data must be a shared_hbm tensor, got "
                        f"{getattr(data, 'buffer', type(data).__name__)}")
    if not isinstance(cores, tuple) or not all(isinstance(c, int) and not isinstance(c, bool)
                                               for c in cores):
        raise nki_error(ins, "cores", f"cores must be a tuple of ints, got {cores!r}")
    if sorted(cores) != list(range(ctx.num_programs)):
        raise nki_error(ins, "cores",
                        f"cores={cores} must list every running program "
                        f"(0..{ctx.num_programs - 1}); launch with kernel[2] / lnc=2 for a "
                        "two-core barrier")
    ctx.report.add_instruction("sync", "core_barrier", 0)
    if ctx.num_programs > 1:
        ctx.shared.scheduler.barrier(ctx.program_id, ins)
