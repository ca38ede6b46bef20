"""Documented NKI 0.8 names the emulator does not model.

They resolve (never ``AttributeError``), and calling one raises
``NkiError("<name> is not modelled by this emulator")``. The lists are the documented names
(nki.language.html / nki.isa.html API lists and the generated API sources
``_modules/nki/language.html``, ``_modules/nki/isa.html`` under
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/) that the emulator has no
implementation for.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

from nkilib_msda.simulator.errors import NkiError

__all__ = ["NL_UNMODELLED", "ISA_UNMODELLED", "unmodelled"]

NL_UNMODELLED = frozenset({
    "softmax", "rms_norm", "var", "prod", "all", "dropout", "random_seed", "rand",
    "expand_dims", "broadcast_to", "load_transpose2d", "gather_flattened", "average", "prelu",
    "int64", "uint64", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4",
    "bypass", "sign", "trunc", "tan", "cos", "gelu_apprx_sigmoid_dx", "softplus", "mish",
})

ISA_UNMODELLED = frozenset({
    "nc_matmul_mx", "tensor_partition_reduce", "tensor_scalar_cumulative", "quantize_mx",
    "dropout", "sequence_bounds", "local_gather",
    "max8", "nc_find_index8", "nc_match_replace8", "rng", "rand2",
    "rand_set_state", "rand_get_state", "set_rng_seed", "nonzero_with_count", "topk",
    "register_alloc", "register_move", "register_load", "register_store",
})


def unmodelled(name: str) -> Callable[..., NoReturn]:
    """A stand-in for the documented ``name``: calling it raises NkiError."""

    def not_modelled(*args: Any, **kwargs: Any) -> NoReturn:
        raise NkiError(f"{name} is not modelled by this emulator")

    not_modelled.__name__ = name.rsplit(".", 1)[-1]
    not_modelled.__qualname__ = name
    not_modelled.__doc__ = f"Documented NKI API ``{name}``: not modelled by this emulator."
    return not_modelled
