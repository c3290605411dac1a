"""AdamW with the usual ViT parameter groups, and linear warmup followed by cosine decay.

Weight decay applies to matrices only: biases, LayerNorm parameters, the class token and position
embeddings are not decayed (their "size" is not what overfits), as in timm, DeiT and nanoGPT.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups of trainable parameters: decayed (2-D and up) and not decayed (the rest)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model_or_groups: nn.Module | list[dict], *, lr: float, weight_decay: float = 0.05, betas=(0.9, 0.999)
) -> torch.optim.AdamW:
    """AdamW over `param_groups(model)` (or given groups), with the fused kernel (one step for all tensors)."""
    groups = param_groups(model_or_groups, weight_decay) if isinstance(model_or_groups, nn.Module) else model_or_groups
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step multiplier: linear from ~0 to 1 over `warmup_steps`, then cosine down to `min_lr_ratio`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
