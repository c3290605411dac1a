"""`vitlab export --pretrained SOURCE --out PATH`: safetensors (+ JSON) or ONNX; `--format timm|hf`: a folder.

`.safetensors`: the weights under timm's names plus `<stem>.json`, which `vitlab predict --checkpoint`
and `vitlab.create_model(checkpoint=PATH)` reload. `.onnx`: a dynamic batch axis, checked with ONNX
Runtime against PyTorch (max abs difference <= 1e-4) before the file is put in place. `--format timm`:
a timm hub folder (`timm.create_model("local-dir:DIR", pretrained=True)`); `--format hf`: a
`save_pretrained` folder (`ViTForImageClassification.from_pretrained(DIR)`), each checked with its library.
"""

from __future__ import annotations

from vitlab.cli._common import add_model_source, add_out, model_from_args
from vitlab.cli._help import example

EXAMPLE = "vitlab export --checkpoint runs/digits_vit --out runs/digits_vit.onnx"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "export",
        help=summary,
        epilog=example(EXAMPLE),
        description="Load weights like `vitlab predict` does and export them. The format comes from the "
        "--out suffix: .safetensors (with a .json config next to it) or .onnx (dynamic batch axis, "
        "checked with ONNX Runtime against PyTorch); --format timm or hf writes a folder that timm or "
        "Hugging Face transformers loads (checked with that library when it is installed).",
    )
    add_model_source(p, weights="required")
    add_out(p, help="output file: *.safetensors (with a .json next to it) or *.onnx; a folder with --format", file=True)
    p.add_argument(
        "--format",
        choices=("timm", "hf"),
        default=None,
        help="timm: a timm hub folder (config.json, model.safetensors); hf: a transformers save_pretrained folder "
        "(config.json, model.safetensors, preprocessor_config.json). Default: a file, by the --out suffix",
    )
    p.add_argument(
        "--no-check", action="store_true", help="skip the comparison with ONNX Runtime, timm or transformers"
    )
    p.add_argument("--opset", type=int, default=None, help="ONNX opset version (default: the exporter's)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.inference.export import check_export, export_model

    check_export(args.out, opset=args.opset, force=args.force, format=args.format)  # before the weights are read
    model = model_from_args(args)
    report = export_model(
        model, args.out, check=not args.no_check, opset=args.opset, force=args.force, format=args.format
    )
    print(f"wrote {', '.join(report['files'])}")
    if report.get("max_abs_diff") is not None:
        against = {"timm": "timm vs vitlab", "hf": "transformers vs vitlab"}.get(args.format, "ONNX Runtime vs PyTorch")
        print(f"{against}: max abs difference {report['max_abs_diff']:.2e} (tolerance {report['tolerance']:.0e})")
    elif args.format is not None and not args.no_check:
        print(f"not checked: {'timm' if args.format == 'timm' else 'transformers'} is not installed")
    return 0
