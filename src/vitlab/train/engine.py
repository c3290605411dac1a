"""The training engine: `train_one_epoch`, `evaluate`, and `fit`, the one loop every command,
experiment and the demo train through (split as in DeiT's engine.py).

`fit(model, train_loader, val_loader, recipe)` adds around them what a Recipe asks for and what a run
needs: AdamW over one layer-id table (vitlab.train.optim) that drives both the staged unfreezing and
layer-wise lr decay, warmup + cosine per stage, MixUp/CutMix, an EMA of the weights, NaN handling,
metrics.csv, checkpoints every epoch in one format (vitlab.weights.checkpoint) with `last.json` and
`best.json`, exact resume, DistributedDataParallel under torchrun, and callbacks for whatever else
(printing, TensorBoard):

    stage 1 (epochs 1..K)     only the head trains (recipe.freeze_epochs = K)
    stage 2 (epochs K+1..E)   the blocks `recipe.unfreeze` names, the final norm and the head, each
                              block at lr x layer_decay^(L + 1 - i)

One AdamW holds every parameter from the start; frozen ones get no gradient (so AdamW leaves them
bitwise unchanged), which makes a checkpoint's optimizer state valid in either stage and resume
exact: the stage is a function of the epoch number alone. Resuming restores weights, optimizer,
schedule, EMA, every process's RNG and the metrics, so on CPU a killed-and-resumed run ends bitwise
equal to an uninterrupted one.

A run is a `TrainState` (the model, its optimizer, schedule and EMA, the epochs done and their metrics,
the plan): `fit` builds it, new or resumed (`TrainState.resume`, the one place a run is restored), then
each epoch sets the stage, trains, evaluates, checkpoints and calls the callbacks. The model comes back
with the trained (last) weights and otherwise as it came: its requires_grad flags and train/eval modes.

Small datasets live in memory as tensors (`TensorLoader`): at the mini experiment's scale the cost
of a step is Python and dispatch overhead, not arithmetic, so batches are sliced from one tensor,
metrics are accumulated on the device and read once per epoch, and AdamW runs as one fused step.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from vitlab.data.transforms import mix_transform
from vitlab.errors import VitlabError, check_range
from vitlab.fileio import check_out_folder, mark_folder, write_csv
from vitlab.options import DEFAULT_FAST_PATH
from vitlab.runtime import autocast, seed_everything
from vitlab.speed import paths
from vitlab.speed.fastpath import FastPath, choose_plan
from vitlab.speed.rules import Plan
from vitlab.train import diagnostics, distributed
from vitlab.train.distributed import DistInfo
from vitlab.train.optim import build_optimizer, freeze_threshold, layer_decay_groups, layer_ids, staged_warmup_cosine
from vitlab.train.recipe import Recipe, schedule
from vitlab.weights import checkpoint as ckpt


class TensorLoader:
    """Mini-batches of in-memory tensors, reshuffled every epoch from (seed, epoch) alone.

    Because the order depends only on the seed and the epoch number, a run resumed at epoch k sees
    exactly the batches an uninterrupted run would.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
    ):
        if len(x) != len(y):
            raise VitlabError(f"images and labels differ in length: {len(x)} vs {len(y)}")
        check_range("batch_size", batch_size, low=1, integer=True)
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
    after_step=None,
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
    `after_step.step()` runs once per optimizer step (the lr schedule, the EMA). `grad_accum` sums
    gradients over that many batches.
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
            if after_step is not None:
                after_step.step()
        total_loss += loss.detach() * len(y)
        correct += (logits.detach().argmax(-1) == y).sum()
        seen += len(y)
    return {
        "train_loss": (total_loss / max(seen, 1)).item(),
        "train_acc": (correct.float() / max(seen, 1)).item(),
        "lr": optimizer.param_groups[0]["lr"],
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable, *, device: torch.device, precision: str = "fp32", num_classes: int | None = None
) -> dict:
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
class History:
    """What `fit` returns: one row per epoch (the metrics.csv rows), the EMA model when the recipe keeps
    one, the head's learning rate at every optimizer step (for the curves), and the plan it trained on
    (`vitlab.speed`)."""

    rows: list[dict] = field(default_factory=list)
    ema: nn.Module | None = None
    lr_steps: tuple[list[float], list[float]] = ((), ())
    plan: Plan | None = None  # the fast path's choices (attention kernel, products, compile)

    @property
    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}

    @property
    def best(self) -> dict:
        """The row of the best validation accuracy (the first of equals, as best.json records it)."""
        return max(self.rows, key=lambda r: r["val_acc"]) if self.rows else {}

    @property
    def best_val_acc(self) -> float:
        return self.best.get("val_acc", float("nan"))


class Callback:
    """Hooks of `fit`; subclass and override what you need. Runs on the main process only."""

    def on_stage(self, epoch: int, stage: int, trainable: int) -> None:
        """A stage starts at 0-based `epoch` with `trainable` parameters (also on the first epoch run)."""

    def on_epoch_end(self, row: dict) -> None:
        """After an epoch's metrics (and checkpoint) are written."""

    def on_fit_end(self, history: History) -> None:
        """After the last epoch."""


class _AfterStep:
    """What `train_one_epoch` calls once per optimizer step: the lr schedule, then the EMA."""

    def __init__(self, scheduler, ema: AveragedModel | None, model: nn.Module):
        self.scheduler, self.ema, self.model = scheduler, ema, model

    def step(self) -> None:
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)


def check_run_folder(out: Path | None, resume: bool, force: bool = False) -> None:
    """A new run needs a folder without a run in it, and not someone else's files unless `force`;
    resuming needs one with a run (its last.json). Either way the folder must be writable
    (vitlab.fileio.check_out_folder)."""
    if resume and (out is None or not (out / "last.json").exists()):
        raise VitlabError(
            f"resume: no checkpoint to resume from in {out} (expected {out}/last.json); start a new run instead",
            arg="resume",
        )
    if out is None:
        return
    if not resume and (out / "last.json").exists():
        raise VitlabError(
            f"out {out} already holds a run (last.json); resume it (resume=True), or choose a new folder",
            arg="out",
            also=("resume",),
        )
    check_out_folder(out, kind="run", force=force or resume)


def _kept(out: Path) -> str:
    """What a run stopped by a failed write leaves to resume from, in one clause."""
    try:
        pointer = ckpt.read_pointer(out / "last.json")
    except VitlabError:
        return "no complete checkpoint was written"
    return (
        f"{out / 'last.json'} still points at {pointer['checkpoint']}, the last complete checkpoint: resume from it "
        "once there is room"
    )


def set_stage(model: nn.Module, ids: dict[str, int], threshold: int) -> int:
    """requires_grad = (layer id >= threshold). Returns the number of trainable parameters."""
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(ids[name] >= threshold)
        n += p.numel() if p.requires_grad else 0
    return n


@dataclass
class TrainState:
    """What a run carries from one epoch to the next, and what its checkpoints keep: the model, its optimizer,
    schedule and EMA, the epochs done with their metrics rows, and the plan it trains on. `start` builds a new
    run's; `resume` brings it to where the run in a folder stopped; `to_state` is a checkpoint's state.pt."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: AveragedModel | None
    plan: Plan
    lr_steps: tuple[list[float], list[float]]  # the head's lr at every optimizer step, for the curves
    epoch: int = 0  # epochs done
    rows: list[dict] = field(default_factory=list)  # one per epoch done: metrics.csv
    best: float = -1.0  # the val_acc of the checkpoint best.json points at (-1: none yet)

    @classmethod
    def start(cls, model: nn.Module, recipe: Recipe, *, steps_per_epoch: int, plan: Plan) -> TrainState:
        optimizer, scheduler, lr_steps = _optimizer(model, recipe, steps=steps_per_epoch)
        ema = None
        if recipe.ema:
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(recipe.ema), use_buffers=True)
        return cls(model, optimizer, scheduler, ema, plan, lr_steps)

    def resume(self, out: Path, recipe: Recipe, identity: dict, dist: DistInfo, say: Callable[[str], None]) -> None:
        """Continue the run in `out` from the checkpoint its last.json points at: the weights, optimizer,
        schedule, EMA, every process's RNG, the metrics, and the plan the run was started on (a state from
        before plans were kept: this run's). Rank 0 reads it from its `out` and hands it to the other
        processes, whose machines need not see that folder; every field is checked (check_state) before
        anything is restored from it or written."""
        folder, state, weights, pointer_epoch = distributed.on_main(lambda: _read_last(out), dist)
        _check_same_run(out, state, recipe, identity)
        epoch = check_state(
            state, folder / "state.pt", recipe=recipe, pointer_epoch=pointer_epoch, ema=self.ema is not None
        )
        saved = self._load(folder, state, weights)
        _check_recorded_plan(out, saved)
        self.epoch, self.rows = epoch, [dict(r) for r in state["history"]]
        _restore_rng(state, epoch, recipe, dist)
        say(f"resumed from {out}/last.json at epoch {epoch} of {recipe.epochs}")
        if saved is not None and saved != self.plan:
            say(f"fast path: the run's own, as it was started ({saved.describe()})")
        self.plan = saved or self.plan
        if dist.is_main:
            _repair_best(out, self.rows)
        self.best = max(r["val_acc"] for r in self.rows)

    def _load(self, folder: Path, state: dict, weights: dict[str, torch.Tensor]) -> Plan | None:
        """The checked state into the model, optimizer, schedule and EMA; returns the run's plan. What the
        schema cannot see (shapes against this model) is a message too, not a traceback."""
        try:
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if self.ema is not None:
                self.ema.load_state_dict(state["ema"])
            return Plan.from_dict(state["plan"]) if "plan" in state else None
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            if isinstance(e, VitlabError):
                raise
            raise VitlabError(
                f"resume: {folder} does not fit this run ({type(e).__name__}: {str(e).splitlines()[0]}); "
                "resume from an earlier checkpoint or start a new run",
                arg="resume",
            ) from e

    def to_state(self, recipe: Recipe, identity: dict, rng: list[torch.Tensor], dist: DistInfo) -> dict:
        """The training state a checkpoint keeps beside the weights (state.pt): `rng` is every process's."""
        state = {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng_cpu": rng,
            "history": [dict(r) for r in self.rows],
            "recipe": recipe.to_dict(),
            "identity": identity,
            "world_size": dist.world_size,
            "plan": self.plan.to_dict(),  # a resumed run trains on the path it started on
        }
        if dist.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(dist.device)
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def history(self) -> History:
        return History(rows=self.rows, ema=self.ema, lr_steps=self.lr_steps, plan=self.plan)


def fit(
    model: nn.Module,
    train_loader,
    val_loader,
    recipe: Recipe,
    *,
    dist: DistInfo | None = None,
    device: str | torch.device = "auto",
    out: str | Path | None = None,
    resume: bool = False,
    identity: dict | None = None,
    callbacks: Iterable[Callback] = (),
    log: Callable[[str], None] | None = None,
    progress: bool = False,
    desc: str = "train",
    save_every: int = 1,
    force: bool = False,
    fast_path: FastPath = DEFAULT_FAST_PATH,
) -> History:
    """Train `model` as `recipe` says; evaluate every epoch; with `out`, write metrics.csv and a
    checkpoint every `save_every` epochs (and the last), with last.json and best.json pointers.

    train_loader / val_loader: iterables of (images, labels) batches, with `set_epoch(epoch)` (or a
        sampler that has it) so that every epoch's order depends on the seed and the epoch alone.
    dist: the process group from `vitlab.train.distributed.setup` (default: one process on `device`).
    resume: continue the run in `out` from its last.json; the recipe and `identity` (what else must
        match: the data's fingerprint, the model's source) must be those of the run being resumed.
    log: where messages go (a stage change, a resume, a non-finite loss, the fast path); None is silent.
    force: write a new run into a non-empty `out` that holds no vitlab run (files of the same names are replaced).
    A write that fails (a full disk) stops the run with a VitlabError that says which checkpoint last.json
    still points at: checkpoints are complete or absent, never torn.
    fast_path (a `vitlab.speed.fastpath.FastPath`): "auto" (DEFAULT_FAST_PATH) trains on the plan the fixed
        rules give this kind of machine (`vitlab.speed.rules`: the attention kernel, no compile), "tuned" on
        the plan `vitlab tune` measured fastest here (measured before the first step if it has not been),
        "compile" compiled (one process only), "eager" never compiled, "off" or None exactly as built; a
        Plan is taken as it is. Each gives the same numbers to float rounding, and the same command gives
        the same numbers bitwise. The plan is said, kept in the History and the checkpoints, and a resumed
        run takes the plan it was started with.

    The model comes back with the trained (last) weights, on the run's device, and otherwise as it came:
    its requires_grad flags, train/eval modes, modules and attention kernel (the best epoch's weights are
    in `out`'s best.json checkpoint).
    """
    check_loaders(train_loader, val_loader)
    _check_recipe(recipe)
    dist = dist or distributed.single_process(device)
    out = Path(out).expanduser() if out is not None else None
    identity = dict(identity or {})
    callbacks = list(callbacks) if dist.is_main else []
    say = log if (log is not None and dist.is_main) else (lambda message: None)
    if out is not None or resume:  # `out` is rank 0's (vitlab.train.distributed): a per-machine folder will do
        distributed.on_main(lambda: check_run_folder(out, resume, force), dist)

    seed_everything(recipe.seed + dist.rank)  # each process its own augmentation and dropout stream
    model.to(dist.device)
    steps = math.ceil(len(train_loader) / recipe.grad_accum)  # optimizer steps per epoch
    plan = choose_plan(
        model,
        fast=fast_path,
        mode="train",
        precision=recipe.precision,
        batch_size=_largest_batch(train_loader, recipe.batch_size),
        items=steps * recipe.epochs,
        device=dist.device,
        log=say,
    )
    state = TrainState.start(model, recipe, steps_per_epoch=steps, plan=plan)
    if resume:
        state.resume(out, recipe, identity, dist, say)
    state.plan = _for_processes(state.plan, dist)
    say(f"fast path: {state.plan.describe()}")

    ids, L = layer_ids(model)
    thresholds = (L + 2, freeze_threshold(recipe.unfreeze, L))  # stage 1: the head only; stage 2: `unfreeze`
    loaders, mix, show = (train_loader, val_loader), _mix(model, recipe), progress and dist.is_main
    epochs = range(state.epoch, recipe.epochs)
    bar = tqdm(epochs, desc=desc, initial=state.epoch, total=recipe.epochs, leave=False, disable=not show)
    with paths.training(model, state.plan, precision=recipe.precision) as trained, _as_given(model):
        current, net = None, trained
        for epoch in bar:
            stage, threshold = _stage(epoch, recipe, thresholds)
            if threshold != current:
                current, net = threshold, _enter_stage(model, trained, ids, threshold, epoch, stage, dist, callbacks)
            row = _run_epoch(state, net, epoch, stage, loaders, recipe, dist, mix=mix, show=show, out=out, say=say)
            bar.set_postfix(loss=f"{row['train_loss']:.3f}", val_acc=f"{row['val_acc']:.3f}")
            if out is not None:
                _checkpoint(out, state, recipe, identity, dist, save_every)
            for cb in callbacks:
                cb.on_epoch_end(row)
            distributed.barrier(dist)
        bar.close()
    history = state.history()
    for cb in callbacks:
        cb.on_fit_end(history)
    return history


def _stage(epoch: int, recipe: Recipe, thresholds: tuple[int, int]) -> tuple[int, int]:
    """The stage of 0-based `epoch` (1: the head only, for the first freeze_epochs; 2: `unfreeze`) and its
    layer-id threshold: a function of the epoch number alone, so a resumed run is in the stage it left."""
    if epoch < recipe.freeze_epochs:
        return 1, thresholds[0]
    return (2 if recipe.freeze_epochs else 1), thresholds[1]


def _enter_stage(model, trained, ids, threshold: int, epoch: int, stage: int, dist: DistInfo, callbacks) -> nn.Module:
    """Set the stage's trainable parameters; returns what its epochs call: `trained` (the model on its plan)
    with one process, else the model wrapped anew (DDP fixes its parameter set when it is built)."""
    trainable = set_stage(model, ids, threshold)
    wrapped = distributed.wrap(model, dist)
    for cb in callbacks:
        cb.on_stage(epoch, stage, trainable)
    return trained if wrapped is model else wrapped  # (the compiled graph is for one process)


def _run_epoch(
    state: TrainState, net, epoch: int, stage: int, loaders, recipe: Recipe, dist: DistInfo, *, mix, show, out, say
) -> dict:
    """Train 0-based `epoch` through `net`, evaluate the model (and its EMA); the epoch's metrics row,
    appended to `state`. A non-finite training loss stops the run (diagnostics.nan_loss)."""
    train_loader, val_loader = loaders
    _set_epoch(epoch, train_loader, val_loader)
    t0 = time.perf_counter()
    stats = train_one_epoch(
        net,
        train_loader,
        state.optimizer,
        _AfterStep(state.scheduler, state.ema, state.model),
        device=dist.device,
        clip_grad=recipe.clip_grad,
        label_smoothing=recipe.label_smoothing,
        precision=recipe.precision,
        grad_accum=recipe.grad_accum,
        batch_transform=mix,
        progress=f"epoch {epoch + 1}" if show else False,
    )
    stats.pop("lr")
    stats = distributed.all_mean(stats, dist)
    if not math.isfinite(stats["train_loss"]):
        written = out is not None and (out / "last.json").exists()
        kept = str(ckpt.resolve_checkpoint(out / "last.json")) if written else None
        finding = diagnostics.nan_loss(epoch + 1, stats["train_loss"], kept)
        say(str(finding))
        raise VitlabError(f"training stopped: {finding.evidence}")
    row = {"epoch": epoch + 1, "stage": stage, "lr": max(g["lr"] for g in state.optimizer.param_groups), **stats}
    val = evaluate(state.model, val_loader, device=dist.device, precision=recipe.precision)
    row.update({k: v for k, v in val.items() if k != "confusion"})
    if state.ema is not None:
        e = evaluate(state.ema.module, val_loader, device=dist.device, precision=recipe.precision)
        row.update(val_loss_ema=e["val_loss"], val_acc_ema=e["val_acc"])
    row["time_s"] = time.perf_counter() - t0
    state.rows.append(row)
    state.epoch = epoch + 1
    return row


def _checkpoint(out: Path, state: TrainState, recipe: Recipe, identity: dict, dist: DistInfo, save_every: int) -> None:
    """metrics.csv after every epoch; a checkpoint every `save_every` epochs and after the last, with last.json,
    and best.json while the validation accuracy improves (the first of equals). A write that fails (a full
    disk) stops the run, saying what last.json still points at."""
    save = state.epoch % save_every == 0 or state.epoch == recipe.epochs
    rng = _gather_rng(dist) if save else None  # every process takes part in the gather
    if not dist.is_main:
        return
    try:
        mark_folder(out, "run")
        write_csv(out / "metrics.csv", state.rows)
        if save:
            name = f"epoch_{state.epoch:04d}"
            ckpt.save_checkpoint(out, name, state.model, state.to_state(recipe, identity, rng, dist))
            val_acc = state.rows[-1]["val_acc"]
            if val_acc > state.best:
                state.best = val_acc
                ckpt.mark_best(out, name, {"epoch": state.epoch, "val_acc": val_acc})
    except VitlabError as e:  # a full disk: say what is left to resume from
        raise VitlabError(f"training stopped at epoch {state.epoch}: {e}; {_kept(out)}") from e


@contextlib.contextmanager
def _as_given(model: nn.Module) -> Iterator[None]:
    """The model's requires_grad flags and train/eval modes, set back when the context ends: the stages and
    the evaluations change them, and `fit` hands the model back as it came, less its trained weights."""
    grads = [(p, p.requires_grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for p, flag in grads:
            p.requires_grad_(flag)
        for m, flag in modes:
            m.training = flag


def _for_processes(plan: Plan, dist: DistInfo) -> Plan:
    """Several processes train uncompiled: DDP wraps the model itself (the compiled graph is for one process)."""
    if dist.world_size > 1 and plan.compile:
        return replace(plan, compile=False, source=f"{plan.source}; not compiled: several processes")
    return plan


def _check_recipe(recipe) -> None:
    if not isinstance(recipe, Recipe):
        raise VitlabError(
            f"recipe must be a vitlab.train.Recipe (e.g. RECIPES['scratch'].replace(epochs=5)); found "
            f"{type(recipe).__name__}",
            arg="recipe",
        )


def _mix(model: nn.Module, recipe: Recipe) -> Callable | None:
    """The recipe's MixUp/CutMix as a batch transform, or None."""
    if not recipe.mixes:
        return None
    return mix_transform(
        num_classes=model.head.out_features,
        mixup=recipe.mixup,
        cutmix=recipe.cutmix,
        switch_prob=recipe.mix_switch_prob,
    )


def check_loaders(train_loader, val_loader) -> None:
    """`fit`'s loaders: iterables of batches with a length (a DataLoader, a TensorLoader), neither empty."""
    for arg, loader in (("train_loader", train_loader), ("val_loader", val_loader)):
        try:
            n = len(loader)
        except TypeError:
            raise VitlabError(
                f"{arg} must be an iterable of (images, labels) batches with a length (a DataLoader, a "
                f"vitlab TensorLoader); found a {type(loader).__name__}",
                arg=arg,
            ) from None
        if n == 0:
            what = "no images to train on" if arg == "train_loader" else "nothing to validate on"
            raise VitlabError(
                f"{arg} has no batches: {what} (an empty dataset, or fewer images than a batch with drop_last)", arg=arg
            )


def _optimizer(model: nn.Module, recipe: Recipe, *, steps: int):
    """One AdamW over every parameter, grouped by layer id (layer decay) and by whether it decays; warmup +
    cosine in each stage (`steps` optimizer steps per epoch; vitlab.train.recipe.schedule). Also the head's
    lr at every step, for the curves."""
    groups = layer_decay_groups(model, lr=recipe.lr, weight_decay=recipe.weight_decay, layer_decay=recipe.layer_decay)
    optimizer = build_optimizer(groups, lr=recipe.lr, weight_decay=recipe.weight_decay)
    stages = schedule(recipe, steps)
    scheduler = staged_warmup_cosine(
        optimizer,
        stage_steps=[s.steps for s in stages],
        warmup_steps=[s.warmup_steps for s in stages],
        min_lr_ratio=recipe.min_lr_ratio,
    )
    total = sum(s.steps for s in stages)  # the head's lr at optimizer step k, drawn at epoch (k + 1) / steps
    lr_steps = ([(k + 1) / steps for k in range(total)], [recipe.lr * scheduler.lr_lambdas[0](k) for k in range(total)])
    return optimizer, scheduler, lr_steps


def _set_epoch(epoch: int, *loaders) -> None:
    """Every epoch's order depends on the seed and the epoch alone (TensorLoader, DistributedSampler)."""
    for loader in loaders:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)


# ----------------------------------------------------------------------------------------------------
# The training state in a checkpoint (state.pt), and resume

STATE_VERSION = 2
STATE_KEYS = ("epoch", "optimizer", "scheduler", "rng_cpu", "history", "recipe")  # what resuming reads


def _gather_rng(dist: DistInfo) -> list[torch.Tensor]:
    """Every process's CPU RNG state (rank 0 gets the list; with one process, a list of one)."""
    return distributed.all_gather_object(torch.get_rng_state(), dist)


def _read_last(out: Path) -> tuple[Path, dict, dict[str, torch.Tensor], int | None]:
    """The checkpoint last.json points at: its folder, its training state, its weights (on the CPU), and the
    epoch last.json says it ends."""
    folder = ckpt.resolve_checkpoint(out / "last.json")
    return folder, ckpt.read_state(folder), ckpt.read_weights(folder), ckpt.read_pointer(out / "last.json").get("epoch")


HISTORY_KEYS = ("epoch", "lr", "train_loss", "train_acc", "val_loss", "val_acc")  # every metrics row has these


def check_state(state: dict, path: Path, *, recipe: Recipe, pointer_epoch: int | None, ema: bool) -> int:
    """The one schema of a training state (state.pt) before anything is restored from it or written: every
    field resume reads, of the type and in the range `fit` writes it. Returns the epoch it ends. A state.pt
    is a file from disk like any other: a field that fails is one VitlabError naming the file and the field,
    and the run's files are left as they are."""

    def bad(field: str, expected: str, found) -> VitlabError:
        shown = f"a {type(found).__name__}" if isinstance(found, (torch.Tensor, dict, list)) else repr(found)
        return VitlabError(
            f"resume: {path} is not a training state vitlab can continue: its {field} should be "
            f"{expected}; found {shown}. Resume from an earlier checkpoint or start a new run",
            arg="resume",
        )

    if state.get("version") != STATE_VERSION:
        raise VitlabError(
            f"resume: {path} was written by an earlier vitlab (state version {state.get('version', 1)}, "
            f"this one reads {STATE_VERSION}); its weights still load as a checkpoint (fine-tune from "
            "it), but the run cannot be resumed",
            arg="resume",
        )
    missing = [k for k in STATE_KEYS + (("ema",) if ema else ()) if k not in state]
    if missing:
        raise VitlabError(
            f"resume: {path} is not a complete training state (it lacks {', '.join(missing)}); resume "
            "from an earlier checkpoint or start a new run",
            arg="resume",
        )
    epoch = state["epoch"]
    if not _integer(epoch) or not 1 <= epoch <= recipe.epochs:
        raise bad("epoch", f"a whole number of epochs done, 1 .. {recipe.epochs} (the run's epochs)", epoch)
    if pointer_epoch is not None and pointer_epoch != epoch:
        raise bad("epoch", f"{pointer_epoch}, the epoch last.json says this checkpoint ends", epoch)
    for name, kind in (
        ("recipe", dict),
        ("identity", dict),
        ("optimizer", dict),
        ("scheduler", dict),
        ("history", list),
        ("rng_cpu", list),
    ):
        if not isinstance(state.get(name, {} if name == "identity" else None), kind):
            raise bad(name, f"a {kind.__name__}", state.get(name))
    rows = state["history"]
    if len(rows) != epoch:
        raise bad("history", f"{epoch} rows of metrics, one per epoch done", f"{len(rows)} rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or row.get("epoch") != i + 1:
            raise bad(f"history row {i + 1}", f"the metrics of epoch {i + 1}", row)
        for key in HISTORY_KEYS[1:]:
            if not _number(row.get(key)):
                raise bad(f"history row {i + 1}", f"a number for {key}", row.get(key, "nothing"))
        if not 0 <= row["val_acc"] <= 1 or not 0 <= row["train_acc"] <= 1:
            raise bad(f"history row {i + 1}", "accuracies between 0 and 1", row)
    size = torch.get_rng_state().shape
    rng = state["rng_cpu"]
    if not rng or not all(isinstance(r, torch.Tensor) and r.dtype == torch.uint8 and r.shape == size for r in rng):
        raise bad(
            "rng_cpu",
            f"one CPU random-generator state per process (uint8 tensors of {size[0]} bytes)",
            rng[0] if rng else rng,
        )
    if "rng_cuda" in state and not (
        isinstance(state["rng_cuda"], torch.Tensor) and state["rng_cuda"].dtype == torch.uint8
    ):
        raise bad("rng_cuda", "a CUDA random-generator state (a uint8 tensor)", state["rng_cuda"])
    world = state.get("world_size", len(rng))
    if not _integer(world) or world != len(rng):
        raise bad("world_size", f"the number of processes that saved it ({len(rng)} random states)", world)
    groups = state["optimizer"].get("param_groups")
    if (
        not isinstance(groups, list)
        or not isinstance(state["optimizer"].get("state"), dict)
        or not all(isinstance(g, dict) and _number(g.get("lr")) and g["lr"] >= 0 for g in groups)
    ):
        raise bad("optimizer", "AdamW's state_dict (param_groups with a learning rate each, and state)", groups)
    last = state["scheduler"].get("last_epoch")
    if not _integer(last) or last < 0:
        raise bad("scheduler", "the schedule's state_dict (last_epoch: the optimizer steps taken)", last)
    if ema and not isinstance(state["ema"], dict):
        raise bad("ema", "the moving average's state_dict", state["ema"])
    if "plan" in state:
        try:
            Plan.from_dict(state["plan"])
        except (ValueError, TypeError):
            raise bad(
                "plan", "the fast path the run trained on (attention, products, compile, pieces, source)", state["plan"]
            ) from None
    return epoch


def _largest_batch(loader, batch_size: int) -> int:
    """The most images a training batch holds: the recipe's batch, or all the images where there are fewer (what
    a plan is chosen, or tuned, for)."""
    sampler = getattr(loader, "sampler", None)  # torch's DataLoader and MemoryLoader: this process's images
    try:
        return max(1, min(batch_size, len(sampler))) if sampler is not None else batch_size
    except TypeError:  # a sampler without a length
        return batch_size


def _check_recorded_plan(out: Path, saved: Plan | None) -> None:
    """A finished run's summary.json records the plan it trained on; a state that names another was edited (its
    plan would be run, compiled or in pieces, behind the recorded one's back): refused."""
    try:
        recorded = json.loads((out / "summary.json").read_text()).get("fast_path")
        recorded = Plan.from_dict(recorded) if isinstance(recorded, dict) else None
    except (OSError, ValueError, TypeError, AttributeError):
        return  # no summary (a run killed before its end), or one that says nothing of a plan
    if saved is not None and recorded is not None and saved != recorded:
        raise VitlabError(
            f"resume: the state in {out} says the run trained on {saved.describe()}, but {out}/summary.json records "
            f"{recorded.describe()}; one of them was edited: resume from an earlier checkpoint or start a new run",
            arg="resume",
        )


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_same_run(out: Path, state: dict, recipe: Recipe, identity: dict) -> None:
    """A resumed run's recipe and identity are those it was started with (checked first: the likelier mistake)."""
    saved = state.get("recipe")
    if not isinstance(saved, dict) or state.get("version") != STATE_VERSION:
        return  # check_state says what is wrong with it
    diff = [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in recipe.to_dict().items() if saved.get(k) != v]
    theirs = state.get("identity") if isinstance(state.get("identity"), dict) else {}
    diff += [f"{k} {theirs.get(k)!r} -> {v!r}" for k, v in identity.items() if theirs.get(k) != v]
    if diff:
        raise VitlabError(
            f"resume {out}: the run being resumed was made with other settings ({'; '.join(diff)}); "
            "resume with the same ones, or start a new run in another folder",
            arg="resume",
        )


def _restore_rng(state: dict, epoch: int, recipe: Recipe, dist: DistInfo) -> None:
    """Every process's random generator as it was saved; with another number of processes, a new stream."""
    rng = state["rng_cpu"]
    if len(rng) == dist.world_size:
        torch.set_rng_state(rng[dist.rank])
    else:
        seed_everything(recipe.seed + 7919 * epoch + dist.rank)
        if dist.is_main:
            print(
                f"note: the run was saved with {len(rng)} process(es) and resumes with {dist.world_size}; "
                "random augmentation continues with a new stream (not bitwise the original)"
            )
    if "rng_cuda" in state and dist.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], dist.device)


def _repair_best(out: Path, rows: list[dict]) -> None:
    """A kill between writing last.json and best.json: point best.json at the best epoch kept."""
    best = max(rows, key=lambda r: r["val_acc"])  # first of equals, as the strict > in fit
    epoch = int(best["epoch"])
    pointer = ckpt.read_pointer(out / "best.json") if (out / "best.json").exists() else {}
    if pointer.get("epoch") != epoch and (out / "checkpoints" / f"epoch_{epoch:04d}").exists():
        ckpt.mark_best(out, f"epoch_{epoch:04d}", {"epoch": epoch, "val_acc": best["val_acc"]})


__all__ = [
    "TensorLoader",
    "train_one_epoch",
    "evaluate",
    "fit",
    "TrainState",
    "History",
    "Callback",
    "set_stage",
    "check_run_folder",
    "check_loaders",
    "check_state",
]
