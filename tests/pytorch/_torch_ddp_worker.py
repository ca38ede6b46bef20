"""Worker of the 2-process gloo DistributedDataParallel test (importable by spawned children)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nkilib_msda import MSDeformAttn

SHAPES = ((4, 4), (2, 2))


class TinyDeformableModel(nn.Module):
    """Input projection -> MSDeformAttn over a 2-level feature map -> linear head."""

    def __init__(self, d_model: int = 16):
        super().__init__()
        self.embed = nn.Linear(3, d_model)
        self.query = nn.Parameter(torch.randn(6, d_model) * 0.5)
        self.reference = nn.Parameter(torch.rand(6, 2))
        self.attn = MSDeformAttn(d_model=d_model, n_levels=len(SHAPES), n_heads=2, n_points=2,
                                 backend="reference")
        self.head = nn.Linear(d_model, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        batch = features.shape[0]
        flat = self.embed(features)
        query = self.query.expand(batch, -1, -1)
        reference = self.reference.clamp(0, 1)[None, :, None, :].expand(batch, -1, len(SHAPES), -1)
        return self.head(self.attn(query, reference, flat, SHAPES, None)).squeeze(-1)


def train(rank: int, world_size: int, port: int, out_dir: str, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(1234 + rank)  # different init per rank: DDP must broadcast rank 0's
        model = TinyDeformableModel()
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        data = torch.Generator().manual_seed(100 + rank)  # different data per rank
        length = sum(h * w for h, w in SHAPES)
        losses = []
        initial = [p.detach().clone() for p in model.parameters()]
        for _ in range(steps):
            features = torch.randn(3, length, 3, generator=data)
            target = torch.randn(3, 6, generator=data)
            loss = (ddp(features) - target).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        moved = sum((p.detach() - q).abs().sum().item() for p, q in zip(model.parameters(), initial))
        torch.save({"params": [p.detach() for p in model.parameters()], "losses": losses,
                    "moved": moved}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
