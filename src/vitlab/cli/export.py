"""`vitlab export --pretrained SOURCE --out PATH`: safetensors (+ JSON) or ONNX.

`.safetensors`: the weights under timm's names plus `<stem>.json`, which `vitlab predict --checkpoint`
and `vitlab.create_model(checkpoint=PATH)` reload. `.onnx`: a dynamic batch axis, checked with ONNX
Runtime against PyTorch (max abs difference <= 1e-4) before the file is put in place.
"""

from __future__ import annotations

from vitlab.cli._common import add_model_source, add_out, example, model_from_args
from vitlab.inference.export import check_export, export_model

HELP = "write a model as .safetensors or .onnx (checked)"  # its line in `vitlab --help`
EXAMPLE = "vitlab export --checkpoint runs/digits_vit --out runs/digits_vit.onnx"  # the last line of its --help


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help=HELP,
        epilog=example(EXAMPLE),
        description="Load weights like `vitlab predict` does and export them. The format comes from the "
        "--out suffix: .safetensors (with a .json config next to it) or .onnx (dynamic batch axis, "
        "checked with ONNX Runtime against PyTorch).",
    )
    add_model_source(p, weights="required")
    add_out(p, help="output file: *.safetensors (with a .json next to it) or *.onnx", file=True)
    p.add_argument("--no-check", action="store_true", help="ONNX: skip the ONNX Runtime comparison")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset version (default: the exporter's)")
    p.set_defaults(func=run)


def run(args) -> int:
    check_export(args.out, opset=args.opset, force=args.force)  # before the weights are read
    model = model_from_args(args)
    report = export_model(model, args.out, check=not args.no_check, opset=args.opset, force=args.force)
    print(f"wrote {', '.join(report['files'])}")
    if "max_abs_diff" in report:
        print(
            f"ONNX Runtime vs PyTorch: max abs difference {report['max_abs_diff']:.2e} "
            f"(tolerance {report['tolerance']:.0e})"
        )
    return 0
