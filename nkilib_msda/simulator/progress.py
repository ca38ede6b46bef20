"""A progress bar for long simulations: ``simulate(..., progress=...)`` and ``nkilib-msda check``.

The bar is drawn by tqdm (https://tqdm.github.io/docs/tqdm/; ``delay=`` needs tqdm >= 4.58.0,
the package's minimum) on stderr, only when stderr is a
terminal (tqdm's ``disable=None``) and only once the run has lasted ``delay_s`` seconds, so
short runs, pipes and logs stay clean. A background thread polls the run every
``interval_s`` seconds; the instructions themselves only bump one byte counter per HBM read
(``Storage.bytes_read``), so a run without a bar costs nothing extra.

How far a run is: when the caller names a *streamed input*, an argument the kernel reads
once, front to back (the MSDA kernels read ``attention_weights`` once per query tile, in
both directions and at either LNC degree), progress is the share of its bytes read so far,
which gives an ETA. Otherwise the bar counts instructions issued, without an ETA. The
postfix names the phase: the program (core) running and the ``core_barrier`` phase it is in.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Progress", "progress_spec", "ProgressDisplay"]


@dataclass(frozen=True)
class Progress:
    """What ``simulate(..., progress=Progress(...))`` shows.

    streamed_input: name of a kernel argument read once, front to back; progress is the share
    of its bytes read (with an ETA). None: instructions issued (no ETA).
    total, unit: show that share as ``total`` units (e.g. the B*N_q queries of MSDA) rather
    than bytes.
    desc: the bar's label (default: the kernel's name).
    delay_s: nothing is shown for runs shorter than this.
    """

    streamed_input: str | None = None
    total: int | None = None
    unit: str = "query"
    desc: str | None = None
    delay_s: float = 2.0
    interval_s: float = 0.5


def progress_spec(progress: Any) -> Progress | None:
    """``simulate``'s ``progress=`` argument as a :class:`Progress` (None: no bar)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return Progress()
    if isinstance(progress, str):
        return Progress(streamed_input=progress)
    if isinstance(progress, Progress):
        return progress
    raise TypeError(f"simulate: progress must be True, False, the name of a kernel argument or "
                    f"a Progress, got {type(progress).__name__} {progress!r}")


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # a declared dependency; an install without it just shows no bar
        warnings.warn("progress: tqdm is not installed (pip install tqdm); no progress bar",
                      RuntimeWarning, stacklevel=4)
        return None
    return tqdm


class ProgressDisplay:
    """``with ProgressDisplay(spec, desc, streamed, contexts, scheduler):`` around a run.

    streamed: the Storage of ``spec.streamed_input`` (or None); contexts: the programs'
    ExecutionContexts; scheduler: their ProgramScheduler (whose turn it is)."""

    def __init__(self, spec: Progress, desc: str, streamed: Any, contexts: Sequence[Any],
                 scheduler: Any) -> None:
        self.spec = spec
        self.streamed = streamed
        self.contexts = list(contexts)
        self.scheduler = scheduler
        self.desc = spec.desc or desc
        self.bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProgressDisplay":
        tqdm = _tqdm()
        if tqdm is None:
            return self
        if self.streamed is not None:
            total = self.spec.total or self.streamed.nbytes
            unit, scale = (self.spec.unit, False) if self.spec.total else ("B", True)
        else:
            total, unit, scale = None, " instructions", True
        self.bar = tqdm(total=total, desc=self.desc, unit=unit, unit_scale=scale,
                        file=sys.stderr, disable=None, delay=self.spec.delay_s, leave=False,
                        dynamic_ncols=True)
        if self.bar.disable:
            self.bar = None
            return self
        self._thread = threading.Thread(target=self._poll, name="nki-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.close()

    def done(self) -> float:
        """Progress in the bar's units: streamed bytes (or ``total`` units) or instructions."""
        if self.streamed is None:
            return float(sum(_instructions(ctx.report) for ctx in self.contexts))
        share = min(self.streamed.bytes_read / max(self.streamed.nbytes, 1), 1.0)
        return share * (self.spec.total or self.streamed.nbytes)

    def phase(self) -> str:
        turn = self.scheduler.turn
        if len(self.contexts) == 1 or turn is None:
            return ""
        barrier = self.contexts[turn].barrier_phase
        return f"core {turn} of {len(self.contexts)}, barrier phase {barrier}"

    def _poll(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(self.spec.interval_s):
            self.bar.n = int(self.done())
            phase = self.phase()
            if self.streamed is not None and self.bar.n >= self.bar.total:
                phase = ", ".join(p for p in (phase, f"{self.spec.streamed_input} read, finishing") if p)
            self.bar.set_postfix_str(phase, refresh=False)
            if time.monotonic() - start >= self.spec.delay_s:
                self.bar.refresh()


def _instructions(report: Any) -> int:
    # list() copies the dicts' values in one step under the GIL: safe while the program runs.
    return sum(entry[0] for per in list(report.instructions.values())
               for entry in list(per.values()))
