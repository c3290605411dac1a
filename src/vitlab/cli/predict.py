"""`vitlab predict IMAGE... --pretrained SOURCE`: the top-k classes of each image.

Load pretrained weights *with their preprocessing* and print the top 5. The
preprocessing (resize, crop, interpolation, mean/std) comes from the weights' source; see
vitlab.data.preprocess. A bad image is one line `error: FILE: ...` on stderr; the other images are
still predicted, and the exit code is 2 if any image failed.
"""

from __future__ import annotations

import json
import sys

from vitlab.cli._common import add_device, add_engine, add_fast_path, add_model_source, add_precision, model_from_args
from vitlab.cli._help import example

EXAMPLE = (
    "vitlab predict runs/digits/val/3/0013.png --checkpoint runs/digits_vit --topk 3"  # the last line of its --help
)


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "predict",
        help=summary,
        epilog=example(EXAMPLE),
        description="Load pretrained weights (timm, Hugging Face, torchvision, JAX .npz, or a vitlab "
        "checkpoint), preprocess each image exactly as the weights' source did, and print the k most "
        "probable classes. Exit code 2 if any image could not be read.",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, WebP, BMP, TIFF)")
    add_model_source(p, weights="required")
    p.add_argument("--topk", type=int, default=5, metavar="K", help="how many classes to print per image (default 5)")
    p.add_argument(
        "--json", action="store_true", help="print one JSON document (model, source, results) instead of text"
    )
    add_device(p)
    add_precision(p, help="fp32, or bf16 autocast")
    p.add_argument("--batch-size", type=int, default=16, metavar="N", help="images per forward pass (default 16)")
    add_fast_path(p)
    add_engine(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.data.preprocess import describe
    from vitlab.inference.predict import check_options, format_results, predict_files
    from vitlab.models.vit import VisionTransformer

    check_options(
        topk=args.topk, batch_size=args.batch_size, device=args.device, precision=args.precision, engine=args.engine
    )
    model = model_from_args(args)
    said: list[str] = []
    results = predict_files(
        model,
        args.images,
        topk=args.topk,
        device=args.device,
        precision=args.precision,
        batch_size=args.batch_size,
        fast_path=args.fast_path,
        engine=args.engine,
        log=said.append,
    )
    failed = [r for r in results if "error" in r]
    for line in said if not failed else []:  # a failed run's stderr is its error lines alone
        print(line, file=sys.stderr)
    for r in failed:
        print(f"error: {r['error']}", file=sys.stderr)
    pcfg = model.pretrained_cfg
    if args.json:
        doc = {
            "model": pcfg.architecture,
            "source": pcfg.source,
            "format": pcfg.format,
            "input_size": list(pcfg.input_size),
            "results": results,
        }
        print(json.dumps(doc, indent=2, allow_nan=False))  # no NaN reaches a result (predict_files)
    else:
        text = format_results(results)
        described = f"ViT {model.cfg.describe()}" if isinstance(model, VisionTransformer) else "model"
        name = pcfg.architecture or described  # the architecture read from the weights, when not named
        print(f"{name} with weights {pcfg.source} ({pcfg.format} layout); preprocessing: {describe(pcfg)}")
        if text:
            print(text)
    return 2 if failed else 0
