"""The figures of `vitlab reproduce`: per-arm accuracies (mean +- std, every seed as a dot; beside them the
paper's numbers where it has them), and error-bar plots over a learning rate, a patch size or a dataset size.
matplotlib without pyplot; each PNG is written through `vitlab.analysis.plots.save_figure` (atomic)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from vitlab.analysis.plots import save_figure
from vitlab.experiments.reproduce.verdicts import stats

BLUE, ORANGE, GREEN, RED = "#4c72b0", "#dd8452", "#55a868", "#c44e52"


def _errorbar_pct(runs: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per configuration: mean and sample std in percent (std 0 for a single seed), for ax.errorbar."""
    per = [stats(v) for v in runs]
    return [100 * m for m, _, _ in per], [100 * sd if n > 1 else 0.0 for _, sd, n in per]


def _save(fig, path: Path) -> Path:
    """Through the project's atomic writer, at 110 dpi with a tight bounding box."""
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def _log_x(ax, values, labels: list[str], xlabel: str) -> None:
    """A log x axis with a tick (and its label) at each value, no minor ticks."""
    ax.set_xscale("log")
    ax.set_xticks(list(values), labels)
    ax.minorticks_off()
    ax.set_xlabel(xlabel)


def _zoom(values: Sequence[Sequence[float]]) -> tuple[float, float]:
    """y limits (%) around the bars, their error bars and their dots: accuracies on one dataset differ by
    points, not tens of points, so the axis starts below the lowest rather than at 0."""
    means, stds = _errorbar_pct(values)
    lo = min([100 * min(v) for v in values if v] + [m - s for m, s in zip(means, stds)])
    hi = max([100 * max(v) for v in values if v] + [m + s for m, s in zip(means, stds)])
    return max(0.0, lo - 0.25 * (100 - lo) - 2), min(105.0, hi + 2)


def _bars(
    ax,
    labels: Sequence[str],
    values: Sequence[Sequence[float]],
    *,
    full_axis: bool = False,
    hlines: dict[str, float] | None = None,
    ylabel: str = "test accuracy (%)",
) -> None:
    """Mean +- std per arm with every seed as a black dot: bars on a 0-105% axis (`full_axis`), else marks on an
    axis zoomed to the data (bars cut off at the bottom would exaggerate the differences)."""
    means, stds = _errorbar_pct(values)
    xs = list(range(len(labels)))
    if full_axis:
        ax.bar(xs, means, yerr=stds, capsize=4, color=BLUE, alpha=0.85)
    else:
        ax.errorbar(xs, means, yerr=stds, fmt="s", color=BLUE, markersize=8, capsize=5, linewidth=1.5)
    for i, v in enumerate(values):
        ax.scatter([i + (0.12 if not full_axis else 0)] * len(v), [100 * a for a in v], color="black", s=10, zorder=3)
    for name, y in (hlines or {}).items():
        ax.axhline(100 * y, color="grey", linestyle="--", linewidth=1)
        ax.text(len(labels) - 0.5, 100 * y, f" {name}", va="center", fontsize=8, color="grey")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_ylim(*((0, 105) if full_axis else _zoom(values)))


def bar_figure(
    path: Path,
    labels: Sequence[str],
    values: Sequence[Sequence[float]],
    title: str,
    *,
    hlines: dict[str, float] | None = None,
    full_axis: bool = False,
    paper: tuple[Sequence[str], Sequence[float], str] | None = None,
    ylabel: str = "test accuracy (%)",
) -> Path:
    """Our accuracies per arm (mean +- std, seeds as dots), on the images that decide the verdict (`ylabel` names
    them); with `paper` = (labels, accuracies in %, title), the paper's numbers in a second panel beside them, on an
    axis zoomed the same way."""
    fig = Figure(figsize=(9.6 if paper else 5.2, 3.6))
    ax = fig.add_subplot(1, 2 if paper else 1, 1)
    _bars(ax, labels, values, hlines=hlines, full_axis=full_axis, ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    if paper:
        p_labels, p_values, p_title = paper
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.plot(range(len(p_labels)), p_values, "s", color="#8c8c8c", markersize=8)
        for i, v in enumerate(p_values):
            ax2.text(i, v + 0.3, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax2.set_xticks(range(len(p_labels)), p_labels, fontsize=8)
        ax2.set_xlim(-0.6, len(p_labels) - 0.4)
        ax2.set_ylim(*_zoom([[v / 100] for v in p_values]))
        ax2.set_ylabel("accuracy (%)")
        ax2.set_title(p_title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def grouped_bar_figure(
    path: Path,
    groups: Sequence[str],
    arms: Sequence[str],
    values: dict,
    title: str,
    *,
    colors: Sequence[str] = (BLUE, ORANGE, GREEN, RED),
) -> Path:
    """Mean +- std of each arm within each group (e.g. the models at each N), every seed as a dot, on an axis
    zoomed to the data; `values[(group, arm)]` = per-seed accuracies (a pair not in `values` is left out)."""
    fig = Figure(figsize=(2.4 + 1.6 * len(groups) * len(arms) / 2, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        present = [(i, g) for i, g in enumerate(groups) if (g, arm) in values]
        xs = [i + (j - (len(arms) - 1) / 2) * width for i, _ in present]
        means, stds = _errorbar_pct([values[(g, arm)] for _, g in present])
        ax.errorbar(xs, means, yerr=stds, fmt="s", markersize=7, capsize=4, color=colors[j % len(colors)], label=arm)
        for x, (_, g) in zip(xs, present):
            v = values[(g, arm)]
            ax.scatter([x + 0.04] * len(v), [100 * a for a in v], color="black", s=8, zorder=3)
    ax.set_ylim(*_zoom([values[(g, arm)] for g in groups for arm in arms if (g, arm) in values]))
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    for i in range(1, len(groups)):
        ax.axvline(i - 0.5, color="#dddddd", linewidth=1)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _save(fig, path)


def patch_figure(path: Path, patches: Sequence[int], acc: dict, flops: dict, train_ms: dict) -> Path:
    """Claim 4: accuracy, forward FLOPs and measured training time against the patch size."""
    fig = Figure(figsize=(10.5, 3.3))
    ps = list(patches)
    ax = fig.add_subplot(1, 3, 1)
    m, s = _errorbar_pct([acc[p] for p in ps])
    ax.errorbar(ps, m, yerr=s, marker="o", capsize=3)
    ax.set_xlabel("patch size P")
    ax.set_ylabel("test accuracy (%)")
    ax.set_xticks(ps)
    ax = fig.add_subplot(1, 3, 2)
    ax.plot(ps, [flops[p] / 1e6 for p in ps], marker="o")
    ax.set_yscale("log")
    ax.set_xlabel("patch size P")
    ax.set_ylabel("forward MFLOPs / image (log)")
    ax.set_xticks(ps)
    ax = fig.add_subplot(1, 3, 3)
    ax.plot(ps, [stats(train_ms[p])[0] for p in ps], marker="o")
    ax.set_yscale("log")
    ax.set_xlabel("patch size P")
    ax.set_ylabel("training ms / image (log)")
    ax.set_xticks(ps)
    fig.suptitle("Patch size on 28x28 Fashion-MNIST: accuracy and cost", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def scale_figure(path: Path, ns: Sequence[int], acc: dict, models: Sequence[tuple[str, str]]) -> Path:
    """Claim 5: accuracy against the number of training images (log axis) for each model, and the gap."""
    fig = Figure(figsize=(10.0, 3.8))
    ax = fig.add_subplot(1, 2, 1)
    for (model, label), color in zip(models, (ORANGE, BLUE)):
        m, s = _errorbar_pct([acc[(model, n)] for n in ns])
        ax.errorbar(ns, m, yerr=s, marker="o", capsize=3, label=label, color=color)
    _log_x(ax, ns, [f"{n:,}" for n in ns], "training images N (log)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("ViT vs CNN from scratch on Fashion-MNIST", fontsize=10)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    (cnn, _), (vit, _) = models
    gaps = [[c - v for c, v in zip(acc[(cnn, n)], acc[(vit, n)])] for n in ns]  # paired by seed
    m, s = _errorbar_pct(gaps)
    ax.errorbar(ns, m, yerr=s, marker="o", capsize=3, color=GREEN)
    ax.axhline(0, color="grey", linewidth=1)
    _log_x(ax, ns, [f"{n:,}" for n in ns], "training images N (log)")
    ax.set_ylabel("CNN - ViT (points)")
    ax.set_title("The CNN's lead: the paper has it shrink as N grows", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def depth_figure(path: Path, per_seed: Sequence[Sequence[float]], uniform: float) -> Path:
    """Claim 8: the mean attention distance of each layer (mean over heads), one line per seed."""
    fig = Figure(figsize=(5.2, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    for i, d in enumerate(per_seed):
        ax.plot(range(1, len(d) + 1), d, marker="o", label=f"seed {i}")
    ax.axhline(uniform, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(1, len(per_seed[0]) + 1))
    ax.set_title("Attention distance by depth, mean over heads", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def compute_figure(path: Path, families: dict[str, list[tuple[float, Sequence[float], str]]], title: str) -> Path:
    """Claim 10: test accuracy against training compute (log x axis), one colour per family: each point (compute
    in FLOPs, its per-seed accuracies, its short name) a mark, joined in order of compute by the family's line (its
    first seed's accuracy, as the claim reads it off), a point of several seeds with its mean +- std and every seed
    as a dot; where a point falls below a cheaper one of its family, the family's best-so-far envelope dashed."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    dashed = False
    for (family, pts), color in zip(families.items(), (BLUE, ORANGE, GREEN, RED)):
        pts = sorted(pts, key=lambda p: p[0])
        xs, firsts = [c for c, _, _ in pts], [100 * v[0] for _, v, _ in pts]
        ax.plot(xs, firsts, color=color, linewidth=1.5, label=family)
        best = [max(firsts[: i + 1]) for i in range(len(firsts))]
        if best != firsts:
            ax.plot(xs, best, color=color, linewidth=1.0, linestyle="--")
            dashed = True
        for c, v, name in pts:
            (m,), (sd,) = _errorbar_pct([v])
            ax.errorbar([c], [m], yerr=[sd], fmt="o", color=color, markersize=6, capsize=3)
            if len(v) > 1:
                ax.scatter([c] * len(v), [100 * a for a in v], color="black", s=8, zorder=3)
            ax.annotate(name, (c, 100 * v[0]), textcoords="offset points", xytext=(4, -10), fontsize=6.5, color=color)
    if dashed:
        ax.plot([], [], color="grey", linewidth=1.0, linestyle="--", label="best so far")
    ax.set_xscale("log")
    ax.set_xlabel("training compute (FLOPs, log)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(True, which="major", color="#eeeeee", linewidth=0.8)
    fig.tight_layout()
    return _save(fig, path)


__all__ = ["bar_figure", "grouped_bar_figure", "patch_figure", "scale_figure", "depth_figure", "compute_figure"]
