"""`vitlab demo`: the mini experiment, and its control without position embedding.

The mini experiment: dataset X (32x32x3, class A has its left half brighter, class B is the
mirror image, plus noise; 2000 training and 500 validation images), a ViT with patch 4 (64 patches),
D = 32, 4 heads, 2 blocks, MLP 64 (`vit_mini_x`), trained with AdamW at lr 3e-3, batch 32, 60 epochs.
It expects >= 95% validation accuracy, and a clear drop when `pos_embed` is removed: without
positions, attention sees a *set* of patch tokens, and both classes give the same set (a bright and a
dark half, only in mirrored places), so nothing separates them.

Cost: two runs of `epochs` epochs of 63 steps each, side by side in two processes on a CPU with two
cores (one after the other on a GPU or with `workers=1`); see the README for the measured wall time.

Outputs, in `out/`:
    pos_learned/, pos_none/     one run each: metrics.csv (per epoch), checkpoints/ (safetensors
                                weights + optimizer state), last.json, best.json  (vitlab.train.engine.fit)
    curves.png                  loss and accuracy per epoch, both runs
    attention_pos_learned.png   last layer's CLS attention per head over a few validation images
    attention_pos_none.png      the same for the run without position embedding
    summary.json                the table below, the boundary attention share, timings and settings
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import queue
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch import nn
from tqdm.auto import tqdm

from vitlab.analysis.attention import boundary_attention_share
from vitlab.analysis.plots import enlarge, overlay, save_figure, to_display
from vitlab.data.synthetic import CLASS_NAMES, dataset_x_splits
from vitlab.errors import VitlabError, check_range
from vitlab.fileio import check_out_folder, output_folder, temporary_folder, write_json
from vitlab.models.factory import create_model
from vitlab.models.registry import get_config
from vitlab.options import check_seed
from vitlab.runtime import check_threads, num_threads, process_pool, resolve_device, seed_everything
from vitlab.train.engine import Callback, TensorLoader, fit
from vitlab.train.recipe import RECIPES

MODEL = "vit_mini_x"
RUNS = (("learned", "with position embedding"), ("none", "without position embedding"))
N_TRAIN, N_VAL = 2000, 500
MAX_EPOCHS = 10_000
WHY = (
    "Without a position embedding both classes are the same set of patches (a bright half and a dark half, "
    "only in mirrored places) and self-attention does not know where a patch is, so the model cannot tell "
    "left-bright from right-bright; the position embedding is what tells it."
)


def check_options(
    *, epochs: int, seed: int, out: str | Path, n_train: int = N_TRAIN, n_val: int = N_VAL, force: bool = False
) -> Path:
    """Every option is checked before anything is written (no partial output after a mistake); `out` must
    be new, empty, an earlier demo's folder, or (with `force`) any folder (vitlab.fileio.check_out_folder)."""
    check_range("epochs", epochs, low=1, high=MAX_EPOCHS, integer=True, hint=" (the mini experiment uses 60)")
    check_seed(seed)
    check_range("n_train", n_train, low=2, integer=True)
    check_range("n_val", n_val, low=1, integer=True)
    return check_out_folder(out, kind="demo", force=force)


def last_layer_cls_attention(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last block's attention from the class token to every patch, on the patch grid.

    Row 0 of the (B, h, N+1, N+1) attention is the class token's query; its columns 1: are the N
    patches in raster order (the class token is column 0, so dropping it does not shift the grid), and
    reshaping to (gh, gw) puts image rows on rows and image columns on columns.
    Returns (logits (B, K), maps (B, h, gh, gw)).
    """
    gh, gw = model.cfg.grid_size
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits, (attn,) = model(x, return_attention=[-1])  # attn: (B, h, N+1, N+1)
    finally:
        model.train(was_training)
    cls_to_patches = attn[:, :, 0, 1:]  # (B, h, N): query = class token, keys = the patches
    return logits, cls_to_patches.reshape(*cls_to_patches.shape[:2], gh, gw)  # (B, h, gh, gw)


def pick_examples(labels: torch.Tensor, per_class: int = 2) -> list[int]:
    """The first `per_class` validation images of each class, class by class."""
    picked = []
    for c in sorted(labels.unique().tolist()):
        picked += (labels == c).nonzero().flatten()[:per_class].tolist()
    return picked


def run_demo(
    *,
    epochs: int = 60,
    seed: int = 0,
    out: str | Path = "runs/demo",
    device: str = "auto",
    n_train: int = N_TRAIN,
    n_val: int = N_VAL,
    threads: int | None = 1,
    workers: int | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    force: bool = False,
) -> dict:
    """Run both trainings, write the files listed in the module docstring, print the table, and
    return the summary (the content of summary.json).

    `threads`: torch's intra-op CPU threads per run (restored after). The mini model's matrices
    (65 tokens x 32 channels) are too small to split between cores: one thread does the same work, and
    on a machine shared with other processes extra threads wait for each other (measured on a loaded
    2-core VM: 2.6 s per epoch with 1 thread, 25-37 s with 2). `None` keeps torch's setting.
    `workers`: 2 trains the two runs side by side in two processes, 1 one after the other; None picks 2
    on a CPU with at least two cores (and 1 on a GPU). The results are the same either way.
    `force`: write into a non-empty folder that is not an earlier demo's (files of the same names are replaced).
    """
    out = check_options(epochs=epochs, seed=seed, out=out, n_train=n_train, n_val=n_val, force=force)
    check_threads(threads)
    check_range(
        "workers",
        workers,
        low=1,
        high=2,
        integer=True,
        optional=True,
        hint=" (1: one run after the other; 2: side by side)",
    )
    dev = resolve_device(device)  # an unavailable device is an error before anything is written
    if workers is None:
        workers = 2 if dev.type == "cpu" and (os.cpu_count() or 1) >= 2 else 1
    with output_folder(out, kind="demo", force=force), num_threads(threads):  # removed again if nothing was written
        return _run(
            epochs=epochs,
            seed=seed,
            out=out,
            device=dev,
            n_train=n_train,
            n_val=n_val,
            workers=workers,
            progress=progress,
            echo=echo,
        )


def _run(*, epochs, seed, out: Path, device: torch.device, n_train, n_val, workers, progress, echo) -> dict:
    t_start = time.perf_counter()
    cfg0 = get_config(MODEL)
    _, (x_val, y_val) = dataset_x_splits(n_train, n_val, seed=seed)  # the figure and the boundary share
    recipe = RECIPES["mini"].replace(epochs=epochs, seed=seed)  # AdamW 3e-3, batch 32
    threads = torch.get_num_threads()
    echo(
        f"vitlab demo: the mini experiment on dataset X ({n_train} train / {n_val} val, 32x32x3, "
        f"left half brighter = A, mirrored = B)"
    )
    echo(
        f"  model {MODEL}: patch {cfg0.patch_size} -> {cfg0.num_patches} patches + CLS, D={cfg0.dim}, "
        f"{cfg0.heads} heads, {cfg0.depth} blocks, MLP {cfg0.hidden_dim}; AdamW lr {recipe.lr:g}, batch "
        f"{recipe.batch_size}, {epochs} epochs, {device} ({threads} CPU thread{'' if threads == 1 else 's'}"
        f"{', both runs side by side in 2 processes' if workers > 1 else ''})"
    )

    show = sorted({1, epochs, *range(max(1, epochs // 6), epochs + 1, max(1, epochs // 6))})

    def report(pos: str, row: dict) -> None:
        if row["epoch"] in show:
            with tqdm.external_write_mode():  # the line goes above the progress bar
                echo(
                    f"  [{pos}] epoch {row['epoch']:>3}/{epochs}  train loss {row['train_loss']:.4f}  "
                    f"train acc {row['train_acc']:.3f}  val acc {row['val_acc']:.3f}  ({row['time_s']:.2f} s/epoch)"
                )

    settings = dict(epochs=epochs, seed=seed, out=out, device=str(device), n_train=n_train, n_val=n_val)
    if workers > 1:
        for pos, label in RUNS:
            echo(f"[{pos}] training {label} ...")
        trained = _train_side_by_side(settings, threads, report, progress=progress)
    else:
        trained = {}
        for pos, label in RUNS:
            echo(f"[{pos}] training {label} ...")
            trained[pos] = _train_arm(
                pos, **settings, progress=progress, on_epoch=lambda row, pos=pos: report(pos, row)
            )

    runs: dict[str, dict] = {}
    histories: dict[str, list[dict]] = {}
    for pos, label in RUNS:
        rows, train_s = trained[pos]["rows"], trained[pos]["train_s"]
        model = create_model(checkpoint=out / f"pos_{pos}").to(device)  # the final weights: the last checkpoint
        boundary = boundary_attention_share(model, x_val)
        last = rows[-1]
        figure = out / f"attention_pos_{pos}.png"
        write_attention_figure(
            model,
            x_val,
            y_val,
            figure,
            class_names=CLASS_NAMES,
            title=f"{MODEL}, pos_embed={pos}: last layer, class token -> patches (val acc {last['val_acc']:.1%})",
        )
        runs[pos] = {
            "label": label,
            "final_val_acc": last["val_acc"],
            "best_val_acc": max(r["val_acc"] for r in rows),
            "final_train_loss": last["train_loss"],
            "final_val_loss": last["val_loss"],
            "train_time_s": round(train_s, 2),
            "boundary_attention": boundary.to_dict(),
            "metrics_csv": f"pos_{pos}/metrics.csv",
            "checkpoint": f"pos_{pos}/last.json",
            "attention_png": figure.name,
        }
        histories[pos] = rows
        echo(f"  [{pos}] done in {train_s:.1f} s: val acc {last['val_acc']:.3f}; {boundary}")

    write_curves_figure(histories, out / "curves.png")
    wall = time.perf_counter() - t_start
    with_pos, without = runs["learned"], runs["none"]
    summary = {
        "experiment": "the mini experiment: vit_mini_x on dataset X, with and without position embedding",
        "model": MODEL,
        "model_config": cfg0.to_dict(),
        "recipe": recipe.to_dict(),
        "data": {"n_train": n_train, "n_val": n_val, "seed": seed},
        "device": str(device),
        "threads": torch.get_num_threads(),
        "workers": workers,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "runs": runs,
        "accuracy_drop_without_pos_embed": with_pos["final_val_acc"] - without["final_val_acc"],
        "expectation_met": bool(
            with_pos["final_val_acc"] >= 0.95 and without["final_val_acc"] < with_pos["final_val_acc"] - 0.1
        ),
        "why": WHY,
        "wall_time_s": round(wall, 1),
        "files": [
            "summary.json",
            "curves.png",
            *[runs[p]["attention_png"] for p in runs],
            *[runs[p]["metrics_csv"] for p in runs],
        ],
    }
    write_json(out / "summary.json", summary)
    echo("\n" + format_table(summary))
    echo(
        f"\nwrote {out}/: summary.json, curves.png, attention_pos_learned.png, attention_pos_none.png, "
        f"pos_learned/ and pos_none/ (metrics.csv, checkpoints)"
    )
    echo(f"demo wall time: {summary['wall_time_s']:.1f} s")
    return summary


class _OnEpoch(Callback):
    def __init__(self, fn: Callable[[dict], None]):
        self.fn = fn

    def on_epoch_end(self, row: dict) -> None:
        self.fn(row)


def _train_arm(
    pos: str, *, epochs, seed, out: Path, device: str, n_train, n_val, progress: bool, on_epoch: Callable[[dict], None]
) -> dict:
    """One run of the demo: train vit_mini_x with `pos_embed=pos` into out/pos_{pos}/ (written to a
    temporary folder, moved into place when complete). Returns its per-epoch rows and training seconds;
    the final weights are its last checkpoint. Depends only on its arguments, so it gives the same
    result in any process."""
    (x_train, y_train), (x_val, y_val) = dataset_x_splits(n_train, n_val, seed=seed)
    recipe = RECIPES["mini"].replace(epochs=epochs, seed=seed)
    seed_everything(seed)  # both runs start from the same patch embedding, blocks and head
    model = create_model(MODEL, pos_embed=pos)
    train_loader = TensorLoader(x_train, y_train, batch_size=recipe.batch_size, shuffle=True, seed=seed)
    val_loader = TensorLoader(x_val, y_val, batch_size=250)
    run_dir = Path(out) / f"pos_{pos}"
    t0 = time.perf_counter()
    with temporary_folder(run_dir) as tmp:  # moved into place when complete
        history = fit(
            model,
            train_loader,
            val_loader,
            recipe,
            device=device,
            out=tmp,
            progress=progress,
            desc=f"pos_embed={pos}",
            callbacks=[_OnEpoch(on_epoch)],
        )
        train_s = time.perf_counter() - t0
    return {"rows": history.rows, "train_s": train_s}


def _arm_worker(pos: str, settings: dict, messages) -> dict:
    """In a worker process: one run; its epochs go to `messages` as they end."""
    return _train_arm(pos, **settings, progress=False, on_epoch=lambda row: messages.put((pos, row)))


def _train_side_by_side(settings: dict, threads: int, report: Callable[[str, dict], None], *, progress: bool) -> dict:
    """Both runs at once, each in its own process. The mini model keeps one core busy and no more (a
    second thread in the same run does not help), so on a machine with two free cores the demo takes
    the time of one run. The parent prints every line."""
    bar = tqdm(total=len(RUNS) * settings["epochs"], desc="both runs", unit="epoch", disable=not progress, leave=False)
    try:
        with (
            multiprocessing.get_context("spawn").Manager() as manager,
            process_pool(len(RUNS), threads=threads) as pool,
        ):
            messages = manager.Queue()
            futures = {pos: pool.submit(_arm_worker, pos, settings, messages) for pos, _ in RUNS}
            while not all(f.done() for f in futures.values()) or not messages.empty():
                try:
                    pos, row = messages.get(timeout=0.5)
                except queue.Empty:
                    for pos, future in futures.items():
                        if future.done() and future.exception() is not None:
                            e = future.exception()
                            raise VitlabError(
                                f"the pos_embed={pos} run failed: "
                                f"{e if isinstance(e, VitlabError) else f'{type(e).__name__}: {e}'}"
                            ) from e
                    continue
                bar.update()
                report(pos, row)
            return {pos: future.result() for pos, future in futures.items()}
    finally:
        bar.close()
        for tmp in Path(settings["out"]).glob(".pos_*.*"):  # a run stopped half-way leaves nothing behind
            shutil.rmtree(tmp, ignore_errors=True)


def format_table(summary: dict) -> str:
    """The final table: validation accuracy with and without position embedding, and why."""
    runs = summary["runs"]
    lines = [
        f"{'vit_mini_x on dataset X':<30}{'val acc':>9}{'best':>8}{'train loss':>12}{'boundary attn':>15}{'time':>8}"
    ]
    for pos in ("learned", "none"):
        r = runs[pos]
        b = r["boundary_attention"]
        lines.append(
            f"{r['label']:<30}{r['final_val_acc']:>9.1%}{r['best_val_acc']:>8.1%}"
            f"{r['final_train_loss']:>12.4f}{b['share']:>9.1%} ({b['ratio']:.1f}x){r['train_time_s']:>6.0f} s"
        )
    drop = summary["accuracy_drop_without_pos_embed"]
    b = runs["learned"]["boundary_attention"]
    cols = "/".join(str(c) for c in b["columns"])
    lines += [
        f"The mini experiment expects >= 95% with position embedding and a clear drop without it: "
        f"{'met' if summary['expectation_met'] else 'NOT met'} (a drop of {100 * drop:.1f} points).",
        WHY,
        f"Boundary attn: the share of the last layer's CLS->patch attention (mean over heads and {b['n_images']} "
        f"validation images) on patch columns {cols}, next to the line between the halves; uniform attention "
        f"gives {b['uniform']:.1%}.",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Figures (matplotlib's Agg canvas; every file written to a temporary name and moved into place)


def write_curves_figure(histories: dict[str, list[dict]], path: Path) -> Path:
    """Loss and accuracy per epoch for both runs: solid = train, dashed = validation."""
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    colours = {"learned": "tab:blue", "none": "tab:red"}
    for pos, rows in histories.items():
        epochs = [r["epoch"] for r in rows]
        name = f"pos_embed={pos}"
        ax_loss.plot(epochs, [r["train_loss"] for r in rows], color=colours[pos], label=f"{name} train")
        ax_loss.plot(epochs, [r["val_loss"] for r in rows], color=colours[pos], ls="--", label=f"{name} val")
        ax_acc.plot(epochs, [r["train_acc"] for r in rows], color=colours[pos], label=f"{name} train")
        ax_acc.plot(epochs, [r["val_acc"] for r in rows], color=colours[pos], ls="--", label=f"{name} val")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0.4, 1.01))
    ax_acc.axhline(0.95, color="grey", lw=0.8, ls=":")
    last_epoch = max(r["epoch"] for rows in histories.values() for r in rows)
    ax_acc.text(last_epoch, 0.935, "expected: 95%", color="grey", fontsize=8, ha="right")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = ax_loss.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)  # below both plots
    fig.suptitle("vit_mini_x on dataset X: with and without position embedding")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, path)


def write_attention_figure(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    path: Path,
    *,
    class_names,
    title: str,
    per_class: int = 2,
) -> Path:
    """One row per validation image: the image, then the last layer's CLS attention of each head
    upsampled over it, then the mean over heads. Images are un-normalised ((x * 0.5) + 0.5, dataset X's
    convention); each heatmap is min-max scaled on its own (colour compares places, not heads), so
    each tile's label gives its largest weight as a multiple of uniform attention (1 / (N+1))."""
    idx = pick_examples(labels, per_class)
    device = next(model.parameters()).device
    logits, maps = last_layer_cls_attention(model, images[idx].to(device))  # (b, h, gh, gw)
    maps, preds = maps.float().cpu(), logits.argmax(-1).cpu()
    heads = maps.shape[1]
    tokens = model.cfg.num_patches + model.cfg.num_prefix_tokens  # uniform attention is 1/tokens per key
    cols = heads + 2
    fig = Figure(figsize=(1.7 * cols, 1.9 * len(idx) + 0.5))
    axes = fig.subplots(len(idx), cols, squeeze=False)
    for row, i in enumerate(idx):
        image = enlarge(to_display(images[i], (0.5,) * 3, (0.5,) * 3), min_side=128)  # (H', W', 3) in [0, 1]
        tiles = [(image, f"{class_names[int(labels[i])]}\npred {class_names[int(preds[row])][0]}")]
        tiles += [
            (overlay(image, maps[row, h], alpha=0.5), f"head {h}: peak {maps[row, h].max() * tokens:.1f}x")
            for h in range(heads)
        ]
        mean = maps[row].mean(0)
        tiles += [(overlay(image, mean, alpha=0.5), f"mean: peak {mean.max() * tokens:.1f}x")]
        for ax, (picture, label) in zip(axes[row], tiles):
            ax.imshow(picture)
            ax.set_title(label, fontsize=8)
            ax.set_axis_off()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = [
    "run_demo",
    "last_layer_cls_attention",
    "format_table",
    "check_options",
    "pick_examples",
    "write_curves_figure",
    "write_attention_figure",
    "WHY",
]
