"""Figures of what a ViT attends to: heatmap overlays, grids of heads per layer, Figure 7 (a, b, c), and
the token norms per layer of Darcet et al. 2023.

matplotlib without pyplot: every figure is a `matplotlib.figure.Figure` rendered by the Agg canvas,
so nothing here touches a global backend or opens a window. Every file is written to a temporary
name in the same folder and moved into place (`os.replace`), so no half-written PNG or CSV is left.

Orientation: a (gh, gw) map has row 0 at the top of the image and column 0 at the left, the raster
order of the patches; `imshow(origin="upper")` and the upsampling below keep it that way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from mpl_toolkits.axes_grid1 import make_axes_locatable
from PIL import Image

from vitlab.analysis import attention as A
from vitlab.errors import VitlabError
from vitlab.fileio import atomic_write, write_csv
from vitlab.options import DEFAULT_FAST_PATH
from vitlab.speed.fastpath import FastPath

DPI = 100


# ----------------------------------------------------------------------------------------------------
# Writing files atomically (vitlab.fileio)


def save_figure(fig: Figure, path: str | Path, *, dpi: float = DPI, bbox_inches: str | None = None) -> Path:
    """Save a Figure as PNG at `dpi`; by default its pixel size is exactly figsize * DPI (no tight bbox).
    `bbox_inches="tight"` crops the figure to what is drawn (the `vitlab reproduce` figures, at 110 dpi)."""
    FigureCanvasAgg(fig)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, bbox_inches=bbox_inches))


def save_image(image: np.ndarray, path: str | Path) -> Path:
    """Save an (H, W, 3) uint8 array as a PNG of exactly W x H pixels."""
    return atomic_write(path, lambda tmp: Image.fromarray(image).save(tmp, format="PNG"))


# ----------------------------------------------------------------------------------------------------
# Images and heatmaps


def to_display(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Undo the eval normalisation of one image: (C, H, W) normalised -> (H, W, 3) float in [0, 1]."""
    C = x.shape[0]
    mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)[:C]
    std_t = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)[:C]
    img = (x.detach().float().cpu() * std_t + mean_t).clamp(0, 1)  # (C, H, W)
    if C == 1:
        img = img.expand(3, -1, -1)  # grey -> RGB
    return img.permute(1, 2, 0).numpy()  # (H, W, 3)


def enlarge(image: np.ndarray, min_side: int = 224) -> np.ndarray:
    """Repeat pixels (nearest neighbour) by an integer factor until the shorter side is >= min_side,
    so a 32 px image shows as crisp patches rather than a blur."""
    f = max(1, math.ceil(min_side / min(image.shape[:2])))
    return image.repeat(f, axis=0).repeat(f, axis=1)


def upsample(heat: torch.Tensor | np.ndarray, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """A (gh, gw) map -> (H, W), each patch's value centred on that patch (align_corners=False)."""
    h = torch.as_tensor(np.asarray(heat), dtype=torch.float32)[None, None]  # (1, 1, gh, gw)
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(h, size=size, mode=mode, **kwargs)[0, 0].numpy()  # (H, W)


def normalize01(a: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]; a constant map becomes all zeros."""
    a = np.asarray(a, dtype=np.float32)
    lo, hi = float(a.min()), float(a.max())
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def overlay(
    image: np.ndarray, heat: torch.Tensor | np.ndarray, *, alpha: float = 0.5, cmap: str = "jet", mode: str = "bilinear"
) -> np.ndarray:
    """Blend a coloured heatmap on an image: (H, W, 3) in [0, 1] and a (gh, gw) map -> (H, W, 3) uint8.

    The map is upsampled to the image size, min-max normalised, coloured with `cmap`, and mixed as
    (1 - alpha) * image + alpha * colour.
    """
    H, W = image.shape[:2]
    colour = colormaps[cmap](normalize01(upsample(heat, (H, W), mode)))[..., :3]  # (H, W, 3)
    out = (1 - alpha) * np.asarray(image, dtype=np.float32) + alpha * colour
    return (out.clip(0, 1) * 255).round().astype(np.uint8)


def display_image(x: torch.Tensor, pretrained_cfg) -> np.ndarray:
    """One preprocessed image (C, H, W) as the attention figures show it: un-normalised with its
    PretrainedCfg's mean and std, and enlarged (`enlarge`) if small. (H', W', 3) float in [0, 1]."""
    return enlarge(to_display(x, pretrained_cfg.mean, pretrained_cfg.std))


def final_overlay(
    image: np.ndarray, maps: torch.Tensor | np.ndarray, *, alpha: float = 0.5, mode: str = "bilinear"
) -> tuple[np.ndarray, torch.Tensor]:
    """The single picture of one image's attention (`vitlab attention`'s <stem>_<method>_overlay.png, the
    page's overlay): the last row of its (R, C, gh, gw) maps, columns averaged, blended on `image`.
    Returns ((H, W, 3) uint8, the (gh, gw) map)."""
    final = torch.as_tensor(maps)[-1].mean(dim=0)  # (gh, gw): the last layer's map, heads fused
    return overlay(image, final, alpha=alpha, mode=mode), final


# ----------------------------------------------------------------------------------------------------
# Attention figures


def attention_grid(
    image: np.ndarray,
    maps: torch.Tensor | np.ndarray,
    path: str | Path,
    *,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
    alpha: float = 0.5,
    mode: str = "bilinear",
    tile: float = 1.6,
    wrap: int = 7,
) -> Path:
    """A grid of overlays from (R, C, gh, gw) maps, rows typically layers and columns heads.

    With several columns: R rows of (1 + C) tiles, the image first in each row. With one column (one
    map per layer): the image then the R maps, wrapped after `wrap` tiles. Each tile is min-max
    normalised on its own, so colours compare places within a tile, not strengths across tiles.
    """
    maps = np.asarray(maps)
    R, C = maps.shape[:2]
    tiles: list[tuple[np.ndarray, str]] = []  # (picture, label) in reading order
    if C > 1:
        for r in range(R):
            tiles.append((image, row_labels[r]))
            tiles += [(overlay(image, maps[r, c], alpha=alpha, mode=mode), col_labels[c]) for c in range(C)]
        rows, cols = R, C + 1
    else:
        tiles.append((image, "image"))
        tiles += [(overlay(image, maps[r, 0], alpha=alpha, mode=mode), row_labels[r]) for r in range(R)]
        cols = min(len(tiles), wrap)
        rows = math.ceil(len(tiles) / cols)
    label_h, head = 0.3, (0.5 if title else 0.0)  # inches: above each tile, above the grid
    fig = Figure(figsize=(tile * cols, head + rows * (tile + label_h)))
    H = fig.get_figheight()
    axes = fig.subplots(
        rows,
        cols,
        squeeze=False,
        gridspec_kw=dict(
            left=0.005, right=0.995, bottom=0.005, top=1 - (head + label_h) / H, wspace=0.04, hspace=label_h / tile
        ),
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (picture, label) in zip(axes.flat, tiles):
        ax.imshow(picture)
        ax.set_title(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.1 / H, va="top")
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------
# Figure 7


def _mosaic(tiles: np.ndarray, rows: int, cols: int, gap: int = 1) -> np.ndarray:
    """(n, h, w[, 3]) tiles -> one (rows*(h+gap)-gap, cols*(w+gap)-gap[, 3]) array, NaN in the gaps."""
    n, h, w = tiles.shape[:3]
    out = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, *tiles.shape[3:]), np.nan, dtype=np.float32)
    for i in range(n):
        r, c = divmod(i, cols)
        out[r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = tiles[i]
    return out


def figure7a(components: torch.Tensor, explained: torch.Tensor, path: str | Path, *, cols: int = 7) -> Path:
    """Figure 7 (left): the principal components of the patch-embedding filters, (k, C, P, P), each
    min-max scaled to [0, 1] on its own and shown as an RGB P x P tile (grey when C != 3)."""
    comps = components.detach().float().cpu().numpy()
    k, C, P, _ = comps.shape
    tiles = np.stack([normalize01(c) for c in comps])  # (k, C, P, P)
    tiles = (
        tiles.transpose(0, 2, 3, 1) if C == 3 else np.repeat(tiles.mean(axis=1)[..., None], 3, axis=-1)
    )  # (k, P, P, 3)
    rows = math.ceil(k / cols)
    mosaic = _mosaic(tiles, rows, cols, gap=max(1, P // 8))
    mosaic = np.where(np.isnan(mosaic), 1.0, mosaic)  # white gaps
    width, title_h = 7.0, 0.5  # inches
    fig = Figure(figsize=(width, round(0.96 * width * mosaic.shape[0] / mosaic.shape[1] + title_h + 0.2, 1)))
    ax = fig.add_axes((0.02, 0.02, 0.96, 1 - (title_h + 0.1) / fig.get_figheight()))
    ax.imshow(mosaic, interpolation="nearest")
    ax.set_axis_off()
    total = float(explained.sum())
    kind = "RGB" if C == 3 else "Grey" if C == 1 else f"{C}-channel"
    fig.suptitle(f"{kind} embedding filters (first {k} principal components, {total:.0%} of the variance)", fontsize=10)
    return save_figure(fig, path)


def figure7b(similarity: torch.Tensor, grid_size: tuple[int, int], path: str | Path) -> Path:
    """Figure 7 (centre): one tile per patch position on the gh x gw grid; tile (r, c) shows the
    cosine similarity of that position's embedding with every other position's embedding."""
    gh, gw = grid_size
    sim = similarity.detach().float().cpu().numpy().reshape(gh * gw, gh, gw)  # row i -> (gh, gw)
    mosaic = _mosaic(sim, gh, gw, gap=1)
    cmap = colormaps["viridis"].with_extremes(bad="white")
    fig = Figure(figsize=(6.4, 5.6))
    ax = fig.add_axes((0.1, 0.1, 0.78, 0.8))
    im = ax.imshow(np.ma.masked_invalid(mosaic), cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    step = gh + 1, gw + 1
    ax.set_xticks([c * step[1] + (gw - 1) / 2 for c in range(gw)], [str(c + 1) for c in range(gw)], fontsize=6)
    ax.set_yticks([r * step[0] + (gh - 1) / 2 for r in range(gh)], [str(r + 1) for r in range(gh)], fontsize=6)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity")
    cax = make_axes_locatable(ax).append_axes("right", size="4%", pad=0.15)  # as tall as the image
    fig.colorbar(im, cax=cax, label="Cosine similarity")
    return save_figure(fig, path)


def figure7c(
    layers: Sequence[int], distances: torch.Tensor, path: str | Path, *, uniform: float | None = None, title: str = ""
) -> Path:
    """Figure 7 (right): mean attention distance (pixels) of every head against the layer's depth.

    `distances` is (len(layers), h); `uniform`, if given, draws the distance uniform attention would
    give as a dashed line (the largest mean distance a head can have on average is not far above it).
    """
    d = distances.detach().float().cpu().numpy()
    fig = Figure(figsize=(5.6, 4.4))
    ax = fig.add_axes((0.14, 0.12, 0.62, 0.78))
    depth = np.asarray(layers) + 1  # the paper counts layers from 1
    cmap = colormaps["tab20"]
    for h in range(d.shape[1]):
        ax.scatter(depth, d[:, h], s=14, color=cmap((2 * h + h // 10) % 20), label=f"Head {h + 1}")
    if uniform is not None:
        ax.axhline(uniform, color="grey", linestyle="--", linewidth=1, label="uniform")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if len(depth) <= 16 else depth[:: math.ceil(len(depth) / 16)])
    ax.set_ylim(0, max(float(d.max()), uniform or 0.0) * 1.1 + 1e-6)
    ax.set_title(title or "Mean attention distance per head")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, path)


def write_figure7(
    model,
    images,
    out_dir: str | Path,
    *,
    batch_size: int | None = None,
    k: int = 28,
    fast_path: FastPath = DEFAULT_FAST_PATH,
    log=None,
) -> dict:
    """The paper's Figure 7 for `model`, as PNGs and CSVs in `out_dir`; returns what was written and
    the headline numbers. (a) needs a patch stem and (b) an absolute position embedding; a model
    without them gets a note instead of that panel.

        fig7a_patch_embedding_pcs.png/.csv           first k principal components of E's filters
        fig7b_position_embedding_similarity.png/.csv cosine similarity of every pair of positions
        fig7c_mean_attention_distance.png/.csv       per layer and head, pixels, mean over `images`

    `fast_path`, `log`: as `vitlab.analysis.attention.iter_attention`'s, for (c).
    """
    out_dir = Path(out_dir).expanduser()
    A.check_vit(model)
    cfg = model.cfg
    summary: dict = {"files": [], "notes": []}
    try:  # only the computation: a failed write is not a skipped panel
        comps, ratio = A.patch_embedding_pcs(model, k=k)
    except VitlabError as e:
        summary["notes"].append(f"(a) skipped: {e}")
    else:
        summary["files"].append(figure7a(comps, ratio, out_dir / "fig7a_patch_embedding_pcs.png"))
        summary["files"].append(
            write_csv(
                out_dir / "fig7a_patch_embedding_pcs.csv",
                [(i, f"{r:.6f}") for i, r in enumerate(ratio.tolist())],
                ["component", "explained_variance_ratio"],
            )
        )
        summary["pcs_explained"] = float(ratio.sum())
    try:
        sim = A.position_embedding_similarity(model)  # (N, N)
    except VitlabError as e:
        summary["notes"].append(f"(b) skipped: {e}")
    else:
        gh, gw = cfg.grid_size
        summary["files"].append(figure7b(sim, (gh, gw), out_dir / "fig7b_position_embedding_similarity.png"))
        header = ["position", "row", "col"] + [f"p{j}" for j in range(gh * gw)]
        rows = [[i, i // gw, i % gw] + [f"{v:.5f}" for v in sim[i].tolist()] for i in range(gh * gw)]
        summary["files"].append(write_csv(out_dir / "fig7b_position_embedding_similarity.csv", rows, header))
        summary["pe_neighbour_vs_far"] = _neighbour_vs_far(sim, (gh, gw))
    layers, dist = A.mean_attention_distance(
        model, images, batch_size=batch_size, fast_path=fast_path, log=log
    )  # (L, h)
    uniform = float(A.patch_distances(cfg.grid_size, cfg.patch_size).mean())
    summary["files"].append(figure7c(layers, dist, out_dir / "fig7c_mean_attention_distance.png", uniform=uniform))
    summary["files"].append(
        write_csv(
            out_dir / "fig7c_mean_attention_distance.csv",
            [(layer, h, f"{dist[i, h]:.4f}") for i, layer in enumerate(layers) for h in range(dist.shape[1])],
            ["layer", "head", "mean_distance_px"],
        )
    )
    summary["distance_per_layer"] = dist.mean(dim=1).tolist()
    summary["distance_uniform"] = uniform
    return summary


def figure7_lines(summary: dict) -> list[str]:
    """The headline numbers of `write_figure7`'s summary, one line per panel, then its notes."""
    lines = []
    if "pcs_explained" in summary:
        lines.append(
            f"(a) first 28 principal components of the patch-embedding filters explain "
            f"{summary['pcs_explained']:.1%} of their variance"
        )
    if "pe_neighbour_vs_far" in summary:
        near, far = summary["pe_neighbour_vs_far"]
        lines.append(f"(b) position-embedding cosine similarity: neighbours {near:.3f}, far apart {far:.3f}")
    per_layer = ", ".join(f"{d:.1f}" for d in summary["distance_per_layer"])
    lines.append(
        f"(c) mean attention distance per layer (px, mean over heads): {per_layer}; uniform attention: "
        f"{summary['distance_uniform']:.1f}"
    )
    return lines + list(summary["notes"])


def token_norm_lines(norms: dict) -> list[str]:
    """The headline numbers of `write_token_norms`: the last layer's patch and prefix-token norms, and the
    share of high-norm patches per layer."""
    last = norms["rows"][-1]
    prefix = ", ".join(f"{name} {last[name]:.3g}" for name in norms["prefix_names"])
    high = ", ".join(f"{r['high_norm_share']:.1%}" for r in norms["rows"])
    return [
        f"(d) token norms, last layer: patches median {last['patch_median']:.3g}, max {last['patch_max']:.3g}"
        + (f"; prefix tokens: {prefix}" if prefix else ""),
        f"    share of patches above {norms['ratio']:g}x the median, per layer: {high}",
    ]


def _neighbour_vs_far(sim: torch.Tensor, grid_size: tuple[int, int]) -> tuple[float, float]:
    """Mean similarity of 4-neighbour positions and of positions at least half the grid apart."""
    gh, gw = grid_size
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    manhattan = (ys[:, None] - ys[None]).abs() + (xs[:, None] - xs[None]).abs()  # (N, N)
    near = sim[manhattan == 1]
    far = sim[manhattan >= (gh + gw) // 2]  # at least half the grid apart
    return float(near.mean()), float(far.mean()) if far.numel() else float("nan")


# ----------------------------------------------------------------------------------------------------
# Token norms (Darcet et al. 2023)


def _spread(layers: Sequence[int], k: int) -> list[int]:
    """Up to k of `layers`, evenly spread, the first and the last included."""
    if len(layers) <= k:
        return list(layers)
    return [layers[round(i * (len(layers) - 1) / (k - 1))] for i in range(k)]


def token_norm_figure(
    image: np.ndarray,
    norms: A.TokenNorms,
    path: str | Path,
    *,
    index: int = 0,
    max_maps: int = 6,
    ratio: float = 4.0,
    title: str = "",
) -> Path:
    """Where the large token norms are, per layer.

    Top: the image, then for up to `max_maps` layers (spread over the depth, the last included) the norm
    of each patch token of image `index` on the patch grid, and beside it, apart, the prefix tokens'
    norms (class, distillation, registers) on the same colour scale; patches above `ratio` x the median
    are outlined in red. Bottom: per layer over all images, the patch norms' median, 5-95% band and
    maximum, and each prefix token's mean norm.
    """
    shown = _spread(norms.layers, max_maps)
    p = len(norms.prefix_names)
    high = norms.high_norm(ratio)
    cols = 1 + len(shown)
    tile, label, panel, head = 1.9, 0.3, 2.6, (0.45 if title else 0.15)  # inches
    fig = Figure(figsize=(max(tile * cols + 0.8, 7.0), head + label + tile + 0.5 + panel + 0.5))
    W, H = fig.get_figwidth(), fig.get_figheight()
    top = fig.add_gridspec(
        1,
        cols,
        left=0.1 / W,
        right=1 - 0.7 / W,
        top=1 - (head + label) / H,
        bottom=1 - (head + label + tile) / H,
        wspace=0.35,
    )
    ax = fig.add_subplot(top[0, 0])
    ax.imshow(image)
    ax.set_title("image", fontsize=8)
    ax.set_axis_off()
    cmap = colormaps["viridis"]
    for c, layer in enumerate(shown, start=1):
        i = norms.layers.index(layer)
        patch = norms.patches[i, index].numpy()  # (gh, gw)
        prefix = norms.prefix[i, index].numpy()  # (p,)
        vmax = float(max(patch.max(), prefix.max() if p else 0.0))
        ax = fig.add_subplot(top[0, c])
        ax.imshow(patch, cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
        for r, q in zip(*np.nonzero(high[i, index].numpy())):
            ax.add_patch(Rectangle((q - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.0))
        ax.set_title(f"layer {layer} (max {vmax:.3g})", fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
        if p:  # the prefix tokens, apart from the grid, as tall as it, on the same colour scale
            strip = make_axes_locatable(ax).append_axes("right", size="12%", pad=0.04)
            strip.imshow(prefix[:, None], cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest", aspect="auto")
            strip.set_xticks([])
            strip.yaxis.tick_right()
            strip.set_yticks(range(p), norms.prefix_names, fontsize=6)
    bottom = fig.add_gridspec(1, 1, left=0.75 / W, right=1 - 1.3 / W, top=(panel + 0.5) / H, bottom=0.5 / H)
    ax = fig.add_subplot(bottom[0, 0])
    flat = norms.patches.flatten(1)  # (L, B*N)
    x = np.asarray(norms.layers)
    lo, med, hi = (flat.quantile(q, dim=1).numpy() for q in (0.05, 0.5, 0.95))
    ax.fill_between(x, lo, hi, color="0.85", label="patches, 5-95%")
    ax.plot(x, med, color="black", label="patches, median")
    ax.plot(x, flat.amax(dim=1).numpy(), color="red", linestyle=":", label="patches, max")
    colours = colormaps["tab10"]
    for j, name in enumerate(norms.prefix_names):
        ax.plot(
            x, norms.prefix[:, :, j].mean(dim=1).numpy(), marker="o", markersize=3, color=colours(j % 10), label=name
        )
    if float(flat.amax()) > 20 * max(float(flat.median()), 1e-6):
        ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("token norm")
    ax.set_xticks(x if len(x) <= 16 else x[:: math.ceil(len(x) / 16)])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.1 / H, va="top")
    return save_figure(fig, path)


def write_token_norms(
    model,
    images: torch.Tensor,
    display: np.ndarray,
    out_dir: str | Path,
    *,
    ratio: float = 4.0,
    batch_size: int | None = None,
) -> dict:
    """token_norms.png (`token_norm_figure`, first image) and token_norms.csv (per layer over all images:
    the patch norms' median, 95th percentile and maximum, the share of high-norm patches, and each prefix
    token's mean norm). Returns the files and the per-layer rows."""
    out_dir = Path(out_dir).expanduser()
    norms = A.token_norms(model, images, batch_size=batch_size)
    rows = norms.summary(ratio)
    title = f"Token norms per layer ({len(images)} images); red: patches above {ratio:g}x the median"
    files = [token_norm_figure(display, norms, out_dir / "token_norms.png", ratio=ratio, title=title)]
    header = list(rows[0])
    files.append(
        write_csv(
            out_dir / "token_norms.csv",
            [[f"{r[k]:.5g}" if k != "layer" else r[k] for k in header] for r in rows],
            header,
        )
    )
    return {"files": files, "rows": rows, "prefix_names": norms.prefix_names, "ratio": ratio}


__all__ = [
    "DPI",
    "save_figure",
    "save_image",
    "to_display",
    "enlarge",
    "upsample",
    "normalize01",
    "overlay",
    "display_image",
    "final_overlay",
    "attention_grid",
    "figure7a",
    "figure7b",
    "figure7c",
    "write_figure7",
    "figure7_lines",
    "token_norm_figure",
    "token_norm_lines",
    "write_token_norms",
]
