"""Callbacks of `vitlab.train.engine.fit` that a training run on a dataset adds: one line per epoch,
and TensorBoard scalars. (The demo prints its own lines; experiments print nothing.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vitlab.train.engine import Callback, History


class EpochPrinter(Callback):
    """`epoch   3/10 [stage 2] lr 1.00e-04 train_loss ... val_acc ... (2.1s)`, and a line when a stage starts."""

    def __init__(self, say: Callable[[str], None], epochs: int, *, staged: bool, unfreeze: str):
        self.say, self.epochs, self.staged, self.unfreeze = say, epochs, staged, unfreeze

    def on_stage(self, epoch: int, stage: int, trainable: int) -> None:
        what = ("stage 1: the head only" if stage == 1 else f"stage 2: unfreeze {self.unfreeze}") if self.staged else ""
        self.say(f"epoch {epoch + 1}: {what + ', ' if what else ''}{trainable:,} trainable parameters")

    def on_epoch_end(self, row: dict) -> None:
        ema = f" val_acc_ema {row['val_acc_ema']:.4f}" if "val_acc_ema" in row else ""
        stage = f" [stage {row['stage']}]" if self.staged else ""
        self.say(
            f"epoch {row['epoch']:>3}/{self.epochs}{stage} lr {row['lr']:.2e} "
            f"train_loss {row['train_loss']:.4f} train_acc {row['train_acc']:.4f} "
            f"val_loss {row['val_loss']:.4f} val_acc {row['val_acc']:.4f}{ema} ({row['time_s']:.1f}s)"
        )


class TensorBoardLogger(Callback):
    """Scalars per epoch in `out/tensorboard` (train/loss, val/acc, lr, ...); `tensorboard --logdir out`."""

    KEYS = ("train_loss", "val_loss", "train_acc", "val_acc", "val_acc_ema", "lr")

    def __init__(self, out: str | Path, *, start_epoch: int = 0):
        self.out, self.start_epoch, self.writer = Path(out), start_epoch, None

    def on_epoch_end(self, row: dict) -> None:
        if self.writer is None:  # opened at the first epoch's end: a run refused before it writes no events
            from torch.utils.tensorboard import SummaryWriter  # slow to import: only when a run writes events

            # purge_step drops events a killed run wrote after its last checkpoint
            self.writer = SummaryWriter(
                str(self.out / "tensorboard"), purge_step=self.start_epoch + 1 if self.start_epoch else None
            )
        for key in self.KEYS:
            if key in row:
                self.writer.add_scalar(key.replace("_", "/", 1) if key != "lr" else "lr", row[key], row["epoch"])
        self.writer.flush()

    def on_fit_end(self, history: History) -> None:
        if self.writer is not None:
            self.writer.close()


__all__ = ["EpochPrinter", "TensorBoardLogger"]
