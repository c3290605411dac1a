"""`vitlab finetune`: the staged fine-tuning recipe on your own image folder.

    vitlab data digits --out runs/digits
    vitlab train --data runs/digits --model vit_mini --epochs 30 --out runs/digits_vit   # ~5 min, one CPU thread
    vitlab finetune --data runs/digits --checkpoint runs/digits_vit --epochs 10 --freeze-epochs 2 \\
        --unfreeze last:2 --lr 1e-3 --out runs/digits_ft                      # ~1 min on a laptop CPU
    torchrun --nproc-per-node 2 -m vitlab finetune --data runs/digits --checkpoint runs/digits_vit \\
        --epochs 10 --freeze-epochs 2 --unfreeze last:2 --lr 1e-3 --out runs/digits_ft_2p  # 2 processes

The flags are `vitlab train`'s; the defaults are the fine-tuning recipe's (`RECIPES["finetune"]`).
"""

from __future__ import annotations

from vitlab.cli._help import DefaultsFormatter, example
from vitlab.cli.train import add_training_arguments
from vitlab.train.recipe import RECIPES

EXAMPLE = (  # the last line of its --help
    "vitlab finetune --data runs/digits --checkpoint runs/digits_vit --epochs 4 --freeze-epochs 1 --unfreeze last:2 "
    "--out runs/digits_ft"
)


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "finetune",
        help=summary,
        epilog=example(EXAMPLE),
        description="Fine-tune on an image folder with a staged recipe: a new zero-initialised head, "
        "--freeze-epochs of head-only training, then --unfreeze last:N|all with layer-wise lr decay; AdamW, "
        "warmup+cosine, clipping, MixUp/CutMix, a moving average of the weights (--ema), checkpoints every epoch "
        "(--resume), metrics.csv, TensorBoard, confusion matrix, curves, summary.json. Runs under torchrun for "
        "several processes.",
        formatter_class=DefaultsFormatter,
    )
    add_training_arguments(p, RECIPES["finetune"], finetune=True)
