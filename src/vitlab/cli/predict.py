"""`vitlab predict IMAGE... --model NAME --pretrained SOURCE`: the top-k classes of each image.

Seed 004, section 7.2: load pretrained weights *with their preprocessing* and print the top 5. The
preprocessing (resize, crop, interpolation, mean/std) comes from the weights' source; see
vitlab.preprocess. A bad image is one line `error: FILE: ...` on stderr; the other images are still
predicted, and the exit code is 2 if any image failed.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from vitlab.errors import VitlabError


def add_weights_arguments(p) -> None:
    """--model / --pretrained / --checkpoint / --img-size, shared with `vitlab export`."""
    p.add_argument("--model", metavar="NAME", help="vitlab model name (see `vitlab info`); optional when the "
                   "weights' config names the architecture (vitlab, timm hub or Hugging Face folders)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="SOURCE", help="weights: a .safetensors/.pth/.bin/.npz file, a "
                     "save_pretrained folder, or a hub id (hf-hub:timm/..., google/vit-...); the Hugging Face "
                     "cache is tried first and HF_HUB_OFFLINE=1 is honoured")
    src.add_argument("--checkpoint", metavar="PATH", help="a vitlab checkpoint: a fine-tuning checkpoint "
                     "folder, run folder or last.json/best.json, or an exported .safetensors with its .json")
    p.add_argument("--img-size", type=int, default=None, metavar="S", help="run at S x S pixels; the position "
                   "embedding is resampled (2-D bicubic) if the weights were trained at another size")


def load_model_from_args(args):
    """The model the flags name; load warnings (new head, dropped parts) printed as `warning: ...` lines."""
    from vitlab.weights import load_pretrained

    if not (args.pretrained or args.checkpoint):
        raise VitlabError("give the weights with --pretrained SOURCE (a file, folder or hub id) or --checkpoint PATH")
    source = args.pretrained
    if args.checkpoint:
        path = Path(args.checkpoint)
        if path.suffix == ".safetensors" and path.with_suffix(".json").is_file():
            source = path  # an exported file and its JSON
        else:
            from vitlab.train.checkpoint import resolve_checkpoint

            source = resolve_checkpoint(path)  # a checkpoint folder: model.safetensors + config.json
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_pretrained(args.model, source, img_size=args.img_size)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return model


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "predict",
        help="top-k ImageNet (or the checkpoint's) classes of images, with the weights' own preprocessing",
        description="Load pretrained weights (timm, Hugging Face, torchvision, JAX .npz, or a vitlab "
        "checkpoint), preprocess each image exactly as the weights' source did, and print the k most "
        "probable classes. Exit code 2 if any image could not be read.",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, WebP, BMP, TIFF)")
    add_weights_arguments(p)
    p.add_argument("--topk", type=int, default=5, metavar="K", help="how many classes to print per image (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON document (model, source, results) instead of text")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="fp32, or bf16 autocast (on a CPU, Linear weights are packed once for oneDNN: vitlab.cpu_inference)")
    p.add_argument("--batch-size", type=int, default=16, metavar="N", help="images per forward pass (default 16)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.predict import format_results, predict_files

    if args.topk < 1:
        raise VitlabError(f"--topk must be at least 1, found {args.topk}")
    if args.batch_size < 1:
        raise VitlabError(f"--batch-size must be at least 1, found {args.batch_size}")
    model = load_model_from_args(args)
    results = predict_files(
        model, args.images, topk=args.topk, device=args.device, precision=args.precision, batch_size=args.batch_size,
        pack=True,
    )
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"error: {r['error']}", file=sys.stderr)
    pcfg = model.pretrained_cfg
    if args.json:
        doc = {
            "model": pcfg.get("architecture"),
            "source": pcfg.get("source"),
            "format": pcfg.get("format"),
            "input_size": list(pcfg.get("input_size", ())),
            "results": results,
        }
        print(json.dumps(doc, indent=2))
    else:
        from vitlab.preprocess import describe

        text = format_results(results)
        print(f"{pcfg.get('architecture') or 'model'} with weights {pcfg.get('source')} ({pcfg.get('format')} layout); "
              f"preprocessing: {describe(pcfg, model.cfg.img_size)}")
        if text:
            print(text)
    return 2 if failed else 0
