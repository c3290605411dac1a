"""`vitlab inspect --model NAME --out DIR`: the paper's Figure 7 for any vitlab model.

(a) the first 28 principal components of the RGB patch-embedding filters, (b) the cosine similarity
of each patch's position embedding to all others, one tile per position, (c) the mean attention
distance of every head against depth, in pixels, averaged over a set of images. PNG + CSV each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitlab.cli.attention import add_model_arguments, image_paths, load_images, load_model

# Photos bundled with scikit-image (no download), used when --images is not given.
BUNDLED_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field",
                  "colorwheel", "camera", "coins", "horse", "moon", "brick", "grass", "gravel")


def bundled_images(model, limit: int) -> torch.Tensor:
    """scikit-image's bundled photos, preprocessed like files would be. (B, C, H, W)."""
    import tempfile

    from PIL import Image
    from skimage import data

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in BUNDLED_PHOTOS[:limit]:
            img = np.asarray(getattr(data, name)())
            path = Path(tmp) / f"{name}.png"
            Image.fromarray(img).save(path)
            paths.append(path)
        return load_images(paths, model)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="the paper's Figure 7: embedding filters, position-embedding similarity, attention distance",
        description="Figure 7 of the ViT paper for a model: (a) principal components of the patch-embedding "
        "filters, (b) position-embedding cosine similarity, (c) mean attention distance per head vs depth.",
    )
    add_model_arguments(p)
    p.add_argument("--images", metavar="DIR", help="folder of images for (c) (default: scikit-image's bundled photos)")
    p.add_argument("--max-images", type=int, default=16, metavar="N", help="use at most N images for (c)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs and CSVs")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.analysis import plots
    from vitlab.errors import VitlabError

    if args.max_images < 1:
        raise VitlabError(f"--max-images must be at least 1; found {args.max_images}")
    model = load_model(args)
    if args.images:
        x = load_images(image_paths([args.images])[: args.max_images], model)
        source = args.images
    else:
        x = bundled_images(model, args.max_images)
        source = "scikit-image's bundled photos"
    summary = plots.write_figure7(model, x, args.out, batch_size=args.batch_size)
    print(f"Figure 7 for {args.model or args.checkpoint} ({len(x)} images from {source}):")
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
