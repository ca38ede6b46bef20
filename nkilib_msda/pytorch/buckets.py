"""Static shapes for Trainium: pad images to a few bucket sizes, with Deformable-DETR's masks.

Neuron compiles one graph per set of input shapes, and the MSDA kernels take the spatial
shapes as compile-time constants. Detection training resizes every batch to a different size,
which would compile a new graph almost every step. The usual recipe, which Deformable-DETR's
own padding already supports: pad each batch to the smallest of a few fixed sizes ("buckets")
that holds it, mark the padding in a mask, and let the model ignore it through

- the padding mask of the flattened value (``input_padding_mask``: padded pixels are zeroed),
- the per-level valid ratios (``get_valid_ratio``), which rescale normalised reference
  points from the valid region to the padded map.

The number of distinct spatial-shape sets (and so of compiled graphs) is then at most the
number of buckets. With bucket sides that are multiples of the coarsest feature stride and
per-level masks from :func:`level_masks`, the valid region of every level is exactly the
feature map of the unpadded image, and for each valid query a padded call computes the same
MSDA as the unpadded one (docs/torch.md, "Static shapes on Trainium").

Masks follow Deformable-DETR: bool, True on padding.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from nkilib_msda.validation.arguments import check_positive_int

__all__ = ["bucket_grid", "select_bucket", "pad_to_bucket", "level_masks", "get_valid_ratio",
           "valid_ratios", "flatten_level_masks", "encoder_reference_points"]

Shape = tuple[int, int]


def bucket_grid(max_height: int, max_width: int, step: int) -> tuple[Shape, ...]:
    """Every (H, W) with H and W multiples of ``step`` up to the maxima (rounded up to a
    multiple), smallest area first. ``step`` should be a multiple of the model's coarsest
    feature stride (e.g. 64 for Deformable-DETR's 4 levels at strides 8..64); the count is
    ceil(max_height/step) * ceil(max_width/step): choose ``step`` to keep it small."""
    for name, arg in (("max_height", max_height), ("max_width", max_width), ("step", step)):
        check_positive_int(name, arg)
    heights = range(step, -(-max_height // step) * step + 1, step)
    widths = range(step, -(-max_width // step) * step + 1, step)
    return tuple(sorted(((h, w) for h in heights for w in widths), key=lambda s: (s[0] * s[1], s)))


def _check_buckets(buckets: Sequence[Shape]) -> tuple[Shape, ...]:
    out = []
    for b in buckets:
        if (not isinstance(b, (tuple, list)) or len(b) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in b)):
            raise ValueError(f"buckets: expected (height, width) pairs of positive ints, got {b!r}")
        out.append((b[0], b[1]))
    if not out:
        raise ValueError("buckets: expected at least one (height, width) pair, got none")
    return tuple(out)


def select_bucket(height: int, width: int, buckets: Sequence[Shape]) -> Shape:
    """The smallest-area bucket (ties: the first listed) with H >= height and W >= width;
    ValueError naming the size when none holds it."""
    fitting = [b for b in _check_buckets(buckets) if b[0] >= height and b[1] >= width]
    if not fitting:
        raise ValueError(f"buckets: no bucket holds an image of (height, width) = ({height}, {width}); "
                         f"largest buckets {sorted(_check_buckets(buckets), key=lambda s: s[0] * s[1])[-3:]}")
    return min(fitting, key=lambda b: b[0] * b[1])


# An image has at most 4 channels (RGBA): (h, w, C) with more "channels" than that and a width
# of at most 4 is a channels-last image passed by mistake.
_MAX_IMAGE_CHANNELS = 4


def pad_to_bucket(images: Sequence[Tensor] | Tensor, buckets: Sequence[Shape], *,
                  pad_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """Pad a batch of (C, h_i, w_i) images (a list of any sizes, or a (B, C, h, w) tensor) at the
    bottom and right to the smallest bucket holding all of them, as Deformable-DETR's
    ``nested_tensor_from_tensor_list`` pads to the batch maximum. Returns ``(batch (B, C, H, W),
    mask (B, H, W))`` with mask True on padding. A channels-last image (more than 4 "channels"
    and a width of at most 4) is rejected."""
    if isinstance(images, Tensor):
        if images.dim() != 4:
            raise ValueError(f"images: expected (B, C, h, w) or a list of (C, h, w), got shape "
                             f"{tuple(images.shape)}")
        images = list(images)
    if not images or any(not isinstance(im, Tensor) or im.dim() != 3 for im in images):
        raise ValueError("images: expected a non-empty list of (C, h, w) tensors, got "
                         f"{[tuple(im.shape) if isinstance(im, Tensor) else type(im).__name__ for im in images]}")
    for im in images:
        if im.shape[0] > _MAX_IMAGE_CHANNELS >= im.shape[2]:
            raise ValueError(f"images: expected (C, h, w) channels-first images, got shape "
                             f"{tuple(im.shape)}, which looks channels-last (h, w, C): use "
                             "image.permute(2, 0, 1)")
    channels = images[0].shape[0]
    if any(im.shape[0] != channels for im in images):
        raise ValueError(f"images: expected the same channel count, got {[im.shape[0] for im in images]}")
    height = max(im.shape[1] for im in images)
    width = max(im.shape[2] for im in images)
    bucket_h, bucket_w = select_bucket(height, width, buckets)
    first = images[0]
    batch = first.new_full((len(images), channels, bucket_h, bucket_w), pad_value)
    mask = torch.ones(len(images), bucket_h, bucket_w, dtype=torch.bool, device=first.device)
    for i, im in enumerate(images):
        batch[i, :, :im.shape[1], :im.shape[2]] = im
        mask[i, :im.shape[1], :im.shape[2]] = False
    return batch, mask


def level_masks(mask: Tensor, spatial_shapes: Sequence[Shape]) -> list[Tensor]:
    """The image mask (B, H, W) resized to each level's (H_l, W_l) by nearest neighbour, as
    Deformable-DETR's backbone does (``F.interpolate(mask[None].float(), size)``). With H, W
    multiples of H/H_l, W/W_l, the valid part of level l is exactly ceil(h / stride) x
    ceil(w / stride), the size a stride-2 conv pyramid gives the unpadded image."""
    if mask.dtype != torch.bool or mask.dim() != 3:
        raise ValueError(f"mask: expected a bool (B, H, W) tensor, got {mask.dtype} {tuple(mask.shape)}")
    return [F.interpolate(mask[None].float(), size=(int(h), int(w)))[0].to(torch.bool)
            for h, w in spatial_shapes]


def get_valid_ratio(mask: Tensor, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """Deformable-DETR's ``get_valid_ratio``: (B, 2) = (valid width / W, valid height / H) of a
    (B, H, W) mask (True on padding), counted along the first column and the first row, in
    ``dtype`` (Deformable-DETR: float32; float64 makes the padded computation match the
    unpadded one to float64 rounding)."""
    if mask.dim() != 3:
        raise ValueError(f"mask: expected (B, H, W), got shape {tuple(mask.shape)}")
    _, height, width = mask.shape
    valid_h = (~mask[:, :, 0]).sum(1)
    valid_w = (~mask[:, 0, :]).sum(1)
    return torch.stack([valid_w.to(dtype) / width, valid_h.to(dtype) / height], -1)


def valid_ratios(masks: Sequence[Tensor], *, dtype: torch.dtype = torch.float32) -> Tensor:
    """(B, N_l, 2) valid ratios (x, y) of the per-level masks (Deformable-DETR's ``valid_ratios``)."""
    return torch.stack([get_valid_ratio(m, dtype=dtype) for m in masks], 1)


def flatten_level_masks(masks: Sequence[Tensor]) -> Tensor:
    """(B, L) padding mask of the flattened value, levels concatenated in order (the
    ``input_padding_mask`` / ``key_padding_mask`` of the MSDA modules)."""
    return torch.cat([m.flatten(1) for m in masks], 1)


def encoder_reference_points(spatial_shapes: Sequence[Shape], ratios: Tensor) -> Tensor:
    """Deformable-DETR's encoder reference points, (B, L, N_l, 2): each pixel centre of each
    padded level, normalised by that level's valid size (so a valid pixel lands where it is in
    the unpadded image), then scaled into every level's padded frame by ``ratios``
    (B, N_l, 2) from :func:`valid_ratios`. Computed in float32 (float64 for float64 ratios)."""
    if ratios.dim() != 3 or ratios.shape[1] != len(spatial_shapes) or ratios.shape[2] != 2:
        raise ValueError(f"ratios: expected (B, N_l={len(spatial_shapes)}, 2), got shape {tuple(ratios.shape)}")
    dtype = ratios.dtype if ratios.dtype == torch.float64 else torch.float32
    ratios = ratios.to(dtype)
    points = []
    for level, (h, w) in enumerate(spatial_shapes):
        ys, xs = torch.meshgrid(torch.linspace(0.5, h - 0.5, h, dtype=dtype, device=ratios.device),
                                torch.linspace(0.5, w - 0.5, w, dtype=dtype, device=ratios.device),
                                indexing="ij")
        ref_y = ys.reshape(-1)[None] / (ratios[:, None, level, 1] * h)
        ref_x = xs.reshape(-1)[None] / (ratios[:, None, level, 0] * w)
        points.append(torch.stack((ref_x, ref_y), -1))
    return torch.cat(points, 1)[:, :, None] * ratios[:, None]
