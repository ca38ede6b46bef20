"""Data-parallel training on Trainium2/Trainium3 with the NKI multi-scale deformable attention
kernels, on TorchNeuron (the native ``neuron`` device).

A small deformable-attention detector head (conv pyramid -> MSDeformAttn encoder -> queries
decoded by MSDeformAttn -> box regression) trained with DistributedDataParallel (default) or
FSDP2 (``--fsdp``), one process per logical NeuronCore, on the ``neuron`` device
(torch-neuronx 2.14+, Neuron SDK 2.33+). On ``neuron`` tensors the registered operators
``torch.ops.nkilib_msda.*`` run their PrivateUse1 kernels, which launch the NKI forward and
backward kernels (see docs/torch.md). The kernels' LNC degree comes from
``NEURON_LOGICAL_NC_CONFIG`` (unset: 1) and must equal neuronx-cc's ``--lnc`` (unset: 2 on
Trn2/Trn3); the nki backend refuses a mismatch before the launch (docs/kernels.md, "LNC on a
Trainium instance"), so export the variable:

One trn2.48xlarge (64 logical NeuronCores at LNC 2):

    export NEURON_LOGICAL_NC_CONFIG=2
    torchrun --nproc_per_node=64 examples/train_trn2.py --steps 100

Several instances (EFA configured; same commands on every node, node_rank 0..N-1):

    export NEURON_LOGICAL_NC_CONFIG=2
    torchrun --nnodes=2 --node_rank=$NODE_RANK --nproc_per_node=64 \\
        --master_addr=$MASTER_ADDR --master_port=29500 examples/train_trn2.py

``--compile`` wraps the model in ``torch.compile(backend="neuron", dynamic=False)``;
``--fsdp`` shards parameters with FSDP2 (``torch.distributed.fsdp.fully_shard``) instead of DDP.

Static shapes: every batch has random image sizes (``--min-image-size`` to ``--image-size``),
as detection training does. Neuron compiles one graph per set of shapes, so each batch is
padded to the smallest of a few bucket sizes (``nkilib_msda.buckets``; sides multiples of
``--bucket-step``) with Deformable-DETR's padding mask and per-level valid ratios; the run
ends by printing how many distinct spatial-shape sets (graphs) it met, at most the number of
buckets (docs/torch.md, "Static shapes on Trainium").

Dry run on any CPU machine (no Neuron SDK): two gloo ranks, tiny sizes, the NKI kernels
executed by the package's emulator (``--fsdp`` works there too):

    python examples/train_trn2.py --dry-run

Without torch-neuronx (and without ``--dry-run``) the script stops and says to use
``--dry-run``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nkilib_msda import MSDeformAttn
from nkilib_msda import buckets as bk
from nkilib_msda.tools.argtypes import OneLineErrorParser, int_at_least, positive_float


class DeformableDetectorHead(nn.Module):
    """Conv pyramid -> one MSDeformAttn encoder layer -> MSDeformAttn query decoder -> boxes."""

    def __init__(self, d_model: int, levels: int, heads: int, points: int, queries: int,
                 backend: str | None):
        super().__init__()
        self.levels = levels
        stem = [nn.Conv2d(3, d_model, 3, stride=2, padding=1)]
        self.pyramid = nn.ModuleList(stem + [nn.Conv2d(d_model, d_model, 3, stride=2, padding=1)
                                             for _ in range(levels - 1)])
        self.level_embed = nn.Parameter(torch.randn(levels, d_model) * 0.02)
        self.encoder = MSDeformAttn(d_model, levels, heads, points, backend=backend)
        self.encoder_norm = nn.LayerNorm(d_model)
        self.query_embed = nn.Parameter(torch.randn(queries, d_model) * 0.1)
        self.query_reference = nn.Linear(d_model, 2)
        self.decoder = MSDeformAttn(d_model, levels, heads, points, backend=backend)
        self.decoder_norm = nn.LayerNorm(d_model)
        self.box_head = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 4))

    def forward(self, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) padded to a bucket, mask (B, H, W) True on padding."""
        feats, x = [], images
        for conv in self.pyramid:
            x = torch.relu(conv(x))
            feats.append(x)
        shapes = tuple((int(f.shape[2]), int(f.shape[3])) for f in feats)  # static per bucket
        masks = bk.level_masks(mask, shapes)
        padding = bk.flatten_level_masks(masks)  # (B, L): padded pixels are zeroed in the value
        ratios = bk.valid_ratios(masks).to(images.dtype)  # (B, N_l, 2)
        flat = torch.cat([f.flatten(2).transpose(1, 2) + self.level_embed[i]
                          for i, f in enumerate(feats)], dim=1)
        batch = images.shape[0]
        # Encoder: every pixel attends around itself on all levels (Deformable-DETR's points).
        enc_ref = bk.encoder_reference_points(shapes, ratios).to(images.dtype)
        memory = self.encoder_norm(flat + self.encoder(flat, enc_ref, flat, shapes, None, padding))
        # Decoder: learned queries with predicted reference points in the valid image, scaled
        # into each level's padded frame by the valid ratios.
        queries = self.query_embed.expand(batch, -1, -1)
        dec_ref = self.query_reference(queries).sigmoid()[:, :, None, :] * ratios[:, None]
        hidden = self.decoder_norm(queries + self.decoder(queries, dec_ref, memory, shapes, None, padding))
        return self.box_head(hidden).sigmoid()


def synthetic_batch(batch: int, min_size: int, max_size: int, queries: int,
                    buckets: tuple[tuple[int, int], ...], generator: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images of random sizes, padded to the smallest bucket holding the batch: (images, mask,
    boxes)."""
    sizes = torch.randint(min_size, max_size + 1, (batch, 2), generator=generator).tolist()
    images, mask = bk.pad_to_bucket([torch.randn(3, h, w, generator=generator) for h, w in sizes],
                                    buckets)
    boxes = 0.2 + 0.6 * torch.rand(batch, queries, 4, generator=generator)
    return images, mask, boxes


def train(args: argparse.Namespace, rank: int, world_size: int, device: torch.device) -> list[float]:
    torch.manual_seed(args.seed)  # identical initial weights (DDP also broadcasts rank 0's)
    model = DeformableDetectorHead(args.d_model, args.levels, args.heads, args.points,
                                   args.queries, backend=args.backend).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in (model.encoder, model.decoder):
            fully_shard(block)
        wrapped: nn.Module = fully_shard(model)
    else:
        wrapped = DistributedDataParallel(model)
    step_fn = torch.compile(wrapped, backend="neuron", dynamic=False) if args.compile else wrapped
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed + 1000 * rank)  # a different shard per rank
    buckets = bk.bucket_grid(args.image_size, args.image_size, args.bucket_step)
    shape_sets: set[tuple[tuple[int, int], ...]] = set()
    losses = []
    for step in range(args.steps):
        start = time.perf_counter()
        images, mask, boxes = synthetic_batch(args.batch_size, args.min_image_size, args.image_size,
                                              args.queries, buckets, data)
        shape_sets.add(_level_shapes(images.shape[2], images.shape[3], args.levels))
        images, mask, boxes = images.to(device), mask.to(device), boxes.to(device)
        loss = nn.functional.l1_loss(step_fn(images, mask), boxes)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f}  {time.perf_counter() - start:.2f} s/step "
                  f"(world size {world_size})", flush=True)
    every_rank: list[set] = [set() for _ in range(world_size)]
    dist.all_gather_object(every_rank, shape_sets)
    if rank == 0:
        seen = set().union(*every_rank)
        print(f"distinct spatial-shape sets: {len(seen)} over {args.steps} steps x {world_size} ranks "
              f"(at most {len(buckets)} buckets)", flush=True)
    checksum = torch.stack([_full(p).detach().double().sum() for p in model.parameters()]).sum()
    gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
    dist.all_gather(gathered, checksum)
    if rank == 0:
        same = all(torch.equal(g, gathered[0]) for g in gathered)
        print(f"parameters identical on all {world_size} ranks: {same}", flush=True)
        if not same:
            raise RuntimeError("data-parallel replicas diverged")
    return losses


def _level_shapes(height: int, width: int, levels: int) -> tuple[tuple[int, int], ...]:
    """The pyramid's (H_l, W_l): each stride-2 conv (kernel 3, padding 1) gives ceil(n / 2)."""
    shapes = []
    for _ in range(levels):
        height, width = -(-height // 2), -(-width // 2)
        shapes.append((height, width))
    return tuple(shapes)


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter (FSDP2 parameters are sharded DTensors)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def run_on_neuron(args: argparse.Namespace) -> None:
    """One process per logical NeuronCore, launched by torchrun (env:// rendezvous)."""
    try:
        import torch_neuronx  # noqa: F401 - registers the "neuron" device and process-group backend
    except ImportError as exc:
        sys.exit(f"train_trn2.py: torch-neuronx is not installed ({exc}); this runs on a "
                 "Trn2/Trn3 instance with TorchNeuron. On any other machine use --dry-run "
                 "(CPU, 2 gloo ranks, NKI kernels in the emulator).")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("train_trn2.py: launch with torchrun (RANK/WORLD_SIZE unset), e.g. "
                 "torchrun --nproc_per_node=64 examples/train_trn2.py")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="neuron", init_method="env://", rank=rank, world_size=world_size)
    try:
        train(args, rank, world_size, torch.device("neuron"))
    finally:
        dist.destroy_process_group()


def _dry_run_worker(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.setdefault("NKILIB_MSDA_NKI", "emulator")  # even where the Neuron nki is installed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        train(args, rank, world_size, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def dry_run(args: argparse.Namespace) -> None:
    """Two gloo ranks on CPU; backend "nki" runs the NKI kernels in the emulator."""
    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_dry_run_worker, args=(2, port, args), nprocs=2, join=True,
                       start_method="spawn")


def main() -> None:
    parser = OneLineErrorParser(
        description="DDP/FSDP training with the NKI MSDA kernels on TorchNeuron (Trn2/Trn3)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU: 2 gloo ranks, tiny sizes, NKI kernels in the emulator")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard parameters with FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--steps", type=int_at_least(1), default=None)
    parser.add_argument("--batch-size", type=int_at_least(1), default=None, help="per rank")
    parser.add_argument("--image-size", type=int_at_least(1), default=None, help="largest image side")
    parser.add_argument("--min-image-size", type=int_at_least(1), default=None, help="smallest image side")
    parser.add_argument("--bucket-step", type=int_at_least(1), default=None,
                        help="bucket sides are multiples of this (a multiple of 2**levels)")
    parser.add_argument("--d-model", type=int_at_least(1), default=None)
    parser.add_argument("--levels", type=int_at_least(1), default=4)
    parser.add_argument("--heads", type=int_at_least(1), default=8)
    parser.add_argument("--points", type=int_at_least(1), default=4)
    parser.add_argument("--queries", type=int_at_least(1), default=None)
    parser.add_argument("--lr", type=positive_float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="nki", choices=["nki", "reference"])
    parser.add_argument("--compile", action="store_true",
                        help='torch.compile(backend="neuron", dynamic=False) (Neuron only)')
    args = parser.parse_args()
    tiny = dict(steps=3, batch_size=2, image_size=16, min_image_size=5, bucket_step=8, d_model=16,
                queries=8)
    full = dict(steps=100, batch_size=4, image_size=256, min_image_size=128, bucket_step=64,
                d_model=256, queries=100)
    for key, default in (tiny if args.dry_run else full).items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.dry_run:
        args.levels, args.heads, args.points = min(args.levels, 3), min(args.heads, 2), min(args.points, 2)
    if args.bucket_step % 2 ** args.levels or not 0 < args.min_image_size <= args.image_size:
        parser.error(f"--bucket-step must be a multiple of 2**levels = {2 ** args.levels} (got "
                     f"{args.bucket_step}) and 0 < --min-image-size <= --image-size")
    if args.dry_run:
        if args.compile:
            parser.error("--compile needs a Neuron device (not available in --dry-run)")
        dry_run(args)
    else:
        run_on_neuron(args)


if __name__ == "__main__":
    main()
