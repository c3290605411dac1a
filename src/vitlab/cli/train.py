"""`vitlab train`: a model from random weights, with the same engine and options as `vitlab finetune`
(one stage, every layer trains, no layer decay), so a ViT and the CNN baseline compare on the same
data and recipe.

    vitlab train --dataset digits --model vit_mini --no-hflip --epochs 30 --out runs/vit     # ~2 min CPU
    vitlab train --dataset digits --model resnet_mini --no-hflip --epochs 30 --out runs/cnn
"""

from __future__ import annotations

from vitlab.cli.finetune import DefaultsFormatter, add_run_arguments, config_from_args, run_with_threads


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a ViT or the CNN baseline from scratch on an image folder or a bundled dataset",
        description="Train from random weights (a vitlab ViT or resnet_mini) on --data DIR or --dataset digits|x, "
        "with the fine-tuning engine: AdamW, warmup+cosine, clipping, augmentation, MixUp/CutMix, EMA, "
        "checkpoints every epoch (--resume), metrics, figures and summary.json. Runs under torchrun too.",
        formatter_class=DefaultsFormatter,
    )
    add_run_arguments(p, finetune=False)
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = config_from_args(args)
    cfg.freeze_epochs, cfg.unfreeze, cfg.layer_decay = 0, "all", 1.0
    return run_with_threads(args, cfg)
