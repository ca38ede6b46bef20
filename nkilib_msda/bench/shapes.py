"""The GPU benchmark's shapes (workloads of :mod:`nkilib_msda.workloads`) and their inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nkilib_msda.hardware import DTYPE_BYTES
from nkilib_msda.workloads import PRESET_ALIASES, PRESETS, MSDACase, make_torch_inputs


@dataclass(frozen=True)
class BenchShape:
    name: str
    batch: int
    queries: int | None  # None: one query per pixel (encoders)
    levels: tuple
    points: int
    heads: int = 8
    channels: int = 32
    decoder: bool = False

    @property
    def pixels(self) -> int:
        return sum(h * w for h, w in self.levels)

    @property
    def num_queries(self) -> int:
        return self.pixels if self.queries is None else self.queries

    @property
    def case(self) -> MSDACase:
        """The workload (BLNC value, BQHLP2 locations, the benchmark's layouts)."""
        return MSDACase(batch=self.batch, num_queries=self.num_queries, num_heads=self.heads,
                        head_dim=self.channels, num_points=self.points,
                        spatial_shapes=tuple(self.levels), name=self.name)


def _bench_shape(name: str) -> BenchShape:
    c = PRESETS[name]
    return BenchShape(name, c.batch, c.num_queries, c.spatial_shapes, c.num_points, c.num_heads,
                      c.head_dim, decoder=c.is_decoder)


# The benchmark's shapes are workloads (nkilib_msda.workloads), named as there; the older names
# (ddetr_enc, bev_tsa, ...) are accepted on the command line and in logs.
SHAPES = {n: _bench_shape(n) for n in ("ddetr-encoder", "ddetr-decoder", "bevformer-sca",
                                       "bevformer-tsa", "bevformer-decoder", "mask2former-encoder")}


def shape_name(name: str) -> str:
    """The benchmark shape called ``name`` or one of its older names (unknown names unchanged)."""
    return PRESET_ALIASES.get(name, name)
DTYPES = ("float32", "bfloat16")


def compulsory_bytes(shape: BenchShape, dtype_name: str) -> int:
    """Bytes a forward must move at least: value, locations, weights (read) and the output
    (written; the backward reads grad_output of the same size), all in ``dtype_name``. A
    forward + backward moves twice this (the benchmark's floor)."""
    b, q, h, c = shape.batch, shape.num_queries, shape.heads, shape.channels
    samples = b * q * h * len(shape.levels) * shape.points
    numel = b * shape.pixels * h * c + samples * 2 + samples + b * q * h * c
    return numel * DTYPE_BYTES[dtype_name]
MODES = ("fwd", "fwd+bwd")

def make_inputs(shape: BenchShape, dtype, seed: int = 0, device: str = "cuda"):
    """(value, locations, weights, grad_output) of the workload on ``device``, all in ``dtype``
    (nkilib_msda.workloads.make_torch_inputs)."""
    name = str(dtype).rsplit(".", 1)[-1]
    made = make_torch_inputs(replace(shape.case, value_dtype=name, param_dtype=name), seed, device)
    return (made["value"], made["sampling_locations"], made["attention_weights"],
            made["grad_output"])
