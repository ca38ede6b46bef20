"""torch.export round trip, in two fresh processes (run by test_ops_export.py):

- ``save DIR``: export a small model calling both MSDA and Block AttnRes, save the program and
  its inputs/expected outputs to DIR;
- ``load DIR``: import only torch and nkilib_msda, load the program and check it reproduces the
  saved outputs;
- ``load-nki DIR`` (run with ``NKILIB_MSDA_BACKEND=nki``): the program, exported where the
  automatic choice was "reference", runs the nki backend here: its entry points are counted and
  the outputs compared with the saved (reference) ones at the float32 tolerance.
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


def load_nki(directory: Path) -> None:
    from nkilib_msda.backends import nki_backend
    from nkilib_msda.workloads import compare, tolerance

    calls = {"msda_forward": 0, "block_attn_res_forward": 0}
    for name in calls:
        real = getattr(nki_backend, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(nki_backend, name, counting)
    program = torch.export.load(directory / "tiny.pt2")
    recorded = [n.args for n in program.graph.nodes if "nkilib_msda" in str(n.target)]
    assert recorded and not any("reference" in map(str, args) for args in recorded), recorded
    io = torch.load(directory / "io.pt")
    got = program.module()(*io["inputs"])
    assert calls == {"msda_forward": 1, "block_attn_res_forward": 1}, calls
    for name, g, w in zip(("msda", "block_attn_res"), got, io["outputs"]):
        result = compare(name, g, w, tolerance("output", "float32"))
        assert result.ok, result.row()


if __name__ == "__main__":
    {"save": save, "load": load, "load-nki": load_nki}[sys.argv[1]](Path(sys.argv[2]))
    print("PASSED", sys.argv[1])
