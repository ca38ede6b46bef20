"""The running program's context: target, program id, report, memory budget, shared HBM.

Each logical-core program runs in its own thread (LNC=2 runs two); the context is
thread-local. Programs never run at the same time: a baton passes between them only at
``core_barrier`` and at program end, so an LNC=2 run is deterministic (program 0 runs until
its first barrier, then program 1, ...). This is functionally exact for race-free kernels.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from nkilib_msda.simulator.errors import NkiError, OtherProgramAborted, nki_error
from nkilib_msda.simulator.events import InstructionEvents
from nkilib_msda.simulator.memory import MemoryTracker
from nkilib_msda.simulator.report import CostReport
from nkilib_msda.simulator.targets import Target

__all__ = ["ExecutionContext", "SimOptions", "SharedState", "MemoryTracker", "ProgramScheduler",
           "current", "current_or_none", "activate"]

_local = threading.local()


@dataclass(frozen=True)
class SimOptions:
    """Behaviour switches of one simulation.

    duplicate_scatter: "error" (default) raises on duplicate indices in one scatter or
    scatter-RMW; "last_writer_wins" emulates the hardware race (one write survives).
    barrier_timeout_s: optional wall-clock limit for a program waiting at core_barrier. A
    deadlock (the other program ends without reaching the barrier) is detected exactly without
    it, since programs hand over cooperatively; None (default) waits as long as the other
    program keeps running.
    source_rules: "error", "warn" or "off" for the kernel-source rules (source_rules.py):
    neuronxcc imports and nl.divide/mod/fmod.
    strict: uninitialised reads and hazard warnings (NkiHazardWarning) raise NkiError
    (simulate(..., strict=True) / NKILIB_MSDA_EMULATOR_STRICT=1; see docs/emulator.md).
    full_indirect: an indirect DMA's index tile must cover partitions [0, 128) and a
    multi-column one start 16-byte aligned (NKILIB_MSDA_EMULATOR_FULL_INDIRECT=1; AWS's
    practice, see isa/_dma_operands.check_index_tile).
    """

    duplicate_scatter: str = "error"
    barrier_timeout_s: float | None = None
    source_rules: str = "error"
    strict: bool = False
    full_indirect: bool = False


class ProgramScheduler:
    """Runs one program at a time; hands over at core_barrier and at program end."""

    def __init__(self, num_programs: int, timeout_s: float | None) -> None:
        self.n = num_programs
        self.timeout_s = timeout_s
        self.cv = threading.Condition()
        self.turn: int | None = 0
        self.state = ["ready"] * num_programs  # ready | barrier | done
        self.generation = 0
        self.aborted = False

    def wait_turn(self, pid: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == pid or self.aborted)

    def _pass_baton(self, pid: int) -> None:
        for k in range(1, self.n + 1):
            j = (pid + k) % self.n
            if self.state[j] == "ready":
                self.turn = j
                self.cv.notify_all()
                return
        self.turn = None
        self.cv.notify_all()

    def abort(self) -> None:
        """Stop the run: every waiting program raises OtherProgramAborted."""
        with self.cv:
            self.aborted = True
            self.cv.notify_all()

    def barrier(self, pid: int, instruction: str) -> None:
        with self.cv:
            if self.aborted:
                raise OtherProgramAborted(f"{instruction}: program {pid}: another program failed")
            self.state[pid] = "barrier"
            waiting = [i for i, s in enumerate(self.state) if s == "barrier"]
            if len(waiting) == self.n:
                self.generation += 1
                for i in waiting:
                    self.state[i] = "ready"
                self.turn = pid
                self.cv.notify_all()
                return
            if "done" in self.state:
                self.state[pid] = "ready"
                raise nki_error(instruction, "barrier deadlock",
                                f"program {pid} waits at core_barrier but program "
                                f"{self.state.index('done')} already finished without reaching it")
            generation = self.generation
            self._pass_baton(pid)
            ok = self.cv.wait_for(
                lambda: self.aborted or "done" in self.state or
                (self.generation != generation and self.turn == pid), timeout=self.timeout_s)
            if self.aborted:
                raise OtherProgramAborted(f"{instruction}: program {pid}: another program failed")
            if self.generation == generation:
                self.state[pid] = "ready"
                self.aborted = True
                self.cv.notify_all()
                why = "timed out" if not ok else "a program finished without reaching it"
                raise nki_error(instruction, "barrier deadlock",
                                f"program {pid} waits at core_barrier; {why}")
            self.cv.wait_for(lambda: self.turn == pid or self.aborted)

    def finish(self, pid: int, failed: bool) -> None:
        with self.cv:
            self.state[pid] = "done"
            if failed:
                self.aborted = True
            self._pass_baton(pid)


@dataclass
class SharedState:
    """State shared by the programs of one simulation (LNC=1 or 2)."""

    num_programs: int
    target: Target
    options: SimOptions
    scheduler: ProgramScheduler
    lock: threading.Lock = field(default_factory=threading.Lock)
    shared_allocations: list[Any] = field(default_factory=list)
    # nki.lnc.sendrecv mailboxes: (sequence number, sending program) -> values
    mailbox: dict[Any, Any] = field(default_factory=dict)
    # Cross-core race detection on shared HBM (access.py): on while the programs of an LNC 2
    # run execute; off at LNC 1 and for the runner's own reads of the outputs afterwards.
    race_tracking: bool = False
    # The timing model's recorder (timing.Timeline), None when timing is off.
    timeline: Any = None


class ExecutionContext:
    """What an instruction needs to know about the program that executes it."""

    # Set lazily by the instructions that need them (read with getattr defaults).
    _warned_activation_ranges: set[Any]
    _reduce_registers: dict[str, Any]
    no_reorder_depth: int

    def __init__(self, shared: SharedState, program_id: int, program_ndim: int) -> None:
        # program_ndim: 1 for a bracket launch (kernel[2]) or simulate(lnc=...), 0 otherwise;
        # num_programs is the LNC degree in both cases (see jit.py, lnc_degree).
        self.shared = shared
        self.target = shared.target
        self.options = shared.options
        self.program_id = program_id
        self.num_programs = shared.num_programs
        self.program_ndim = program_ndim
        self.report = CostReport()
        self.report.target = shared.target.name
        self.timeline = shared.timeline
        # the one source of this program's instruction events: counted by the report, timed
        # by the run's timeline (when timing is on)
        self.events = InstructionEvents(program_id, [self.report] if self.timeline is None
                                        else [self.report, self.timeline])
        self.memory = MemoryTracker(shared.target, self.report, strict=shared.options.strict)
        self.shared_allocation_count = 0
        self.barrier_phase = 0  # core_barriers this program has passed (cross-core race phases)

    def shared_allocation(self, make: Callable[[], Any], check: Callable[[Any], None]) -> Any:
        """The k-th shared_hbm allocation of every program resolves to one storage."""
        k = self.shared_allocation_count
        self.shared_allocation_count += 1
        with self.shared.lock:
            allocs = self.shared.shared_allocations
            if k < len(allocs):
                check(allocs[k])
                return allocs[k]
            storage = make()
            allocs.append(storage)
            return storage


def current_or_none() -> ExecutionContext | None:
    return getattr(_local, "ctx", None)


def current() -> ExecutionContext:
    """The context of the kernel running in this thread; NkiError outside a kernel."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise NkiError("nki: no running kernel: NKI instructions and nl allocations can only "
                       "be used inside a kernel run by nki.jit / simulate(...)")
    if ctx.shared.scheduler.aborted:
        # Every instruction looks up its context, so an aborted run (the other program failed,
        # or Ctrl-C) stops the running program at its next instruction.
        raise OtherProgramAborted(f"program {ctx.program_id}: the run was aborted")
    return ctx


class activate:
    """``with activate(ctx):`` makes ``ctx`` the current context of this thread."""

    def __init__(self, ctx: ExecutionContext | None) -> None:
        self.ctx = ctx

    def __enter__(self) -> ExecutionContext | None:
        self.previous = getattr(_local, "ctx", None)
        _local.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _local.ctx = self.previous
