"""Cost report: what a kernel asked the hardware to do, counted per engine and per DMA kind.

The counts (instructions, elements, DMA bytes and descriptors, peak on-chip memory) are exact.
The modelled time, which overlaps engines and DMA queues, is ``report.timing`` (a
:class:`~nkilib_msda.simulator.timing.Timing`, docs/timing.md): the report forwards each
counted instruction to the run's timeline while the kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["CostReport", "ENGINES", "DMA_KINDS", "DMA_DIRECTIONS"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "sync")
DMA_KINDS = ("direct", "indirect_gather", "indirect_scatter", "indirect_rmw", "transpose",
             "indirect_transpose", "compute")
DMA_DIRECTIONS = ("hbm_to_sbuf", "sbuf_to_hbm", "hbm_to_hbm", "sbuf_to_sbuf", "mixed_to_sbuf",
                  "mixed_to_hbm")


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
            descriptors: dict[int, int] | None, skipped: int) -> None:
        self.instructions += 1
        self.elements += int(elements)
        self.bytes += int(nbytes)
        self.hbm_bytes += int(hbm_bytes)
        self.skipped_descriptors += int(skipped)
        if descriptors:
            self._merge_histogram(descriptors)

    def _merge_histogram(self, hist: dict[int, int]) -> None:
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
        self._timeline: Any = None  # (timing.Timeline, program id) while the kernel runs

    # -- recording -------------------------------------------------------------------------
    def add_instruction(self, engine: str, opcode: str, elements: int) -> None:
        """Count one instruction of ``opcode`` on ``engine`` processing ``elements`` elements."""
        self._count(engine, opcode, elements)
        if self._timeline is not None:
            timeline, program = self._timeline
            timeline.compute(program, engine, opcode, int(elements))

    def _count(self, engine: str, opcode: str, elements: int) -> None:
        per_engine = self.instructions.get(engine)
        if per_engine is None:
            raise ValueError(f"CostReport.add_instruction: unknown engine {engine!r}; "
                             f"expected one of {ENGINES}")
        entry = per_engine.get(opcode)
        if entry is None:
            per_engine[opcode] = [1, int(elements)]
        else:
            entry[0] += 1
            entry[1] += int(elements)

    def add_dma(self, opcode: str, kind: str, direction: str, elements: int, nbytes: int,
                hbm_bytes: int = 0, descriptors: dict[int, int] | None = None,
                skipped_descriptors: int = 0, queue: str | None = None) -> None:
        """Count one DMA instruction: kind, direction, bytes, and descriptors as a histogram
        ``{bytes_per_descriptor: count}`` (indirect DMAs). ``queue`` ("sync" or "act":
        hardware DGE, "swdge": software DGE, None: by kind) is where the timing model issues
        it."""
        if kind not in DMA_KINDS:
            raise ValueError(f"CostReport.add_dma: unknown kind {kind!r}; expected {DMA_KINDS}")
        if direction not in DMA_DIRECTIONS:
            raise ValueError(f"CostReport.add_dma: unknown direction {direction!r}")
        timeline, self._timeline = self._timeline, None  # timed below, as a DMA
        try:
            self.add_instruction("dma", opcode, elements)  # every instruction passes here
        finally:
            self._timeline = timeline
        stats = self.dma.get((kind, direction))
        if stats is None:
            stats = self.dma[(kind, direction)] = _DmaStats()
        stats.add(elements, nbytes, hbm_bytes, descriptors, skipped_descriptors)
        if timeline is not None:
            recorder, program = timeline
            recorder.dma(program, opcode, kind, direction, int(elements), int(nbytes),
                         int(hbm_bytes), descriptors, queue, int(skipped_descriptors))

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
