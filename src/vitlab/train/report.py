"""What a training run ends with: learning curves, the best checkpoint's confusion matrix and per-class
accuracy, the EMA weights, the diagnostics, and summary.json. matplotlib without pyplot; files are
written atomically (vitlab.fileio)."""

from __future__ import annotations

import copy
import csv
import io
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vitlab.analysis.plots import save_figure
from vitlab.fileio import atomic_write, write_json
from vitlab.train import diagnostics
from vitlab.train.engine import History, evaluate
from vitlab.weights import checkpoint as ckpt


def plot_curves(
    rows: list[dict],
    path: str | Path,
    *,
    freeze_epochs: int = 0,
    title: str = "",
    lr_steps: tuple[list[float], list[float]] | None = None,
) -> Path:
    """Loss, accuracy and learning rate against epochs completed (a metric at x = e was measured at the
    end of epoch e); a dashed line where stage 2 (unfreezing) begins.

    `lr_steps` = (epoch position of each optimizer step, its head lr) draws the schedule step by step.
    """
    epochs = [r["epoch"] for r in rows]
    fig = Figure(figsize=(13, 4))
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
    ax_loss.plot(epochs, [r["train_loss"] for r in rows], "o-", ms=3, label="train")
    ax_loss.plot(epochs, [r["val_loss"] for r in rows], "o-", ms=3, label="val")
    ax_loss.set(xlabel="epochs completed", ylabel="cross-entropy loss", title="loss")
    ax_acc.plot(epochs, [r["train_acc"] for r in rows], "o-", ms=3, label="train (hard labels)")
    ax_acc.plot(epochs, [r["val_acc"] for r in rows], "o-", ms=3, label="val")
    if "val_acc_ema" in rows[0]:
        ax_acc.plot(epochs, [r["val_acc_ema"] for r in rows], "o--", ms=3, label="val (EMA weights)")
    ax_acc.set(xlabel="epochs completed", ylabel="accuracy", title="accuracy", ylim=(0, 1.02))
    if lr_steps is not None:
        ax_lr.plot(*lr_steps, "-", color="tab:gray", lw=1.2, label="head lr per step")
    else:
        ax_lr.plot(epochs, [r["lr"] for r in rows], "o-", ms=3, color="tab:gray", label="head lr (end of epoch)")
    ax_lr.set(xlabel="epochs completed", ylabel="learning rate", title="learning rate")
    for ax in (ax_loss, ax_acc, ax_lr):
        if 0 < freeze_epochs < max(epochs):
            ax.axvline(freeze_epochs, color="k", ls="--", lw=0.8, label="unfreeze (stage 2 starts)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_confusion(confusion: torch.Tensor, classes: list[str], path: str | Path, *, title: str = "") -> Path:
    """Rows: true class, columns: predicted class; colour = share of the row, text = count."""
    cm = confusion.cpu().numpy().astype(np.int64)
    share = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    n = len(classes)
    side = min(16, max(5, 0.5 * n + 2))
    fig = Figure(figsize=(side + 1, side))
    ax = fig.subplots()
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1, origin="upper")
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of the true class")
    if n <= 30:
        ax.set_xticks(range(n), labels=classes, rotation=90 if max(map(len, classes)) > 3 else 0)
        ax.set_yticks(range(n), labels=classes)
        for i in range(n):
            for j in range(n):
                if cm[i, j]:
                    ax.text(
                        j,
                        i,
                        str(cm[i, j]),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if share[i, j] > 0.5 else "black",
                    )
    ax.set(xlabel="predicted class", ylabel="true class", title=title or "confusion matrix (validation)")
    fig.tight_layout()
    return save_figure(fig, path)


def write_per_class(path: str | Path, classes: list[str], accuracy: list[float | None], counts: list[int]) -> Path:
    """class, accuracy (empty where the class has no validation image), val_images."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["class", "accuracy", "val_images"])
    w.writerows([c, "" if a is None else f"{a:.6f}", n] for c, a, n in zip(classes, accuracy, counts))
    return atomic_write(path, lambda tmp: Path(tmp).write_text(buf.getvalue()))


def finish_run(
    out: Path,
    *,
    model,
    history: History,
    scan,
    val_loader,
    recipe,
    in_force: dict,
    name: str,
    from_scratch: bool,
    world_size: int,
    elapsed: float,
    settings: dict,
    say,
) -> dict:
    """The end of a run in `out`: the best checkpoint evaluated (confusion matrix, per-class accuracy),
    the curves, the EMA weights, the diagnostics; printed, and written to summary.json with the recipe
    in force (`vitlab.train.recipe.in_force`: what the run printed at its start). The best weights are
    evaluated on a copy of `model`, which keeps its own (the last epoch's)."""
    best_ptr = ckpt.read_pointer(out / "best.json")
    device = next(model.parameters()).device
    best_model = copy.deepcopy(model)
    best_model.load_state_dict(ckpt.read_weights(ckpt.resolve_checkpoint(out / "best.json"), device))
    ev = evaluate(best_model, val_loader, device=device, precision=recipe.precision, num_classes=len(scan.classes))
    confusion = ev["confusion"]
    counts = confusion.sum(1).tolist()
    per_class = [c / n if n else None for c, n in zip(confusion.diag().tolist(), counts)]  # None: no val image
    rows = history.rows
    files = {
        "metrics": "metrics.csv",
        "tensorboard": "tensorboard/",
        "confusion": plot_confusion(
            confusion,
            scan.classes,
            out / "confusion.png",
            title=f"{name}, best epoch {best_ptr['epoch']}: val acc {ev['val_acc']:.3f}",
        ).name,
        "curves": plot_curves(
            rows, out / "curves.png", freeze_epochs=recipe.freeze_epochs, title=name, lr_steps=history.lr_steps
        ).name,
        "per_class": write_per_class(out / "per_class_accuracy.csv", scan.classes, per_class, counts).name,
        "best": "best.json",
        "last": "last.json",
    }
    if history.ema is not None:
        files["ema"] = ckpt.save_weights(out / "ema", history.ema.module).name + "/"
    stage_start = recipe.freeze_epochs if recipe.freeze_epochs < recipe.epochs else 0
    warmup_epochs = in_force["stages"][-1]["warmup_steps"] / in_force["steps_per_epoch"]  # the last stage's
    findings = diagnostics.diagnose(
        rows, warmup_epochs=warmup_epochs, num_classes=len(scan.classes), stage_start=stage_start
    )
    early = diagnostics.tiny_from_scratch(len(scan.train), name) if from_scratch else None
    summary = {
        "model": name,
        "data": str(scan.root),
        "classes": scan.classes,
        "images": {"train": len(scan.train), "val": len(scan.val), "skipped": len(scan.skipped)},
        "world_size": world_size,
        "global_batch": recipe.batch_size * world_size * recipe.grad_accum,
        "recipe": in_force,
        "best": {"epoch": best_ptr["epoch"], "val_acc": ev["val_acc"], "val_loss": ev["val_loss"]},
        "final": {k: v for k, v in rows[-1].items() if k != "time_s"},
        "per_class_accuracy": dict(zip(scan.classes, per_class)),
        "diagnostics": [str(f) for f in ([early] if early else []) + findings],  # `early` was printed at the start
        "time_s": elapsed,
        "train_time_s": sum(r["time_s"] for r in rows),
        "files": files,
        "settings": settings,
        "fast_path": history.plan.to_dict() if history.plan is not None else None,  # the plan it trained on
    }
    write_json(out / "summary.json", summary)
    width = max(5, *(len(c) for c in scan.classes))
    lines = [
        f"best epoch {best_ptr['epoch']}: val acc {ev['val_acc']:.4f} (val loss {ev['val_loss']:.4f})"
        + (f"; EMA val acc (last epoch) {rows[-1]['val_acc_ema']:.4f}" if history.ema is not None else ""),
        f"  {'class':<{width}}  {'acc':>6}  {'n':>5}",
    ]
    lines += [
        f"  {c:<{width}}  {'-' if a is None else f'{a:.3f}':>6}  {n:>5}"
        for c, a, n in zip(scan.classes, per_class, counts)
    ]
    say("\n".join(lines))
    for f in findings:
        say(str(f))
    say(f"wrote {out}/: " + ", ".join(files.values()) + ", summary.json")
    return summary


__all__ = ["plot_curves", "plot_confusion", "write_per_class", "finish_run"]
