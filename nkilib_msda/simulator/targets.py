"""Hardware targets and their capacities (docs/emulator.md)."""

from __future__ import annotations

from dataclasses import dataclass

from nkilib_msda import hardware
from nkilib_msda._env import EnvironmentVariableError, check_package_variables, read_env
from nkilib_msda.simulator.errors import env_error, nki_error

__all__ = ["Target", "TARGETS", "get_target", "default_target_name"]

# The capacities come from the package's one table of hardware facts (nkilib_msda.hardware):
# usable SBUF = capacity - the runtime's 16 KiB dynamic-DMA scratch (trn2 212,992 B). Bytes
# nki-library keeps for itself (its identity tile, a few bytes) are allocated by its kernels
# and counted as they do.


@dataclass(frozen=True)
class Target:
    """One NeuronCore generation: capacities are bytes per partition."""

    name: str
    neuron_core: str
    num_partitions: int
    sbuf_bytes_per_partition: int
    usable_sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_bank_bytes: int
    psum_num_banks: int
    matmul_max_n_fp32: int  # one PSUM bank on v2/v3
    supports_bf16_matmul_dst: bool
    supports_abs_max: bool

    @property
    def is_trn3(self) -> bool:
        return self.name == "trn3"


def _make(name: str) -> Target:
    trn3 = name == "trn3"
    return Target(
        name=name, neuron_core=hardware.NEURON_CORES[name], num_partitions=hardware.PARTITIONS,
        sbuf_bytes_per_partition=hardware.SBUF_BYTES_PER_PARTITION[name],
        usable_sbuf_bytes_per_partition=hardware.USABLE_SBUF_BYTES[name],
        psum_bytes_per_partition=hardware.PSUM_BYTES, psum_bank_bytes=hardware.PSUM_BANK_BYTES,
        psum_num_banks=hardware.PSUM_BANKS, matmul_max_n_fp32=hardware.MATMUL_MAX_N_FP32[name],
        supports_bf16_matmul_dst=trn3, supports_abs_max=trn3)


TARGETS: dict[str, Target] = {name: _make(name) for name in hardware.TARGETS}


def default_target_name() -> str:
    """``NEURON_PLATFORM_TARGET_OVERRIDE`` if set, else trn2; another value raises an error
    that is both an NkiError and an EnvironmentVariableError."""
    check_package_variables()  # another variable's error is not a target error
    try:
        return str(read_env("NEURON_PLATFORM_TARGET_OVERRIDE"))
    except EnvironmentVariableError as exc:
        raise env_error("simulate", "unsupported target", exc,
                        f"the emulator models {sorted(TARGETS)}") from None


def get_target(target: "str | Target | None" = None) -> Target:
    """Resolve a target name (trn2, trn3) or the environment default."""
    if isinstance(target, Target):
        return target
    name = (target or default_target_name()).lower()
    if name not in TARGETS:
        raise nki_error("simulate", "unsupported target",
                        f"target={name!r}; the emulator models {sorted(TARGETS)}")
    return TARGETS[name]
