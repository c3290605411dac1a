"""The seeded subsets the experiments train on (`vitlab reproduce`), each named by an `ExperimentData` and
decoded once into uint8 tensors (vitlab.data.memory):

    fashion-mnist, split "test"     the first n_train of one permutation of the 60,000 training images seeded by
                                    the run's seed (nested: a smaller set is inside a larger one); validated on the
                                    first n_val test images
    fashion-mnist, split "search"   the recipe search's: trained on n_train of the 50,000 training images of
                                    `search_split`, validated on n_val of the other 10,000 (never a test image)
    digits, split "test"            n_train digits (stratified, per seed); validated on the digits not trained on
                                    but for DIGITS_HELD_OUT of them, drawn per seed
    digits, split "held_out"        validated on those DIGITS_HELD_OUT (where a claim chooses its lr and budget)
    x                               dataset X of the mini experiment, generated from the seed
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from vitlab.data.digits import load_digits
from vitlab.data.fashion_mnist import load_fashion_mnist, nested_subset
from vitlab.data.memory import ImageTensors
from vitlab.data.split import stratified_split
from vitlab.data.synthetic import dataset_x_splits
from vitlab.errors import VitlabError

HELD_OUT = 10_000  # training images the recipe search validates on (split "search"); never the test images
HELD_OUT_SEED = 28  # the one permutation of the 60,000 training images that splits them
DIGITS_HELD_OUT = 400  # of the digits a run does not train on, those a claim chooses on (split "held_out")
NAMES = ("fashion-mnist", "digits", "x")


@dataclass(frozen=True)
class ExperimentData:
    """Which images a run trains and validates on: the dataset, how many of each, their size and channels
    (the images as the model sees them), and the split (see the module docstring)."""

    name: str
    n_train: int
    n_val: int
    img_size: int
    channels: int = 3
    split: str = "test"

    def __post_init__(self) -> None:
        splits = {"fashion-mnist": ("test", "search"), "digits": ("test", "held_out"), "x": ("test",)}
        if self.name not in splits:
            raise VitlabError(f"unknown dataset {self.name!r} in an experiment; expected one of {', '.join(NAMES)}")
        if self.split not in splits[self.name]:
            raise VitlabError(f"{self.name}: split must be one of {', '.join(splits[self.name])}; found {self.split!r}")


@lru_cache(maxsize=2)
def _fashion(train: bool) -> ImageTensors:
    return ImageTensors(*load_fashion_mnist(train=train))


def search_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe search's split of the 60,000 Fashion-MNIST training images: (the 50,000 it trains on,
    the 10,000 it validates on), index tensors of one fixed permutation. The 10,000 test images are in neither."""
    perm = torch.randperm(60_000, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    return perm[: 60_000 - HELD_OUT], perm[60_000 - HELD_OUT :]


@lru_cache(maxsize=6)
def experiment_splits(data: ExperimentData, seed: int) -> tuple[ImageTensors, ImageTensors, int]:
    """(train, val, num_classes) of `data` for `seed`: uint8 images (N, C, H, W)."""
    n_train, n_val = data.n_train, data.n_val
    if data.name == "fashion-mnist" and data.split == "search":
        pool, held_out = search_split()
        train = _fashion(True).subset(pool[nested_subset(len(pool), n_train, seed=seed)])
        return train, _fashion(True).subset(held_out[:n_val]), 10
    if data.name == "fashion-mnist":
        train = _fashion(True).subset(nested_subset(60_000, n_train, seed=seed))
        return train, _fashion(False).subset(torch.arange(n_val)), 10
    if data.name == "x":
        (xt, yt), (xv, yv) = dataset_x_splits(n_train, n_val, seed=seed, normalize=False)
        return ImageTensors.from_float(xt, yt), ImageTensors.from_float(xv, yv), 2
    x, y = load_digits(data.img_size, channels=data.channels, normalize=False)
    train, rest = stratified_split(y, 1 - n_train / len(y), seed=seed)
    rest = rest[torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))]
    val = (rest[:DIGITS_HELD_OUT] if data.split == "held_out" else rest[DIGITS_HELD_OUT:]).sort().values
    return ImageTensors.from_float(x[train], y[train]), ImageTensors.from_float(x[val][:n_val], y[val][:n_val]), 10


__all__ = ["DIGITS_HELD_OUT", "HELD_OUT", "ExperimentData", "experiment_splits", "search_split"]
