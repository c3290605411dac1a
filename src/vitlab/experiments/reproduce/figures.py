"""The figures of `vitlab reproduce`: bar charts with every seed as a dot, and error-bar plots over a
learning rate, a patch size or a dataset size. matplotlib without pyplot; each PNG is written through
`vitlab.analysis.plots.save_figure` (atomic)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from vitlab.analysis.plots import save_figure
from vitlab.experiments.reproduce.verdicts import _stats


def _errorbar_pct(runs: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per configuration: mean and sample std in percent (std 0 for a single seed), for ax.errorbar."""
    stats = [_stats(v) for v in runs]
    return [100 * m for m, _, _ in stats], [100 * sd if n > 1 else 0.0 for _, sd, n in stats]


def _new_figure(w: float = 5.2, h: float = 3.6):
    fig = Figure(figsize=(w, h))
    return fig


def _save(fig, path: Path) -> Path:
    """Through the project's atomic writer, at the 110 dpi and tight bounding box these PNGs always had."""
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def _bar_figure(path: Path, labels: Sequence[str], values: Sequence[Sequence[float]], title: str,
                hlines: dict[str, float] | None = None) -> Path:
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    means = [100 * _stats(v)[0] for v in values]
    stds = [100 * (_stats(v)[1] if len(v) > 1 else 0.0) for v in values]
    xs = range(len(labels))
    ax.bar(xs, means, yerr=stds, capsize=4, color="#4c72b0", alpha=0.85)
    for i, v in enumerate(values):  # every seed as a dot
        ax.scatter([i] * len(v), [100 * a for a in v], color="black", s=10, zorder=3)
    for name, y in (hlines or {}).items():
        ax.axhline(100 * y, color="grey", linestyle="--", linewidth=1)
        ax.text(len(labels) - 0.5, 100 * y, f" {name}", va="center", fontsize=8, color="grey")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _lr_figure(path: Path, lrs: Sequence[float], acc: dict) -> Path:
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    for pool, label in (("cls", "class token"), ("mean", "global average pooling")):
        m, s = _errorbar_pct([acc[(pool, lr)] for lr in lrs])
        ax.errorbar(lrs, m, yerr=s, marker="o" if pool == "cls" else "s", linestyle="-" if pool == "cls" else "--",
                    capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(list(lrs), [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.set_xlabel("learning rate")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("Class token vs GAP, learning-rate sweep", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _patch_figure(path: Path, patches: Sequence[int], acc: dict, flops: dict, train_ms: dict) -> Path:
    fig = _new_figure(10.5, 3.3)
    ps = list(patches)
    ax = fig.add_subplot(1, 3, 1)
    m, s = _errorbar_pct([acc[p] for p in ps])
    ax.errorbar(ps, m, yerr=s, marker="o", capsize=3)
    ax.set_xlabel("patch size P")
    ax.set_ylabel("val accuracy (%)")
    ax.set_xticks(ps)
    ax = fig.add_subplot(1, 3, 2)
    ax.plot(ps, [flops[p] / 1e6 for p in ps], marker="o")
    ax.set_yscale("log")
    ax.set_xlabel("patch size P")
    ax.set_ylabel("forward MFLOPs / image (log)")
    ax.set_xticks(ps)
    ax = fig.add_subplot(1, 3, 3)
    ax.plot(ps, [_stats(train_ms[p])[0] for p in ps], marker="o")
    ax.set_yscale("log")
    ax.set_xlabel("patch size P")
    ax.set_ylabel("training ms / image (log)")
    ax.set_xticks(ps)
    fig.suptitle("Patch size at 32x32: accuracy and cost", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _scale_figure(path: Path, ns: Sequence[int], acc: dict) -> Path:
    fig = _new_figure()
    ax = fig.add_subplot(1, 1, 1)
    for model, label in (("resnet_mini", "CNN (resnet_mini)"), ("vit_mini", "ViT (vit_mini)")):
        m, s = _errorbar_pct([acc[(model, n)] for n in ns])
        ax.errorbar(ns, m, yerr=s, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(list(ns), [f"{n:,}" for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("training images N (log)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("Data scale: ViT vs CNN from scratch (shapes, 16x16)", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)
