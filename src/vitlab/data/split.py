"""The train/validation split every dataset without one of its own gets: seeded and stratified."""

from __future__ import annotations

import torch

from vitlab.errors import VitlabError

DEFAULT_VAL_SPLIT = 0.2  # the share of each class that goes to validation


def stratified_split(labels: torch.Tensor, val_fraction: float, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a seeded, stratified train/val split: each class keeps its share in both parts."""
    if not 0.0 < val_fraction < 1.0:
        raise VitlabError(f"val_split must be between 0 and 1 (exclusive); found {val_fraction}", arg="val_split")
    g = torch.Generator().manual_seed(seed)
    train, val = [], []
    for c in labels.unique(sorted=True):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        k = max(1, round(len(idx) * val_fraction))
        val.append(idx[:k])
        train.append(idx[k:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


__all__ = ["DEFAULT_VAL_SPLIT", "stratified_split"]
