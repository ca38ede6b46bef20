"""Helpers shared by the Block AttnRes NKI kernels (inlined at trace time)."""

from __future__ import annotations

from typing import Any

from nkilib_msda._nki import nisa, nl
from nkilib_msda.experimental.block_attn_res.tiling import TOKEN_TILE
from nkilib_msda.experimental.kernel_commons import core_barrier, core_info, kernel_sbuf_budget
from nkilib_msda.validation.msda import dtype_name

__all__ = ["launch", "barrier", "sbuf_budget", "load_query", "check_vector_arg", "row_broadcast", "dtype_str",
           "NamedTiles"]


def launch() -> tuple[int, int]:
    """(LNC degree, this core's index): ``nl.num_programs()`` / ``nl.program_id(0)``, see
    kernel_commons.core_info (correct for env-var LNC, bracket launch and LNC 1 alike)."""
    return core_info()


def barrier(data: Any, lnc: int) -> None:
    """Cross-core barrier over the shared-HBM tensor ``data`` (a no-op at LNC 1)."""
    core_barrier(data, lnc)


def sbuf_budget() -> int:
    """The planners' SBUF budget per partition on the running target."""
    return kernel_sbuf_budget()


def check_vector_arg(name: str, x: Any, dim: int) -> None:
    """Kernel-contract check of a [D] HBM vector (fp32 by contract; any float is cast on load)."""
    if not hasattr(x, "shape") or tuple(x.shape) != (dim,):
        got = tuple(x.shape) if hasattr(x, "shape") else x
        raise ValueError(f"{name}: expected an HBM tensor of shape ({dim},), got {got}")


def row_broadcast(vector: Any, rows: int, dim: int) -> Any:
    """HBM view [rows, D] of a [D] vector, partition stride 0 (every partition reads the vector)."""
    return vector.ap([[0, rows], [1, dim]])


def load_query(u: Any, staging: Any, proj_weight: Any, rmsnorm_gamma: Any, scale: float,
               enable_rmsnorm: bool) -> None:
    """u[128, D] fp32 = scale * gamma * w (RMSNorm on) or scale * w, on every partition.

    ``staging`` is a [128, D] fp32 scratch tile (holds gamma).
    """
    dim = u.shape[1]
    nisa.dma_copy(dst=u, src=row_broadcast(proj_weight, TOKEN_TILE, dim))
    if enable_rmsnorm:
        nisa.dma_copy(dst=staging, src=row_broadcast(rmsnorm_gamma, TOKEN_TILE, dim))
        nisa.tensor_tensor(dst=u, data1=u, data2=staging, op=nl.multiply)
    if float(scale) != 1.0:
        nisa.tensor_scalar(dst=u, data=u, op0=nl.multiply, operand0=float(scale))


def dtype_str(t: Any) -> str:
    """Canonical dtype name of a kernel argument ('bfloat16', 'float32', ...)."""
    return dtype_name(t.dtype)


class NamedTiles:
    """A kernel's working set: tiles made by :meth:`allocate` are read as attributes (typed
    ``Any``), next to the ones a subclass assigns itself."""

    def allocate(self, names: tuple[str, ...], shape: tuple[int, ...], dtype: Any = nl.float32) -> None:
        """One SBUF tile of ``shape`` and ``dtype`` per name, in order, named after it."""
        named = self.__dict__.setdefault("_named", {})
        for name in names:
            named[name] = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf, name=name)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_named"][name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no tile {name!r}") from None
