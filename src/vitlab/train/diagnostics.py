"""A troubleshooting table for training runs, checked against a run's metrics.

    symptom                        likely cause                        what to try
    loss does not fall             lr too large or too small;          change the lr; check the inputs
                                   inputs not normalised (or labels    are normalised (and flips keep
                                   broken by augmentation)             the labels true)
    NaN / inf loss                 lr too large, bad data              stop, keep the last good checkpoint
    validation oscillates          too little data                     stronger augmentation, smaller lr
                                                                       (or a CNN)
    train far above val            overfitting                         MixUp/crop augmentation, fewer epochs
    small dataset does badly       no pre-training (a ViT has no       pretrained weights, or the CNN
                                   convolutional prior: it needs data) baseline

`diagnose(rows, ...)` returns the rows of the table that apply, each a `Finding` with the evidence in
numbers; the trainer prints them at the end (and the NaN one as soon as it happens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Below this many training images a ViT from scratch is "small data": on tens of thousands of images
# or fewer, a ViT trained from scratch will probably not beat a CNN.
SMALL_DATASET = 10_000


@dataclass(frozen=True)
class Finding:
    symptom: str
    evidence: str
    advice: str

    def __str__(self) -> str:
        return f"diagnosis: {self.symptom} ({self.evidence}). {self.advice}"


def nan_loss(epoch: int, value: float, checkpoint: str | None) -> Finding:
    kept = f"the last good checkpoint is kept in {checkpoint}" if checkpoint else "no checkpoint was written yet"
    return Finding(
        "loss became non-finite",
        f"train loss {value} in epoch {epoch}; {kept}",
        "Lower the learning rate (e.g. 3x), keep gradient clipping on, check the images are normalised "
        "(and for bf16, try fp32); resume after fixing the cause of a bad batch",
    )


def tiny_from_scratch(n_train: int, model_name: str) -> Finding | None:
    """A ViT trained from random weights on a small folder: the last row of the table."""
    if n_train >= SMALL_DATASET or model_name.startswith("resnet"):
        return None
    return Finding(
        "small dataset, ViT from scratch",
        f"{n_train} training images, random initial weights",
        "ViT has no convolutional prior and needs much more data; fine-tune pretrained weights "
        "(vitlab finetune --pretrained ...) or compare with the CNN baseline (--model resnet_mini)",
    )


def diagnose(rows: list[dict], *, warmup_epochs: float, num_classes: int, stage_start: int = 0) -> list[Finding]:
    """Findings from per-epoch metrics (dicts with train_loss, train_acc, val_loss, val_acc).

    `stage_start` is the epoch index where the last stage began (its warmup restarts there).
    """
    out: list[Finding] = []
    if not rows:
        return out
    losses = [r["train_loss"] for r in rows]
    if not all(math.isfinite(v) for v in losses):
        return out  # reported by nan_loss when it happened
    first_after = stage_start + math.ceil(warmup_epochs)
    chance_loss = math.log(num_classes)
    # 1. Loss not falling after warmup: no 5% improvement over the first post-warmup epoch in 3+ epochs.
    if len(rows) >= first_after + 3:
        ref = losses[min(first_after, len(losses) - 1)] if first_after > 0 else losses[0]
        best_after = min(losses[first_after + 1 :])
        stuck_at_chance = min(losses) > 0.95 * chance_loss
        if best_after > 0.95 * ref or stuck_at_chance:
            out.append(
                Finding(
                    "training loss is not falling after warmup",
                    f"train loss {ref:.3f} after warmup, best later {best_after:.3f}; "
                    f"chance level is {chance_loss:.3f}",
                    "Try another --lr (10x smaller if it jumped around, 3-10x larger if it crawled), check the "
                    "inputs are normalised (mean/std of the weights' pretrained_cfg), and that augmentation keeps "
                    "the labels true (--no-hflip where a mirror image is another class)",
                )
            )
    # 2. Validation oscillating: the last epochs' val accuracy goes up and down by large steps.
    tail = [r["val_acc"] for r in rows[max(first_after, len(rows) - 6) :]]
    if len(tail) >= 4:
        steps = [b - a for a, b in zip(tail, tail[1:])]
        reversals = sum(1 for a, b in zip(steps, steps[1:]) if a * b < 0 and min(abs(a), abs(b)) > 0.02)
        swing = sum(abs(s) for s in steps) / len(steps)
        if reversals >= 2 and swing > 0.05:
            out.append(
                Finding(
                    "validation accuracy oscillates",
                    f"mean change {swing:.3f} per epoch with {reversals} reversals over the last {len(tail)} epochs",
                    "Use stronger augmentation (--mixup 0.8 --cutmix 1.0, --auto-augment rand) and a smaller --lr; "
                    "with little data, consider the CNN baseline",
                )
            )
    # 3. Overfitting: train accuracy far above validation accuracy at the end.
    last = rows[-1]
    if last["train_acc"] - last["val_acc"] > 0.15 and last["train_acc"] > 0.5:
        out.append(
            Finding(
                "training accuracy is far above validation accuracy (overfitting)",
                f"train {last['train_acc']:.3f} vs val {last['val_acc']:.3f} in the last epoch",
                "Add augmentation (MixUp/CutMix, random crops), --drop-path 0.1, --weight-decay, fewer --epochs, "
                "or fine-tune pretrained weights instead of training from scratch",
            )
        )
    return out


__all__ = ["Finding", "diagnose", "nan_loss", "tiny_from_scratch", "SMALL_DATASET"]
