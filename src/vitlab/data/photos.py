"""Photos that need no download: scikit-image ships a few (an astronaut, a cat, coffee, a rocket, ...).
`vitlab inspect` measures attention distances on them when no images are given."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitlab.data.preprocess import to_rgb

BUNDLED_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "colorwheel",
    "camera",
    "coins",
    "horse",
    "moon",
    "brick",
    "grass",
    "gravel",
)


def sample_photos(limit: int | None = None) -> list[tuple[str, Image.Image]]:
    """(name, RGB PIL image) of the first `limit` bundled photos."""
    from skimage import data  # imported here: scikit-image loads slowly and only this needs it

    names = BUNDLED_PHOTOS[:limit]
    return [(name, to_rgb(Image.fromarray(np.asarray(getattr(data, name)())))) for name in names]


__all__ = ["BUNDLED_PHOTOS", "sample_photos"]
