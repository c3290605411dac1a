"""What a timm user's detection, segmentation and deployment code calls next, against timm's own results on the
same weights: dynamic_img_size, dynamic_img_pad and set_input_size. Small models (width 64, 3
blocks, a 4x4 grid), so the file runs in seconds.
"""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.errors import VitlabError

timm = pytest.importorskip("timm")

# One of each kind timm builds: plain (class token), DINOv2 with registers (patch 14, LayerScale, no class row in
# the table), DeiT distilled (two prefix tokens, two heads), CLIP (pre-norm, eps 1e-5), GAP without class token.
KINDS = {
    "vit_small_patch16_224": {},
    "vit_small_patch14_reg4_dinov2": {},
    "deit_tiny_distilled_patch16_224": {},
    "vit_base_patch16_clip_224": {},
    "vit_small_patch16_224-gap": dict(global_pool="avg", class_token=False),
}


def pair(kind: str, **kw):
    """(timm's model, vitlab's) of `kind`, small, vitlab's holding timm's random weights; both in eval mode."""
    name, extra = kind.split("-")[0], KINDS[kind]
    P = 14 if "patch14" in name else 16
    args = dict(embed_dim=64, depth=3, num_heads=2, img_size=4 * P, num_classes=10, **extra, **kw)
    torch.manual_seed(0)
    theirs = timm.create_model(name, **args).eval()
    ours = vitlab.create_model(name, **args).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def batch(*hw: int) -> torch.Tensor:
    return torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------------------------------
# Any image size: dynamic_img_size=True and set_input_size


@pytest.mark.parametrize("kind", list(KINDS))
def test_dynamic_img_size_equals_timms_at_other_sizes(kind):
    theirs, ours = pair(kind, dynamic_img_size=True)
    assert ours.pretrained_cfg["fixed_input_size"] is False
    P = ours.cfg.patch_size
    for hw in [(4 * P, 4 * P), (6 * P, 3 * P), (2 * P, 7 * P)]:
        x = batch(*hw)
        with torch.no_grad():
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
            maps = ours.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
            for t, o in zip(theirs.forward_intermediates(x, indices=[0, 2], intermediates_only=True), maps):
                assert o.shape == (2, 64, hw[0] // P, hw[1] // P)
                torch.testing.assert_close(o, t, atol=0, rtol=0)
    with pytest.raises(
        VitlabError,
        match=rf"input image is {4 * P + 1}x{4 * P}: dynamic_img_size takes sides that are multiples.*dynamic_img_pad",
    ):
        ours(batch(4 * P + 1, 4 * P))


@pytest.mark.parametrize("kind", list(KINDS))
def test_dynamic_img_pad_equals_timms_at_sides_that_are_no_multiples_of_the_patch(kind):
    theirs, ours = pair(kind, dynamic_img_size=True, dynamic_img_pad=True)
    P = ours.cfg.patch_size
    for hw in [(4 * P + 1, 4 * P), (3 * P - 5, 5 * P + 7), (128, 96)]:
        x = batch(*hw)
        grid = (-(-hw[0] // P), -(-hw[1] // P))  # rounded up: the padded image's grid
        with torch.no_grad():
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
            (o,), (t,) = (
                ours.forward_intermediates(x, indices=1, intermediates_only=True),
                theirs.forward_intermediates(x, indices=1, intermediates_only=True),
            )
        assert o.shape == t.shape == (2, 64, *grid)
        torch.testing.assert_close(o, t, atol=0, rtol=0)
    with pytest.raises(VitlabError, match="dynamic_img_pad=True pads images of other sizes.*give both"):
        vitlab.create_model("vit_mini", dynamic_img_pad=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_set_input_size_equals_timms(kind):
    theirs, ours = pair(kind)
    P = ours.cfg.patch_size
    theirs.set_input_size(img_size=(6 * P, 5 * P))
    ours.set_input_size(img_size=(6 * P, 5 * P))
    assert ours.pos_embed.shape == theirs.pos_embed.shape and ours.patch_embed.grid_size == (6, 5)
    assert ours.pretrained_cfg["input_size"] == (3, 6 * P, 5 * P)  # vitlab's preprocessing follows
    x = batch(6 * P, 5 * P)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
    with pytest.raises(VitlabError, match="build the model with img_size"):
        ours(batch(4 * P, 4 * P))  # built for the new size only


def test_fixed_input_size_follows_the_model_and_other_position_tables_are_refused_by_name():
    assert vitlab.create_model("vit_mini").pretrained_cfg["fixed_input_size"] is True
    assert vitlab.create_model("vit_mini", dynamic_img_size=True).pretrained_cfg["fixed_input_size"] is False
    with pytest.raises(VitlabError, match="dynamic_img_size=True resamples the 1-D position table.*'sincos2d'"):
        vitlab.create_model("vit_mini", pos_embed="sincos2d", dynamic_img_size=True)
    with pytest.raises(VitlabError, match="set_input_size resamples the 1-D position table.*'relative'"):
        vitlab.create_model("vit_mini", pos_embed="relative").set_input_size(img_size=64)
