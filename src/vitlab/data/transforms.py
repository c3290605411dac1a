"""Training augmentation and batch mixing with torchvision.transforms.v2; eval preprocessing from the
model's pretrained_cfg. These are the per-image transforms of data read from disk every epoch; data kept
in memory gets the same augmentation on whole batches (vitlab.data.memory.BatchTransform).

Random crop, flip and colour jitter are standard; MixUp and CutMix matter especially for a ViT (it
has no convolutional prior, so the data must teach it the invariances).
The order follows timm's training pipeline: crop -> flip -> colour -> RandAugment/TrivialAugment on
the PIL image, then to a normalised tensor, then RandomErasing on the tensor. MixUp/CutMix act on a
whole batch (`mix_transform`), after the loader, and turn the labels into soft targets.

Eval preprocessing is `vitlab.data.preprocess.eval_transform(model.pretrained_cfg)`: the resize, crop and
normalisation the weights were trained with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

from vitlab.data.preprocess import INTERPOLATIONS, eval_transform
from vitlab.errors import VitlabError, check_range
from vitlab.options import AUTO_AUGMENTS


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
    channels: int = 3,
) -> v2.Compose:
    """PIL image -> augmented, normalised float tensor (channels, H, W); channels=1 turns the image grey
    first, as the eval preprocessing of a one-channel model does.

    hflip: a horizontal flip with p=0.5 -- right for photos, wrong for digits and text (a flipped 3
    is not a 3), so it can be switched off. color_jitter: brightness/contrast/saturation strength
    (0 = off). auto_augment: "rand" (RandAugment, 2 ops, magnitude 9), "trivial" (TrivialAugmentWide)
    or "none". re_prob: RandomErasing probability on the normalised tensor.
    """
    if auto_augment not in AUTO_AUGMENTS:
        raise VitlabError(
            f"auto_augment must be one of {', '.join(AUTO_AUGMENTS)}; found {auto_augment!r}", arg="auto_augment"
        )
    check_range("crop_scale", scale[0], low=0, high=scale[1], low_open=True)
    check_range("color_jitter", color_jitter, low=0)
    check_range("reprob", re_prob, low=0, high=1)
    interp = INTERPOLATIONS[interpolation]
    ops: list = [v2.Grayscale(num_output_channels=1)] if channels == 1 else []  # PIL's convert("L")
    ops.append(v2.RandomResizedCrop(size, scale=scale, ratio=ratio, interpolation=interp, antialias=True))
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
        v2.Normalize(mean=list(mean)[:channels], std=list(std)[:channels]),
    ]
    if re_prob > 0:
        ops.append(v2.RandomErasing(p=re_prob, value=0))  # 0 after normalising = the mean colour
    return v2.Compose(ops)


def model_transforms(model, *, augment: bool = True, **options) -> tuple[v2.Compose, v2.Compose]:
    """(train, eval) transforms for `model`: eval from its pretrained_cfg at its input size, train with
    the same normalisation and interpolation. `augment=False` makes train = eval (deterministic)."""
    size = tuple(model.cfg.img_size)
    pcfg = model.pretrained_cfg
    evaluate = eval_transform(pcfg, size)
    if not augment:
        return evaluate, evaluate
    train = train_transform(
        size=size, mean=pcfg.mean, std=pcfg.std, interpolation=pcfg.interpolation, channels=pcfg.in_chans, **options
    )
    return train, evaluate


def mix_transform(
    *, num_classes: int, mixup: float = 0.0, cutmix: float = 0.0, switch_prob: float = 0.5
) -> Callable | None:
    """Batch-level MixUp (Zhang et al. 2018) and/or CutMix (Yun et al. 2019) with torchvision's v2.

    `mixup`/`cutmix` are the Beta(alpha, alpha) parameters (0 = off). With both on, each batch uses
    CutMix with probability `switch_prob`, else MixUp (timm's convention). Returns `f(x, y) ->
    (x_mixed, y_soft)` with y_soft rows summing to 1, or None when both are off.
    """
    check_range("mixup", mixup, low=0)
    check_range("cutmix", cutmix, low=0)
    check_range("mix_switch_prob", switch_prob, low=0, high=1)
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


__all__ = ["train_transform", "model_transforms", "mix_transform", "eval_transform", "AUTO_AUGMENTS"]
