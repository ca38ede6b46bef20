"""Analytic DMA cost model of the corner-block value layout against today's four-corner gather
(issue 30, item 4); used by ``benchmarks/corner_block_model.py`` and, through a test, to check
the planner's ``gather_layout="auto"`` rule (``plan/corner_plan.py``).

This module counts, per core and per phase, what each design asks of the DMA engines,
software DGE (GpSimd), the compute engines and HBM, and prices it with the timing model's
formulas and parameter ranges (``nkilib_msda/simulator/timing/constants.py``,
docs/timing.md): per DMA engine ``bytes / (23 B/ns * efficiency) + descriptors * cost``;
GpSimd ``instructions * swdge_fixed_ns + descriptors * swdge_descriptor_ns``. A phase takes
its busiest resource (perfect overlap inside a phase, a lower-bound-style estimate) plus one
DMA fixed latency; phases (build, zero, main, reduce, fold) follow each other. The
structures mirror the timing scenarios of issue 30: ``nominal`` (engine j serves partitions
8j..8j+7; an HBM->HBM copy uses min(16, runs) engines), ``spread`` (every DMA on 16 engines),
``serial`` (every software-DGE DMA of a core on one engine).

Designs: forward "four-corner" (today), "corner-block", "x-pair" (one ``2 * C_h`` run per
corner row: native in BNLC, a 2x-value build in BLNC); backward also "corner-gather"
(corner-block gathers, today's scatter). Shapes and units: a problem is an
:class:`MSDAProblem`; times are ns inside, µs out; bytes are per core. The compute-engine
busy time of the gather pipeline per sample is the emulator's (constants below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from nkilib_msda.experimental.deformable_attention.plan.backward_config import plan_backward
from nkilib_msda.experimental.deformable_attention.plan.corner_plan import (
    corner_cells, scratch_bytes, value_elements)
from nkilib_msda.hardware import DMA_ENGINES, DTYPE_BYTES, PARTITIONS, PARTITIONS_PER_DMA_ENGINE
from nkilib_msda.simulator.timing.constants import hardware_for, params_for
from nkilib_msda.validation.msda import MSDAProblem

DESIGNS_FWD = ("four-corner", "corner-block", "x-pair")
DESIGNS_BWD = ("four-corner", "corner-gather", "corner-block", "x-pair")
STRUCTURES = ("nominal", "spread", "serial")
PARAMETER_SETS = ("nominal", "swdge-bound", "descriptor-bound", "low", "high")

# Forward Vector work per gathered corner column and partition, in Vector cycles per channel
# (timing-model formulas, docs/timing.md): the weight multiply reading PSUM (N), the bitwise
# corner mask on fp32-as-int32 SBUF data (2N) and the fp32 reduce (N). The corner-block layout
# drops the mask (out-of-map corners are stored zeros; the validity bits go into the 4
# weights per sample instead of the 4 * C_h products).
FORWARD_MULTIPLY_REDUCE_CYCLES = 2
FORWARD_MASK_CYCLES = 2
_CLOCK_GHZ = hardware_for("trn2").clock_ghz  # Trn2 engine clocks (timing constants)
VECTOR_GHZ = _CLOCK_GHZ["vector"]
# The rest of the forward's Vector busy time per sample (coordinates, indices, weights): the
# emulator's tsa-small LNC 1 forward, 3,712 µs / 720,000 samples = 5.16 ns, less the gather
# part at C_h = 32 (4 columns * 4 * 32 cycles / 0.96 GHz / 128 partitions = 4.17 ns).
FORWARD_COORDINATE_NS_PER_SAMPLE = 1.0
FORWARD_TENSOR_NS_PER_SAMPLE = 0.42
# Backward busy time per sample, the same for every design (the masks apply to the (n, 4)
# corner dot products, not to C_h-wide data), from `python benchmarks/msda_side_by_side.py
# --kernels ours` (benchmarks/msda_side_by_side.json, commit 276be64): tsa-small LNC 1
# backward vector 8,103 µs / 720,000 samples.
BACKWARD_VECTOR_NS_PER_SAMPLE = 11.3
BACKWARD_TENSOR_NS_PER_SAMPLE = 0.83
# Forward transpose gather: 8 index columns of 128 indices per indirect DMA (forward_config).
FORWARD_INDICES_PER_DMA = 8 * PARTITIONS
# Backward transpose gather: M_g = 4 columns of 128 per DMA (backward plan of the shapes here).
BACKWARD_GATHER_INDICES_PER_DMA = 4 * PARTITIONS
# Build-pass copies on chip: Vector tensor_copy of 2-byte data with a strided destination at
# 2 elements/cycle (Trn2 perf mode) next to Scalar (or GpSimd) at 1 element/cycle.
BUILD_COPY_ELEMENTS_PER_NS = 2 * VECTOR_GHZ + _CLOCK_GHZ["scalar"]
# Direct DMAs of the build/zero/reduce/fold passes move >= 2 KiB per partition and descriptor.
BULK_RUN_BYTES = 2048
# fp32 Vector add of the fold pass: tensor_tensor 2N cycles per partition.
FOLD_NS_PER_ELEMENT = 2 / VECTOR_GHZ


@dataclass(frozen=True)
class Transfer:
    """One class of DMA instructions of one core: ``descriptors`` runs carrying ``nbytes``."""

    name: str
    instructions: float
    descriptors: float
    nbytes: float
    hbm_bytes: float
    efficiency: float = 1.0
    engines: int = DMA_ENGINES      # engines under the nominal partition rule
    swdge: bool = False             # software DGE (indirect, dma_compute): GpSimd issue cost


@dataclass(frozen=True)
class Phase:
    """Work of one core between two synchronisation points (compute busy ns per engine)."""

    name: str
    transfers: tuple[Transfer, ...]
    compute_ns: Mapping[str, float] = field(default_factory=dict)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _samples_per_core(p: MSDAProblem, lnc: int) -> int:
    return p.batch * _ceil(p.num_queries, lnc) * p.num_heads * p.num_levels * p.num_points


def _build_phase(p: MSDAProblem, vb: int, lnc: int, design: str) -> Phase | None:
    """Write the scratch layout through SBUF: rows y (and y+1) of value come in as long runs,
    Vector/Scalar copies interleave them into cells, cells go out as long runs."""
    out = scratch_bytes(p, "bfloat16" if vb == 2 else "float32", design) / lnc
    if out == 0:
        return None
    reads = (2 if design.startswith("corner") else 1) * value_elements(p) * vb / lnc
    slots = out / vb  # every scratch element is one copied element
    load = Transfer("build-load", reads / (BULK_RUN_BYTES * PARTITIONS) + 1,
                    reads / BULK_RUN_BYTES, reads, reads)
    store = Transfer("build-store", out / (BULK_RUN_BYTES * PARTITIONS) + 1,
                     out / BULK_RUN_BYTES, out, out)
    copy_ns = slots / PARTITIONS / BUILD_COPY_ELEMENTS_PER_NS
    return Phase("build", (load, store), {"vector": copy_ns})


def _gather(p: MSDAProblem, samples: int, vb: int, design: str, per_dma: int) -> Transfer:
    runs = {"four-corner": 4, "corner-block": 1, "corner-gather": 1, "x-pair": 2}[design]
    nbytes = 4 * samples * p.head_dim * vb
    desc = runs * samples
    return Transfer(f"gather-{design}", desc / per_dma, desc, nbytes, nbytes, efficiency=0.9,
                    engines=DMA_ENGINES, swdge=True)


def forward_phases(problem: MSDAProblem, value_dtype: str, lnc: int, design: str) -> list[Phase]:
    """Phases of one core of the forward under ``design`` (see DESIGNS_FWD)."""
    if design not in DESIGNS_FWD:
        raise ValueError(f"design: expected one of {DESIGNS_FWD}, got {design!r}")
    p, vb = problem, DTYPE_BYTES[value_dtype]
    s = _samples_per_core(p, lnc)
    params_bytes = s * (2 + 1) * 2  # locations (2) and weight per sample, 2-byte
    out_bytes = p.batch * _ceil(p.num_queries, lnc) * p.num_heads * p.head_dim * vb
    io = Transfer("load-store", 3 * s / (PARTITIONS * 64) + 1, 2 * s / 64,
                  params_bytes + out_bytes, params_bytes + out_bytes)
    cycles = FORWARD_MULTIPLY_REDUCE_CYCLES + (0 if design == "corner-block" else FORWARD_MASK_CYCLES)
    vector_ns = FORWARD_COORDINATE_NS_PER_SAMPLE + 4 * cycles * p.head_dim / VECTOR_GHZ / PARTITIONS
    main = Phase("main", (_gather(p, s, vb, design, FORWARD_INDICES_PER_DMA), io),
                 {"vector": vector_ns * s,
                  "tensor": FORWARD_TENSOR_NS_PER_SAMPLE * s})
    build = None if design == "four-corner" or (design == "x-pair" and p.value_layout == "BNLC") \
        else _build_phase(p, vb, lnc, design)
    return ([build] if build else []) + [main]


def _scatter_plan(p: MSDAProblem, value_dtype: str, lnc: int) -> tuple[int, int, int]:
    """(P_s, K, sets) of today's backward plan."""
    cfg = plan_backward(p, value_dtype, lnc)
    return cfg.scatter_partitions, cfg.num_buffers, cfg.scatter_sets


def backward_phases(problem: MSDAProblem, value_dtype: str, lnc: int, design: str) -> list[Phase]:
    """Phases of one core of the backward (all three gradients) under ``design``.

    four-corner: today's kernel (4 gather and 4 scatter-RMW descriptors per sample into K fp32
    buffers, zeroed before and reduced after). corner-gather: corner-block gathers, today's
    scatter. corner-block: corner-block gathers and a scatter of one ``4 * C_h`` fp32 run per
    sample into K fp32 *cell* buffers, then a dense fold (grad_value[y, x] = sum of the four
    cells that hold (x, y) as a corner). x-pair: 2 runs per sample for gathers and scatters.
    """
    if design not in DESIGNS_BWD:
        raise ValueError(f"design: expected one of {DESIGNS_BWD}, got {design!r}")
    p, vb = problem, DTYPE_BYTES[value_dtype]
    s = _samples_per_core(p, lnc)
    p_s, k, sets = _scatter_plan(p, value_dtype, lnc)
    cell_rows = corner_cells(p) * 4 if design == "corner-block" else p.total_pixels
    buf_bytes = sets * k * p.batch * cell_rows * p.num_heads * p.head_dim * 4  # this core's K
    phases: list[Phase] = []
    build = None
    if design in ("corner-gather", "corner-block") or (design == "x-pair" and p.value_layout == "BLNC"):
        build = _build_phase(p, vb, lnc, "corner-block" if design != "x-pair" else "x-pair")
    if build:
        phases.append(build)
    phases.append(Phase("zero", (Transfer("zero", buf_bytes / (BULK_RUN_BYTES * PARTITIONS) + 1,
                                          buf_bytes / BULK_RUN_BYTES, buf_bytes, buf_bytes),)))
    # today's x-pair scatter (cap-free plan) is one 2*C_h run in BNLC, two C_h runs in BLNC
    today = 2 if p.value_layout == "BNLC" else 4
    runs = {"four-corner": today, "corner-gather": today, "corner-block": 1, "x-pair": 2}[design]
    sc_desc = runs * s
    sc_bytes = 4 * s * p.head_dim * 4
    per_dma = p_s * (1 if design == "corner-block" else 2)  # one index per partition (pairs: 2 runs)
    scatter = Transfer("scatter", sc_desc / per_dma, sc_desc, sc_bytes, 2 * sc_bytes,
                       efficiency=0.5, engines=max(1, p_s // PARTITIONS_PER_DMA_ENGINE), swdge=True)
    gdesign = "four-corner" if design == "four-corner" else design
    io_bytes = s * 3 * 2 + s * 3 * 4 + p.batch * _ceil(p.num_queries, lnc) * p.num_heads * p.head_dim * vb
    io = Transfer("load-store", 3 * s / (PARTITIONS * 16) + 1, 3 * s / 16, io_bytes, io_bytes)
    phases.append(Phase("main", (_gather(p, s, vb, gdesign, BACKWARD_GATHER_INDICES_PER_DMA),
                                 scatter, io),
                        {"vector": BACKWARD_VECTOR_NS_PER_SAMPLE * s,
                         "tensor": BACKWARD_TENSOR_NS_PER_SAMPLE * s}))
    # Reduce: this core's band of all lnc*K buffers (dma_compute into SBUF, <= 16 sources).
    red = sets * k * p.batch * cell_rows * p.num_heads * p.head_dim * 4  # lnc*K buffers / lnc bands
    phases.append(Phase("reduce", (Transfer("reduce", red / (BULK_RUN_BYTES * PARTITIONS * 16) + 1,
                                            red / BULK_RUN_BYTES, red, red, efficiency=0.5,
                                            swdge=True),
                                   Transfer("store", 2, value_elements(p) * vb / lnc / BULK_RUN_BYTES,
                                            value_elements(p) * vb / lnc,
                                            value_elements(p) * vb / lnc))))
    if design == "corner-block":
        cells = p.batch * corner_cells(p) * p.num_heads * 4 * p.head_dim / lnc
        phases.append(Phase("fold", (Transfer("fold-load", 2, cells * 4 / BULK_RUN_BYTES, cells * 4,
                                              cells * 4),),
                            {"vector": 3 * value_elements(p) / lnc / PARTITIONS * FOLD_NS_PER_ELEMENT}))
    return phases


def scenario_params(structure: str, parameters: str, target: str = "trn2") -> dict[str, float]:
    """Timing parameters of one scenario: ``parameters`` is nominal, swdge-bound (software-DGE
    generation at the top of its range, indirect descriptors at the bottom), descriptor-bound
    (the reverse), low or high (every unknown at its end of the band)."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure: expected one of {STRUCTURES}, got {structure!r}")
    if parameters not in PARAMETER_SETS:
        raise ValueError(f"parameters: expected one of {PARAMETER_SETS}, got {parameters!r}")
    ps = {q.name: q for q in params_for(target)}
    which = parameters if parameters in ("low", "high") else "nominal"
    out = {name: getattr(q, which) for name, q in ps.items()}
    swdge = ("swdge_descriptor_ns", "swdge_fixed_ns")
    if parameters == "swdge-bound":
        out.update({n: ps[n].high for n in swdge}, dma_indirect_descriptor_ns=ps["dma_indirect_descriptor_ns"].low)
    elif parameters == "descriptor-bound":
        out.update({n: ps[n].low for n in swdge}, dma_indirect_descriptor_ns=ps["dma_indirect_descriptor_ns"].high)
    return out


def _engines(t: Transfer, structure: str) -> int:
    if structure == "spread":
        return DMA_ENGINES
    if structure == "serial" and t.swdge:
        return 1
    return t.engines


def modelled_us(phases: Iterable[Phase], lnc: int, structure: str = "nominal",
                parameters: str = "nominal", target: str = "trn2") -> float:
    """Modelled time (µs) of one core's phases under one scenario (launch floor included)."""
    hw = hardware_for(target)
    q = scenario_params(structure, parameters, target)
    hbm_ns_per_byte = q["hbm_contending_cores"] / hw.hbm_bytes_per_ns_chip
    total = q["launch_floor_us"] * 1000.0
    for ph in phases:
        dma = gpsimd = hbm = 0.0
        for t in ph.transfers:
            cost = q["dma_indirect_descriptor_ns"] if t.swdge else q["dma_descriptor_ns"]
            # every transfer class starts at engine 0, so engine 0 carries a share of each
            dma += (t.nbytes / (hw.dma_bytes_per_ns * t.efficiency) + t.descriptors * cost) \
                / _engines(t, structure)
            if t.swdge:
                gpsimd += t.instructions * q["swdge_fixed_ns"] + t.descriptors * q["swdge_descriptor_ns"]
            hbm += t.hbm_bytes * hbm_ns_per_byte
        busy = max([dma, gpsimd, hbm] + list(ph.compute_ns.values()))
        total += busy + q["dma_fixed_latency_ns"]
    return total / 1000.0


def robust_ratio(candidate: list[Phase], baseline: list[Phase], lnc: int,
                 target: str = "trn2") -> tuple[float, str]:
    """Worst candidate/baseline over every structure and parameter set, and where it is."""
    worst, where = 0.0, ""
    for st in STRUCTURES:
        for ps in PARAMETER_SETS:
            r = modelled_us(candidate, lnc, st, ps, target) / modelled_us(baseline, lnc, st, ps, target)
            if r > worst:
                worst, where = r, f"{st}/{ps}"
    return worst, where
