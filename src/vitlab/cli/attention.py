"""`vitlab attention IMAGE... --checkpoint RUN --out DIR`: where the model looks, drawn on the image.

For each image: a grid of heatmap overlays (`<stem>_<method>.png`: rows = layers, columns = heads
or the fused heads), the final map at the image's resolution (`<stem>_<method>_overlay.png`), and
`attention.csv` with the patch each map peaks at.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vitlab.cli._common import add_device, add_fast_path, add_model_source, add_out, model_from_args
from vitlab.cli._help import example
from vitlab.errors import check_range
from vitlab.fileio import check_out_folder, output_folder, write_csv

# the last line of its --help
EXAMPLE = "vitlab attention runs/digits/val/3/0013.png --checkpoint runs/digits_vit --out runs/attention"


def add_analysis_arguments(p) -> None:
    """The model and device flags, --batch-size and --fast-path, shared with `vitlab inspect`."""
    add_model_source(p, weights="optional")
    add_device(p)
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="N",
        help="images per forward pass (default: as many as fit in 1 GiB of attention weights)",
    )
    add_fast_path(p)


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "attention",
        help=summary,
        epilog=example(EXAMPLE),
        description="Heatmaps of the attention of the token the classifier reads (the class token, or "
        "the mean of the patch tokens for models that pool by averaging them) to every patch, from the explicit "
        "attention path, upsampled and blended on the image; or attention rollout (Abnar & Zuidema 2020).",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders of images")
    add_analysis_arguments(p)
    p.add_argument(
        "--layer",
        default="last",
        help="layer index (negative from the end), 'last' or 'all' (rollout: the last layer included)",
    )
    p.add_argument(
        "--head",
        default="mean",
        help="head index, mean/max/min over heads, or 'all' for one "
        "column per head (rollout: the head fusion, mean/max/min)",
    )
    p.add_argument(
        "--method",
        default="cls",
        choices=("cls", "rollout"),
        help="cls: one layer's attention; rollout: attention rolled out through the layers",
    )
    p.add_argument("--start-layer", type=int, default=0, help="rollout: the first layer included")
    p.add_argument("--discard-ratio", type=float, default=0.0, help="rollout: zero the lowest fraction of each row")
    p.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity in the overlay, 0..1")
    p.add_argument(
        "--upsample",
        default="bilinear",
        choices=("bilinear", "nearest"),
        help="how a patch map is scaled to the image (nearest shows the patches)",
    )
    add_out(p, help="folder for the PNGs and attention.csv")
    p.set_defaults(func=run)


def check_analysis_options(args, kind: str) -> Path:
    """The flags `vitlab attention` and `vitlab inspect` share, and the output folder, before any work."""
    from vitlab.runtime import resolve_device

    check_range("batch_size", args.batch_size, low=1, integer=True, optional=True)
    check_range("img_size", args.img_size, low=1, integer=True, optional=True)
    resolve_device(args.device)
    return check_out_folder(args.out, kind=kind, force=args.force)


def run(args) -> int:
    from vitlab.analysis import attention as A
    from vitlab.data.folder import image_paths
    from vitlab.data.preprocess import images_tensor
    from vitlab.runtime import resolve_device

    check_range("alpha", args.alpha, low=0, high=1)
    check_range("discard_ratio", args.discard_ratio, low=0, high=1, high_open=True)
    check_range("start_layer", args.start_layer, low=0, integer=True)
    check_analysis_options(args, "attention")
    paths = image_paths(args.images)
    model = model_from_args(args).to(resolve_device(args.device)).eval()
    A.check_vit(model)
    x = images_tensor(paths, model.pretrained_cfg, model.cfg.img_size)  # (B, C, H, W)
    layers = {"last": -1, "all": "all"}.get(args.layer, args.layer)
    said: list[
        str
    ] = []  # the fast path taken: printed once the run has succeeded (a failed run prints its error alone)
    maps, rows, cols = A.explain(
        model,
        x,
        method=args.method,
        layers=layers,
        head=args.head,
        discard_ratio=args.discard_ratio,
        start_layer=args.start_layer,
        batch_size=args.batch_size,
        fast_path=args.fast_path,
        log=said.append,
    )  # (B, R, C, gh, gw)
    with output_folder(args.out, kind="attention", force=args.force) as out:
        _write(args, out, model, paths, x, maps, rows, cols)
    for line in said:
        print(line, file=sys.stderr)
    return 0


def _write(args, out: Path, model, paths, x, maps, rows, cols) -> None:
    from vitlab.analysis import plots

    pcfg = model.pretrained_cfg
    gh, gw = model.cfg.grid_size
    stems = [p.stem for p in paths]
    if len(set(stems)) < len(stems):  # same name in different folders: number them
        stems = [f"{i:02d}_{s}" for i, s in enumerate(stems)]
    csv_rows = []
    for i, (path, stem) in enumerate(zip(paths, stems)):
        image = plots.display_image(x[i], pcfg)  # (H', W', 3) in [0, 1]
        grid = plots.attention_grid(
            image,
            maps[i],
            out / f"{stem}_{args.method}.png",
            row_labels=rows,
            col_labels=cols,
            title=f"{path.name}: {args.method}",
            alpha=args.alpha,
            mode=args.upsample,
        )
        picture, final = plots.final_overlay(image, maps[i], alpha=args.alpha, mode=args.upsample)
        single = plots.save_image(picture, out / f"{stem}_{args.method}_overlay.png")
        for r, row in enumerate(rows):
            for c, col in enumerate(cols):
                m = maps[i, r, c]
                peak = int(m.argmax())
                csv_rows.append(
                    (path.name, args.method, row, col, peak // gw, peak % gw, f"{m.max():.5f}", f"{m.sum():.5f}")
                )
        peak = int(final.argmax())
        print(
            f"{path.name}: {rows[-1]}, {cols[-1] if len(cols) == 1 else 'mean of heads'}: peak at patch "
            f"(row {peak // gw}, col {peak % gw}) of {gh}x{gw}, weight {final.max():.3f}; wrote {grid}, {single}"
        )
    table = write_csv(
        out / "attention.csv",
        csv_rows,
        ["image", "method", "layer", "head", "peak_row", "peak_col", "peak_weight", "patch_weight_sum"],
    )
    print(f"wrote {table}")
