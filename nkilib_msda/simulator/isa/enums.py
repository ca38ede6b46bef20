"""Enums of ``nki.isa`` (named members; raw ints are rejected by the instructions)."""

from __future__ import annotations

from enum import Enum

__all__ = ["engine", "oob_mode", "dge_mode", "reduce_cmd", "matmul_perf_mode", "nc_version",
           "get_nc_version"]


class engine(Enum):
    """Engine selector for instructions that may run on several engines."""

    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    sync = 5
    activation = 3  # alias of scalar (ACT engine)


class oob_mode(Enum):
    """Out-of-bounds handling of dynamic (indirect) DMA addresses."""

    error = 0
    skip = 1


class dge_mode(Enum):
    """Descriptor generation: none (static), swdge (GpSimd, needed for vector_offset),
    hwdge (hardware, no indirection), unknown (compiler picks)."""

    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class reduce_cmd(Enum):
    """Accumulator commands of activation's optional free-axis reduction."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class matmul_perf_mode(Enum):
    none = 0
    double_row = 1
    double_column = 2
    double_row_gen3 = 3


class nc_version(Enum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """NeuronCore version of the running target (trn2 -> gen3, trn3 -> gen4)."""
    from nkilib_msda.simulator.context import current_or_none
    from nkilib_msda.simulator.targets import get_target

    ctx = current_or_none()
    target = ctx.target if ctx is not None else get_target()
    return nc_version.gen4 if target.name == "trn3" else nc_version.gen3
