"""Swap nkilib_msda into an HF transformers Deformable DETR, compare, then train a few steps.

Runs on CPU in seconds (a tiny random model, nothing downloaded):

    python examples/hf_deformable_detr_swap.py --steps 2
    python examples/hf_deformable_detr_swap.py --backend nki   # NKI kernels in the emulator
    python examples/hf_deformable_detr_swap.py --device cuda --backend auto \
        --compile-decoder reduce-overhead                     # GPU: decoder in CUDA graphs

``--compile-decoder MODE`` wraps the transformer's decoder in ``torch.compile(mode=MODE)``
for the training steps; on a GPU, ``reduce-overhead`` replays it as CUDA graphs, which removes the
host cost that bounds decoder-sized MSDA calls (docs/performance.md, "CUDA graphs").

Needs the ``hf`` extra (transformers, scipy, pillow).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    DeformableDetrConfig, DeformableDetrForObjectDetection, ResNetConfig)

import nkilib_msda  # noqa: E402


def tiny_deformable_detr(seed: int = 0) -> DeformableDetrForObjectDetection:
    """A 61k-parameter random Deformable DETR (small config, random init, no download)."""
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                            out_features=["stage2", "stage3", "stage4"])
    config = DeformableDetrConfig(
        backbone_config=backbone, use_timm_backbone=False, use_pretrained_backbone=False,
        d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10,
        num_feature_levels=4, encoder_n_points=2, decoder_n_points=2, num_labels=3)
    torch.manual_seed(seed)
    return DeformableDetrForObjectDetection(config)


def random_batch(batch: int, size: int, seed: int) -> tuple[torch.Tensor, list[dict]]:
    """Images and one or two random boxes per image (normalized cx, cy, w, h)."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch, 3, size, size, generator=g)
    labels = []
    for _ in range(batch):
        n = int(torch.randint(1, 3, (1,), generator=g))
        centre = 0.25 + 0.5 * torch.rand(n, 2, generator=g)
        extent = 0.1 + 0.3 * torch.rand(n, 2, generator=g)
        labels.append({"class_labels": torch.randint(0, 3, (n,), generator=g),
                       "boxes": torch.cat([centre, extent], dim=1)})
    return pixels, labels


def _to(batch: tuple[torch.Tensor, list[dict]], device: torch.device
        ) -> tuple[torch.Tensor, list[dict]]:
    pixels, labels = batch
    return pixels.to(device), [{k: v.to(device) for k, v in t.items()} for t in labels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps after the swap")
    parser.add_argument("--backend", default="reference", choices=["reference", "nki", "auto"],
                        help="nkilib_msda backend for the swapped layers")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (backend auto: triton)")
    parser.add_argument("--compile-decoder", default="", metavar="MODE",
                        choices=["", "default", "reduce-overhead", "max-autotune"],
                        help="after the swap, torch.compile the decoder with this mode")
    args = parser.parse_args()
    backend = None if args.backend == "auto" else args.backend
    device = torch.device(args.device)

    model = tiny_deformable_detr().to(device)
    model.train()
    pixels, labels = _to(random_batch(2, args.image_size, seed=1), device)

    # Reference run with HF's own grid_sample layer.
    torch.manual_seed(2)
    before = model(pixel_values=pixels, labels=labels)
    before.loss.backward()
    grads_before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    sites = nkilib_msda.patch_transformers_model(model, backend=backend)
    print(f"patched {sites} MultiScaleDeformableAttention layers (backend={args.backend})")

    torch.manual_seed(2)
    after = model(pixel_values=pixels, labels=labels)
    after.loss.backward()
    logits_diff = (after.logits - before.logits).abs().max().item()
    boxes_diff = (after.pred_boxes - before.pred_boxes).abs().max().item()
    grad_diff = max((p.grad - grads_before[n]).abs().max().item()
                    for n, p in model.named_parameters() if n in grads_before)
    grad_scale = max(g.abs().max().item() for g in grads_before.values())
    print(f"max |logits diff| {logits_diff:.3e}  max |boxes diff| {boxes_diff:.3e}  "
          f"loss {before.loss.item():.6f} -> {after.loss.item():.6f}  "
          f"max |parameter-gradient diff| {grad_diff:.3e} (largest gradient {grad_scale:.3e})")
    model.zero_grad()

    if args.compile_decoder:  # after the comparison: compiled dropout draws other masks
        model.model.decoder = torch.compile(model.model.decoder, mode=args.compile_decoder)
        print(f"decoder compiled with mode={args.compile_decoder!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        start = time.perf_counter()
        pixels, labels = _to(random_batch(2, args.image_size, seed=10 + step), device)
        loss = model(pixel_values=pixels, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f} ({time.perf_counter() - start:.2f} s)")


if __name__ == "__main__":
    main()
