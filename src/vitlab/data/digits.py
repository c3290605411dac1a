"""scikit-learn's bundled digits: 1,797 real 8x8 grey images of handwritten digits, 10 classes.

It ships inside scikit-learn, so it needs no download: vitlab's real dataset for tests and demos.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitlab.errors import VitlabError

CLASS_NAMES = tuple(str(i) for i in range(10))


def load_digits(
    size: int = 32, *, channels: int = 3, normalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as (1797, channels, size, size) float32 in [0, 1] (or [-1, 1]) and labels.

    The 8x8 images (values 0..16) are upsampled bilinearly to `size` and repeated over `channels`.
    """
    from sklearn.datasets import load_digits as _load

    if size < 8:
        raise VitlabError(f"digits --size must be at least 8 (the images are 8x8); found {size}")
    d = _load()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # (1797, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    x = x.expand(-1, channels, -1, -1)  # (1797, C, size, size)
    if normalize:
        x = (x - 0.5) / 0.5
    return x.contiguous(), torch.tensor(d.target, dtype=torch.int64)


def stratified_split(labels: torch.Tensor, val_fraction: float, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a seeded, stratified train/val split: each class keeps its share in both parts."""
    if not 0.0 < val_fraction < 1.0:
        raise VitlabError(f"--val-split must be between 0 and 1 (exclusive); found {val_fraction}")
    g = torch.Generator().manual_seed(seed)
    train, val = [], []
    for c in labels.unique(sorted=True):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = max(1, round(len(idx) * val_fraction))
        val.append(idx[:k])
        train.append(idx[k:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values
