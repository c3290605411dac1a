"""`vitlab train`: a ViT or the CNN baseline from random weights, on an image folder or a bundled
dataset; `vitlab finetune` is the same run from pretrained weights with the fine-tuning recipe.

    vitlab train --dataset fashion-mnist --model vit_mini --out runs/vit           # 60,000 real photos, 28x28 grey
    vitlab train --dataset fashion-mnist --model resnet_mini --train-size 4000 --out runs/cnn
    vitlab train --dataset digits --model vit_mini --epochs 30 --out runs/digits

Every flag of the recipe group is a field of `vitlab.train.Recipe`; its default is the command's
preset (`RECIPES["scratch"]` here, `RECIPES["finetune"]` for `vitlab finetune`), never a number of
argparse's own.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from vitlab.cli._common import add_device, add_fast_path, add_model_source, add_out, add_precision, add_threads
from vitlab.cli._help import DefaultsFormatter, example
from vitlab.options import DATASETS, INITS
from vitlab.train.recipe import AUG_MIN_EPOCHS, RECIPES, Recipe, auto_crop_scale

if TYPE_CHECKING:
    from vitlab.train.job import TrainJob

EXAMPLE = (
    "vitlab train --data runs/digits --model vit_mini --epochs 40 --out runs/digits_vit"  # the last line of its --help
)

# flag -> Recipe field, where the names differ
RENAMED = {"smoothing": "label_smoothing"}


def add_training_arguments(p: argparse.ArgumentParser, preset: Recipe, *, finetune: bool) -> None:
    """The flags of `vitlab train` and `vitlab finetune`: a TrainJob's fields, the recipe's defaults from `preset`."""
    _data_and_model(p, finetune)
    _recipe(p, preset, finetune)
    _augmentation(p, preset)
    _running(p, preset)
    p.set_defaults(func=run, preset=preset, flag_names={field: f"--{flag}" for flag, field in RENAMED.items()})


def _data_and_model(p: argparse.ArgumentParser, finetune: bool) -> None:
    """Where the images come from, the model and its weights."""
    d = p.add_argument_group("data")
    d.add_argument(
        "--data", metavar="DIR", help="image folder: DIR/train/<class>/*, DIR/val/<class>/*, or DIR/<class>/*"
    )
    d.add_argument(
        "--dataset",
        choices=DATASETS,
        help="a bundled dataset instead of --data: fashion-mnist "
        "(70,000 grey 28x28 photos, 10 classes; Debian's dataset-fashion-mnist package, --root, $VITLAB_DATA, or "
        "a download), digits (scikit-learn's, 10 classes) or x (dataset X of the mini experiment: 2,000 / 500 "
        "synthetic 32x32 images, left or right half brighter, 2 classes)",
    )
    d.add_argument(
        "--root",
        metavar="DIR",
        help="the folder with Fashion-MNIST's idx files (.gz or not; default: "
        "$VITLAB_DATA, /usr/share/datasets/fashion-mnist, an earlier download, else a download; a --root serves "
        "this command only)",
    )
    d.add_argument(
        "--train-size",
        type=int,
        default=None,
        metavar="N",
        help="train on N images of the training split: the first N of one permutation seeded by --seed, so "
        "smaller training sets are inside larger ones (default: all)",
    )
    d.add_argument(
        "--val-split",
        type=float,
        default=None,
        metavar="F",
        help="validation fraction for a one-folder layout (seeded, stratified; default 0.2)",
    )
    d.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="data-loading processes for a folder too large to keep in memory, read from disk every epoch "
        "(default: 0 on CPU, up to 8 on GPU); data in memory needs none",
    )
    add_model_source(p, weights="optional" if finetune else "none")
    p.add_argument(
        "--crop-pct",
        type=float,
        default=None,
        metavar="F",
        help="evaluation resize: the image resized to the model's input / F, then centre-cropped to it "
        "(timm's crop_pct; also the training images' resize without augmentation); default: 1 (the whole "
        "image) for a model from random weights, the weights' own for pretrained weights",
    )
    p.add_argument(
        "--drop-path",
        type=float,
        default=0.0,
        metavar="R",
        help="stochastic depth rate of the last block, rising from 0 over the blocks before it (ViTs and the CNN)",
    )


def _recipe(p: argparse.ArgumentParser, preset: Recipe, finetune: bool) -> None:
    """The optimiser, its schedule and the stages."""
    r = p.add_argument_group("recipe")
    r.add_argument("--epochs", type=int, default=preset.epochs, metavar="E", help="epochs in total")
    r.add_argument(
        "--batch-size",
        type=int,
        default=preset.batch_size,
        metavar="B",
        help="batch per process (global batch = B x processes x --grad-accum)",
    )
    r.add_argument(
        "--lr",
        type=float,
        default=preset.lr,
        help="peak learning rate (of the head, with layer decay)"
        + ("; 1e-5 to 1e-4 is usual for pretrained weights" if finetune else ""),
    )
    r.add_argument(
        "--weight-decay",
        type=float,
        default=preset.weight_decay,
        metavar="W",
        help="AdamW weight decay (matrices only)",
    )
    r.add_argument(
        "--warmup-epochs",
        type=float,
        default=preset.warmup_epochs,
        metavar="E",
        help="linear warmup at the start of each stage, then cosine (default: "
        + (
            f"{preset.warmup_epochs:g})"
            if preset.warmup_epochs is not None
            else f"{preset.warmup_fraction:g} of each stage's steps, whatever the run's length)"
        ),
    )
    r.add_argument(
        "--min-lr-ratio",
        type=float,
        default=preset.min_lr_ratio,
        metavar="F",
        help="cosine floor as a fraction of --lr",
    )
    r.add_argument(
        "--clip-grad", type=float, default=preset.clip_grad, metavar="C", help="gradient norm clipping (0 = off)"
    )
    r.add_argument(
        "--freeze-epochs",
        type=int,
        default=preset.freeze_epochs,
        metavar="K",
        help="stage 1: train only the head for K epochs",
    )
    r.add_argument(
        "--unfreeze",
        default=preset.unfreeze,
        metavar="last:N|all",
        help="stage 2: train the last N blocks (+ final norm and head), or all",
    )
    r.add_argument(
        "--layer-decay",
        type=float,
        default=preset.layer_decay,
        metavar="D",
        help="layer-wise lr decay: block i of L gets lr x D^(L+1-i) (1 = off)",
    )
    if not finetune:
        r.add_argument(
            "--init",
            choices=INITS,
            default=preset.init,
            help="initialisation of the ViT's random weights: jax (the original release: Xavier linear maps, "
            "LeCun patch projection) or trunc_normal (timm's std 0.02, which suits ViT-B but makes the small "
            "models train several times slower)",
        )
        r.add_argument(
            "--head-init",
            type=float,
            default=preset.head_init,
            metavar="STD",
            help="std of the head's random weights; 0 = the zero head of the paper's fine-tuning (Section 3.2), "
            "slower from random weights",
        )


def _augmentation(p: argparse.ArgumentParser, preset: Recipe) -> None:
    """The training images' augmentation, batch mixing and the regularisers."""
    a = p.add_argument_group("augmentation and regularisation")
    a.add_argument(
        "--aug",
        dest="augment",
        action=argparse.BooleanOptionalAction,
        default=preset.augment,
        help="random augmentation (crops, flips and what the flags below add); --no-aug: train images are "
        "preprocessed like val images. Default: on for runs of at least "
        f"{AUG_MIN_EPOCHS} epochs or when an augmentation flag is given, else off. Augmentation trades "
        "short-run accuracy for long-run accuracy: in a short run it slows learning, in a long one it "
        "keeps the model from memorising the training images",
    )
    a.add_argument(
        "--hflip",
        action=argparse.BooleanOptionalAction,
        default=preset.hflip,
        help="random horizontal flips; --no-hflip for digits, text, anything with a handedness "
        "(default: on for image folders and fashion-mnist, off for the bundled digits and dataset X)",
    )
    a.add_argument(
        "--crop-scale",
        type=float,
        default=preset.crop_scale,
        metavar="S",
        help="RandomResizedCrop keeps between S and all of the image area (default: by the model's input "
        f"side, {auto_crop_scale(32):g} at 32 px or less to {auto_crop_scale(224):g} at 224 px or more; "
        "a smaller S regularises more and learns slower)",
    )
    a.add_argument(
        "--color-jitter",
        type=float,
        default=preset.color_jitter,
        metavar="F",
        help="brightness/contrast/saturation jitter",
    )
    a.add_argument(
        "--auto-augment",
        choices=("none", "rand", "trivial"),
        default=preset.auto_augment,
        help="RandAugment (rand) or TrivialAugmentWide (trivial)",
    )
    a.add_argument("--reprob", type=float, default=preset.reprob, metavar="P", help="RandomErasing probability")
    a.add_argument(
        "--mixup", type=float, default=preset.mixup, metavar="A", help="MixUp Beta alpha (0 = off; e.g. 0.8)"
    )
    a.add_argument(
        "--cutmix", type=float, default=preset.cutmix, metavar="A", help="CutMix Beta alpha (0 = off; e.g. 1.0)"
    )
    a.add_argument(
        "--mix-switch-prob",
        type=float,
        default=preset.mix_switch_prob,
        metavar="P",
        help="with both MixUp and CutMix on, the chance a batch uses CutMix",
    )
    a.add_argument("--smoothing", type=float, default=preset.label_smoothing, metavar="S", help="label smoothing")
    a.add_argument(
        "--ema",
        type=float,
        default=preset.ema,
        metavar="DECAY",
        help="keep an exponential moving average of the weights (e.g. 0.999); evaluated every epoch",
    )


def _running(p: argparse.ArgumentParser, preset: Recipe) -> None:
    """Precision, seed, device, the run folder and the speed path."""
    x = p.add_argument_group("running")
    add_precision(x, help="bf16 autocast or fp32")
    x.add_argument(
        "--grad-accum", type=int, default=preset.grad_accum, metavar="G", help="accumulate gradients over G batches"
    )
    x.add_argument("--seed", type=int, default=preset.seed, help="seed of the split, the shuffles and the augmentation")
    add_device(x)
    add_out(
        x,
        help="run folder: metrics.csv, tensorboard/, checkpoints, PNGs, summary.json (a folder of "
        "other files is refused unless --force)",
    )
    x.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_threads(x)
    add_fast_path(x)


def job_from_args(args) -> TrainJob:
    """The TrainJob the flags describe: the recipe's fields from the recipe flags, the rest one to one."""
    from vitlab.train.job import TrainJob

    recipe_fields = set(Recipe.__dataclass_fields__)
    values = {RENAMED.get(k, k): v for k, v in vars(args).items() if RENAMED.get(k, k) in recipe_fields}
    recipe = Recipe(**{**args.preset.to_dict(), **values})
    job_fields = set(TrainJob.__dataclass_fields__) - {"recipe"}
    return TrainJob(recipe=recipe, **{k: v for k, v in vars(args).items() if k in job_fields})


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "train",
        help=summary,
        epilog=example(EXAMPLE),
        description="Train from random weights (a vitlab ViT or resnet_mini) on --data DIR or --dataset "
        "fashion-mnist|digits|x, "
        "with the one training engine: AdamW, warmup+cosine, clipping, augmentation, MixUp/CutMix, a moving "
        "average of the weights (--ema), "
        "checkpoints every epoch (--resume), metrics, figures and summary.json. Runs under torchrun too.",
        formatter_class=DefaultsFormatter,
    )
    add_training_arguments(p, RECIPES["scratch"], finetune=False)


def run(args) -> int:
    from vitlab.runtime import busy_note, num_threads
    from vitlab.train.job import run as run_job

    job = job_from_args(args)
    note = busy_note(args.threads)
    if note and os.environ.get("RANK", "0") == "0":  # under torchrun, once
        print(note)
    with num_threads(args.threads):
        run_job(job)
    return 0
