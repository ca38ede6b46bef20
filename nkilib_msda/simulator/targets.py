"""Hardware targets and their capacities (docs/emulator.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nkilib_msda.simulator.errors import nki_error

__all__ = ["Target", "TARGETS", "get_target", "default_target_name"]

KIB = 1024
# The runtime reserves 16 KiB per partition for dynamic-DMA scratch (docs/emulator.md):
# trn2 224 KiB - 16 KiB = 212,992 B usable ("~207 KiB" once nki-library also keeps 8 B and
# its identity tile, which kernels allocate themselves and are counted as they do).
DYNAMIC_DMA_SCRATCH_BYTES = 16 * KIB


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


def _make(name: str, core: str, sbuf_kib: int, matmul_n: int, trn3: bool) -> Target:
    sbuf = sbuf_kib * KIB
    return Target(
        name=name, neuron_core=core, num_partitions=128, sbuf_bytes_per_partition=sbuf,
        usable_sbuf_bytes_per_partition=sbuf - DYNAMIC_DMA_SCRATCH_BYTES,
        psum_bytes_per_partition=16 * KIB, psum_bank_bytes=2 * KIB, psum_num_banks=8,
        matmul_max_n_fp32=matmul_n, supports_bf16_matmul_dst=trn3, supports_abs_max=trn3)


TARGETS: dict[str, Target] = {
    "trn2": _make("trn2", "NC-v3", 224, 512, False),
    "trn3": _make("trn3", "NC-v4", 256, 4096, True),
}


def default_target_name() -> str:
    """``NEURON_PLATFORM_TARGET_OVERRIDE`` if set, else trn2."""
    return os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "") or "trn2"


def get_target(target: "str | Target | None" = None) -> Target:
    """Resolve a target name (trn2, trn3) or the environment default."""
    if isinstance(target, Target):
        return target
    name = (target or default_target_name()).lower()
    if name not in TARGETS:
        raise nki_error("simulate", "unsupported target",
                        f"target={name!r}; the emulator models {sorted(TARGETS)}")
    return TARGETS[name]
