"""nkilib_msda.buckets: bounded shape sets, and padded == unpadded on valid queries (float64).

Why equality holds (docs/torch.md, "Static shapes on Trainium"): a level's valid region is the
unpadded feature map (bucket sides are multiples of the coarsest stride), the padding of the
value is zero (input_padding_mask), and a location normalised to the unpadded map, times the
level's valid ratio, is the same pixel coordinate in the padded map. Bilinear corners beyond
the valid region read zeros in both cases, so the outputs agree up to float64 rounding.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

import nkilib_msda
from nkilib_msda import buckets as bk

STRIDES = (2, 4, 8)  # a stride-2 conv pyramid, 3 levels
COARSEST = STRIDES[-1]


def _level_shapes(height, width):
    """Feature-map sizes of a stride-2 conv pyramid (kernel 3, padding 1): ceil(n / stride)."""
    return tuple((-(-height // s), -(-width // s)) for s in STRIDES)


def test_bucket_grid_and_select_bucket():
    grid = bk.bucket_grid(100, 70, 32)
    assert grid[0] == (32, 32) and len(grid) == 4 * 3 and (128, 96) in grid
    assert bk.select_bucket(33, 20, grid) == (64, 32)
    assert bk.select_bucket(32, 32, grid) == (32, 32)
    with pytest.raises(ValueError, match=r"no bucket holds an image of \(height, width\) = \(200, 20\)"):
        bk.select_bucket(200, 20, grid)
    with pytest.raises(ValueError, match="step"):
        bk.bucket_grid(100, 100, 0)


def test_distinct_spatial_shape_sets_stay_bounded_over_many_random_sizes():
    rng = random.Random(0)
    buckets = ((512, 512), (640, 832), (832, 640), (832, 1344), (1344, 832), (1344, 1344))
    raw, padded = set(), set()
    for _ in range(2000):
        batch = [(rng.randint(200, 1333), rng.randint(200, 1333)) for _ in range(rng.randint(1, 4))]
        height, width = max(h for h, _ in batch), max(w for _, w in batch)
        raw.add(_level_shapes(height, width))
        padded.add(_level_shapes(*bk.select_bucket(height, width, buckets)))
    assert len(raw) > 1000  # without buckets: a new graph almost every step
    assert len(padded) <= len(buckets)


def test_pad_to_bucket_pads_bottom_right_and_marks_the_padding():
    images = [torch.randn(3, 10, 7), torch.randn(3, 5, 13)]
    batch, mask = bk.pad_to_bucket(images, [(8, 8), (16, 16), (32, 32)], pad_value=-1.0)
    assert batch.shape == (2, 3, 16, 16) and mask.shape == (2, 16, 16) and mask.dtype == torch.bool
    assert torch.equal(batch[0, :, :10, :7], images[0]) and torch.equal(batch[1, :, :5, :13], images[1])
    assert (batch[0, :, 10:] == -1).all() and (batch[0, :, :, 7:] == -1).all()
    assert (~mask[0]).sum() == 70 and not mask[0, :10, :7].any() and mask[0, 10:].all()
    torch.testing.assert_close(bk.get_valid_ratio(mask), torch.tensor([[7 / 16, 10 / 16], [13 / 16, 5 / 16]]))
    with pytest.raises(ValueError, match="images"):
        bk.pad_to_bucket([torch.randn(3, 4, 4), torch.randn(1, 4, 4)], [(8, 8)])


def test_level_masks_give_exactly_the_unpadded_feature_sizes():
    rng = random.Random(1)
    for _ in range(50):
        h, w = rng.randint(1, 60), rng.randint(1, 60)
        _, mask = bk.pad_to_bucket([torch.zeros(1, h, w)], bk.bucket_grid(64, 64, COARSEST))
        padded_shapes = tuple((mask.shape[1] // s, mask.shape[2] // s) for s in STRIDES)
        for level_mask, (uh, uw) in zip(bk.level_masks(mask, padded_shapes), _level_shapes(h, w)):
            assert int((~level_mask[0, :, 0]).sum()) == uh and int((~level_mask[0, 0, :]).sum()) == uw
            assert not level_mask[0, :uh, :uw].any() and level_mask[0].sum() == level_mask[0].numel() - uh * uw


def _padded_problem(sizes, bucket_step=16, channels=8, seed=0):
    """Per-image unpadded level maps (B of them, sizes differ), and the padded batch built from
    them: (padded flat (B, L_pad, C), padded shapes, level masks, unpadded flats, unpadded shapes)."""
    g = torch.Generator().manual_seed(seed)
    _, mask = bk.pad_to_bucket([torch.zeros(1, h, w) for h, w in sizes],
                               bk.bucket_grid(64, 64, bucket_step))
    padded_shapes = tuple((mask.shape[1] // s, mask.shape[2] // s) for s in STRIDES)
    masks = bk.level_masks(mask, padded_shapes)
    unpadded_flat, unpadded_shapes, padded_levels = [], [], []
    for h, w in sizes:
        shapes = _level_shapes(h, w)
        maps = [torch.randn(channels, uh, uw, dtype=torch.float64, generator=g) for uh, uw in shapes]
        unpadded_shapes.append(shapes)
        unpadded_flat.append(torch.cat([m.flatten(1).T for m in maps])[None])
        # padding holds garbage: the padding mask must keep it out
        padded_levels.append([F.pad(m, (0, ph_w - m.shape[2], 0, ph_h - m.shape[1]), value=7.0)
                              for m, (ph_h, ph_w) in zip(maps, padded_shapes)])
    padded_flat = torch.stack([torch.cat([m.flatten(1).T for m in levels]) for levels in padded_levels])
    return padded_flat, padded_shapes, masks, unpadded_flat, unpadded_shapes


def test_op_on_padded_value_equals_unpadded_with_valid_ratios():
    sizes = [(37, 21), (50, 44)]
    padded_flat, padded_shapes, masks, unpadded_flat, unpadded_shapes = _padded_problem(sizes)
    ratios = bk.valid_ratios(masks, dtype=torch.float64)  # (B, N_l, 2)
    value = padded_flat.masked_fill(bk.flatten_level_masks(masks)[..., None], 0.0).view(2, -1, 2, 4)
    g = torch.Generator().manual_seed(3)
    loc_u = torch.rand(2, 9, 2, 3, 4, 2, dtype=torch.float64, generator=g) * 1.4 - 0.2
    attn = torch.rand(2, 9, 2, 3, 4, dtype=torch.float64, generator=g)
    padded = nkilib_msda.multi_scale_deformable_attention(
        value, padded_shapes, None, loc_u * ratios[:, None, None, :, None, :], attn)
    for i in range(2):
        unpadded = nkilib_msda.multi_scale_deformable_attention(
            unpadded_flat[i].view(1, -1, 2, 4), unpadded_shapes[i], None, loc_u[i:i + 1], attn[i:i + 1])
        torch.testing.assert_close(padded[i:i + 1], unpadded, rtol=1e-12, atol=1e-12)
    # float32 ratios (Deformable-DETR's) agree to float32 rounding of the locations only
    ratios32 = bk.valid_ratios(masks)
    assert ratios32.dtype == torch.float32 and (ratios32.double() - ratios).abs().max() < 1e-7
    # and the identity is not vacuous: without the ratios the padded call differs
    wrong = nkilib_msda.multi_scale_deformable_attention(value, padded_shapes, None, loc_u, attn)
    assert (wrong[:1] - unpadded_first(unpadded_flat, unpadded_shapes, loc_u, attn)).abs().max() > 1e-3


def unpadded_first(unpadded_flat, unpadded_shapes, loc_u, attn):
    return nkilib_msda.multi_scale_deformable_attention(
        unpadded_flat[0].view(1, -1, 2, 4), unpadded_shapes[0], None, loc_u[:1], attn[:1])


@pytest.mark.parametrize("ref_dims", [2, 4])
def test_msdeformattn_decoder_queries_padded_equal_unpadded(ref_dims):
    torch.manual_seed(4)
    sizes = [(29, 40), (56, 17)]
    padded_flat, padded_shapes, masks, unpadded_flat, unpadded_shapes = _padded_problem(sizes, seed=5)
    attn = nkilib_msda.MSDeformAttn(d_model=8, n_levels=3, n_heads=2, n_points=3).double()
    with torch.no_grad():  # non-trivial offsets and weights (the init has zero weights)
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ratios = bk.valid_ratios(masks, dtype=torch.float64)
    query = torch.randn(2, 6, 8, dtype=torch.float64)
    ref_u = torch.rand(2, 6, 3, ref_dims, dtype=torch.float64)  # in the unpadded frame, per image
    scale = ratios if ref_dims == 2 else torch.cat([ratios, ratios], -1)  # Deformable-DETR's decoder
    padded = attn(query, ref_u * scale[:, None], padded_flat, padded_shapes, None,
                  bk.flatten_level_masks(masks))
    for i in range(2):
        unpadded = attn(query[i:i + 1], ref_u[i:i + 1], unpadded_flat[i], unpadded_shapes[i], None)
        torch.testing.assert_close(padded[i:i + 1], unpadded, rtol=1e-11, atol=1e-12)


def test_encoder_on_padded_batch_equals_unpadded_on_valid_pixels():
    torch.manual_seed(6)
    sizes = [(43, 30), (24, 61)]
    padded_flat, padded_shapes, masks, unpadded_flat, unpadded_shapes = _padded_problem(sizes, seed=7)
    attn = nkilib_msda.MSDeformAttn(d_model=8, n_levels=3, n_heads=2, n_points=2).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ratios = bk.valid_ratios(masks, dtype=torch.float64)
    padding = bk.flatten_level_masks(masks)
    ref = bk.encoder_reference_points(padded_shapes, ratios)
    assert ref.shape == (2, padded_flat.shape[1], 3, 2) and ref.dtype == torch.float64
    padded = attn(padded_flat, ref, padded_flat, padded_shapes, None, padding)
    for i in range(2):
        ones = torch.ones(1, 3, 2, dtype=torch.float64)
        ref_u = bk.encoder_reference_points(unpadded_shapes[i], ones)
        unpadded = attn(unpadded_flat[i], ref_u, unpadded_flat[i], unpadded_shapes[i], None)
        valid = padded[i][~padding[i]]  # valid pixels, level by level, row-major: the unpadded order
        assert valid.shape == unpadded[0].shape
        torch.testing.assert_close(valid, unpadded[0], rtol=1e-11, atol=1e-12)


def test_encoder_reference_points_match_deformable_detr_for_an_unpadded_map():
    shapes = ((3, 5), (2, 1))
    ref = bk.encoder_reference_points(shapes, torch.ones(1, 2, 2))
    assert ref.dtype == torch.float32
    # level 0, pixel (row 1, col 3): centre ((3 + 0.5) / 5, (1 + 0.5) / 3) on every level
    torch.testing.assert_close(ref[0, 1 * 5 + 3], torch.tensor([[3.5 / 5, 1.5 / 3]] * 2))
    assert math.isclose(float(ref[0, 15 + 1, 0, 1]), 1.5 / 2)


def test_pad_to_bucket_rejects_a_channels_last_image():
    """An (h, w, 3) image is not 3 channels of h x w: it used to be padded as h channels."""
    buckets = bk.bucket_grid(max_height=256, max_width=256, step=128)
    with pytest.raises(ValueError, match=r"^images: expected \(C, h, w\) channels-first images, "
                                         r"got shape \(100, 120, 3\), which looks channels-last "
                                         r"\(h, w, C\): use image.permute\(2, 0, 1\)$"):
        bk.pad_to_bucket([torch.randn(100, 120, 3)], buckets)
    with pytest.raises(ValueError, match=r"^images: expected \(C, h, w\) channels-first"):
        bk.pad_to_bucket(torch.randn(2, 100, 120, 3), buckets)
    batch, mask = bk.pad_to_bucket([torch.randn(3, 100, 120), torch.randn(1, 90, 4)[:1].expand(3, -1, -1)],
                                   buckets)
    assert batch.shape == (2, 3, 128, 128) and mask.shape == (2, 128, 128)
