"""The training engine: `train_one_epoch`, `evaluate`, and `fit`, which adds the schedule, metrics,
checkpoints and resume around them (split as in DeiT's engine.py).

Small datasets live in memory as tensors (`TensorLoader`): at the seed's scale the cost of a step is
Python and dispatch overhead, not arithmetic, so batches are sliced from one tensor, metrics are
accumulated on the device and read once per epoch, and AdamW runs as one fused step.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from vitlab import cpu_training
from vitlab.errors import VitlabError
from vitlab.fileio import write_csv
from vitlab.runtime import autocast, resolve_device, seed_everything
from vitlab.train import checkpoint as ckpt
from vitlab.train.optim import build_optimizer, warmup_cosine


class TensorLoader:
    """Mini-batches of in-memory tensors, reshuffled every epoch from (seed, epoch) alone.

    Because the order depends only on the seed and the epoch number, a run resumed at epoch k sees
    exactly the batches an uninterrupted run would.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0):
        if len(x) != len(y):
            raise VitlabError(f"images and labels differ in length: {len(x)} vs {len(y)}")
        if batch_size < 1:
            raise VitlabError(f"--batch-size must be at least 1; found {batch_size}")
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.x)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
            x, y = self.x[order], self.y[order]  # one gather per epoch, then cheap slices
        else:
            x, y = self.x, self.y
        for i in range(len(self)):
            yield x[i * self.batch_size : (i + 1) * self.batch_size], y[i * self.batch_size : (i + 1) * self.batch_size]


def train_one_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    scheduler=None,
    *,
    device: torch.device,
    clip_grad: float | None = 1.0,
    label_smoothing: float = 0.0,
    precision: str = "fp32",
    grad_accum: int = 1,
    batch_transform: Callable | None = None,
    progress: bool | str = False,
) -> dict:
    """One pass over `loader`. Returns mean loss, accuracy (on the hard labels) and the last lr.

    `batch_transform(x, y) -> (x, y_soft)` is where MixUp/CutMix go; the loss then takes soft targets.
    The scheduler steps once per optimizer step. `grad_accum` sums gradients over that many batches.
    """
    model.train()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    bar = tqdm(loader, desc=progress if isinstance(progress, str) else "train", leave=False, disable=not progress)
    optimizer.zero_grad(set_to_none=True)
    n_batches = len(loader) if hasattr(loader, "__len__") else None
    for step, (x, y) in enumerate(bar):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        target = y
        if batch_transform is not None:
            x, target = batch_transform(x, y)
        with autocast(device, precision):
            logits = model(x)
            loss = F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)
        (loss / grad_accum).backward()
        last = n_batches is not None and step + 1 == n_batches
        if (step + 1) % grad_accum == 0 or last:
            if clip_grad:
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
        total_loss += loss.detach() * len(y)
        correct += (logits.detach().argmax(-1) == y).sum()
        seen += len(y)
    return {
        "train_loss": (total_loss / max(seen, 1)).item(),
        "train_acc": (correct.float() / max(seen, 1)).item(),
        "lr": optimizer.param_groups[0]["lr"],
    }


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, *, device: torch.device, precision: str = "fp32",
             num_classes: int | None = None) -> dict:
    """Loss and accuracy over `loader`; with `num_classes`, also the confusion matrix (true x predicted)."""
    model.eval()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device) if num_classes else None
    seen = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, precision):
            logits = model(x).float()
        total_loss += F.cross_entropy(logits, y, reduction="sum")
        pred = logits.argmax(-1)
        correct += (pred == y).sum()
        if confusion is not None:
            confusion += torch.bincount(y * num_classes + pred, minlength=num_classes**2).view(num_classes, num_classes)
        seen += len(y)
    out = {"val_loss": (total_loss / max(seen, 1)).item(), "val_acc": (correct.float() / max(seen, 1)).item()}
    if confusion is not None:
        out["confusion"] = confusion.cpu()
    return out


@dataclass
class TrainConfig:
    """The recipe. Defaults are the seed's mini experiment (seed 000 section 5.3): AdamW, lr 3e-3,
    batch 32, 60 epochs; plus a short warmup, cosine decay and gradient clipping."""

    epochs: int = 60
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 5.0
    min_lr_ratio: float = 0.0
    clip_grad: float | None = 1.0
    label_smoothing: float = 0.0
    precision: str = "fp32"
    grad_accum: int = 1
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        checks = {
            "epochs": self.epochs >= 1,
            "batch_size": self.batch_size >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "warmup_epochs": self.warmup_epochs >= 0,
            "grad_accum": self.grad_accum >= 1,
            "label_smoothing": 0 <= self.label_smoothing < 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise VitlabError(f"--{name.replace('_', '-')} is out of range: found {getattr(self, name)!r}")


@dataclass
class History:
    rows: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}

    @property
    def best_val_acc(self) -> float:
        return max((r["val_acc"] for r in self.rows), default=float("nan"))


def fit(
    model: nn.Module,
    train_loader,
    val_loader,
    cfg: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
    batch_transform: Callable | None = None,
    progress: bool = True,
    desc: str = "train",
    on_epoch_end: Callable[[dict], None] | None = None,
    save_every: int = 1,
) -> History:
    """Train for cfg.epochs; evaluate every epoch; write metrics.csv and checkpoints to `out_dir`.

    On CPU the model's nn.Linear layers become `vitlab.cpu_training.TrainingLinear` (same parameters).
    With `resume`, training continues from `out_dir/last.json`: weights, optimizer, scheduler, RNG
    and metrics are restored, so on CPU the result is bitwise the one an uninterrupted run gives.
    """
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    model.to(device)
    cpu_training.use_onednn_linears(model)  # on CPU: big fp32 products through oneDNN, where it is faster
    optimizer = optimizer or build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum)
    scheduler = warmup_cosine(
        optimizer,
        warmup_steps=round(cfg.warmup_epochs * steps_per_epoch),
        total_steps=cfg.epochs * steps_per_epoch,
        min_lr_ratio=cfg.min_lr_ratio,
    )
    history, start = History(), 0
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if resume:
        if out is None or not (out / "last.json").exists():
            raise VitlabError(f"--resume: no checkpoint to resume from in {out} (expected {out}/last.json)")
        start, history = _restore(out, model, optimizer, scheduler, device)
    best = history.best_val_acc if history.rows else -1.0

    epochs = range(start, cfg.epochs)
    bar = tqdm(epochs, desc=desc, initial=start, total=cfg.epochs, disable=not progress, leave=False)
    for epoch in bar:
        for loader in (train_loader, val_loader):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
                loader.sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        row = {"epoch": epoch + 1}
        row.update(train_one_epoch(model, train_loader, optimizer, scheduler, device=device, clip_grad=cfg.clip_grad,
                                   label_smoothing=cfg.label_smoothing, precision=cfg.precision,
                                   grad_accum=cfg.grad_accum, batch_transform=batch_transform))
        row.update({k: v for k, v in evaluate(model, val_loader, device=device, precision=cfg.precision).items()
                    if k != "confusion"})
        row["time_s"] = time.perf_counter() - t0
        if not math.isfinite(row["train_loss"]):
            raise VitlabError(
                f"training loss became {row['train_loss']} at epoch {epoch + 1}: stopped. The last good checkpoint "
                f"is kept{f' in {out}' if out else ''}; lower --lr or check that the inputs are normalised"
            )
        history.rows.append(row)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", val_acc=f"{row['val_acc']:.3f}")
        if out is not None:
            write_csv(out / "metrics.csv", history.rows)
            is_last = epoch + 1 == cfg.epochs
            if (epoch + 1) % save_every == 0 or is_last:
                name = f"epoch_{epoch + 1:04d}"
                state = {
                    "epoch": epoch + 1,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng_cpu": torch.get_rng_state(),
                    "history": [{k: float(v) for k, v in r.items()} for r in history.rows],
                    "train_config": asdict(cfg),
                }
                if device.type == "cuda":
                    state["rng_cuda"] = torch.cuda.get_rng_state(device)
                ckpt.save_checkpoint(out, name, model, state)
                if row["val_acc"] > best:
                    best = row["val_acc"]
                    ckpt.mark_best(out, name, {"epoch": epoch + 1, "val_acc": best})
        if on_epoch_end is not None:
            on_epoch_end(row)
    bar.close()
    return history


def _restore(out: Path, model: nn.Module, optimizer, scheduler, device: torch.device) -> tuple[int, History]:
    from safetensors.torch import load_file

    folder = ckpt.resolve_checkpoint(out / "last.json")
    ckpt._unwrap(model).load_state_dict(load_file(folder / "model.safetensors", device=str(device)))
    state = torch.load(folder / "state.pt", map_location=device, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng_cpu"].cpu())
    if "rng_cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"].cpu(), device)
    rows = [{k: (int(v) if k == "epoch" else v) for k, v in r.items()} for r in state["history"]]
    return int(state["epoch"]), History(rows)
