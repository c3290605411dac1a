"""Training augmentation and batch mixing with torchvision.transforms.v2; eval preprocessing from the
model's pretrained_cfg.

Seed 004 section 6.3: "random crop, flip and colour jitter are standard; MixUp and CutMix matter
especially for ViT" (they have no convolutional prior, so they need the data to teach invariances).
The order follows timm's training pipeline: crop -> flip -> colour -> RandAugment/TrivialAugment on
the PIL image, then to a normalised tensor, then RandomErasing on the tensor. MixUp/CutMix act on a
whole batch (`mix_transform`), after the loader, and turn the labels into soft targets.

Eval preprocessing is `vitlab.preprocess.eval_transform(model.pretrained_cfg)`: the resize, crop and
normalisation the weights were trained with (seed 004 section 7.2).
"""

from __future__ import annotations

from typing import Callable

import torch
from torchvision.transforms import v2

from vitlab.errors import VitlabError
from vitlab.preprocess import INTERPOLATIONS, eval_transform

AUTO_AUGMENTS = ("none", "rand", "trivial")


def input_size(model) -> tuple[int, int]:
    """The (H, W) the model takes: its config's img_size, else pretrained_cfg's input_size."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        return tuple(cfg.img_size)
    return tuple(model.pretrained_cfg.get("input_size", (3, 224, 224))[1:])


def train_transform(
    *,
    size: int | tuple[int, int],
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: bool = True,
    color_jitter: float = 0.0,
    auto_augment: str = "none",
    re_prob: float = 0.0,
    interpolation: str = "bicubic",
) -> v2.Compose:
    """PIL image -> augmented, normalised float tensor (3, H, W).

    hflip: a horizontal flip with p=0.5 -- right for photos, wrong for digits and text (a flipped 3
    is not a 3), so it can be switched off. color_jitter: brightness/contrast/saturation strength
    (0 = off). auto_augment: "rand" (RandAugment, 2 ops, magnitude 9), "trivial" (TrivialAugmentWide)
    or "none". re_prob: RandomErasing probability on the normalised tensor.
    """
    if auto_augment not in AUTO_AUGMENTS:
        raise VitlabError(f"--auto-augment must be one of {', '.join(AUTO_AUGMENTS)}; found {auto_augment!r}")
    if not 0 < scale[0] <= scale[1] <= 1:
        raise VitlabError(f"--crop-scale must be in (0, 1]; found {scale[0]:g}")
    if color_jitter < 0 or not 0 <= re_prob <= 1:
        raise VitlabError(f"--color-jitter must be >= 0 and --reprob in [0, 1]; found {color_jitter:g}, {re_prob:g}")
    interp = INTERPOLATIONS[interpolation]
    ops: list = [v2.RandomResizedCrop(size, scale=scale, ratio=ratio, interpolation=interp, antialias=True)]
    if hflip:
        ops.append(v2.RandomHorizontalFlip())
    if color_jitter > 0:
        ops.append(v2.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter))
    if auto_augment == "rand":
        ops.append(v2.RandAugment(num_ops=2, magnitude=9, interpolation=interp))
    elif auto_augment == "trivial":
        ops.append(v2.TrivialAugmentWide(interpolation=interp))
    ops += [
        v2.ToImage(),  # PIL (H, W, 3) uint8 -> tv_tensors.Image (3, H, W) uint8
        v2.ToDtype(torch.float32, scale=True),  # [0, 255] -> [0, 1]
        v2.Normalize(mean=list(mean), std=list(std)),
    ]
    if re_prob > 0:
        ops.append(v2.RandomErasing(p=re_prob, value=0))  # 0 after normalising = the mean colour
    return v2.Compose(ops)


def model_transforms(model, *, augment: bool = True, **options) -> tuple[v2.Compose, v2.Compose]:
    """(train, eval) transforms for `model`: eval from its pretrained_cfg at its input size, train with
    the same normalisation and interpolation. `augment=False` makes train = eval (deterministic)."""
    size = input_size(model)
    cfg = dict(model.pretrained_cfg or {})
    evaluate = eval_transform(cfg, size)
    if not augment:
        return evaluate, evaluate
    train = train_transform(size=size, mean=cfg.get("mean", (0.5,) * 3), std=cfg.get("std", (0.5,) * 3),
                            interpolation=cfg.get("interpolation", "bicubic"), **options)
    return train, evaluate


def mix_transform(*, num_classes: int, mixup: float = 0.0, cutmix: float = 0.0,
                  switch_prob: float = 0.5) -> Callable | None:
    """Batch-level MixUp (Zhang et al. 2018) and/or CutMix (Yun et al. 2019) with torchvision's v2.

    `mixup`/`cutmix` are the Beta(alpha, alpha) parameters (0 = off). With both on, each batch uses
    CutMix with probability `switch_prob`, else MixUp (timm's convention). Returns `f(x, y) ->
    (x_mixed, y_soft)` with y_soft rows summing to 1, or None when both are off.
    """
    if mixup < 0 or cutmix < 0:
        raise VitlabError(f"--mixup and --cutmix are Beta alphas >= 0 (0 = off); found {mixup:g}, {cutmix:g}")
    if not 0 <= switch_prob <= 1:
        raise VitlabError(f"--mix-switch-prob must be in [0, 1]; found {switch_prob:g}")
    ops, probs = [], []
    if mixup > 0:
        ops.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
        probs.append(1 - switch_prob if cutmix > 0 else 1.0)
    if cutmix > 0:
        ops.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
        probs.append(switch_prob if mixup > 0 else 1.0)
    if not ops:
        return None
    return ops[0] if len(ops) == 1 else v2.RandomChoice(ops, p=probs)


__all__ = ["train_transform", "model_transforms", "mix_transform", "input_size", "eval_transform", "AUTO_AUGMENTS"]
