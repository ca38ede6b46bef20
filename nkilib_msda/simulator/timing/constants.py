"""Every number the timing model uses, with the page that states it (docs/timing.md).

Two kinds of numbers:

- :class:`Hardware` constants stated by AWS's documentation (clock rates, data-path widths,
  DMA engines and their bandwidth, HBM bandwidth, documented per-instruction cost formulas).
- :class:`Param` unknowns: numbers nobody has published, or published only as "about";
  each has a (low, nominal, high) range and a doc string. Every parameter is a *cost* (time
  per event, or a count that scales a time), so the modelled schedule is non-decreasing in
  each of them: all parameters at ``low`` give the fastest schedule (``low_us``), all at
  ``high`` the slowest (``high_us``).

The per-instruction cost formulas come from the "Estimated instruction cost" blocks of the
NKI ISA reference of Neuron 2.26 (removed in 2.27; written for NeuronCore-v2), scaled by the
Trainium2/3 data-path widths and Vector/Scalar performance modes where the architecture
guides state them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from nkilib_msda.hardware import DMA_ENGINES, PARTITIONS_PER_DMA_ENGINE
from nkilib_msda.simulator.timing import calibrated

__all__ = ["Param", "Hardware", "HARDWARE", "PARAMS", "PARAM_NAMES", "PARAM_INDEX", "SOURCES",
           "hardware_for", "params_for", "nominal_params", "param_vector", "build_params"]

_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
_ISA_226 = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.0/general/nki/api/generated"
SOURCES: dict[str, str] = {
    "trn2_arch": f"{_DOCS}/nki/guides/architecture/trainium2_arch.html",
    "trn3_arch": f"{_DOCS}/nki/guides/architecture/trainium3_arch.html",
    "trn1_arch": f"{_DOCS}/nki/guides/architecture/trainium_inferentia2_arch.html",
    "trn2_chip": f"{_DOCS}/about-neuron/arch/neuron-hardware/trainium2.html",
    "dma_bandwidth": f"{_DOCS}/nki/deep-dives/nki-dma-bandwidth-guide.html",
    "dma_overview": f"{_DOCS}/nki/get-started/about/nki-dma-overview.html",
    "dge": f"{_DOCS}/nki/deep-dives/nki-dge.html",
    "perf_guide": f"{_DOCS}/nki/deep-dives/nki_perf_guide.html",
    "isa_226": _ISA_226 + "/nki.isa.<instruction>.html (2.26 'Estimated instruction cost')",
    "isa_tensor_tensor": f"{_ISA_226}/nki.isa.tensor_tensor.html",
    "isa_nc_matmul": f"{_ISA_226}/nki.isa.nc_matmul.html",
    "isa_nc_transpose": f"{_ISA_226}/nki.isa.nc_transpose.html",
    "isa_iota": f"{_ISA_226}/nki.isa.iota.html",
    "isa_tensor_copy_dynamic_src": f"{_ISA_226}/nki.isa.tensor_copy_dynamic_src.html",
    "nkilib_topk": ("https://github.com/aws-neuron/nki-library/blob/main/src/nkilib_src/nkilib/"
                    "core/topk/rotational_topk_utils.py"),
    "nkilib_launch": ("https://github.com/aws-neuron/nki-library/blob/main/src/nkilib_src/nkilib/"
                      "experimental/matmul_mxfp8/bf16_baseline_cache.json"),
}


@dataclass(frozen=True)
class Param:
    """An unknown: ``low <= nominal <= high``; larger is slower (a cost)."""

    name: str
    low: float
    nominal: float
    high: float
    unit: str
    doc: str
    source: str = ""

    def __post_init__(self) -> None:
        if not self.low <= self.nominal <= self.high:
            raise ValueError(f"Param {self.name}: need low <= nominal <= high, got "
                             f"{self.low}, {self.nominal}, {self.high}")


@dataclass(frozen=True)
class Hardware:
    """Documented numbers of one NeuronCore generation (per physical core unless stated)."""

    target: str
    clock_ghz: Mapping[str, float]  # engine -> GHz
    # Elements per partition per cycle of the plain (no perf mode) Vector data path; the
    # 2.26 formulas count 1 element per partition per cycle (NC-v2).
    vector_perf_2x_tensor_tensor: bool  # all-bf16/fp16 SBUF tensor_tensor at 2x
    vector_perf_4x_copy: bool  # bf16/fp16 SBUF contiguous tensor_copy/tensor_scalar at 4x
    scalar_2byte_speedup: float  # Scalar elements per partition per cycle for 2-byte dtypes
    min_ii_cycles: int  # minimum initiation interval of a compute instruction
    gpsimd_start_cycles: int  # GpSimd instruction start-up
    min_ii_dynamic_cycles: int  # copy with a dynamic (register) address
    matmul_min_stationary: int  # nc_matmul cost max(min(64, N_stationary), N_moving)
    matmul_fp32_factor: int  # fp32 matmul runs 4x slower
    transpose_fp32_factor: int  # fp32 PE transpose (transpose mode) at 2x the 2-byte cost
    dma_engines: int  # DMA engines per core
    dma_queues_per_engine: int
    partitions_per_dma_engine: int  # a transfer over P partitions uses ceil(P/8) engines
    dma_bytes_per_ns: float  # per DMA engine
    dma_transpose_efficiency: float  # HBM->SBUF dma_transpose share of DMA throughput
    dma_transpose_sbuf_efficiency: float  # SBUF->SBUF dma_transpose
    dma_accumulate_efficiency: float  # DMA read-modify-write (dma_compute, accumulate) share
    dma_accumulate_sbuf_efficiency: float  # the same into an SBUF destination
    hwdge_instruction_ns: float  # documented "about" value; the range is PARAMS
    hbm_bytes_per_ns_chip: float  # HBM bandwidth of the whole chip
    cores_per_chip: int
    sources: Mapping[str, str] = field(default_factory=dict)


_COMMON_SOURCES = {
    "min_ii_cycles": SOURCES["isa_tensor_tensor"],
    "gpsimd_start_cycles": SOURCES["isa_iota"],
    "min_ii_dynamic_cycles": SOURCES["isa_tensor_copy_dynamic_src"],
    "matmul_min_stationary": SOURCES["isa_nc_matmul"],
    "matmul_fp32_factor": SOURCES["isa_nc_matmul"],
    "transpose_fp32_factor": SOURCES["trn2_arch"] + " (Built-in Transpose Support: 2x fp32)",
    "dma_engines": SOURCES["dma_bandwidth"],
    "dma_queues_per_engine": SOURCES["dma_overview"],
    "partitions_per_dma_engine": SOURCES["dma_overview"],
    "dma_bytes_per_ns": SOURCES["dma_bandwidth"] + " (BW / Engine table)",
    "dma_transpose_efficiency": SOURCES["trn2_arch"] + " (DMA transpose: up to 90%)",
    "dma_transpose_sbuf_efficiency": SOURCES["trn2_arch"] + " (SBUF->SBUF up to 50%)",
    "dma_accumulate_efficiency": SOURCES["trn3_arch"] + " (50% before NeuronCore-v4)",
    "dma_accumulate_sbuf_efficiency": SOURCES["trn3_arch"] + " (near-memory accumulation)",
    "hwdge_instruction_ns": SOURCES["trn2_arch"] + " (DGE: about 600 ns per instruction)",
}

_TRN2 = Hardware(
    target="trn2",
    clock_ghz={"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2, "sync": 1.2},
    vector_perf_2x_tensor_tensor=True, vector_perf_4x_copy=True, scalar_2byte_speedup=1.0,
    min_ii_cycles=64, gpsimd_start_cycles=150, min_ii_dynamic_cycles=600,
    matmul_min_stationary=64, matmul_fp32_factor=4, transpose_fp32_factor=2,
    dma_engines=DMA_ENGINES, dma_queues_per_engine=16,
    partitions_per_dma_engine=PARTITIONS_PER_DMA_ENGINE,
    dma_bytes_per_ns=23.0, dma_transpose_efficiency=0.9, dma_transpose_sbuf_efficiency=0.5,
    dma_accumulate_efficiency=0.5, dma_accumulate_sbuf_efficiency=0.5,
    hwdge_instruction_ns=600.0,
    hbm_bytes_per_ns_chip=2900.0, cores_per_chip=8,
    sources={**_COMMON_SOURCES,
             "clock_ghz": SOURCES["trn2_arch"] + " (Compute Engine Specifications)",
             "vector_perf": SOURCES["trn2_arch"] + " (Vector Engine Performance Mode)",
             "hbm_bytes_per_ns_chip": SOURCES["trn2_chip"] + " (2.9 TB/sec)",
             "cores_per_chip": SOURCES["trn2_chip"]})

# Trainium3 differs from Trainium2 only where its pages say so.
_TRN3 = replace(
    _TRN2,
    target="trn3",
    clock_ghz={"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2, "sync": 1.2},
    scalar_2byte_speedup=2.0,
    dma_bytes_per_ns=33.0,
    # NeuronCore-v4 accumulates into SBUF at full DMA throughput ("near-memory accumulation
    # maintains the same throughput as standard DMA copy operations to SBUF"); HBM
    # destinations keep the 50% of the DMA compute engines (assumption: the page speaks of
    # SBUF only).
    dma_accumulate_efficiency=0.5,
    dma_accumulate_sbuf_efficiency=1.0,
    hbm_bytes_per_ns_chip=4700.0,
    sources={**_COMMON_SOURCES,
             "clock_ghz": SOURCES["trn3_arch"] + " (Compute Engine Specifications)",
             "vector_perf": SOURCES["trn2_arch"] + " (perf modes; trn3 keeps them)",
             "scalar_2byte_speedup": SOURCES["trn3_arch"] + " (Scalar 256 bf16/cycle)",
             "hbm_bytes_per_ns_chip": SOURCES["trn3_arch"] + " (4.7 TB/s)",
             "cores_per_chip": SOURCES["trn3_arch"] + " (8 NeuronCores)",
             "dma_bytes_per_ns": SOURCES["dma_bandwidth"] + " (TRN3 33 B/ns)"})

HARDWARE: dict[str, Hardware] = {"trn2": _TRN2, "trn3": _TRN3}


def _params(hwdge_ns: float) -> tuple[Param, ...]:
    return (
        Param("launch_floor_us", 14.0, 17.0, 20.0, "us",
              "Fixed time of one kernel launch, added to the schedule (tiny kernels take "
              "14-20 us whatever their work: a Trn3 256x128x256 matmul measured 17.8 us total, "
              "14.0 us active).", SOURCES["nkilib_launch"]),
        Param("compute_overhead_cycles", 0.0, 64.0, 144.0, "engine cycles",
              "Static overhead added to every compute instruction on top of max(MIN_II, work). "
              "The NC-v2 guide says ~100 cycles for back-to-back small or dependent "
              "instructions; nki-library's top-k model charges 144 per Vector instruction; "
              "0 when fully pipelined.", SOURCES["trn1_arch"] + "; " + SOURCES["nkilib_topk"]),
        Param("dependency_latency_ns", 0.0, 100.0, 200.0, "ns",
              "Semaphore latency between an instruction and the instruction it waits for "
              "(read-after-write and the like). The perf guide measured a 189 ns initiation "
              "interval (264 NC-v2 cycles) for tiny dependent ScalarE instructions, of which "
              "~130 cycles are MIN_II and overhead.", SOURCES["perf_guide"]),
        Param("dma_fixed_latency_ns", 1000.0, 1300.0, 2000.0, "ns",
              "Latency from a DMA's trigger (or the semaphore it waits on) to the first byte "
              "moving: '~1300 ns cross-engine'. Overlaps with other transfers on the engines.",
              SOURCES["dma_bandwidth"]),
        Param("dma_descriptor_ns", 5.0, 20.0, 60.0, "ns per descriptor per DMA engine",
              "DMA engine time per descriptor of a direct (static) transfer, on top of its "
              "bytes at 23/33 B/ns. The bandwidth guide only says <256 B per partition is "
              "'severely overhead-bound', >=2 KiB approaches peak and >=4 KiB saturates; 20 ns "
              "gives 36% / 82% / 90% of peak at 256 B / 2 KiB / 4 KiB.",
              SOURCES["dma_bandwidth"]),
        Param("dma_indirect_descriptor_ns", 10.0, 40.0, 160.0, "ns per descriptor per DMA engine",
              "DMA engine time per descriptor of an indirect (gather/scatter) transfer of "
              "small rows (64-512 B): unpublished, the dominant unknown of MSDA.",
              SOURCES["dma_bandwidth"]),
        Param("swdge_descriptor_ns", 0.5, 2.0, 8.0, "ns per descriptor",
              "GpSimd time to generate one software-DGE descriptor (indirect DMAs on NC-v3 "
              "and dma_compute): unpublished. 2 ns = 8 GpSimd cores at ~20 cycles each.",
              SOURCES["trn2_arch"]),
        Param("swdge_fixed_ns", 125.0, 300.0, 1000.0, "ns per instruction",
              "GpSimd time to start one software-DGE DMA instruction (at least the 150-cycle "
              "GpSimd start-up): unpublished.", SOURCES["isa_iota"]),
        Param("hwdge_issue_ns", 0.67 * hwdge_ns, hwdge_ns, 1.33 * hwdge_ns, "ns per instruction",
              "Hardware DGE time per DMA instruction on its queue ('about 600 ns'); charged "
              "to DMAs with dge_mode=hwdge.", SOURCES["trn2_arch"]),
        Param("dma_trigger_ns", 50.0, 100.0, hwdge_ns, "ns per instruction",
              "Queue time to start a direct DMA whose dge_mode is unknown or none: the "
              "compiler may use descriptors prepared before execution (a trigger only) or "
              "hardware DGE (about 600 ns, the high end): unpublished which.",
              SOURCES["dge"]),
        Param("barrier_latency_ns", 200.0, 1000.0, 3000.0, "ns",
              "Time of nki.lnc.core_barrier once both cores arrived (a semaphore exchange "
              "through shared HBM): unpublished.", SOURCES["trn2_arch"]),
        Param("hbm_contending_cores", 2.0, 2.0, 8.0, "cores",
              "How many physical cores of the chip share its HBM bandwidth evenly; the launch "
              "gets lnc of those shares. 2: the other cores of the chip are idle (the "
              "benchmark case); 8: every core of the chip streams from HBM.",
              SOURCES["trn2_chip"]),
    )


def build_params(target: str, calibration_dir: Path | None = None) -> tuple[Param, ...]:
    """The unknowns of ``target``: the documented ranges above, with the nominal values of
    the target's calibration data file where one was adopted (:mod:`.calibrated`;
    ``calibration_dir``: another folder of data files, for tests)."""
    params = _params(HARDWARE[target].hwdge_instruction_ns)
    data = calibrated.load(target, calibration_dir)
    if data is None or not data.nominals:
        return params
    names = {p.name for p in params}
    unknown = sorted(set(data.nominals) - names)
    if unknown:
        raise ValueError(f"calibration data of {target}: unknown parameters {unknown}; expected "
                         f"names from {sorted(names)}")
    # Param checks low <= nominal <= high: a fitted value outside its range is rejected
    return tuple(replace(p, nominal=data.nominals[p.name]) if p.name in data.nominals else p
                 for p in params)


PARAMS: dict[str, tuple[Param, ...]] = {name: build_params(name) for name in HARDWARE}
PARAM_NAMES: tuple[str, ...] = tuple(p.name for p in PARAMS["trn2"])
PARAM_INDEX: dict[str, int] = {name: i for i, name in enumerate(PARAM_NAMES)}


def hardware_for(target: str) -> Hardware:
    try:
        return HARDWARE[target]
    except KeyError:
        raise ValueError(f"timing: unknown target {target!r}; expected one of "
                         f"{sorted(HARDWARE)}") from None


def params_for(target: str) -> tuple[Param, ...]:
    hardware_for(target)
    return PARAMS[target]


def nominal_params(target: str) -> dict[str, float]:
    return {p.name: p.nominal for p in params_for(target)}


def param_vector(target: str, overrides: Mapping[str, float] | None = None,
                 which: str = "nominal") -> list[float]:
    """Parameter values in PARAM_NAMES order: ``which`` (low/nominal/high) with
    ``overrides`` by name; unknown names raise ValueError."""
    if which not in ("low", "nominal", "high"):
        raise ValueError(f"param_vector: which must be low, nominal or high, got {which!r}")
    values = {p.name: getattr(p, which) for p in params_for(target)}
    for name, value in (overrides or {}).items():
        if name not in values:
            raise ValueError(f"timing params: unknown parameter {name!r}; expected one of "
                             f"{sorted(values)}")
        values[name] = float(value)
    return [values[n] for n in PARAM_NAMES]
