"""`vitlab inspect --checkpoint RUN --out DIR`: the paper's Figure 7 for any vitlab model, and the token
norms per layer of "Vision Transformers Need Registers".

(a) the first 28 principal components of the RGB patch-embedding filters, (b) the cosine similarity
of each patch's position embedding to all others, one tile per position, (c) the mean attention
distance of every head against depth, in pixels, averaged over a set of images; (d) the norm of every
token after each block, patches on the grid and prefix tokens (class, distillation, registers) apart,
where high-norm artefact patches show (Darcet et al. 2023). PNG + CSV each.
"""

from __future__ import annotations

import sys

from vitlab.cli._common import add_out, model_from_args
from vitlab.cli._help import example
from vitlab.cli.attention import add_analysis_arguments, check_analysis_options
from vitlab.errors import check_range
from vitlab.fileio import output_folder

# the last line of its --help
EXAMPLE = "vitlab inspect --checkpoint runs/digits_vit --images runs/digits/val/3 --out runs/inspect"


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "inspect",
        help=summary,
        epilog=example(EXAMPLE),
        description="Figure 7 of the ViT paper for a model: (a) principal components of the patch-embedding "
        "filters, (b) position-embedding cosine similarity, (c) mean attention distance per head vs depth; and "
        "(d) the norm of every token per layer on the patch grid, with the prefix tokens (class, distillation, "
        "registers) apart, which shows high-norm artefact patches and the registers that take them (Darcet et "
        "al. 2023, 'Vision Transformers Need Registers').",
    )
    add_analysis_arguments(p)
    p.add_argument("--images", metavar="DIR", help="folder of images for (c) (default: scikit-image's bundled photos)")
    p.add_argument("--max-images", type=int, default=16, metavar="N", help="use at most N images for (c) and (d)")
    p.add_argument(
        "--norm-ratio",
        type=float,
        default=4.0,
        metavar="R",
        help="(d): mark patches whose norm is above R times the median patch norm of their layer",
    )
    add_out(p, help="folder for the PNGs and CSVs")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.analysis import plots
    from vitlab.analysis.attention import check_vit
    from vitlab.data.folder import image_paths
    from vitlab.data.photos import sample_photos
    from vitlab.data.preprocess import images_tensor
    from vitlab.runtime import resolve_device

    check_range("max_images", args.max_images, low=1, integer=True)
    check_analysis_options(args, "inspect")
    check_range("norm_ratio", args.norm_ratio, low=1)
    if args.images:
        images, source = image_paths([args.images])[: args.max_images], args.images
    else:
        images, source = [im for _, im in sample_photos(args.max_images)], "scikit-image's bundled photos"
    model = model_from_args(args).to(resolve_device(args.device)).eval()
    check_vit(model)
    x = images_tensor(images, model.pretrained_cfg, model.cfg.img_size)
    said: list[str] = []  # the fast path taken: printed once the run has succeeded
    with output_folder(args.out, kind="inspect", force=args.force) as out:
        summary = plots.write_figure7(
            model, x, out, batch_size=args.batch_size, fast_path=args.fast_path, log=said.append
        )
        pcfg = model.pretrained_cfg
        display = plots.enlarge(plots.to_display(x[0], pcfg.mean, pcfg.std))
        norms = plots.write_token_norms(model, x, display, out, ratio=args.norm_ratio, batch_size=args.batch_size)
    print(f"Figure 7 for {args.model or args.pretrained or args.checkpoint} ({len(x)} images from {source}):")
    for line in plots.figure7_lines(summary) + plots.token_norm_lines(norms):
        print(f"  {line}")
    for path in summary["files"] + norms["files"]:
        print(f"  wrote {path}")
    for line in said:
        print(line, file=sys.stderr)
    return 0
