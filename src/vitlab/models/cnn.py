"""The CNN side of the paper's comparisons: a small ResNet baseline and the hybrid stem.

Section 4 compares ViT with ResNets (BiT); Section 3.1 feeds a ResNet's feature map to the
Transformer ("hybrid"). At laptop scale both need a ResNet of a few hundred thousand parameters, so
this file builds one from torchvision's BasicBlock rather than a new residual block of our own.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock
from torchvision.ops import StochasticDepth

from vitlab.errors import VitlabError, check_range


def check_images(x, channels: int) -> None:
    """A model's input must be a batch of images, (B, C, H, W) with its C channels: one line naming what was
    found, not a convolution's error deep inside torch."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or x.shape[1] != channels:
        found = f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
        fix = (
            " (one image: add the batch axis, x[None])"
            if isinstance(x, torch.Tensor) and x.ndim == 3 and x.shape[0] == channels
            else ""
        )
        raise VitlabError(f"the model takes a batch of images, a tensor (B, {channels}, H, W); found {found}{fix}")
    if not x.is_floating_point():
        raise VitlabError(
            f"the model takes float images (preprocessed, e.g. by vitlab.data.preprocess.eval_transform); "
            f"found {x.dtype}"
        )


class DropPathBlock(BasicBlock):
    """torchvision's BasicBlock with stochastic depth on its residual branch: in training, each image's branch is
    dropped with probability `drop_path` (and the kept ones scaled by 1 / (1 - drop_path)), the shortcut always
    kept, as the ViT's blocks do (`StochasticDepth(mode="row")`). The same parameters as BasicBlock's: a checkpoint
    of one loads into the other."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, downsample: nn.Module | None = None, *, drop_path):
        super().__init__(in_ch, out_ch, stride=stride, downsample=downsample)
        self.drop_path = StochasticDepth(drop_path, mode="row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))  # the residual branch, (B, C', H', W')
        return self.relu(identity + self.drop_path(y))


def _block(in_ch: int, out_ch: int, stride: int = 1, downsample: nn.Module | None = None, drop_path: float = 0.0):
    if drop_path > 0:
        return DropPathBlock(in_ch, out_ch, stride, downsample, drop_path=drop_path)
    return BasicBlock(in_ch, out_ch, stride=stride, downsample=downsample)


def _stage(in_ch: int, out_ch: int, stride: int, blocks: int, drop_paths: tuple[float, ...] = ()) -> nn.Sequential:
    """`blocks` BasicBlocks, the first changing the width and stride; `drop_paths`: each block's stochastic depth
    rate (none: 0)."""
    rates = drop_paths or (0.0,) * blocks
    down = None
    if stride != 1 or in_ch != out_ch:
        down = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))
    layers = [_block(in_ch, out_ch, stride, down, rates[0])]
    layers += [_block(out_ch, out_ch, drop_path=r) for r in rates[1:]]
    return nn.Sequential(*layers)


class ConvStem(nn.Module):
    """A ResNet-style stem that downsamples by `downsample` (a power of 2) for the hybrid ViT.

    A 3x3 conv, then one BasicBlock stage per factor of 2, doubling the width each time (capped at 4x).
    """

    def __init__(self, *, in_chans: int = 3, width: int = 64, downsample: int = 16):
        super().__init__()
        steps = int(math.log2(downsample))
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        stages, ch = [], width
        for i in range(steps):
            out = width * min(2 ** (i + 1), 4)
            stages.append(_stage(ch, out, stride=2, blocks=1))
            ch = out
        self.stages = nn.Sequential(*stages)
        self.out_channels = ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))  # (B, C', H/downsample, W/downsample)


@dataclass(frozen=True)
class ResNetConfig:
    """The CNN baseline's configuration, a dataclass like ViTConfig so that both kinds of model are
    described, saved and rebuilt the same way. `img_size` is not structural (the network pools
    globally): it is the input size the model is meant for, which its preprocessing resizes to."""

    num_classes: int = 10
    in_chans: int = 3
    width: int = 16  # channels of the first stage; stages 2 and 3 have 2x and 4x
    blocks: int = 1  # BasicBlocks per stage
    drop_path: float = 0.0  # stochastic depth, rising linearly over the blocks to this rate in the last (as the ViT's)
    img_size: int | tuple[int, int] = 32

    def __post_init__(self) -> None:
        size = self.img_size
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if not (
            isinstance(size, (tuple, list))
            and len(size) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 8 for v in size)
        ):
            raise VitlabError(
                f"img_size must be an int or (height, width) of at least 8 pixels; found {self.img_size!r}",
                arg="img_size",
            )
        object.__setattr__(self, "img_size", tuple(size))
        for name in ("num_classes", "in_chans", "width", "blocks"):
            check_range(name, getattr(self, name), low=0 if name == "num_classes" else 1, integer=True)
        check_range("drop_path", self.drop_path, low=0.0, high=1.0, high_open=True)

    def replace(self, **overrides) -> ResNetConfig:
        """A copy with some fields changed; an unknown field is an error that lists the valid ones."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise VitlabError(
                f"the CNN baseline has no field(s) {unknown} (ViT-only options such as patch_size do "
                f"not apply to it); its fields: {sorted(known)}"
            )
        return ResNetConfig(**{**asdict(self), **overrides})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        return d


class ResNetMini(nn.Module):
    """A CIFAR-style ResNet (3 stages of BasicBlocks, global average pooling, linear head).

    `resnet_mini` (width 16, 1 block per stage) has ~0.1M parameters, the size of the small ViTs used
    in vitlab's experiments, so ViT and CNN compare at equal size on the same data and recipe.
    """

    def __init__(self, cfg: ResNetConfig | None = None, **overrides):
        super().__init__()
        cfg = (cfg or ResNetConfig()).replace(**overrides) if overrides else (cfg or ResNetConfig())
        self.cfg = cfg
        width, blocks, in_chans = cfg.width, cfg.blocks, cfg.in_chans
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        n = 3 * blocks  # as the ViT's: block i of n drops its residual branch at drop_path * i / (n - 1)
        rates = [cfg.drop_path * i / max(n - 1, 1) for i in range(n)]
        self.layer1 = _stage(width, width, 1, blocks, tuple(rates[:blocks]))
        self.layer2 = _stage(width, 2 * width, 2, blocks, tuple(rates[blocks : 2 * blocks]))
        self.layer3 = _stage(2 * width, 4 * width, 2, blocks, tuple(rates[2 * blocks :]))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * width, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.pretrained_cfg = None  # a vitlab.models.pretrained_cfg.PretrainedCfg, set by create_model

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, self.cfg.in_chans)
        return self.layer3(self.layer2(self.layer1(self.stem(x))))  # (B, 4w, H/4, W/4)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.pool(x).flatten(1)  # (B, 4w)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    @property
    def num_features(self) -> int:
        """Channels of the last stage, what the pooled head reads (timm's num_features)."""
        return 4 * self.cfg.width

    head_hidden_size = num_features

    @property
    def default_cfg(self):
        """timm's older name of `pretrained_cfg`."""
        return self.pretrained_cfg

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new zero-initialised head for `num_classes` classes, as the ViT's (paper Section 3.2); 0: none,
        the model returns the pooled features. `global_pool`: timm's "avg", the only pooling here."""
        if global_pool not in (None, "avg"):
            raise VitlabError(
                f"global_pool must be 'avg' for the CNN baseline; found {global_pool!r}", arg="global_pool"
            )
        self.cfg = self.cfg.replace(num_classes=num_classes)
        weight = self.stem[0].weight
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
            self.head.to(device=weight.device, dtype=weight.dtype)

    def no_weight_decay(self) -> set[str]:
        return set()
