"""Cross-core communication of the paired physical cores: ``core_barrier``, ``sendrecv``,
``sendrecv_compute``.

NKI 0.8 moved them to ``nki.lnc`` (:mod:`nkilib_msda.simulator.lnc` re-exports
:func:`lnc_core_barrier` & co. under their documented names); the ``nki.isa`` names stay as
deprecated wrappers that emit ``DeprecationWarning`` at the call site
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/nki.lnc.html).
Signatures follow ``_modules/nki/lnc.html``.

- ``core_barrier(data, cores, engine=engine.gpsimd, name=None)``: ``data`` in shared HBM;
  only ``cores=(0, 1)`` is supported (a list ``[0, 1]`` is accepted as the same value); valid
  at LNC 1 and 2. At LNC 1 the other physical core runs a separate kernel instance that the
  emulator does not model, so the barrier is a no-op there.
- ``sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine=dma_engine.dma, name=None,
  priority=None)`` and ``sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op,
  name=None, priority=None)``: LNC 2 only; the N-th call of one program pairs with the N-th call
  of the other (program order), ranks 0 or 1; ``priority`` None or 0..3 (accepted, no timing);
  ``sendrecv_compute`` reduces with nl.add / nl.maximum / nl.minimum and needs ``src``/``dst``
  in the same memory space (both SBUF or both private HBM).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from nkilib_msda.simulator.access import read, write
from nkilib_msda.simulator.alu import NkiOp
from nkilib_msda.simulator.context import current
from nkilib_msda.simulator.errors import nki_error
from nkilib_msda.simulator.isa.enums import as_enum, dma_engine as _dma_engine, engine as _engine
from nkilib_msda.simulator.tensor import NkiTensor

__all__ = ["core_barrier", "sendrecv", "sendrecv_compute"]

_BARRIER_CORES = (0, 1)


def lnc_core_barrier(data: Any, cores: Any, engine: Any = _engine.gpsimd,
                     name: str | None = None) -> None:
    """``nki.lnc.core_barrier``: wait until both physical cores of the pair reach it."""
    ins = "core_barrier"
    ctx = current()
    if not isinstance(data, NkiTensor) or data.buffer != "shared_hbm":
        raise nki_error(ins, "shared_hbm data",
                        f"data must be a shared_hbm tensor, got "
                        f"{getattr(data, 'buffer', type(data).__name__)}")
    if not isinstance(cores, (tuple, list)) or tuple(cores) != _BARRIER_CORES or not all(
            type(c) is int for c in cores):
        raise nki_error(ins, "cores", f"cores must be (0, 1) (the only supported value; a list "
                                      f"[0, 1] is accepted), got {cores!r}")
    as_enum(engine, _engine, "engine", ins)
    ctx.events.compute("sync", "core_barrier", 0)
    if ctx.num_programs > 1:
        ctx.events.barrier()  # before the hand-over: see Timeline.on_barrier
        ctx.shared.scheduler.barrier(ctx.program_id, ins)
        ctx.barrier_phase += 1  # orders this program's shared-HBM accesses (access.py races)


def _check_rank(ins: str, argument: str, value: Any) -> int:
    if type(value) is not int or value not in (0, 1):
        raise nki_error(ins, argument, f"{argument} must be 0 or 1 (a rank within the LNC), "
                                       f"got {value!r}")
    return value


def _exchange(ins: str, src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any,
              priority: Any) -> np.ndarray:
    """Post ``src``, rendezvous with the peer's call of the same sequence number, return the
    values the peer sent to this program."""
    ctx = current()
    if ctx.num_programs != 2:
        raise nki_error(ins, "LNC degree",
                        f"{ins} needs LNC degree 2 (NEURON_LOGICAL_NC_CONFIG=2), the kernel runs "
                        f"with {ctx.num_programs}")
    for role, t in (("src", src), ("dst", dst)):
        if not isinstance(t, NkiTensor):
            raise nki_error(ins, "operand type", f"{role} must be an NkiTensor, got {type(t).__name__}")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise nki_error(ins, "operand agreement",
                        f"src {src.shape} {src.dtype} and dst {dst.shape} {dst.dtype} must match")
    to = _check_rank(ins, "send_to_rank", send_to_rank)
    frm = _check_rank(ins, "recv_from_rank", recv_from_rank)
    if priority is not None and (type(priority) is not int or not 0 <= priority <= 3):
        raise nki_error(ins, "priority", f"priority must be None or 0..3, got {priority!r}")
    me = ctx.program_id
    seq = getattr(ctx, "_sendrecv_seq", 0)
    ctx._sendrecv_seq = seq + 1  # type: ignore[attr-defined]
    box = ctx.shared.mailbox
    box[(seq, me)] = (to, read(src, ins))
    ctx.events.compute("dma", ins, src.size)
    ctx.events.barrier()  # a rendezvous of the two cores, timed as a barrier
    ctx.shared.scheduler.barrier(me, ins)
    posted = box.get((seq, frm))
    if posted is None or posted[0] != me:
        raise nki_error(ins, "rank mismatch",
                        f"program {me} receives from rank {frm}, but that program's call #{seq} "
                        f"sends to rank {None if posted is None else posted[0]}")
    return posted[1]


def lnc_sendrecv(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any,
                 dma_engine: Any = _dma_engine.dma, name: str | None = None,
                 priority: Any = None) -> None:
    """``nki.lnc.sendrecv``: ``dst`` (this core) = ``src`` of core ``recv_from_rank``."""
    ins = "sendrecv"
    eng = as_enum(dma_engine, _dma_engine, "dma_engine", ins)
    if eng is _dma_engine.gpsimd_dma and priority is not None:
        raise nki_error(ins, "priority", "dma_engine=gpsimd_dma requires priority=None")
    write(dst, _exchange(ins, src, dst, send_to_rank, recv_from_rank, priority), ins)


_REDUCE_OPS = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum}


def lnc_sendrecv_compute(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any,
                         reduce_op: Any, name: str | None = None, priority: Any = None) -> None:
    """``nki.lnc.sendrecv_compute``: ``dst = reduce_op(src, peer src)`` (fp32, then cast)."""
    ins = "sendrecv_compute"
    op_name = reduce_op.name if isinstance(reduce_op, NkiOp) else None
    if op_name not in _REDUCE_OPS:
        raise nki_error(ins, "reduce_op", f"reduce_op must be nl.add, nl.maximum or nl.minimum, "
                                          f"got {reduce_op!r}")
    spaces = {getattr(src, "buffer", None), getattr(dst, "buffer", None)}
    if spaces not in ({"sbuf"}, {"private_hbm"}):
        raise nki_error(ins, "memory space", f"src and dst must both be in SBUF or both in private "
                                             f"HBM, got {sorted(map(str, spaces))}")
    peer = _exchange(ins, src, dst, send_to_rank, recv_from_rank, priority)
    mine = read(src, ins)
    write(dst, _REDUCE_OPS[op_name](mine.astype(np.float32), peer.astype(np.float32)), ins)


def _deprecated(old: str) -> None:
    warnings.warn(f"nki.isa.{old} is deprecated since NKI 0.8; use nki.lnc.{old}",
                  DeprecationWarning, stacklevel=3)


def core_barrier(data: Any, cores: Any = _BARRIER_CORES, engine: Any = _engine.gpsimd,
                 name: str | None = None) -> None:
    """Deprecated ``nki.isa.core_barrier``: ``nki.lnc.core_barrier`` with a DeprecationWarning."""
    _deprecated("core_barrier")
    lnc_core_barrier(data, cores, engine=engine, name=name)


def sendrecv(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any, pipe_id: Any = None,
             dma_engine: Any = _dma_engine.dma, name: str | None = None) -> None:
    """Deprecated ``nki.isa.sendrecv`` (``pipe_id`` ignored): ``nki.lnc.sendrecv``."""
    _deprecated("sendrecv")
    lnc_sendrecv(src, dst, send_to_rank, recv_from_rank, dma_engine=dma_engine, name=name)


def sendrecv_compute(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any, reduce_op: Any,
                     name: str | None = None) -> None:
    """Deprecated ``nki.isa.sendrecv_compute``: ``nki.lnc.sendrecv_compute``."""
    _deprecated("sendrecv_compute")
    lnc_sendrecv_compute(src, dst, send_to_rank, recv_from_rank, reduce_op, name=name)
