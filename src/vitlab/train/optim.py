"""AdamW with the usual ViT parameter groups, and linear warmup followed by cosine decay.

Weight decay applies to matrices only: biases, LayerNorm parameters, the class token and position
embeddings are not decayed (their "size" is not what overfits), as in timm, DeiT and nanoGPT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from vitlab.errors import VitlabError
from vitlab.models.cnn import ResNetMini
from vitlab.models.vit import VisionTransformer


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups of trainable parameters: decayed (2-D and up) and not decayed (the rest)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model_or_groups: nn.Module | list[dict], *, lr: float, weight_decay: float = 0.05, betas=(0.9, 0.999)
) -> torch.optim.AdamW:
    """AdamW over `param_groups(model)` (or given groups), with the fused kernel (one step for all tensors)."""
    groups = param_groups(model_or_groups, weight_decay) if isinstance(model_or_groups, nn.Module) else model_or_groups
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


# ----------------------------------------------------------------------------------------------------
# Fine-tuning: one layer id per parameter drives both freezing and layer-wise learning-rate decay


def layer_ids(model: nn.Module) -> tuple[dict[str, int], int]:
    """Each parameter's depth, and L (the number of blocks/stages): ({name: id}, L).

    ViT: patch_embed, the prefix tokens (class, distillation, registers), pos_embed, norm_pre -> 0;
    blocks.i (and its relative-position bias) -> i + 1; the final norm / fc_norm -> L + 1; the head
    (and DeiT's head_dist) -> L + 2. ResNetMini: stem -> 0, layer1..3 -> 1..3,
    head -> L + 2. A parameter trains when its id >= the stage's threshold (`freeze_threshold`), and
    its learning rate is scaled by layer_decay ** (L + 1 - min(id, L + 1)) (BEiT/timm layer decay:
    the head and final norm keep the full rate, the last block decay^1, ... the embedding decay^(L+1)).
    """
    names = [n for n, _ in model.named_parameters()]
    if isinstance(model, VisionTransformer):
        L = len(model.blocks)
        prefixes = {f"blocks.{i}.": i + 1 for i in range(L)} | {f"rel_pos.{i}.": i + 1 for i in range(L)}
    elif isinstance(model, ResNetMini):
        L = 3
        prefixes = {"layer1.": 1, "layer2.": 2, "layer3.": 3}
    else:
        raise TypeError(f"layer_ids: no layer structure known for {type(model).__name__}")
    ids = {}
    for n in names:
        if n.startswith(("head.", "head_dist.")):
            ids[n] = L + 2
        elif n.startswith(("norm.", "fc_norm.")):
            ids[n] = L + 1
        else:
            ids[n] = next((v for p, v in prefixes.items() if n.startswith(p)), 0)
    return ids, L


def freeze_threshold(unfreeze: str, num_layers: int) -> int:
    """The lowest trainable layer id for `unfreeze`: "head" (L + 2), "last:N" (L + 1 - N), "all" (0)."""
    if unfreeze == "all":
        return 0
    if unfreeze == "head":
        return num_layers + 2
    if unfreeze.startswith("last:") and unfreeze[5:].isdigit():
        n = int(unfreeze[5:])
        if n > num_layers:
            raise VitlabError(
                f"unfreeze last:{n}: the model has only {num_layers} blocks; use last:{num_layers} or all",
                arg="unfreeze",
            )
        return num_layers + 1 - n
    raise VitlabError(
        f"unfreeze must be all, head or last:N (N = number of blocks); found {unfreeze!r}", arg="unfreeze"
    )


def layer_decay_groups(model: nn.Module, *, lr: float, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """AdamW groups for every parameter, frozen or not: one per (layer id, decayed or not).

    Each group carries `layer_id` and `lr_scale`, and `lr = lr * lr_scale`; a schedule multiplies
    these per-group rates. Frozen parameters stay in their groups with requires_grad False: they get
    no gradient, so AdamW (which skips parameters whose .grad is None) leaves them bitwise unchanged.
    """
    ids, L = layer_ids(model)
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        lid = ids[name]
        decay = not (p.ndim <= 1 or name in skip)
        scale = layer_decay ** (L + 1 - min(lid, L + 1))
        g = groups.setdefault(
            (lid, decay),
            {
                "params": [],
                "param_names": [],
                "layer_id": lid,
                "lr_scale": scale,
                "lr": lr * scale,
                "weight_decay": weight_decay if decay else 0.0,
            },
        )
        g["params"].append(p)
        g["param_names"].append(name)
    return [groups[k] for k in sorted(groups)]


def staged_warmup_cosine(
    optimizer: torch.optim.Optimizer,
    *,
    stage_steps: list[int],
    warmup_steps: int | Sequence[int],
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then cosine within each stage (stage_steps = optimizer steps per stage).

    Stage 2 of fine-tuning unfreezes blocks whose AdamW moments start from zero, so it warms up
    again. `warmup_steps`: one number per stage (`vitlab.train.recipe.schedule` counts them), or one
    number for every stage, at most half of a stage when there are several. With one stage: warmup,
    then cosine.
    """
    bounds = [0]
    for n in stage_steps:
        bounds.append(bounds[-1] + n)
    if isinstance(warmup_steps, int):
        warmups = [min(warmup_steps, max(1, n) // 2) if len(stage_steps) > 1 else warmup_steps for n in stage_steps]
    else:
        warmups = list(warmup_steps)
        if len(warmups) != len(stage_steps):
            raise VitlabError(f"warmup_steps: one per stage expected ({len(stage_steps)}); found {len(warmups)}")

    def factor(step: int) -> float:
        k = next((i for i in range(len(stage_steps)) if step < bounds[i + 1]), len(stage_steps) - 1)
        local, total = step - bounds[k], max(1, stage_steps[k])
        warm = warmups[k]
        if local < warm:
            return (local + 1) / warm
        progress = (local - warm) / max(1, total - warm)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
