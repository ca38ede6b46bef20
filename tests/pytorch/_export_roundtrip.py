"""torch.export round trip, in two fresh processes (run by test_torch_export.py):

- ``save DIR``: export a small model calling both MSDA and Block AttnRes, save the program and
  its inputs/expected outputs to DIR;
- ``load DIR``: import only torch and nkilib_msda, load the program and check it reproduces the
  saved outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import nkilib_msda

SHAPES = ((4, 6), (3, 2))


class Tiny(torch.nn.Module):
    def forward(self, value, loc, attn, blocks, w):
        out = nkilib_msda.multi_scale_deformable_attention(value, SHAPES, None, loc, attn)
        from nkilib_msda.pytorch.block_attn_res_ops import block_attn_res

        h = block_attn_res(list(blocks.unbind(0)), w, enable_rmsnorm=False)
        return out, h


def save(directory: Path) -> None:
    g = torch.Generator().manual_seed(0)
    length = sum(h * w for h, w in SHAPES)
    inputs = (torch.randn(2, length, 2, 4, generator=g), torch.rand(2, 5, 2, 2, 2, 2, generator=g),
              torch.rand(2, 5, 2, 2, 2, generator=g), torch.randn(3, 2, 4, 8, generator=g),
              torch.randn(8, generator=g))
    program = torch.export.export(Tiny(), inputs)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "nkilib_msda.ms_deformable_attention.default" in targets, targets
    assert "nkilib_msda.block_attn_res.default" in targets, targets
    torch.export.save(program, directory / "tiny.pt2")
    torch.save({"inputs": inputs, "outputs": Tiny()(*inputs)}, directory / "io.pt")


def load(directory: Path) -> None:
    program = torch.export.load(directory / "tiny.pt2")
    io = torch.load(directory / "io.pt")
    got = program.module()(*io["inputs"])
    for g, w in zip(got, io["outputs"]):
        assert torch.equal(g, w)


if __name__ == "__main__":
    {"save": save, "load": load}[sys.argv[1]](Path(sys.argv[2]))
    print("PASSED", sys.argv[1])
