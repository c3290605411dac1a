"""scikit-learn's bundled digits: 1,797 real 8x8 grey images of handwritten digits, 10 classes.

It ships inside scikit-learn, so it needs no download: vitlab's real dataset for tests and demos.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from PIL import Image

from vitlab.data.split import stratified_split
from vitlab.errors import check_range
from vitlab.fileio import whole_folder
from vitlab.models.size import check_memory
from vitlab.options import DEFAULT_VAL_SPLIT, check_seed

CLASS_NAMES = tuple(str(i) for i in range(10))
N_DIGITS = 1797


def load_digits(size: int = 32, *, channels: int = 3, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as (1797, channels, size, size) float32 in [0, 1] (or [-1, 1]) and labels.

    The 8x8 images (values 0..16) are upsampled bilinearly to `size` and repeated over `channels`.
    """
    from sklearn.datasets import load_digits as _load

    check_range("size", size, low=8, integer=True, hint=" (the images are 8x8)")
    # the upsampled float images, their normalised copy over `channels`, and the uint8 copy a folder is written from
    check_memory(
        N_DIGITS * size * size * (4 + 4 * channels + 1),
        f"size {size}: the {N_DIGITS:,} digits at {size}x{size} pixels",
        arg="size",
        fix="; choose a smaller size",
    )
    d = _load()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # (1797, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    x = x.expand(-1, channels, -1, -1)  # (1797, C, size, size)
    if normalize:
        x = (x - 0.5) / 0.5
    return x.contiguous(), torch.tensor(d.target, dtype=torch.int64)


def write_digits_folder(
    out, *, size: int = 32, val_split: float = DEFAULT_VAL_SPLIT, seed: int = 0, per_class: int | None = None
) -> dict:
    """Write the digits as an image folder, `out/{train,val}/<digit>/<index>.png` (grey PNGs).

    The split is `stratified_split(val_split, seed)`; `per_class` keeps at most that many images per
    class (before splitting), for quick tests. The folder is built under a temporary name and moved
    into place, so `out` is either complete or as it was; `out` may hold this function's earlier output,
    which is replaced whole. Returns {"train": n, "val": n}.
    """
    check_range("size", size, low=8, integer=True, hint=" (the images are 8x8)")
    check_range("val_split", val_split, low=0, high=1, low_open=True, high_open=True)
    check_range(
        "per_class", per_class, low=2, integer=True, optional=True, hint=" (one image to train, one to validate)"
    )
    check_seed(seed)
    with whole_folder(out, kind="digits") as tmp:  # new, empty, or its own earlier output: replaced whole
        x, y = load_digits(size, channels=1, normalize=False)  # (1797, 1, size, size) in [0, 1]
        keep = torch.arange(len(y))
        if per_class is not None:
            keep = torch.cat([(y == c).nonzero().flatten()[:per_class] for c in range(10)]).sort().values
        train_idx, val_idx = stratified_split(y[keep], val_split, seed=seed)
        pixels = (x[:, 0] * 255 + 0.5).to(torch.uint8).numpy()  # (1797, size, size)
        for part, idx in (("train", train_idx), ("val", val_idx)):
            for c in CLASS_NAMES:
                (tmp / part / c).mkdir(parents=True)
            for i in keep[idx].tolist():
                Image.fromarray(pixels[i], "L").save(tmp / part / CLASS_NAMES[int(y[i])] / f"{i:04d}.png")
    return {"train": len(train_idx), "val": len(val_idx)}
