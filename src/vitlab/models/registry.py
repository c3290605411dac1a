"""Named model variants, as data: each a configuration and the source its numbers come from.

Sizes: Table 1 of the paper (Base, Large, Huge); Tiny and Small from DeiT (Touvron et al. 2021,
Table 1), which the paper's code base adopted. `vit_mini_x` is the model of the mini experiment
(`vitlab demo`: a tiny ViT on the synthetic dataset X). A ViT name reads
`vit_{size}_patch{P}_{resolution}`, as in timm. The CNN baselines (`resnet_*`) are here too, so that
one registry answers "which models are there" for every command.

The family that followed the paper has timm's names, so a timm checkpoint's config.json names its
vitlab model: DeiT and DeiT-distilled (Touvron et al. 2021), DeiT III (Touvron et al. 2022), DINO
(Caron et al. 2021), DINOv2 with and without registers (Oquab et al. 2023; Darcet et al. 2023), CLIP
image towers (Radford et al. 2021), and timm's GAP, register and no-qkv-bias ViTs. Each carries the
preprocessing its source uses (`PretrainedCfg`, from `PREPROCESSING`), which a checkpoint without its
own preprocessing then gets.

Each ViT that timm also has names its default weights on the Hugging Face hub (`HUB_IDS`, timm 1.0.31's
default tag of the name), which `create_model(name, pretrained=True)` loads from the local hub cache,
and carries that tag's preprocessing (the CLIP towers: timm's, whose default weights are ImageNet
fine-tunes).

Nothing here loads weights or builds a module: `vitlab.models.factory.create_model` does, from these
entries.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from vitlab.errors import VitlabError
from vitlab.models.cnn import ResNetConfig
from vitlab.models.pretrained_cfg import PREPROCESSING, PretrainedCfg
from vitlab.models.vit import ViTConfig

# (dim, depth, heads, source)
SIZES = {
    "tiny": (192, 12, 3, "DeiT Table 1 (ViT-Ti)"),
    "small": (384, 12, 6, "DeiT Table 1 (ViT-S)"),
    "base": (768, 12, 12, "ViT paper Table 1 (ViT-Base)"),
    "large": (1024, 24, 16, "ViT paper Table 1 (ViT-Large)"),
    "huge": (1280, 32, 16, "ViT paper Table 1 (ViT-Huge)"),
}


@dataclass(frozen=True)
class Variant:
    config: ViTConfig | ResNetConfig
    source: str
    # The eval preprocessing of a randomly initialised model: the original JAX release's
    # normalisation, (x - 0.5) / 0.5, with timm's bicubic resize and 0.9 centre crop.
    pretrained_cfg: PretrainedCfg = PretrainedCfg()

    @property
    def is_vit(self) -> bool:
        return isinstance(self.config, ViTConfig)

    def describe(self) -> str:
        c = self.config
        if not self.is_vit:
            return f"width={c.width} blocks/stage={c.blocks} img={c.img_size[0]}  ({self.source})"
        return f"{c.describe()}  ({self.source})"


# The default weights of each name timm has: timm 1.0.31's default tag (`timm.models.get_pretrained_cfg(name)`).
# A tag alone means the repository timm/<name>.<tag>; a full id is a repository of another timm name.
HUB_IDS = {
    **{f"vit_{s}_patch{p}_224": "augreg_in21k_ft_in1k" for s in ("tiny", "small", "base", "large") for p in (16, 32)},
    "vit_tiny_patch32_224": None,  # timm has the name, but no weights for it
    "vit_base_patch16_224": "augreg2_in21k_ft_in1k",
    "vit_large_patch32_224": "orig_in21k",
    "vit_base_patch16_384": "augreg_in21k_ft_in1k",
    "vit_large_patch16_384": "augreg_in21k_ft_in1k",
    "vit_huge_patch14_224": "orig_in21k",
    **{f"deit_{s}_patch16_224": "fb_in1k" for s in ("tiny", "small", "base")},
    **{f"deit_{s}_distilled_patch16_224": "fb_in1k" for s in ("tiny", "small", "base")},
    **{f"deit3_{s}_patch16_224": "fb_in1k" for s in ("small", "base")},
    **{f"vit_{s}_patch{p}_224_dino": f"timm/vit_{s}_patch{p}_224.dino" for s in ("small", "base") for p in (16, 8)},
    **{f"vit_{s}_patch14_dinov2": "lvd142m" for s in ("small", "base", "large")},
    **{f"vit_{s}_patch14_reg4_dinov2": "lvd142m" for s in ("small", "base", "large")},
    **{f"vit_{s}_patch{p}_clip_224": "laion2b_ft_in12k_in1k" for s, p in (("base", 32), ("base", 16), ("large", 14))},
    "vit_base_patch32_clip_quickgelu_224": "timm/vit_base_patch32_clip_224.laion400m_e32",
    "vit_base_patch16_clip_quickgelu_224": "timm/vit_base_patch16_clip_224.metaclip_2pt5b",
    "vit_large_patch14_clip_quickgelu_224": "timm/vit_large_patch14_clip_224.dfn2b",
    "vit_base_patch16_224_miil": "in21k",
    "vit_medium_patch16_gap_256": "sw_in12k_ft_in1k",
    "vit_medium_patch16_reg4_gap_256": "sbb_in12k_ft_in1k",
}


def hub_id(name: str) -> str | None:
    """The hub repository of `name`'s default weights (timm's), or None when there are none."""
    tag = HUB_IDS.get(name)
    return tag if tag is None or "/" in tag else f"timm/{name}.{tag}"


# The CLIP towers' preprocessing as timm's default tag of the name has it (ImageNet fine-tunes and
# the quick-GELU towers' releases), where it is not OpenAI CLIP's crop 1.0.
CLIP_TIMM_PREPROCESSING = {
    "vit_base_patch32_clip_224": dict(crop_pct=0.9),
    "vit_base_patch16_clip_224": dict(crop_pct=0.95),
    "vit_large_patch14_clip_224": dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "vit_base_patch32_clip_quickgelu_224": dict(crop_pct=0.9),
}


def _vit(size: str, patch: int, img: int) -> Variant:
    dim, depth, heads, source = SIZES[size]
    config = ViTConfig(img_size=img, patch_size=patch, dim=dim, depth=depth, heads=heads)
    if img < 384:
        return Variant(config, source)
    # timm's ViTs at 384 (vit_base_patch16_384.augreg_in21k_ft_in1k, ...): the whole image, no crop
    return Variant(
        config, source, PretrainedCfg(**{**PREPROCESSING["timm"], "crop_pct": 1.0}, input_size=(3, img, img))
    )


def _member(
    size: str, patch: int, img: int, source: str, preprocessing: str, num_classes: int = 1000, **options
) -> Variant:
    """A ViT of the family: a Table 1 (or DeiT) size with the family's options, and its source's preprocessing."""
    dim, depth, heads, _ = SIZES[size]
    config = ViTConfig(
        img_size=img, patch_size=patch, dim=dim, depth=depth, heads=heads, num_classes=num_classes, **options
    )
    return Variant(
        config, source, PretrainedCfg(**PREPROCESSING[preprocessing], input_size=(3, img, img), num_classes=num_classes)
    )


DEIT = "DeiT (Touvron et al. 2021), Table 1; timm deit_*"
DEIT3 = "DeiT III (Touvron et al. 2022); timm deit3_*"
DINO = "DINO (Caron et al. 2021), self-supervised; timm vit_*.dino"
DINOV2 = "DINOv2 (Oquab et al. 2023); timm vit_*_dinov2"
DINOV2_REG = "DINOv2 with registers (Darcet et al. 2023); timm vit_*_reg4_dinov2"
CLIP = "CLIP image tower (Radford et al. 2021), the head is its image-text projection; timm vit_*_clip_*"
CLIP_QUICK = CLIP.replace("; timm", " (OpenAI's weights); timm")
CLIP_OPTIONS = dict(pre_norm=True, patch_bias=False, norm_eps=1e-5)
TIMM_GAP = dict(class_token=False, pool="mean", img_size=256, dim=512, depth=12, heads=8)  # timm's ViT-Medium
TIMM_GAP_PREPROCESSING = PretrainedCfg(**{**PREPROCESSING["timm"], "crop_pct": 0.95}, input_size=(3, 256, 256))

FAMILY: dict[str, Variant] = {
    **{f"deit_{s}_patch16_224": _member(s, 16, 224, DEIT, "deit") for s in ("tiny", "small", "base")},
    **{
        f"deit_{s}_distilled_patch16_224": _member(s, 16, 224, DEIT + ", distilled", "deit", dist_token=True)
        for s in ("tiny", "small", "base")
    },
    **{
        f"deit3_{s}_patch16_224": _member(s, 16, 224, DEIT3, "deit", layer_scale=1e-6, no_embed_class=True)
        for s in ("small", "base")
    },
    **{
        f"vit_{s}_patch{p}_224_dino": _member(s, p, 224, DINO, "dino", num_classes=0)
        for s in ("small", "base")
        for p in (16, 8)
    },
    **{
        f"vit_{s}_patch14_dinov2": _member(s, 14, 518, DINOV2, "dinov2", num_classes=0, layer_scale=1e-5)
        for s in ("small", "base", "large")
    },
    **{
        f"vit_{s}_patch14_reg4_dinov2": _member(
            s, 14, 518, DINOV2_REG, "dinov2", num_classes=0, layer_scale=1e-5, reg_tokens=4, no_embed_class=True
        )
        for s in ("small", "base", "large")
    },
    **{
        f"vit_{s}_patch{p}_clip{q}_224": _member(
            s,
            p,
            224,
            CLIP_QUICK if q else CLIP,
            "clip",
            num_classes=512 if s == "base" else 768,
            act="quick_gelu" if q else "gelu",
            **CLIP_OPTIONS,
        )
        for s, p in (("base", 32), ("base", 16), ("large", 14))
        for q in ("", "_quickgelu")
    },
    "vit_base_patch16_224_miil": _member(
        "base",
        16,
        224,
        "ImageNet-21K pre-training (Ridnik et al. 2021); timm vit_base_patch16_224_miil",
        "miil",
        qkv_bias=False,
    ),
    "vit_medium_patch16_gap_256": Variant(
        ViTConfig(**TIMM_GAP, fc_norm=False, qkv_bias=False, layer_scale=1e-6),
        "timm's ViT-Medium, the mean of the patch tokens after the final LayerNorm; timm vit_medium_patch16_gap_256",
        TIMM_GAP_PREPROCESSING,
    ),
    "vit_medium_patch16_reg4_gap_256": Variant(
        ViTConfig(**TIMM_GAP, reg_tokens=4, no_embed_class=True, layer_scale=1e-5),
        "timm's ViT-Medium with registers (Darcet et al. 2023); timm vit_medium_patch16_reg4_gap_256",
        TIMM_GAP_PREPROCESSING,
    ),
}


_VARIANTS: dict[str, Variant] = {
    **{f"vit_{s}_patch{p}_224": _vit(s, p, 224) for s in ("tiny", "small", "base", "large") for p in (16, 32)},
    "vit_base_patch16_384": _vit("base", 16, 384),
    "vit_large_patch16_384": _vit("large", 16, 384),
    "vit_huge_patch14_224": _vit("huge", 14, 224),
    **FAMILY,
    # The mini experiment: 32x32x3 images, patch 4 (64 patches), D=32, 4 heads, 2 blocks, MLP 64, 2 classes.
    "vit_mini_x": Variant(
        ViTConfig(img_size=32, patch_size=4, dim=32, depth=2, heads=4, mlp_dim=64, num_classes=2),
        "the mini experiment, on dataset X",
    ),
    # A small ViT for 32 px data (digits, shapes): 0.2M parameters, comparable to resnet_mini.
    "vit_mini": Variant(
        ViTConfig(img_size=32, patch_size=4, dim=64, depth=4, heads=4, mlp_dim=128, num_classes=10),
        "vitlab: laptop-scale ViT for 32 px images",
    ),
    # The CNN side of the paper's comparisons (Section 4): CIFAR-style ResNets of the small ViTs' size.
    "resnet_mini": Variant(ResNetConfig(width=16, blocks=1), "vitlab: CIFAR-style ResNet, 3 stages of BasicBlocks"),
    "resnet_small": Variant(ResNetConfig(width=32, blocks=2), "vitlab: CIFAR-style ResNet, 3 stages of BasicBlocks"),
}


def _with_timm_defaults(name: str, variant: Variant) -> Variant:
    """The variant with its default weights' hub id and, for a CLIP tower, timm's preprocessing of the name;
    the CNN baselines' first convolution is their stem's."""
    if not variant.is_vit:
        return replace(variant, pretrained_cfg=variant.pretrained_cfg.replace(first_conv="stem.0"))
    pcfg = variant.pretrained_cfg.replace(hf_hub_id=hub_id(name), **CLIP_TIMM_PREPROCESSING.get(name, {}))
    return replace(variant, pretrained_cfg=pcfg)


VARIANTS: dict[str, Variant] = {name: _with_timm_defaults(name, v) for name, v in _VARIANTS.items()}


def model_names() -> list[str]:
    """Every registered name: the ViTs, then the CNN baselines."""
    vits = sorted(n for n, v in VARIANTS.items() if v.is_vit)
    return vits + sorted(n for n, v in VARIANTS.items() if not v.is_vit)


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        close = difflib.get_close_matches(str(name), model_names(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "."
        raise VitlabError(f"unknown model {name!r}{hint} Valid models: {', '.join(model_names())}")
    return VARIANTS[name]


def get_config(name: str, **overrides) -> ViTConfig | ResNetConfig:
    """The configuration of a named variant, with checked overrides (None values are ignored)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    config = get_variant(name).config
    return config.replace(**overrides) if overrides else config


__all__ = ["SIZES", "HUB_IDS", "hub_id", "Variant", "VARIANTS", "model_names", "get_variant", "get_config"]
