"""`vitlab finetune`: the seeds' staged fine-tuning recipe on your own image folder.

    vitlab data digits --out /tmp/digits
    vitlab finetune --data /tmp/digits --checkpoint runs/pretrain --no-hflip \\
        --epochs 10 --freeze-epochs 2 --unfreeze last:2 --lr 1e-3 --out runs/ft     # ~1 min on a laptop CPU
    torchrun --nproc_per_node=2 -m vitlab finetune ...                            # the same, 2 processes

The options are shared with `vitlab train` (`add_run_arguments`); only the defaults differ.
"""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with the default, where there is one worth showing."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        d = action.default
        if d is None or isinstance(d, bool) or d is argparse.SUPPRESS or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_run_arguments(p: argparse.ArgumentParser, *, finetune: bool) -> None:
    """The flags of `vitlab finetune` and `vitlab train` (one RunConfig field each)."""
    d = p.add_argument_group("data")
    d.add_argument("--data", metavar="DIR", help="image folder: DIR/train/<class>/*, DIR/val/<class>/*, or DIR/<class>/*")
    if not finetune:
        d.add_argument("--dataset", choices=("digits", "x"),
                       help="a bundled dataset instead of --data: digits (sklearn, 10 classes) or x (seed 000's dataset X)")
    d.add_argument("--val-split", type=float, default=None, metavar="F",
                   help="validation fraction for a one-folder layout (seeded, stratified; default 0.2)")
    d.add_argument("--workers", type=int, default=None, metavar="N",
                   help="data-loading processes (default: 0 on CPU, up to 8 on GPU)")
    m = p.add_argument_group("model")
    m.add_argument("--model", metavar="NAME", required=False,
                   help="model name (vitlab info lists them); optional with --checkpoint")
    if finetune:
        src = m.add_mutually_exclusive_group()
        src.add_argument("--pretrained", metavar="SOURCE",
                         help="pretrained weights: a file, a folder or a hub id (see vitlab.weights)")
        src.add_argument("--checkpoint", metavar="PATH",
                         help="a vitlab checkpoint: a run folder, its last.json/best.json, or a checkpoint folder")
    m.add_argument("--img-size", type=int, default=None, metavar="PX", help="input size (default: the model's)")
    m.add_argument("--drop-path", type=float, default=0.0, metavar="R", help="stochastic depth rate of the last block (ViTs)")
    r = p.add_argument_group("recipe")
    r.add_argument("--epochs", type=int, default=10 if finetune else 30, metavar="E", help="epochs in total")
    r.add_argument("--batch-size", type=int, default=32, metavar="B",
                   help="batch per process (global batch = B x processes x --grad-accum)")
    r.add_argument("--lr", type=float, default=1e-4 if finetune else 1e-3,
                   help="peak learning rate (of the head, with layer decay)"
                   + ("; seed 004: 1e-5 to 1e-4 for pretrained weights" if finetune else ""))
    r.add_argument("--weight-decay", type=float, default=0.05, metavar="W", help="AdamW weight decay (matrices only)")
    r.add_argument("--warmup-epochs", type=float, default=1.0 if finetune else 3.0, metavar="E",
                   help="linear warmup at the start of each stage, then cosine")
    r.add_argument("--min-lr-ratio", type=float, default=0.0, metavar="F", help="cosine floor as a fraction of --lr")
    r.add_argument("--clip-grad", type=float, default=1.0, metavar="C", help="gradient norm clipping (0 = off)")
    if finetune:
        r.add_argument("--freeze-epochs", type=int, default=2, metavar="K",
                       help="stage 1: train only the head for K epochs (seed 004 section 7.3)")
        r.add_argument("--unfreeze", default="all", metavar="last:N|all",
                       help="stage 2: train the last N blocks (+ final norm and head), or all (default all)")
        r.add_argument("--layer-decay", type=float, default=0.75, metavar="D",
                       help="layer-wise lr decay: block i of L gets lr x D^(L+1-i) (1 = off)")
    a = p.add_argument_group("augmentation and regularisation")
    a.add_argument("--no-aug", dest="augment", action="store_false",
                   help="no random augmentation: train images are preprocessed like val images")
    a.add_argument("--hflip", action=argparse.BooleanOptionalAction, default=None,
                   help="random horizontal flips; --no-hflip for digits, text, anything with a handedness "
                   "(default: on for image folders, off for the bundled digits and dataset X)")
    a.add_argument("--crop-scale", type=float, default=0.35, metavar="S",
                   help="RandomResizedCrop keeps between S and all of the image area")
    a.add_argument("--color-jitter", type=float, default=0.0, metavar="F", help="brightness/contrast/saturation jitter")
    a.add_argument("--auto-augment", choices=("none", "rand", "trivial"), default="none",
                   help="RandAugment (rand) or TrivialAugmentWide (trivial)")
    a.add_argument("--reprob", type=float, default=0.0, metavar="P", help="RandomErasing probability")
    a.add_argument("--mixup", type=float, default=0.0, metavar="A", help="MixUp Beta alpha (0 = off; e.g. 0.8)")
    a.add_argument("--cutmix", type=float, default=0.0, metavar="A", help="CutMix Beta alpha (0 = off; e.g. 1.0)")
    a.add_argument("--mix-switch-prob", type=float, default=0.5, metavar="P",
                   help="with both MixUp and CutMix on, the chance a batch uses CutMix")
    a.add_argument("--smoothing", type=float, default=0.0, metavar="S", help="label smoothing")
    a.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="keep an exponential moving average of the weights (e.g. 0.999); evaluated every epoch")
    x = p.add_argument_group("running")
    x.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16 autocast or fp32")
    x.add_argument("--grad-accum", type=int, default=1, metavar="G", help="accumulate gradients over G batches")
    x.add_argument("--seed", type=int, default=0, help="seed of the split, the shuffles and the augmentation")
    x.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps")
    x.add_argument("--out", required=True, metavar="DIR",
                   help="run folder: metrics.csv, tensorboard/, checkpoints, PNGs, summary.json")
    x.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    x.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op CPU threads for this run (default: torch's; 1 is often fastest for "
                   "small models on a busy CPU)")


def run_with_threads(args, cfg) -> int:
    """Run `cfg`, with --threads set for the run and restored afterwards."""
    import torch

    from vitlab.errors import VitlabError
    from vitlab.train.finetune import run as run_training

    if args.threads is not None and args.threads < 1:
        raise VitlabError(f"--threads must be at least 1; found {args.threads}")
    before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run_training(cfg)
    finally:
        torch.set_num_threads(before)
    return 0


def config_from_args(args):
    from dataclasses import fields

    from vitlab.train.finetune import RunConfig

    values = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    return RunConfig(**values)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune a (pretrained) model on your image folder: staged, with layer decay",
        description="Fine-tune on an image folder with the seeds' staged recipe: a new zero-initialised head, "
        "--freeze-epochs of head-only training, then --unfreeze last:N|all with layer-wise lr decay; AdamW, "
        "warmup+cosine, clipping, MixUp/CutMix, EMA, checkpoints every epoch (--resume), metrics.csv, "
        "TensorBoard, confusion matrix, curves, summary.json. Runs under torchrun for several processes.",
        formatter_class=DefaultsFormatter,
    )
    add_run_arguments(p, finetune=True)
    p.set_defaults(func=run)


def run(args) -> int:
    return run_with_threads(args, config_from_args(args))
