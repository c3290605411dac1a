"""Procedurally generated shapes: the laptop-scale stand-in for "more data" in the paper's Section 4.2.

Two tasks, both rendered on the fly from a seed (nothing is downloaded or stored):

- `task="shape"` (`make_shapes`): one shape per image; the label is its kind (circle, square,
  triangle, diamond, plus, ring). Nuisances: position (translation), radius (scale), foreground and
  background colour (dark-on-light or light-on-dark), pixel noise. A CNN's translation equivariance
  is a real advantage here, which is what the data-scale experiment (paper Figures 3-4) needs.
- `task="arrangement"` (`make_arrangement`): a red and a blue object (random shapes, sizes, shades)
  on a grey background; the label is where the red one is relative to the blue one (left, right,
  above, below). "Red left of blue" and "red right of blue" contain the same patches, only in
  mirrored places, so a model without a position embedding cannot tell them apart: the task of the
  position-embedding ablation (paper Table 8).
- `task="position"`: one shape in one cell of a 3 x 3 grid; the label is the cell (9 classes). The
  label depends on both coordinates, so a learned 1-D position table has to discover the image's
  rows and columns: the model that Figure 7's position-embedding similarity is measured on.

Determinism: image i depends only on (seed, i), never on n. Samples are drawn in fixed chunks of
`CHUNK` images, each from its own generator seeded by (seed, chunk index), so the first 500 images of
a 50,000-image set are exactly the 500-image set: the data-scale experiment's sets are nested.
Shapes are drawn with signed distance functions and a one-pixel soft edge (anti-aliasing).
"""

from __future__ import annotations

import math

import torch

from vitlab.errors import VitlabError

SHAPE_NAMES = ("circle", "square", "triangle", "diamond", "plus", "ring")
ARRANGEMENT_NAMES = ("red left of blue", "red right of blue", "red above blue", "red below blue")
POSITION_NAMES = tuple(f"{row} {col}" for row in ("top", "middle", "bottom") for col in ("left", "centre", "right"))
CHUNK = 1024
VAL_SEED_OFFSET = 1_000_003  # validation sets come from another seed stream: never the training images


def _chunk_generator(seed: int, chunk: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_033 + chunk) * 7 + stream)


def _balanced_labels(b: int, k: int, g: torch.Generator) -> torch.Tensor:
    """b labels of k classes, each class b // k or b // k + 1 times, in random order."""
    return (torch.arange(b) % k)[torch.randperm(b, generator=g)]


def _signed_distance(kind: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Signed distance (pixels, negative inside) of pixel offsets (dx, dy) (b, H, W) from a shape of
    kind `kind` (b,) and radius `r` (b,), centred at the origin; y points down."""
    r = r[:, None, None]  # (b, 1, 1)
    ax, ay = dx.abs(), dy.abs()
    rad = torch.sqrt(dx**2 + dy**2)
    sd = torch.stack(
        [
            rad - r,  # circle
            torch.maximum(ax, ay) - 0.85 * r,  # square (area close to the circle's)
            torch.maximum(dy - 0.5 * r, (ax * math.sqrt(3) - (dy + r)) / 2),  # triangle, apex up
            (ax + ay - 1.2 * r) / math.sqrt(2),  # diamond
            torch.minimum(torch.maximum(ax - r, ay - 0.35 * r), torch.maximum(ax - 0.35 * r, ay - r)),  # plus
            (rad - 0.7 * r).abs() - 0.3 * r,  # ring
        ]
    )  # (6, b, H, W)
    return sd.gather(0, kind[None, :, None, None].expand(1, *dx.shape))[0]  # (b, H, W)


def _colours(b: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Foreground and background RGB (b, 3): one dark and one light colour, randomly which is which."""
    dark = 0.45 * torch.rand(b, 3, generator=g)
    light = 0.55 + 0.45 * torch.rand(b, 3, generator=g)
    swap = (torch.rand(b, generator=g) < 0.5)[:, None]
    return torch.where(swap, dark, light), torch.where(swap, light, dark)


def _paint(canvas: torch.Tensor, sd: torch.Tensor, colour: torch.Tensor) -> torch.Tensor:
    alpha = (0.5 - sd).clamp(0.0, 1.0)[:, None]  # (b, 1, H, W): one-pixel soft edge
    return canvas * (1 - alpha) + colour[:, :, None, None] * alpha


def _grid(b: int, img_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(torch.arange(img_size, dtype=torch.float32), torch.arange(img_size, dtype=torch.float32), indexing="ij")
    return xs[None].expand(b, -1, -1) + 0.5, ys[None].expand(b, -1, -1) + 0.5  # pixel centres, (b, H, W)


def _one_shape(kinds: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, r: torch.Tensor, g: torch.Generator,
               img_size: int, noise: float) -> torch.Tensor:
    """One shape per image (kind, centre and radius per image, each (b,)) in random colours, plus noise."""
    b = len(kinds)
    fg, bg = _colours(b, g)
    xs, ys = _grid(b, img_size)
    sd = _signed_distance(kinds, xs - cx[:, None, None], ys - cy[:, None, None], r)
    img = _paint(bg[:, :, None, None].expand(b, 3, img_size, img_size), sd, fg)
    return img + noise * torch.randn(img.shape, generator=g)  # (b, 3, H, W)


def _render_shape_chunk(b: int, g: torch.Generator, img_size: int, scale: tuple[float, float], noise: float):
    S = float(img_size)
    labels = _balanced_labels(b, len(SHAPE_NAMES), g)
    r = S * (scale[0] + (scale[1] - scale[0]) * torch.rand(b, generator=g))  # (b,) radius in pixels
    cx = r + (S - 2 * r) * torch.rand(b, generator=g)  # translation: the shape stays inside the image
    cy = r + (S - 2 * r) * torch.rand(b, generator=g)
    return _one_shape(labels, cx, cy, r, g, img_size, noise), labels


def _render_arrangement_chunk(b: int, g: torch.Generator, img_size: int, scale: tuple[float, float], noise: float):
    """A red and a blue object (each a random kind of shape, size and shade) on a grey background;
    the label says where the red one is relative to the blue one."""
    S = float(img_size)
    labels = _balanced_labels(b, len(ARRANGEMENT_NAMES), g)
    r = S * (scale[0] + (scale[1] - scale[0]) * torch.rand(b, 2, generator=g))  # (b, 2): red, blue radii
    rmax = r.max(dim=1).values  # (b,)
    # Along the relation's axis the two centres are at least 2 rmax + 2 px apart; across it they
    # differ by at most half that separation, so the relation is never ambiguous.
    lo, hi = rmax, S - rmax
    sep_min = (2 * rmax + 2).clamp(max=hi - lo)
    sep = sep_min + (hi - lo - sep_min) * torch.rand(b, generator=g)  # (b,)
    u1 = lo + (hi - lo - sep) * torch.rand(b, generator=g)  # first centre along the axis
    u2 = u1 + sep
    c = lo + (hi - lo) * torch.rand(b, generator=g)  # shared coordinate across the axis
    jitter = (torch.rand(b, 2, generator=g) - 0.5) * (sep / 2)[:, None]
    c1, c2 = (c[:, None] + jitter).clamp(lo[:, None], hi[:, None]).unbind(1)
    first = (labels == 0) | (labels == 2)  # red left of / above blue: red takes u1
    a_along, b_along = torch.where(first, u1, u2), torch.where(first, u2, u1)
    horizontal = labels < 2
    ax_, ay_ = torch.where(horizontal, a_along, c1), torch.where(horizontal, c1, a_along)
    bx_, by_ = torch.where(horizontal, b_along, c2), torch.where(horizontal, c2, b_along)
    kinds = torch.randint(len(SHAPE_NAMES), (b, 2), generator=g)  # shape kind is a nuisance here
    shade = 0.6 + 0.4 * torch.rand(b, 2, generator=g)
    low = 0.25 * torch.rand(b, 2, 2, generator=g)
    red = torch.stack([shade[:, 0], low[:, 0, 0], low[:, 0, 1]], dim=1)  # (b, 3)
    blue = torch.stack([low[:, 1, 0], low[:, 1, 1], shade[:, 1]], dim=1)  # (b, 3)
    grey = (0.3 + 0.4 * torch.rand(b, 1, generator=g)).expand(b, 3)
    xs, ys = _grid(b, img_size)
    img = grey[:, :, None, None].expand(b, 3, img_size, img_size)
    img = _paint(img, _signed_distance(kinds[:, 0], xs - ax_[:, None, None], ys - ay_[:, None, None], r[:, 0]), red)
    img = _paint(img, _signed_distance(kinds[:, 1], xs - bx_[:, None, None], ys - by_[:, None, None], r[:, 1]), blue)
    img = img + noise * torch.randn(img.shape, generator=g)
    return img, labels


def _render_position_chunk(b: int, g: torch.Generator, img_size: int, scale: tuple[float, float], noise: float):
    """One shape (random kind, size, colours) in one cell of a 3 x 3 grid; the label is the cell."""
    S = float(img_size)
    labels = _balanced_labels(b, len(POSITION_NAMES), g)
    kinds = torch.randint(len(SHAPE_NAMES), (b,), generator=g)
    r = S * (scale[0] + (scale[1] - scale[0]) * torch.rand(b, generator=g))
    cell = S / 3
    slack = (cell / 2 - r).clamp(min=0)  # the shape's centre stays inside its cell
    cx = (labels % 3 + 0.5) * cell + slack * (2 * torch.rand(b, generator=g) - 1)
    cy = (labels // 3 + 0.5) * cell + slack * (2 * torch.rand(b, generator=g) - 1)
    return _one_shape(kinds, cx, cy, r, g, img_size, noise), labels


_TASKS = {
    "shape": (_render_shape_chunk, SHAPE_NAMES),
    "arrangement": (_render_arrangement_chunk, ARRANGEMENT_NAMES),
    "position": (_render_position_chunk, POSITION_NAMES),
}


def class_names(task: str) -> tuple[str, ...]:
    if task not in _TASKS:
        raise VitlabError(f"shapes task must be one of {', '.join(_TASKS)}; found {task!r}")
    return _TASKS[task][1]


def make_shapes(
    n: int,
    *,
    seed: int = 0,
    task: str = "shape",
    img_size: int = 32,
    scale: tuple[float, float] | None = None,
    noise: float = 0.08,
    split: str = "train",
    normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images of the shapes `task` and their labels: (n, 3, img_size, img_size) float32 in [-1, 1]
    (or [0, 1] without `normalize`) and (n,) int64.

    `scale` is the range of the shape's radius as a fraction of the image side (default (0.15, 0.32)
    for "shape", (0.1, 0.2) for "arrangement", (0.08, 0.14) for "position"). `split="val"` draws from a separate seed stream,
    so a validation set never shares an image with the training set of the same seed.
    """
    render, _ = _TASKS.get(task, (None, None))
    if render is None:
        raise VitlabError(f"shapes task must be one of {', '.join(_TASKS)}; found {task!r}")
    if n < 1 or img_size < 8:
        raise VitlabError(f"shapes need n >= 1 and img_size >= 8; found n={n}, img_size={img_size}")
    if split not in ("train", "val"):
        raise VitlabError(f"shapes split must be 'train' or 'val'; found {split!r}")
    scale = scale or {"shape": (0.15, 0.32), "arrangement": (0.1, 0.2), "position": (0.08, 0.14)}[task]
    if not 0 < scale[0] <= scale[1] < 0.5:
        raise VitlabError(f"shapes scale must satisfy 0 < low <= high < 0.5 (a fraction of the side); found {scale}")
    stream = 0 if split == "train" else 1
    images, labels = [], []
    for chunk in range(math.ceil(n / CHUNK)):
        g = _chunk_generator(seed + (VAL_SEED_OFFSET if split == "val" else 0), chunk, stream)
        x, y = render(CHUNK, g, img_size, scale, noise)  # always a full chunk: image i depends on (seed, i) only
        images.append(x)
        labels.append(y)
    x = torch.cat(images)[:n].clamp(0.0, 1.0)
    if normalize:
        x = (x - 0.5) / 0.5
    return x.contiguous(), torch.cat(labels)[:n].contiguous()


def make_arrangement(n: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The position-dependent task: where the circle is relative to the square (4 classes)."""
    return make_shapes(n, task="arrangement", **kwargs)


__all__ = ["SHAPE_NAMES", "ARRANGEMENT_NAMES", "POSITION_NAMES", "make_shapes", "make_arrangement", "class_names"]
