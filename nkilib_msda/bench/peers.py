"""Peer implementations the GPU benchmark times beside ours, each from a folder the user
supplies (their code is not part of this package): roulbac/msda-triton (``--peer-dir``, the
folder holding its ``msda_triton`` package) with fp32 grad_value accumulation, the accurate
setting (its default on sm_90, native bf16 atomics, gave grad_value errors of ~2e-2)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable


def add_peer_dir(path: str) -> None:
    """Make the folder holding the ``msda_triton`` package importable."""
    if path:
        sys.path.insert(0, os.path.abspath(path))


def msda_triton(levels: tuple, inputs: tuple, leaves: list
                ) -> tuple[dict[str, Callable[[], Any]] | None, str | None]:
    """{"fwd", "fwd+bwd"} callables of msda-triton's public function on ``inputs`` (value,
    locations, weights, grad_output; ``leaves`` the same three with requires_grad), fwd+bwd
    through its autograd.Function, or (None, why not)."""
    import torch

    try:
        from msda_triton import multi_scale_deformable_attention as peer
    except ImportError as exc:
        return None, f"msda-triton not importable ({exc}); 'msda-triton' rows skipped (--peer-dir)"
    value, loc, attn, grad = inputs
    shapes = torch.tensor(levels, dtype=torch.long, device=value.device)

    def fwd():
        with torch.no_grad():
            return peer(value, shapes, None, loc, attn, fp32_grad_accum=True)

    def fwd_bwd():
        out = peer(leaves[0], shapes, None, leaves[1], leaves[2], fp32_grad_accum=True)
        return torch.autograd.grad(out, leaves, grad)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}, None
