"""Cost report: what a kernel asked the hardware to do, counted per engine and per DMA kind.

The counts (instructions, elements, DMA bytes and descriptors, peak on-chip memory) are exact.
The report is one subscriber of the program's instruction events (:mod:`.events`); the timing
recorder is the other. The modelled time, which overlaps engines and DMA queues, is
``report.timing`` (a :class:`~nkilib_msda.simulator.timing.Timing`, docs/timing.md), set
after the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from nkilib_msda.simulator.events import (DMA_DIRECTIONS, DMA_KINDS, ENGINES, ComputeEvent,
                                          DmaEvent, check_dma, check_engine)

__all__ = ["CostReport", "ENGINES", "DMA_KINDS", "DMA_DIRECTIONS"]


@dataclass
class _DmaStats:
    instructions: int = 0
    elements: int = 0
    bytes: int = 0
    hbm_bytes: int = 0
    descriptors: int = 0
    descriptor_bytes: int = 0
    min_descriptor_bytes: int = 0
    max_descriptor_bytes: int = 0
    skipped_descriptors: int = 0
    histogram: dict[int, int] = field(default_factory=dict)

    def add(self, elements: int, nbytes: int, hbm_bytes: int,
            descriptors: Mapping[int, int] | None, skipped: int) -> None:
        self.instructions += 1
        self.elements += int(elements)
        self.bytes += int(nbytes)
        self.hbm_bytes += int(hbm_bytes)
        self.skipped_descriptors += int(skipped)
        if descriptors:
            self._merge_histogram(descriptors)

    def _merge_histogram(self, hist: Mapping[int, int]) -> None:
        for size, count in hist.items():
            if count <= 0:
                continue
            first = self.descriptors == 0
            self.histogram[size] = self.histogram.get(size, 0) + count
            self.descriptors += count
            self.descriptor_bytes += size * count
            self.min_descriptor_bytes = size if first else min(self.min_descriptor_bytes, size)
            self.max_descriptor_bytes = max(self.max_descriptor_bytes, size)

    def merge(self, other: "_DmaStats") -> None:
        self.instructions += other.instructions
        self.elements += other.elements
        self.bytes += other.bytes
        self.hbm_bytes += other.hbm_bytes
        self.skipped_descriptors += other.skipped_descriptors
        self._merge_histogram(other.histogram)

    def to_dict(self) -> dict[str, Any]:
        mean = self.descriptor_bytes / self.descriptors if self.descriptors else 0.0
        return {"instructions": self.instructions, "elements": self.elements,
                "bytes": self.bytes, "hbm_bytes": self.hbm_bytes, "descriptors": self.descriptors,
                "descriptor_bytes_min": self.min_descriptor_bytes,
                "descriptor_bytes_max": self.max_descriptor_bytes,
                "descriptor_bytes_mean": mean, "skipped_descriptors": self.skipped_descriptors,
                "descriptor_bytes_histogram": dict(sorted(self.histogram.items()))}


class CostReport:
    """Per-engine instruction/element counts, DMA bytes by kind and direction, memory peaks.

    Engines are "tensor", "vector", "scalar", "gpsimd" and "dma". DMA traffic is keyed by
    (kind, direction); ``bytes`` counts the bytes written to the destination, ``hbm_bytes`` the
    bytes read from plus written to HBM (an HBM read-modify-write counts both). Indirect DMAs count one descriptor per contiguous run of one index row
    (an HBM row of C elements read or written in one piece is one descriptor of C*itemsize bytes).
    """

    def __init__(self) -> None:
        self.instructions: dict[str, dict[str, list[int]]] = {e: {} for e in ENGINES}
        self.dma: dict[tuple[str, str], _DmaStats] = {}
        self.peak_sbuf_bytes_per_partition = 0
        self.peak_psum_bytes_per_partition = 0
        self.num_programs = 1
        self.target = ""
        self.programs: list[CostReport] = []  # per-program reports of an LNC>1 run
        self.timing: Any = None  # the modelled time (timing.Timing), set after the run

    # -- instruction events (a subscriber of events.InstructionEvents) ----------------------
    wants_accesses = False  # counts need no operand geometry

    def on_compute(self, program: int, event: ComputeEvent) -> None:
        self.add_instruction(event.engine, event.opcode, event.elements)

    def on_dma(self, program: int, event: DmaEvent) -> None:
        self.add_dma(event.opcode, event.kind, event.direction, event.elements, event.nbytes,
                     event.hbm_bytes, event.descriptors, event.skipped_descriptors)

    def on_barrier(self, program: int) -> None:
        """Counted as its ``sync`` instruction (a compute event)."""

    # -- counting ----------------------------------------------------------------------------
    def add_instruction(self, engine: str, opcode: str, elements: int) -> None:
        """Count one instruction of ``opcode`` on ``engine`` processing ``elements`` elements."""
        check_engine(engine)
        per_engine = self.instructions[engine]
        entry = per_engine.get(opcode)
        if entry is None:
            per_engine[opcode] = [1, int(elements)]
        else:
            entry[0] += 1
            entry[1] += int(elements)

    def add_dma(self, opcode: str, kind: str, direction: str, elements: int, nbytes: int,
                hbm_bytes: int = 0, descriptors: Mapping[int, int] | None = None,
                skipped_descriptors: int = 0) -> None:
        """Count one DMA instruction (on the ``dma`` engine): kind, direction, bytes, and
        descriptors as a histogram ``{bytes_per_descriptor: count}`` (indirect DMAs)."""
        check_dma(kind, direction)
        self.add_instruction("dma", opcode, elements)
        stats = self.dma.get((kind, direction))
        if stats is None:
            stats = self.dma[(kind, direction)] = _DmaStats()
        stats.add(elements, nbytes, hbm_bytes, descriptors, skipped_descriptors)

    def note_memory(self, sbuf_bytes: int, psum_bytes: int) -> None:
        self.peak_sbuf_bytes_per_partition = max(self.peak_sbuf_bytes_per_partition, sbuf_bytes)
        self.peak_psum_bytes_per_partition = max(self.peak_psum_bytes_per_partition, psum_bytes)

    # -- queries ---------------------------------------------------------------------------
    def instruction_count(self, engine: str, opcode: str | None = None) -> int:
        per = self.instructions[engine]
        if opcode is not None:
            return per.get(opcode, [0, 0])[0]
        return sum(v[0] for v in per.values())

    def dma_hbm_bytes(self, kind: str | None = None) -> int:
        return sum(s.hbm_bytes for (k, _), s in self.dma.items() if kind is None or k == kind)

    def dma_bytes(self, kind: str | None = None, direction: str | None = None) -> int:
        return sum(s.bytes for (k, d), s in self.dma.items()
                   if (kind is None or k == kind) and (direction is None or d == direction))

    def dma_descriptors(self, kind: str | None = None) -> int:
        return sum(s.descriptors for (k, _), s in self.dma.items() if kind is None or k == kind)

    # -- combining -------------------------------------------------------------------------
    @classmethod
    def merged(cls, reports: Iterable["CostReport"]) -> "CostReport":
        """Sum counts over LNC programs; memory peaks are per core, so take the maximum."""
        out = cls()
        reports = list(reports)
        out.num_programs = sum(r.num_programs for r in reports)
        out.target = reports[0].target if reports else ""
        for r in reports:
            for engine, ops in r.instructions.items():
                for opcode, (count, elements) in ops.items():
                    entry = out.instructions[engine].setdefault(opcode, [0, 0])
                    entry[0] += count
                    entry[1] += elements
            for key, stats in r.dma.items():
                out.dma.setdefault(key, _DmaStats()).merge(stats)
            out.note_memory(r.peak_sbuf_bytes_per_partition, r.peak_psum_bytes_per_partition)
        return out

    def to_dict(self) -> dict[str, Any]:
        engines = {}
        for engine, ops in self.instructions.items():
            engines[engine] = {
                "instructions": sum(v[0] for v in ops.values()),
                "elements": sum(v[1] for v in ops.values()),
                "by_opcode": {op: {"instructions": c, "elements": n}
                              for op, (c, n) in sorted(ops.items())},
            }
        dma = {f"{k}/{d}": s.to_dict() for (k, d), s in sorted(self.dma.items())}
        return {
            "target": self.target, "num_programs": self.num_programs, "engines": engines,
            "dma": dma,
            "dma_bytes_total": self.dma_bytes(),
            "dma_hbm_bytes_total": self.dma_hbm_bytes(),
            "peak_sbuf_bytes_per_partition": self.peak_sbuf_bytes_per_partition,
            "peak_psum_bytes_per_partition": self.peak_psum_bytes_per_partition,
        }

    def __str__(self) -> str:
        lines = [f"NKI emulator cost report (target {self.target or '?'}, "
                 f"{self.num_programs} program(s); exact counts)"]
        lines.append(f"  {'engine':<8}{'opcode':<28}{'instructions':>14}{'elements':>16}")
        for engine, ops in self.instructions.items():
            for opcode, (count, elements) in sorted(ops.items()):
                lines.append(f"  {engine:<8}{opcode:<28}{count:>14,}{elements:>16,}")
        if self.dma:
            lines.append(f"  {'dma kind/direction':<36}{'instr':>8}{'bytes':>16}{'hbm bytes':>16}"
                         f"{'descriptors':>13}{'B/desc min/mean/max':>24}")
            for (kind, direction), s in sorted(self.dma.items()):
                d = s.to_dict()
                desc = (f"{d['descriptor_bytes_min']}/{d['descriptor_bytes_mean']:.0f}/"
                        f"{d['descriptor_bytes_max']}" if s.descriptors else "-")
                lines.append(f"  {kind + '/' + direction:<36}{s.instructions:>8,}{s.bytes:>16,}{s.hbm_bytes:>16,}"
                             f"{s.descriptors:>13,}{desc:>24}")
        lines.append(f"  peak SBUF {self.peak_sbuf_bytes_per_partition:,} B/partition, "
                     f"peak PSUM {self.peak_psum_bytes_per_partition:,} B/partition")
        if self.timing is not None:
            lines.append(f"  {self.timing.summary()}")
        return "\n".join(lines)

    __repr__ = __str__
