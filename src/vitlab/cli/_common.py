"""The flags several commands share, declared once, with one meaning and one set of messages:
where the model comes from, the device, the precision, CPU threads, the output.

    add_model_source(p, weights="required" | "optional" | "none")   --model, --pretrained | --checkpoint, --img-size
    model_from_args(args, num_classes=...)                          vitlab.create_model, load warnings printed
    add_device(p), add_precision(p), add_threads(p), add_out(p)   --out and --force (vitlab.fileio checks them)
    add_fast_path(p)                                                --fast-path auto|tuned|compile|eager|off
    add_engine(p)                                                   --engine auto|torch|onnxruntime
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING

from vitlab.errors import VitlabError
from vitlab.options import DEFAULT_ENGINE, DEFAULT_FAST_PATH, ENGINE_CHOICES, FAST_PATHS, PRECISIONS

if TYPE_CHECKING:
    from torch import nn


def add_model_source(p: argparse.ArgumentParser, *, weights: str = "optional") -> None:
    """--model NAME, --pretrained SOURCE | --checkpoint PATH, --img-size S.

    weights: "required" (predict, export: random weights would predict nothing), "optional"
    (attention, inspect, finetune: --model alone is a randomly initialised model), "none" (train:
    from random weights only).
    """
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        metavar="NAME",
        help="a registered model (`vitlab info` lists them); with --pretrained "
        "or --checkpoint optional, and then checked against the weights",
    )
    if weights != "none":
        src = g.add_mutually_exclusive_group()
        src.add_argument(
            "--pretrained",
            metavar="SOURCE",
            help="weights of timm, Hugging Face, torchvision or the JAX "
            "release: a .safetensors/.pth/.bin/.npz file, a save_pretrained folder, or a hub id "
            "(hf-hub:timm/..., google/vit-...); the Hugging Face cache is tried first and HF_HUB_OFFLINE=1 "
            "is honoured",
        )
        src.add_argument(
            "--checkpoint",
            metavar="PATH",
            help="a vitlab checkpoint: a run folder (its last.json), a "
            "last.json/best.json, a checkpoint folder, or an exported .safetensors with its .json",
        )
    g.add_argument(
        "--img-size",
        type=int,
        default=None,
        metavar="S",
        help="run at S x S pixels; the position "
        "embedding is resampled (2-D bicubic) if the weights were trained at another size",
    )
    p.set_defaults(weights_rule=weights)


def model_from_args(args, **kwargs) -> nn.Module:
    """The model the flags name (vitlab.create_model); load warnings (a new head, dropped parts) are
    printed as `warning: ...` lines."""
    from vitlab.models.factory import create_model

    pretrained, checkpoint = getattr(args, "pretrained", None), getattr(args, "checkpoint", None)
    if args.weights_rule == "required" and not (pretrained or checkpoint):
        raise VitlabError(
            "give the weights with --pretrained SOURCE (a file, folder or hub id) or --checkpoint PATH "
            "(a vitlab run); random weights predict nothing"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model(args.model, pretrained=pretrained, checkpoint=checkpoint, img_size=args.img_size, **kwargs)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return model


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")


def add_precision(p: argparse.ArgumentParser, help: str = "fp32, or bf16 autocast") -> None:
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=help)


def add_threads(p: argparse.ArgumentParser, default: int | None = None, help: str | None = None) -> None:
    p.add_argument(
        "--threads",
        type=int,
        default=default,
        metavar="N",
        help=help
        or ("torch intra-op CPU threads (default: torch's; 1 is often fastest for small models on a busy CPU)"),
    )


def add_fast_path(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument(
        "--fast-path",
        choices=FAST_PATHS,
        default=DEFAULT_FAST_PATH,
        help=help
        or (
            "auto (the default): the plan fixed rules give this kind of CPU, precision and run (nothing timed: the "
            "same command gives the same numbers); tuned: the plan `vitlab tune` measured fastest here (measured "
            "first if need be); "
            "compile / eager: the rules' plan compiled / never compiled; off: the model exactly as built. Every path "
            "gives the same numbers to float rounding; the plan is printed"
        ),
    )


def add_engine(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=DEFAULT_ENGINE,
        help=help
        or (
            "what computes the logits: auto (the default): the engine fixed rules give this kind of CPU, precision "
            "and batch (ONNX Runtime for fp32 at batch 1 on an AMD Zen 4, where it was measured faster; else "
            "PyTorch); torch; onnxruntime: the model exported to ONNX once per weights (under the cache folder), "
            "checked against PyTorch, run by ONNX Runtime (fp32; the same top-k). PyTorch runs where ONNX Runtime "
            "cannot, and says why; the engine is printed"
        ),
    )


def add_out(p, *, help: str, required: bool = True, default: str | None = None, file: bool = False) -> None:
    """--out and --force: vitlab.fileio checks the place before any work (a folder vitlab can create
    or write, not someone else's non-empty folder, not an existing file) unless --force is given."""
    p.add_argument("--out", required=required, default=default, metavar="PATH" if file else "DIR", help=help)
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output file (and the .json next to a .safetensors)"
        if file
        else "write into a folder that is not empty though vitlab did not make it for this command "
        "(files of the same names are replaced; nothing else is touched)",
    )


__all__ = [
    "add_model_source",
    "model_from_args",
    "add_device",
    "add_precision",
    "add_threads",
    "add_fast_path",
    "add_engine",
    "add_out",
]
