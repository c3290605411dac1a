"""Named model variants, as data: each a configuration and the source its numbers come from.

Sizes: Table 1 of the paper (Base, Large, Huge); Tiny and Small from DeiT (Touvron et al. 2021,
Table 1), which the paper's code base adopted. `vit_mini_x` is the configuration of the mini
experiment of the ViT notes this project started from (seed 000, section 5.1). A ViT name reads
`vit_{size}_patch{P}_{resolution}`, as in timm. The CNN baselines (`resnet_*`) are here too, so that
one registry answers "which models are there" for every command.

Nothing here loads weights or builds a module: `vitlab.models.factory.create_model` does, from these
entries.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from vitlab.errors import VitlabError
from vitlab.models.cnn import ResNetConfig
from vitlab.models.pretrained_cfg import PretrainedCfg
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
        "the mini experiment (seed 000 section 5.1), on dataset X",
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


__all__ = ["SIZES", "Variant", "VARIANTS", "model_names", "get_variant", "get_config"]
