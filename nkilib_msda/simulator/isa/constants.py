"""``nki.isa.constants``: the ISA enums (``from nki.isa.constants import dge_mode, oob_mode``,
as nki-library imports them)."""

from nkilib_msda.simulator.isa.enums import (dge_mode, dma_engine, engine, matmul_perf_mode,  # noqa: F401
                                             nc_version, oob_mode, reduce_cmd)

__all__ = ["engine", "oob_mode", "dge_mode", "reduce_cmd", "matmul_perf_mode", "nc_version",
           "dma_engine"]
