"""The train/validation split every dataset without one of its own gets: seeded and stratified."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitlab.errors import VitlabError, check_range
from vitlab.options import check_seed


def stratified_split(
    labels: torch.Tensor, val_fraction: float, *, seed: int = 0, names: Sequence[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a seeded, stratified train/val split: each class keeps its share in both parts.

    Every class gets at least one validation image; a class the split would leave with no training
    image is a VitlabError naming it (`names[label]`, or the label) before anything trains."""
    check_range("val_split", val_fraction, low=0, high=1, low_open=True, high_open=True)
    check_seed(seed)
    g = torch.Generator().manual_seed(seed)
    train, val, starved = [], [], []
    for c in labels.unique(sorted=True):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = max(1, round(len(idx) * val_fraction))
        if k >= len(idx):
            starved.append(f"{names[int(c)] if names is not None else int(c)} ({len(idx)} image{'s' * (len(idx) > 1)})")
        val.append(idx[:k])
        train.append(idx[k:])
    if starved:
        raise VitlabError(
            f"val_split {val_fraction:g} would send every image of class(es) {', '.join(starved)} to "
            "validation, leaving none to train on; use a smaller val_split or add images",
            arg="val_split",
        )
    return torch.cat(train).sort().values, torch.cat(val).sort().values


__all__ = ["stratified_split"]
