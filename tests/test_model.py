"""The model against the paper (Eq. 1-4, Table 1) and against timm's VisionTransformer."""

import pytest
import torch
from torch import nn

from vitlab import VisionTransformer, ViTConfig, VitlabError, count_parameters, create_model, model_names
from vitlab.models.registry import VARIANTS

timm = pytest.importorskip("timm")


def _randomize_head(model: nn.Module, seed: int = 0) -> nn.Module:
    """The paper zero-initialises the head (Section 3.2), which makes every logit 0 and blocks all
    gradients at step 0; tests that compare logits or gradients need a head that is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=g) * 0.1)
        model.head.bias.copy_(torch.randn(model.head.bias.shape, generator=g) * 0.1)
    return model


# --- Table 1: parameter counts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected, tolerance",
    [
        ("vit_base_patch16_224", 86_567_656, 0),  # torchvision's exact count, 1000 classes
        ("vit_base_patch32_224", 88_224_232, 0),
        ("vit_large_patch16_224", 304_326_632, 0),
        ("vit_huge_patch14_224", 632_000_000, 0.005),  # Table 1: "632M"
    ],
)
def test_parameter_counts_match_table_1(name, expected, tolerance):
    with torch.device("meta"):  # count without allocating 2.5 GB
        model = create_model(name)
    n = count_parameters(model)
    assert abs(n - expected) <= tolerance * expected, (name, n, expected)


@pytest.mark.parametrize("name", sorted(n for n, v in VARIANTS.items() if v.is_vit))
def test_every_variant_builds_runs_and_trains(name):
    """Each variant's width, heads and patch size, at depth 2 and a 2x2 patch grid to stay fast:
    right output shape, finite logits, and a gradient for every parameter."""
    cfg = VARIANTS[name].config
    with torch.device("meta"):
        full = VisionTransformer(cfg)
    assert len(full.blocks) == cfg.depth
    small = VisionTransformer(cfg.replace(depth=2, img_size=2 * cfg.patch_size, num_classes=5))
    _randomize_head(small)
    x = torch.randn(2, 3, 2 * cfg.patch_size, 2 * cfg.patch_size)
    logits = small(x)
    assert logits.shape == (2, 5)
    assert torch.isfinite(logits).all()
    logits.square().sum().backward()
    missing = [n for n, p in small.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"parameters without gradient: {missing}"


def test_zero_initialised_head():
    model = create_model("vit_mini_x")
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    assert torch.equal(model(torch.randn(2, 3, 32, 32)), torch.zeros(2, 2))


def test_model_names_cover_the_issue():
    for name in [
        "vit_tiny_patch16_224",
        "vit_small_patch32_224",
        "vit_base_patch16_384",
        "vit_huge_patch14_224",
        "vit_large_patch32_224",
        "vit_mini_x",
        "resnet_mini",
    ]:
        assert name in model_names()
    mini = VARIANTS["vit_mini_x"].config  # the mini experiment (vitlab demo)
    assert (mini.img_size, mini.patch_size, mini.dim, mini.heads, mini.depth, mini.hidden_dim, mini.num_classes) == (
        (32, 32),
        4,
        32,
        4,
        2,
        64,
        2,
    )


# --- the two attention paths ---------------------------------------------------------------------------


@pytest.mark.parametrize("pos_embed", ["learned", "learned2d", "sincos2d", "relative", "none"])
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_fast_and_explicit_attention_agree(pos_embed, pool):
    torch.manual_seed(0)
    model = _randomize_head(create_model("vit_mini_x", pos_embed=pos_embed, pool=pool, depth=3)).eval()
    if model.rel_pos is not None:  # a bias that is not ~0, so the test sees it
        for rp in model.rel_pos:
            nn.init.normal_(rp.table, std=1.0)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        fast = model(x)
        explicit, attns = model(x, return_attention=True)
    assert (fast - explicit).abs().max().item() <= 1e-5
    assert len(attns) == 3 and attns[0].shape == (4, 4, 65, 65)
    torch.testing.assert_close(attns[0].sum(-1), torch.ones(4, 4, 65), atol=1e-5, rtol=0)


def test_return_attention_for_chosen_layers_only():
    model = create_model("vit_mini_x", depth=4).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _, all_layers = model(x, return_attention=True)
        _, chosen = model(x, return_attention=[1, -1])
    assert len(chosen) == 2
    torch.testing.assert_close(chosen[0], all_layers[1])
    torch.testing.assert_close(chosen[1], all_layers[3])
    with pytest.raises(VitlabError, match="layers 0..3"):
        model(x, return_attention=[7])


def test_explicit_attention_is_softmax_qk_by_hand():
    """Eq. 5-7 of Appendix A, recomputed from the qkv weights of block 0."""
    torch.manual_seed(1)
    model = create_model("vit_mini_x").eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        _, (attn0, _) = model(x, return_attention=True)
        z = model.blocks[0].norm1(model.embed(x))  # (1, 65, 32)
        q, k, v = model.blocks[0].attn.qkv(z).split(32, dim=-1)  # each (1, 65, 32)
        q0, k0 = q[..., :8], k[..., :8]  # head 0: d = 32 / 4 = 8
        expected = torch.softmax(q0 @ k0.transpose(-2, -1) / 8**0.5, dim=-1)  # (1, 65, 65)
    torch.testing.assert_close(attn0[:, 0], expected, atol=1e-6, rtol=1e-5)


# --- Eq. 1: patch embedding and position -----------------------------------------------------------


def test_conv_and_linear_patch_embedding_agree():
    conv = create_model("vit_mini_x", patch_embed="conv").eval()
    linear = create_model("vit_mini_x", patch_embed="linear").eval()
    state = conv.state_dict()
    state["patch_embed.proj.weight"] = state["patch_embed.proj.weight"].reshape(32, -1)  # (D, C, P, P) -> (D, C*P*P)
    linear.load_state_dict(state)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert (conv.patch_embed(x) - linear.patch_embed(x)).abs().max().item() < 1e-5
        assert (conv.forward_features(x) - linear.forward_features(x)).abs().max().item() < 1e-5


def _permute_patches(x: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    B, C, H, W = x.shape
    gh, gw = H // patch, W // patch
    tiles = x.reshape(B, C, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C, patch, patch)
    tiles = tiles[:, perm]
    return tiles.reshape(B, gh, gw, C, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def test_without_position_embedding_patch_order_does_not_matter():
    """Section 3.1: self-attention is permutation-equivariant; only E_pos tells where a patch is."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    perm = torch.randperm(64)
    shuffled = _permute_patches(x, 4, perm)
    assert not torch.equal(x, shuffled)
    blind = _randomize_head(create_model("vit_mini_x", pos_embed="none")).eval()
    seeing = _randomize_head(create_model("vit_mini_x", pos_embed="learned")).eval()
    with torch.no_grad():
        assert (blind(x) - blind(shuffled)).abs().max().item() < 1e-5
        assert (seeing(x) - seeing(shuffled)).abs().max().item() > 1e-3


def test_sincos_embedding_is_fixed_and_not_saved():
    model = create_model("vit_mini_x", pos_embed="sincos2d")
    assert not any("pos_embed" in k for k in model.state_dict())
    assert model.patch_pos_embed().shape == (1, 64, 32)


# --- timm parity -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, img, batch",
    [("vit_tiny_patch16_224", 224, 2), ("vit_small_patch16_224", 224, 2), ("vit_base_patch16_224", 224, 1)],
)
def test_timm_state_dict_loads_strictly_and_gives_the_same_logits(name, img, batch):
    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False).eval()
    ours = create_model(name).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(batch, 3, img, img)
    with torch.no_grad():
        expected, found = reference(x), ours(x)
    assert expected.abs().max() > 0  # timm's head is not zero: the comparison means something
    assert (expected - found).abs().max().item() <= 1e-5


def test_timm_global_average_pooling_parity():
    torch.manual_seed(0)
    reference = timm.create_model("vit_tiny_patch16_224", global_pool="avg", class_token=False, depth=4).eval()
    ours = create_model("vit_tiny_patch16_224", pool="mean", class_token=False, depth=4).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (reference(x) - ours(x)).abs().max().item() <= 1e-5


# --- errors that teach ---------------------------------------------------------------------------------


def test_image_size_not_divisible_by_patch_names_both():
    with pytest.raises(VitlabError, match=r"img_size 30x30 is not divisible by patch_size 4"):
        create_model("vit_mini_x", img_size=30)


def test_dim_not_divisible_by_heads():
    with pytest.raises(VitlabError, match=r"dim 32 is not divisible by heads 5"):
        create_model("vit_mini_x", heads=5)


def test_wrong_input_size_names_both_sizes():
    with pytest.raises(VitlabError, match=r"input image is 64x64 but the model was built for 32x32"):
        create_model("vit_mini_x")(torch.randn(1, 3, 64, 64))


def test_pos_embed_length_mismatch_explains_the_fix():
    state = create_model("vit_mini_x", img_size=64).state_dict()  # 16x16 grid: 257 rows
    with pytest.raises(VitlabError, match=r"pos_embed has 257 rows but this model expects 65 .*resample"):
        create_model("vit_mini_x").load_state_dict(state)


def test_unknown_model_and_unknown_override():
    with pytest.raises(VitlabError, match=r"unknown model 'vit_bass_patch16_224'; did you mean vit_base_patch16_224"):
        create_model("vit_bass_patch16_224")
    with pytest.raises(VitlabError, match=r"unknown ViTConfig field\(s\) \['depht'\]"):
        create_model("vit_mini_x", depht=3)
    with pytest.raises(VitlabError, match=r"pos_embed must be one of learned, learned2d, sincos2d, relative, none"):
        ViTConfig(pos_embed="rope")


def test_hybrid_stem_keeps_the_patch_grid():
    model = _randomize_head(create_model("vit_mini_x", stem="hybrid", stem_width=8))
    x = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(x)
    assert tokens.shape == (2, 65, 32)  # 8x8 grid from a stem that downsamples by P = 4, plus the class token
    model(x).sum().backward()
    assert model.patch_embed.backbone.stem[0].weight.grad.abs().sum() > 0


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    a = _randomize_head(create_model("vit_mini_x", depth=3))
    b = _randomize_head(create_model("vit_mini_x", depth=3))
    b.load_state_dict(a.state_dict())
    b.set_grad_checkpointing(True)
    x = torch.randn(4, 3, 32, 32)
    a(x).square().sum().backward()
    b(x).square().sum().backward()
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=1e-5, msg=n)
