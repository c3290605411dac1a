"""`vitlab attention IMAGE... --model NAME --out DIR`: where the model looks, drawn on the image.

For each image: a grid of heatmap overlays (`<stem>_<method>.png`: rows = layers, columns = heads
or the fused heads), the final map at the image's resolution (`<stem>_<method>_overlay.png`), and
`attention.csv` with the patch each map peaks at. Seed 000 section 5.3, seed 004 section 7.4.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vitlab.errors import VitlabError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model / --pretrained / --checkpoint / --device, shared with `vitlab inspect`."""
    p.add_argument("--model", metavar="NAME", help="model name (see `vitlab info`); not with --checkpoint, which names its own")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="SOURCE", help="weights: a file, a folder or a hub id (see vitlab.weights)")
    src.add_argument("--checkpoint", metavar="PATH", help="a vitlab checkpoint folder, run folder or last.json/best.json")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="images per forward pass (default: as many as fit in 1 GiB of attention weights)")


def load_model(args) -> torch.nn.Module:
    """The model the flags name, in eval mode on the chosen device."""
    from vitlab.runtime import resolve_device

    if args.checkpoint:
        from vitlab.train.checkpoint import load_model as load_checkpoint

        if args.model:
            raise VitlabError(f"--model {args.model} and --checkpoint {args.checkpoint}: give one; the checkpoint "
                              "already records its model's configuration")

        model = load_checkpoint(args.checkpoint)
    elif args.model:
        import vitlab

        model = vitlab.create_model(args.model, pretrained=args.pretrained)
    else:
        raise VitlabError("--model NAME is required (or --checkpoint PATH); see `vitlab info` for the names")
    return model.to(resolve_device(args.device)).eval()


def image_paths(items: list[str]) -> list[Path]:
    """Files as given, folders expanded to their image files (sorted)."""
    out = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            out.append(path)
        else:
            raise VitlabError(f"image {item}: no such file or folder")
    if not out:
        raise VitlabError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) found in {', '.join(items)}")
    return out


def load_images(paths: list[Path], model: torch.nn.Module) -> torch.Tensor:
    """Open and preprocess images for `model` with the eval transform of its pretrained_cfg
    (vitlab.preprocess: the weights' own resize, crop and normalisation). (B, C, H, W)."""
    from vitlab.preprocess import eval_transform, open_image

    C = model.cfg.in_chans
    cfg = dict(model.pretrained_cfg or {})
    cfg["mean"] = list(cfg.get("mean", (0.5,) * 3))[:C]  # a grey (C = 1) model keeps one channel's values
    cfg["std"] = list(cfg.get("std", (0.5,) * 3))[:C]
    transform = eval_transform(cfg, img_size=model.cfg.img_size)
    images = [open_image(path) for path in paths]  # RGB; a bad file is a VitlabError naming it
    return torch.stack([transform(im if C == 3 else im.convert("L")) for im in images])  # (B, C, H, W)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "attention",
        help="draw where a ViT attends on images (CLS attention or rollout)",
        description="Heatmaps of the attention of the token the classifier reads (the class token, or "
        "the mean of the patch tokens for GAP models) to every patch, from the explicit attention path, "
        "upsampled and blended on the image; or attention rollout (Abnar & Zuidema 2020).",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders of images")
    add_model_arguments(p)
    p.add_argument("--layer", default="last", help="layer index (negative from the end), 'last' or 'all' "
                   "(rollout: the last layer included)")
    p.add_argument("--head", default="mean", help="head index, mean/max/min over heads, or 'all' for one "
                   "column per head (rollout: the head fusion, mean/max/min)")
    p.add_argument("--method", default="cls", choices=("cls", "rollout"), help="cls: one layer's attention; "
                   "rollout: attention rolled out through the layers")
    p.add_argument("--start-layer", type=int, default=0, help="rollout: the first layer included")
    p.add_argument("--discard-ratio", type=float, default=0.0, help="rollout: zero the lowest fraction of each row")
    p.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity in the overlay, 0..1")
    p.add_argument("--upsample", default="bilinear", choices=("bilinear", "nearest"),
                   help="how a patch map is scaled to the image (nearest shows the patches)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs and attention.csv")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.analysis import attention as A
    from vitlab.analysis import plots

    if not 0.0 <= args.alpha <= 1.0:
        raise VitlabError(f"--alpha must be in [0, 1]; found {args.alpha}")
    model = load_model(args)
    paths = image_paths(args.images)
    x = load_images(paths, model)
    layers = {"last": -1, "all": "all"}.get(args.layer, args.layer)
    maps, rows, cols = A.explain(model, x, method=args.method, layers=layers, head=args.head,
                                 discard_ratio=args.discard_ratio, start_layer=args.start_layer,
                                 batch_size=args.batch_size)  # (B, R, C, gh, gw)
    out = Path(args.out)
    pcfg = model.pretrained_cfg or {}
    C = model.cfg.in_chans
    mean, std = pcfg.get("mean", (0.5,) * C), pcfg.get("std", (0.5,) * C)
    gh, gw = model.cfg.grid_size
    stems = [p.stem for p in paths]
    if len(set(stems)) < len(stems):  # same name in different folders: number them
        stems = [f"{i:02d}_{s}" for i, s in enumerate(stems)]
    csv_rows = []
    for i, (path, stem) in enumerate(zip(paths, stems)):
        image = plots.enlarge(plots.to_display(x[i], mean, std))  # (H', W', 3) in [0, 1]
        grid = plots.attention_grid(image, maps[i], out / f"{stem}_{args.method}.png", row_labels=rows,
                                    col_labels=cols, title=f"{path.name}: {args.method}", alpha=args.alpha, mode=args.upsample)
        final = maps[i, -1].mean(dim=0)  # (gh, gw): the last row's fused map
        single = plots.save_image(plots.overlay(image, final, alpha=args.alpha, mode=args.upsample),
                                  out / f"{stem}_{args.method}_overlay.png")
        for r, row in enumerate(rows):
            for c, col in enumerate(cols):
                m = maps[i, r, c]
                peak = int(m.argmax())
                csv_rows.append((path.name, args.method, row, col, peak // gw, peak % gw, f"{m.max():.5f}", f"{m.sum():.5f}"))
        peak = int(final.argmax())
        print(f"{path.name}: {rows[-1]}, {cols[-1] if len(cols) == 1 else 'mean of heads'}: peak at patch "
              f"(row {peak // gw}, col {peak % gw}) of {gh}x{gw}, weight {final.max():.3f}; wrote {grid}, {single}")
    table = plots.write_csv(out / "attention.csv", ["image", "method", "layer", "head", "peak_row", "peak_col",
                                                     "peak_weight", "patch_weight_sum"], csv_rows)
    print(f"wrote {table}")
    return 0
