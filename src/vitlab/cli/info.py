"""`vitlab info MODEL`: parameters per component, tokens, FLOPs per image, training memory, the
paper's Base/Large/Huge table (Table 1) and the O(N^2 D) cost of smaller patches (vitlab.analysis.flops)."""

from __future__ import annotations

from vitlab.cli._help import example

EXAMPLE = "vitlab info vit_base_patch16_224"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "info",
        help=summary,
        epilog=example(EXAMPLE),
        description="Parameters per component (patch embedding, class token and position embedding, blocks, "
        "norm, head), the sequence length N+1, MACs and FLOPs per image counting the attention products "
        "QK^T and AV (checked against torch's FlopCounterMode), an estimate of fp32 AdamW training memory, "
        "the paper's Base/Large/Huge table and the patch 16 vs 8 trade-off. Nothing is allocated: the "
        "model is built on PyTorch's shape-only 'meta' device, so even ViT-H is instant. "
        "Without MODEL, lists the model names.",
    )
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a model name, e.g. vit_base_patch16_224 (run `vitlab info` without it for the list)",
    )
    p.add_argument(
        "--img-size",
        type=int,
        default=None,
        metavar="S",
        help="image side in pixels (default: the model's; must be a multiple of the patch size)",
    )
    p.add_argument(
        "--patch-size", type=int, default=None, metavar="P", help="patch side in pixels (default: the model's)"
    )
    p.add_argument(
        "--batch-size", type=int, default=64, metavar="B", help="batch size for the training memory estimate"
    )
    p.add_argument("--dim", type=int, default=None, metavar="D", help="override the width D (what-if)")
    p.add_argument("--depth", type=int, default=None, metavar="L", help="override the number of blocks L (what-if)")
    p.add_argument("--heads", type=int, default=None, metavar="H", help="override the number of heads (must divide D)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.analysis.flops import info_report
    from vitlab.models.registry import VARIANTS, model_names

    if args.model is None:
        width = max(map(len, model_names())) + 2
        for name in model_names():
            print(f"{name:<{width}}{VARIANTS[name].describe()}")
        return 0
    print(
        info_report(
            args.model,
            img_size=args.img_size,
            patch_size=args.patch_size,
            batch_size=args.batch_size,
            dim=args.dim,
            depth=args.depth,
            heads=args.heads,
        )
    )
    return 0
