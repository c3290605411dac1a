"""Named model variants, each citing where its numbers come from, and `create_model`.

Sizes: Table 1 of the paper (Base, Large, Huge); Tiny and Small from DeiT (Touvron et al. 2021,
Table 1), which the paper's code base adopted. `vit_mini_x` is the configuration of seed 000's mini
experiment (section 5.1). The name reads `vit_{size}_patch{P}_{resolution}`, as in timm.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from torch import nn

from vitlab.errors import VitlabError
from vitlab.model import ViTConfig, VisionTransformer

# (dim, depth, heads, source)
SIZES = {
    "tiny": (192, 12, 3, "DeiT Table 1 (ViT-Ti)"),
    "small": (384, 12, 6, "DeiT Table 1 (ViT-S)"),
    "base": (768, 12, 12, "ViT paper Table 1 (ViT-Base)"),
    "large": (1024, 24, 16, "ViT paper Table 1 (ViT-Large)"),
    "huge": (1280, 32, 16, "ViT paper Table 1 (ViT-Huge)"),
}

# The default eval preprocessing of a randomly initialised model: the original JAX release's
# normalisation, (x - 0.5) / 0.5, with timm's bicubic resize and 0.9 centre crop.
DEFAULT_PRETRAINED_CFG = {
    "input_size": (3, 224, 224),
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
    "crop_pct": 0.9,
    "interpolation": "bicubic",
    "num_classes": 1000,
    "label_names": None,
    "source": "random init",
}


@dataclass(frozen=True)
class Variant:
    config: ViTConfig
    source: str

    def describe(self) -> str:
        c = self.config
        return f"D={c.dim} L={c.depth} h={c.heads} P={c.patch_size} img={c.img_size[0]}  ({self.source})"


def _vit(size: str, patch: int, img: int) -> Variant:
    dim, depth, heads, source = SIZES[size]
    return Variant(ViTConfig(img_size=img, patch_size=patch, dim=dim, depth=depth, heads=heads), source)


VARIANTS: dict[str, Variant] = {
    **{f"vit_{s}_patch{p}_224": _vit(s, p, 224) for s in ("tiny", "small", "base", "large") for p in (16, 32)},
    "vit_base_patch16_384": _vit("base", 16, 384),
    "vit_large_patch16_384": _vit("large", 16, 384),
    "vit_huge_patch14_224": _vit("huge", 14, 224),
    # Seed 000, section 5.1: 32x32x3 images, patch 4 (64 patches), D=32, 4 heads, 2 blocks, MLP 64, 2 classes.
    "vit_mini_x": Variant(
        ViTConfig(img_size=32, patch_size=4, dim=32, depth=2, heads=4, mlp_dim=64, num_classes=2),
        "seed 000 section 5.1 (mini experiment on dataset X)",
    ),
    # A small ViT for 32 px data (digits, shapes): 0.2M parameters, comparable to resnet_mini.
    "vit_mini": Variant(
        ViTConfig(img_size=32, patch_size=4, dim=64, depth=4, heads=4, mlp_dim=128, num_classes=10),
        "vitlab: laptop-scale ViT for 32 px images",
    ),
}

CNN_VARIANTS = {"resnet_mini": dict(width=16, blocks=1), "resnet_small": dict(width=32, blocks=2)}


def model_names() -> list[str]:
    return sorted(VARIANTS) + sorted(CNN_VARIANTS)


def get_config(name: str, **overrides) -> ViTConfig:
    """The ViTConfig of a named variant, with checked overrides."""
    if name not in VARIANTS:
        raise VitlabError(_unknown(name))
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return VARIANTS[name].config.replace(**overrides) if overrides else VARIANTS[name].config


def create_model(
    name: str,
    pretrained: str | None = None,
    *,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides,
) -> nn.Module:
    """Build a named model, like timm.create_model.

    `pretrained` is a weight source (a file, a directory, or a hub id; see vitlab.weights); the
    configuration is checked against the checkpoint, the position embedding resampled for a new
    img_size, and a new zero head made for a different num_classes.
    """
    if name in CNN_VARIANTS:
        from vitlab.cnn import ResNetMini

        if pretrained is not None:
            raise VitlabError(f"model {name!r} has no pretrained weights; use --checkpoint for a vitlab checkpoint")
        kwargs = dict(CNN_VARIANTS[name], **{k: v for k, v in overrides.items() if k == "in_chans"})
        model = ResNetMini(num_classes=num_classes or 10, **kwargs)
        model.pretrained_cfg = {**DEFAULT_PRETRAINED_CFG, "input_size": (3, img_size or 32, img_size or 32),
                                "num_classes": model.num_classes}
        return model
    if pretrained is not None:
        from vitlab.weights import load_pretrained

        return load_pretrained(name, pretrained, num_classes=num_classes, img_size=img_size, **overrides)
    cfg = get_config(name, num_classes=num_classes, img_size=img_size, **overrides)
    model = VisionTransformer(cfg)
    model.pretrained_cfg = {
        **DEFAULT_PRETRAINED_CFG,
        "input_size": (cfg.in_chans, *cfg.img_size),
        "num_classes": cfg.num_classes,
        "architecture": name,
    }
    return model


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, model_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "."
    return f"unknown model {name!r}{hint} Valid models: {', '.join(model_names())}"
