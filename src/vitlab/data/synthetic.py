"""Dataset X, the synthetic task of the mini experiment (`vitlab demo`).

32x32x3 images in two classes: class A (label 0) has its left half brighter than its right half,
class B (label 1) is the mirror image; Gaussian noise is added to every pixel. The task is easy for
anything that knows where a patch is, and impossible for anything that does not: without a position
embedding, the two classes produce the same *set* of patches, only in mirrored places.
"""

from __future__ import annotations

import torch

from vitlab.errors import VitlabError

CLASS_NAMES = ("A: left bright", "B: right bright")


def make_dataset_x(
    n: int,
    *,
    seed: int = 0,
    img_size: int = 32,
    channels: int = 3,
    bright: float = 0.7,
    dark: float = 0.3,
    level_jitter: float = 0.1,
    noise: float = 0.2,
    normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images of dataset X and their labels, the same tensors for the same arguments.

    Each image's bright and dark levels are drawn around `bright` and `dark` (+- `level_jitter`,
    uniform), then noise with std `noise` is added and the result clipped to [0, 1]. With `normalize`,
    pixels are mapped to [-1, 1] ((x - 0.5) / 0.5, the JAX release's convention).

    Returns images (n, channels, img_size, img_size) float32 and labels (n,) int64, balanced.
    """
    if n < 1 or img_size < 2 or img_size % 2:
        raise VitlabError(f"dataset X needs n >= 1 and an even img_size >= 2; found n={n}, img_size={img_size}")
    if not 0.0 <= dark < bright <= 1.0:
        raise VitlabError(f"dataset X needs 0 <= dark < bright <= 1; found dark={dark}, bright={bright}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2  # balanced: A, B, A, B, ...
    labels = labels[torch.randperm(n, generator=g)]
    hi = bright + level_jitter * (2 * torch.rand(n, generator=g) - 1)  # (n,)
    lo = dark + level_jitter * (2 * torch.rand(n, generator=g) - 1)  # (n,)
    half = img_size // 2
    left_is_bright = (labels == 0)[:, None, None, None]  # (n, 1, 1, 1)
    left = torch.where(left_is_bright, hi[:, None, None, None], lo[:, None, None, None])
    right = torch.where(left_is_bright, lo[:, None, None, None], hi[:, None, None, None])
    images = torch.cat(
        [left.expand(n, channels, img_size, half), right.expand(n, channels, img_size, half)], dim=3
    )  # (n, C, H, W)
    images = (images + noise * torch.randn(images.shape, generator=g)).clamp(0.0, 1.0)
    if normalize:
        images = (images - 0.5) / 0.5
    return images.contiguous(), labels


def dataset_x_splits(
    n_train: int = 2000, n_val: int = 500, *, seed: int = 0, **kwargs
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The mini experiment's split: 2000 training and 500 validation images, drawn with different seeds."""
    return make_dataset_x(n_train, seed=seed, **kwargs), make_dataset_x(n_val, seed=seed + 10_000, **kwargs)
