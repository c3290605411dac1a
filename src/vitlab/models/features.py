"""Feature maps for dense heads (detection, segmentation): timm's `features_only=True` over vitlab's ViT.

    model = vitlab.create_model("vit_base_patch16_224", features_only=True, out_indices=(3, 7, 11))
    maps = model(images)                  # [(B, 768, 14, 14)] * 3: blocks 3, 7 and 11, patch tokens as maps
    model.feature_info.channels()         # [768, 768, 768];  .reduction(): [16, 16, 16] (the patch size)

`FeatureGetter` is timm's FeatureGetterNet: it prunes the blocks after the last one asked for (and the head),
then calls the ViT's `forward_intermediates(x, indices=out_indices, norm=..., output_fmt=...,
intermediates_only=True)`. The ViT stays inside as `.model`, so its state dict has timm's `model.` prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitlab.errors import VitlabError

FEATURE_CLASSES = ("getter",)  # timm's feature_cls for its ViTs; "hook" and "fx" are other models' wrappers
FEATURE_KEYS = ("out_indices", "feature_cls", "output_fmt", "norm")  # what timm's feature_cfg may hold here
DEFAULT_OUT_INDICES = 3  # timm's ViTs: the last 3 blocks


class FeatureInfo:
    """timm's FeatureInfo: per output, its module, channels and stride (`channels()`, `reduction()`,
    `module_name()`, `get_dicts()`), read by detection and segmentation code written for timm."""

    def __init__(self, info: list[dict], out_indices: Sequence[int]):
        self.info = [dict(d, index=i) for i, d in enumerate(info)]
        self.out_indices = tuple(out_indices)

    def get(self, key: str, idx: int | Sequence[int] | None = None):
        if idx is None:
            return [self.info[i][key] for i in self.out_indices]
        if isinstance(idx, (tuple, list)):
            return [self.info[i][key] for i in idx]
        return self.info[idx][key]

    def get_dicts(self, keys: Sequence[str] | None = None, idx: int | Sequence[int] | None = None):
        chosen = self.out_indices if idx is None else idx
        pick = lambda d: d if keys is None else {k: d[k] for k in keys}  # noqa: E731
        if isinstance(chosen, int):
            return pick(self.info[chosen])
        return [pick(self.info[i]) for i in chosen]

    def channels(self, idx=None):
        return self.get("num_chs", idx)

    def reduction(self, idx=None):
        return self.get("reduction", idx)

    def module_name(self, idx=None):
        return self.get("module", idx)

    def __getitem__(self, item):
        return self.info[item]

    def __len__(self) -> int:
        return len(self.info)


class FeatureGetter(nn.Module):
    """A ViT that returns the outputs of some blocks: a list of (B, D, gh, gw) maps ("NCHW") or (B, N, D)
    token sets ("NLC"), through the final LayerNorm with `norm`. The blocks after the last one taken, and
    the head, are removed (timm's prune_intermediate_layers)."""

    def __init__(
        self,
        model: nn.Module,
        out_indices: int | Sequence[int] = DEFAULT_OUT_INDICES,
        output_fmt: str = "NCHW",
        norm: bool = False,
    ):
        super().__init__()
        if output_fmt not in ("NCHW", "NLC"):
            raise VitlabError(f"output_fmt must be 'NCHW' or 'NLC'; found {output_fmt!r}", arg="output_fmt")
        self.out_indices = model.prune_intermediate_layers(out_indices, prune_norm=not norm, prune_head=True)
        self.feature_info = FeatureInfo(model.feature_info, self.out_indices)
        self.model = model
        self.output_fmt, self.norm = output_fmt, norm
        self.pretrained_cfg = model.pretrained_cfg

    @property
    def default_cfg(self):
        """timm's older name of `pretrained_cfg`."""
        return self.pretrained_cfg

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_intermediates(
            x, indices=self.out_indices, norm=self.norm, output_fmt=self.output_fmt, intermediates_only=True
        )


def feature_options(overrides: dict) -> dict | None:
    """timm's features_only keywords taken out of create_model's `overrides` (in place): None without
    `features_only=True`, else FeatureGetter's arguments. Each keyword is checked, by its name."""
    features_only = overrides.pop("features_only", False)
    cfg = dict(overrides.pop("feature_cfg", None) or {})
    for key in ("out_indices", "feature_cls", "output_fmt"):
        if key in overrides:
            cfg[key] = overrides.pop(key)
    if not isinstance(features_only, bool):
        raise VitlabError(f"features_only must be True or False; found {features_only!r}", arg="features_only")
    if not features_only:
        if cfg:
            raise VitlabError(
                f"{', '.join(sorted(cfg))}: feature options need features_only=True", arg=next(iter(sorted(cfg)))
            )
        return None
    unknown = sorted(set(cfg) - set(FEATURE_KEYS))
    if unknown:
        raise VitlabError(
            f"feature_cfg has {unknown}; expected keys among {', '.join(FEATURE_KEYS)}", arg="feature_cfg"
        )
    feature_cls = cfg.pop("feature_cls", "getter")
    if feature_cls not in FEATURE_CLASSES:
        raise VitlabError(
            f"feature_cls must be 'getter' (timm's for its ViTs: forward_intermediates); found {feature_cls!r}",
            arg="feature_cls",
        )
    return cfg


__all__ = ["FeatureGetter", "FeatureInfo", "feature_options", "FEATURE_CLASSES", "DEFAULT_OUT_INDICES"]
