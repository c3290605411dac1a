"""`vitlab inspect --checkpoint RUN --out DIR`: the paper's Figure 7 for any vitlab model.

(a) the first 28 principal components of the RGB patch-embedding filters, (b) the cosine similarity
of each patch's position embedding to all others, one tile per position, (c) the mean attention
distance of every head against depth, in pixels, averaged over a set of images. PNG + CSV each.
"""

from __future__ import annotations

import sys

from vitlab.analysis import plots
from vitlab.cli._common import add_out, model_from_args
from vitlab.cli.attention import add_analysis_arguments
from vitlab.data.folder import image_paths
from vitlab.data.photos import sample_photos
from vitlab.data.preprocess import images_tensor
from vitlab.errors import check_range
from vitlab.runtime import resolve_device


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="the paper's Figure 7: embedding filters, position-embedding similarity, attention distance",
        description="Figure 7 of the ViT paper for a model: (a) principal components of the patch-embedding "
        "filters, (b) position-embedding cosine similarity, (c) mean attention distance per head vs depth.",
    )
    add_analysis_arguments(p)
    p.add_argument("--images", metavar="DIR", help="folder of images for (c) (default: scikit-image's bundled photos)")
    p.add_argument("--max-images", type=int, default=16, metavar="N", help="use at most N images for (c)")
    add_out(p, help="folder for the PNGs and CSVs")
    p.set_defaults(func=run)


def run(args) -> int:
    check_range("max_images", args.max_images, low=1, integer=True)
    if args.images:
        images, source = image_paths([args.images])[: args.max_images], args.images
    else:
        images, source = [im for _, im in sample_photos(args.max_images)], "scikit-image's bundled photos"
    model = model_from_args(args).to(resolve_device(args.device)).eval()
    x = images_tensor(images, model.pretrained_cfg, model.cfg.img_size)
    summary = plots.write_figure7(model, x, args.out, batch_size=args.batch_size, fast_path=args.fast_path,
                                  log=lambda line: print(line, file=sys.stderr))
    print(f"Figure 7 for {args.model or args.pretrained or args.checkpoint} ({len(x)} images from {source}):")
    if "pcs_explained" in summary:
        print(f"  (a) first 28 principal components of the patch-embedding filters explain {summary['pcs_explained']:.1%} of their variance")
    if "pe_neighbour_vs_far" in summary:
        near, far = summary["pe_neighbour_vs_far"]
        print(f"  (b) position-embedding cosine similarity: neighbours {near:.3f}, far apart {far:.3f}")
    per_layer = ", ".join(f"{d:.1f}" for d in summary["distance_per_layer"])
    print(f"  (c) mean attention distance per layer (px, mean over heads): {per_layer}; uniform attention: {summary['distance_uniform']:.1f}")
    for note in summary["notes"]:
        print(f"  {note}")
    for path in summary["files"]:
        print(f"  wrote {path}")
    return 0
