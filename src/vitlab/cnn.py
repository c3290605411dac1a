"""The CNN side of the paper's comparisons: a small ResNet baseline and the hybrid stem.

Section 4 compares ViT with ResNets (BiT); Section 3.1 feeds a ResNet's feature map to the
Transformer ("hybrid"). At laptop scale both need a ResNet of a few hundred thousand parameters, so
this file builds one from torchvision's BasicBlock rather than a new residual block of our own.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock


def _stage(in_ch: int, out_ch: int, stride: int, blocks: int) -> nn.Sequential:
    down = None
    if stride != 1 or in_ch != out_ch:
        down = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))
    layers = [BasicBlock(in_ch, out_ch, stride=stride, downsample=down)]
    layers += [BasicBlock(out_ch, out_ch) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class ConvStem(nn.Module):
    """A ResNet-style stem that downsamples by `downsample` (a power of 2) for the hybrid ViT.

    A 3x3 conv, then one BasicBlock stage per factor of 2, doubling the width each time (capped at 4x).
    """

    def __init__(self, *, in_chans: int = 3, width: int = 64, downsample: int = 16):
        super().__init__()
        steps = int(math.log2(downsample))
        self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        stages, ch = [], width
        for i in range(steps):
            out = width * min(2 ** (i + 1), 4)
            stages.append(_stage(ch, out, stride=2, blocks=1))
            ch = out
        self.stages = nn.Sequential(*stages)
        self.out_channels = ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))  # (B, C', H/downsample, W/downsample)


class ResNetMini(nn.Module):
    """A CIFAR-style ResNet (3 stages of BasicBlocks, global average pooling, linear head).

    `resnet_mini` (width 16, 1 block per stage) has ~0.1M parameters, the size of the small ViTs used
    in vitlab's experiments, so ViT and CNN compare at equal size on the same data and recipe.
    """

    def __init__(self, *, num_classes: int = 10, in_chans: int = 3, width: int = 16, blocks: int = 1):
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.layer1 = _stage(width, width, 1, blocks)
        self.layer2 = _stage(width, 2 * width, 2, blocks)
        self.layer3 = _stage(2 * width, 4 * width, 2, blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * width, num_classes)
        self.pretrained_cfg: dict = {}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer3(self.layer2(self.layer1(self.stem(x))))  # (B, 4w, H/4, W/4)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.pool(x).flatten(1)  # (B, 4w)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.head.in_features, num_classes).to(self.head.weight.device)

    def no_weight_decay(self) -> set[str]:
        return set()
