"""Fine-tuning on your own image folder, the seeds' staged recipe; training from scratch is the same
loop with one stage.

Seed 004 section 7.3: replace the head with one for your classes, load the pretrained weights, a
small learning rate (1e-5 to 1e-4) with an Adam-type optimizer; "first freeze everything but the
head for a few epochs, watch the head converge, then unfreeze the last few layers" -- more stable
than fine-tuning everything at once. Section 6.3: warmup then cosine, MixUp/CutMix. Paper Section
3.2: the new head is zero-initialised.

    stage 1 (epochs 1..K)     only the head trains (`--freeze-epochs K`)
    stage 2 (epochs K+1..E)   the last N blocks, the final norm and the head train (`--unfreeze last:N|all`)
                              with layer-wise lr decay: block i of L gets lr * decay^(L + 1 - i)

Freezing and layer decay come from one table, `optim.layer_ids` (a depth per parameter): a stage
trains the parameters at or above its threshold depth, and the lr of each depth is scaled by the
decay. One AdamW holds every parameter from the start; frozen ones simply get no gradient (so
AdamW leaves them bitwise unchanged), which makes a checkpoint's optimizer state valid in either
stage and resume exact: the stage is a function of the epoch number alone.

Each epoch writes metrics.csv, TensorBoard scalars and an atomic checkpoint (`last.json`, `best.json`
by val accuracy); `--resume` restores weights, optimizer, schedule, EMA, RNG and metrics, so on CPU a
killed-and-resumed run ends bitwise equal to an uninterrupted one. At the end: the best checkpoint's
confusion matrix (PNG) and per-class accuracy, the curves (PNG), diagnostics, and summary.json.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import tqdm

from vitlab import cpu_training
from vitlab.errors import VitlabError
from vitlab.runtime import PRECISIONS, seed_everything
from vitlab.train import checkpoint as ckpt
from vitlab.train import diagnostics, distributed
from vitlab.fileio import write_csv as _write_csv
from vitlab.train.engine import evaluate, train_one_epoch
from vitlab.train.optim import build_optimizer, freeze_threshold, layer_decay_groups, layer_ids, staged_warmup_cosine

DATASETS = ("digits", "x")


@dataclass
class RunConfig:
    """Everything a fine-tuning or training run depends on (the CLI flags, one to one)."""

    # data
    data: str | None = None  # an image folder; or
    dataset: str | None = None  # a bundled dataset: digits | x (`vitlab train`)
    val_split: float | None = None
    # model
    model: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    img_size: int | None = None
    drop_path: float = 0.0
    # recipe
    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.0
    clip_grad: float = 1.0
    freeze_epochs: int = 0
    unfreeze: str = "all"
    layer_decay: float = 1.0
    # augmentation and regularisation
    augment: bool = True
    hflip: bool | None = None  # None: on for image folders, off for the bundled datasets (a flip changes their classes)
    crop_scale: float = 0.35
    color_jitter: float = 0.0
    auto_augment: str = "none"
    reprob: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mix_switch_prob: float = 0.5
    smoothing: float = 0.0
    ema: float | None = None
    # running
    precision: str = "fp32"
    grad_accum: int = 1
    seed: int = 0
    device: str = "auto"
    workers: int | None = None
    out: str = "runs/finetune"
    resume: bool = False

    def check(self) -> None:
        if (self.data is None) == (self.dataset is None):
            raise VitlabError("give exactly one of --data DIR (an image folder) or --dataset " + "|".join(DATASETS))
        if self.dataset is not None and self.dataset not in DATASETS:
            raise VitlabError(f"--dataset must be one of {', '.join(DATASETS)}; found {self.dataset!r}")
        if self.pretrained and self.checkpoint:
            raise VitlabError("give --pretrained SOURCE or --checkpoint PATH, not both")
        if self.model is None and self.checkpoint is None:
            raise VitlabError("--model NAME is required (or --checkpoint PATH, which knows its model)")
        checks = {
            "epochs": self.epochs >= 1, "batch-size": self.batch_size >= 1, "lr": self.lr > 0,
            "weight-decay": self.weight_decay >= 0, "warmup-epochs": self.warmup_epochs >= 0,
            "freeze-epochs": 0 <= self.freeze_epochs <= self.epochs, "layer-decay": 0 < self.layer_decay <= 1,
            "smoothing": 0 <= self.smoothing < 1, "grad-accum": self.grad_accum >= 1,
            "drop-path": 0 <= self.drop_path < 1, "clip-grad": self.clip_grad >= 0,
            "ema": self.ema is None or 0 < self.ema < 1, "min-lr-ratio": 0 <= self.min_lr_ratio <= 1,
            "workers": self.workers is None or self.workers >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                value = getattr(self, name.replace("-", "_"))
                raise VitlabError(f"--{name} is out of range: found {value!r}" +
                                  (f" (at most --epochs {self.epochs})" if name == "freeze-epochs" else ""))
        if self.precision not in PRECISIONS:
            raise VitlabError(f"--precision must be one of {', '.join(PRECISIONS)}; found {self.precision!r}")

    def recipe(self) -> dict:
        """The fields a resumed run must share with the run it resumes (the rest only say where/how fast)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("resume", "out", "workers", "device", "data")}


# ----------------------------------------------------------------------------------------------------
# Data and model


def load_data(cfg: RunConfig, model_size: tuple[int, int] | None = None):
    """A FolderScan for --data or --dataset."""
    from vitlab.data import folder

    if cfg.data is not None:
        return folder.scan_folder(cfg.data, val_split=cfg.val_split, seed=cfg.seed)
    if cfg.dataset == "digits":
        from vitlab.data.digits import CLASS_NAMES, load_digits, stratified_split

        x, y = load_digits(max(32, (model_size or (32, 32))[0]), channels=3, normalize=False)
        tr, va = stratified_split(y, cfg.val_split or 0.2, seed=cfg.seed)
        return folder.in_memory_scan("digits", CLASS_NAMES, (x[tr], y[tr]), (x[va], y[va]))
    from vitlab.data.synthetic import CLASS_NAMES, dataset_x_splits

    (xt, yt), (xv, yv) = dataset_x_splits(seed=cfg.seed, normalize=False)
    return folder.in_memory_scan("dataset X", CLASS_NAMES, (xt, yt), (xv, yv))


def dataset_classes(cfg: RunConfig) -> int | None:
    return {"digits": 10, "x": 2}.get(cfg.dataset)


def build_model(cfg: RunConfig, num_classes: int, class_names: list[str]) -> nn.Module:
    """The model with a new zero-initialised head for `num_classes` (paper Section 3.2)."""
    from vitlab.zoo import CNN_VARIANTS, create_model

    overrides = {"drop_path": cfg.drop_path} if cfg.drop_path > 0 else {}
    is_cnn = (cfg.model or "") in CNN_VARIANTS
    if overrides and is_cnn:
        raise VitlabError(f"--drop-path applies to ViTs (stochastic depth over blocks); {cfg.model} has none")
    if cfg.checkpoint:
        folder = ckpt.resolve_checkpoint(cfg.checkpoint)
        meta = json.loads((folder / "config.json").read_text())
        if meta.get("kind") == "vit" and overrides:
            meta["config"] = {**meta["config"], **overrides}
        elif overrides:
            raise VitlabError(f"--drop-path applies to ViTs; the checkpoint {folder} holds a {meta.get('kind')}")
        model = ckpt.build_model_from_config(meta)
        from safetensors.torch import load_file

        model.load_state_dict(load_file(folder / "model.safetensors"))
        size = tuple(model.cfg.img_size) if hasattr(model, "cfg") else None
        if cfg.img_size and size and size != (cfg.img_size, cfg.img_size):
            raise VitlabError(f"--img-size {cfg.img_size}: the checkpoint {folder} is built for {size[0]}x{size[1]}; "
                              "drop --img-size (images are resized to the model's size)")
    else:
        model = create_model(cfg.model, pretrained=cfg.pretrained, num_classes=num_classes, img_size=cfg.img_size,
                             **overrides)
    model.reset_classifier(num_classes)
    nn.init.zeros_(model.head.weight)  # ResNetMini's reset_classifier keeps nn.Linear's default init
    nn.init.zeros_(model.head.bias)
    model.pretrained_cfg = {**dict(model.pretrained_cfg or {}), "num_classes": num_classes,
                            "label_names": list(class_names)}
    if hasattr(model, "cfg"):
        model.pretrained_cfg["input_size"] = (model.cfg.in_chans, *model.cfg.img_size)
    return model


def set_stage(model: nn.Module, ids: dict[str, int], threshold: int) -> int:
    """requires_grad = (layer id >= threshold). Returns the number of trainable parameters."""
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(ids[name] >= threshold)
        n += p.numel() if p.requires_grad else 0
    return n


def make_loaders(cfg: RunConfig, scan, model: nn.Module, info) -> tuple:
    """(sampler, train loader, val loader, batch mixing or None) for `scan`, with `model`'s transforms.

    A DistributedSampler in every case (with one process it is a seeded shuffle), so one process with
    batch B x N sees exactly the batches N processes with batch B see together.
    """
    from vitlab.data.folder import ImageDataset
    from vitlab.data.transforms import mix_transform, model_transforms

    hflip = cfg.hflip if cfg.hflip is not None else cfg.dataset is None
    train_tf, eval_tf = model_transforms(model, augment=cfg.augment, scale=(cfg.crop_scale, 1.0), hflip=hflip,
                                         color_jitter=cfg.color_jitter, auto_augment=cfg.auto_augment,
                                         re_prob=cfg.reprob)
    mix = mix_transform(num_classes=len(scan.classes), mixup=cfg.mixup, cutmix=cfg.cutmix,
                        switch_prob=cfg.mix_switch_prob)
    train_ds = ImageDataset(scan.train, train_tf, images=scan.images)
    val_ds = ImageDataset(scan.val, eval_tf, images=scan.images)
    sampler = DistributedSampler(train_ds, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed)
    cuda = info.device.type == "cuda"
    workers = cfg.workers if cfg.workers is not None else (min(8, torch.get_num_threads()) if cuda else 0)
    train_loader = DataLoader(train_ds, batch_size=cfg.batch_size, sampler=sampler, drop_last=mix is not None,
                              num_workers=workers, pin_memory=cuda)  # mixing needs full batches (a partner each)
    val_loader = DataLoader(val_ds, batch_size=2 * cfg.batch_size, shuffle=False, num_workers=workers, pin_memory=cuda)
    if len(train_loader) == 0:
        raise VitlabError(f"--batch-size {cfg.batch_size} x {info.world_size} process(es) is larger than the "
                          f"{len(scan.train)} training images, and MixUp/CutMix drop incomplete batches; "
                          "use a smaller --batch-size")
    return sampler, train_loader, val_loader, mix


class AfterStep:
    """What `train_one_epoch` calls once per optimizer step (its `scheduler` argument): the lr
    schedule, then the EMA of the weights (torch.optim.swa_utils.AveragedModel)."""

    def __init__(self, scheduler, ema=None, model: nn.Module | None = None):
        self.scheduler, self.ema, self.model = scheduler, ema, model

    def step(self) -> None:
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)


# ----------------------------------------------------------------------------------------------------
# The run


def run(cfg: RunConfig, *, progress: bool | None = None) -> dict:
    """Fine-tune (or train) as `cfg` says; returns the summary (also written to out/summary.json)."""
    cfg.check()
    t_start = time.perf_counter()
    info = distributed.setup(cfg.device)
    device = info.device
    say = _printer(info)
    show = (sys.stderr.isatty() if progress is None else progress) and info.is_main
    out = Path(cfg.out)
    if cfg.resume and not (out / "last.json").exists():
        raise VitlabError(f"--resume: no checkpoint to resume from in {out} (expected {out}/last.json); "
                          "drop --resume to start a new run")
    if not cfg.resume and (out / "last.json").exists():
        raise VitlabError(f"--out {out} already holds a run (last.json); add --resume to continue it, "
                          "or choose a new --out")

    seed_everything(cfg.seed)
    n_cls = dataset_classes(cfg)
    scan = None
    if n_cls is None:
        scan = load_data(cfg)
        if info.is_main:
            if scan.warning():
                print(scan.warning(), file=sys.stderr)
            say(scan.report())
        n_cls, names = len(scan.classes), scan.classes
    else:
        from vitlab.data import digits, synthetic

        names = list(digits.CLASS_NAMES if cfg.dataset == "digits" else synthetic.CLASS_NAMES)
    model = build_model(cfg, n_cls, names).to(device)
    cpu_training.use_onednn_linears(model)  # on CPU: big fp32 products through oneDNN, where it is faster
    from vitlab.data.transforms import input_size

    if scan is None:
        scan = load_data(cfg, input_size(model))
        say(scan.report())
    model_name = cfg.model or model.pretrained_cfg.get("architecture") or type(model).__name__
    scratch = not (cfg.pretrained or cfg.checkpoint)
    if scratch and info.is_main:
        finding = diagnostics.tiny_from_scratch(len(scan.train), model_name)
        if finding:
            say(str(finding))

    sampler, train_loader, val_loader, mix = make_loaders(cfg, scan, model, info)

    # One optimizer, one layer-id table for freezing and layer decay; the stage is a function of the epoch.
    ids, L = layer_ids(model)
    K = cfg.freeze_epochs
    thresholds = (L + 2, freeze_threshold(cfg.unfreeze, L))  # stage 1: the head only; stage 2: --unfreeze

    def threshold(epoch: int) -> int:
        return thresholds[0] if epoch < K else thresholds[1]

    groups = layer_decay_groups(model, lr=cfg.lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay)
    optimizer = build_optimizer(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = math.ceil(len(train_loader) / cfg.grad_accum)  # optimizer steps per epoch
    stage_steps = [n for n in (K * steps, (cfg.epochs - K) * steps) if n > 0]
    scheduler = staged_warmup_cosine(optimizer, stage_steps=stage_steps, warmup_steps=round(cfg.warmup_epochs * steps),
                                     min_lr_ratio=cfg.min_lr_ratio)
    total = sum(stage_steps)  # the head's lr at each optimizer step k, drawn at epoch (k + 1) / steps
    lr_steps = ([(k + 1) / steps for k in range(total)], [cfg.lr * scheduler.lr_lambdas[0](k) for k in range(total)])
    ema = None
    if cfg.ema:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema), use_buffers=True)
    after_step = AfterStep(scheduler, ema, model)

    rows: list[dict] = []
    start = 0
    data_hash = _fingerprint(scan)
    if cfg.resume:
        start, rows = _restore(out, cfg, model, optimizer, scheduler, ema, info, data_hash)
        say(f"resumed from {out}/last.json at epoch {start} of {cfg.epochs}")
    else:
        seed_everything(cfg.seed + info.rank)  # each process its own augmentation/dropout stream
    best = max((r["val_acc"] for r in rows), default=-1.0)
    if rows and info.is_main:  # a kill between writing last.json and best.json: point best.json at the best epoch
        best_epoch = max(rows, key=lambda r: r["val_acc"])["epoch"]  # first of equals, as the strict > below
        pointer = json.loads((out / "best.json").read_text()) if (out / "best.json").exists() else {}
        if pointer.get("epoch") != best_epoch and (out / "checkpoints" / f"epoch_{best_epoch:04d}").exists():
            ckpt.mark_best(out, f"epoch_{best_epoch:04d}", {"epoch": best_epoch, "val_acc": best})

    writer = None
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tensorboard"), purge_step=start + 1 if start else None)
    say(f"{model_name}: {sum(p.numel() for p in model.parameters()):,} parameters, {n_cls} classes; "
        f"{cfg.epochs} epochs ({f'{K} head-only, then --unfreeze {cfg.unfreeze}' if K else f'--unfreeze {cfg.unfreeze}'}), global batch "
        f"{cfg.batch_size * info.world_size * cfg.grad_accum} = {cfg.batch_size} x {info.world_size} process(es)"
        f"{f' x {cfg.grad_accum} accumulation' if cfg.grad_accum > 1 else ''}, {device}, {cfg.precision}")

    current, wrapped = None, model
    bar = tqdm(range(start, cfg.epochs), desc="epochs", initial=start, total=cfg.epochs, disable=not show, leave=False)
    for epoch in bar:
        if threshold(epoch) != current:
            current = threshold(epoch)
            trainable = set_stage(model, ids, current)
            wrapped = distributed.wrap(model, info)  # DDP fixes its parameter set when built
            stage = f"stage {1 if epoch < K else 2}, " if K else ""  # stages only when a head-only phase exists
            say(f"epoch {epoch + 1}: {stage}{trainable:,} trainable parameters")
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        stats = train_one_epoch(wrapped, train_loader, optimizer, after_step, device=device, clip_grad=cfg.clip_grad,
                                label_smoothing=cfg.smoothing, precision=cfg.precision, grad_accum=cfg.grad_accum,
                                batch_transform=mix, progress=f"epoch {epoch + 1}" if show else False)
        stats.pop("lr")
        lr = max(g["lr"] for g in optimizer.param_groups)  # the head's rate (layer decay scales the rest)
        stats = distributed.all_mean(stats, info)
        if not math.isfinite(stats["train_loss"]):
            kept = str(ckpt.resolve_checkpoint(out / "last.json")) if (out / "last.json").exists() else None
            finding = diagnostics.nan_loss(epoch + 1, stats["train_loss"], kept)
            say(str(finding))
            if writer:
                writer.close()
            raise VitlabError(f"training stopped: {finding.evidence}")
        row = {"epoch": epoch + 1, "stage": 1 if epoch < K else 2, "lr": lr, **stats}
        row.update({k: v for k, v in evaluate(model, val_loader, device=device, precision=cfg.precision).items()
                    if k != "confusion"})
        if ema is not None:
            e = evaluate(ema.module, val_loader, device=device, precision=cfg.precision)
            row.update(val_loss_ema=e["val_loss"], val_acc_ema=e["val_acc"])
        row["time_s"] = time.perf_counter() - t0
        rows.append(row)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", val_acc=f"{row['val_acc']:.3f}")
        if info.is_main:
            say(_epoch_line(row, cfg.epochs, staged=K > 0))
            _write_csv(out / "metrics.csv", rows)
            for key in ("train_loss", "val_loss", "train_acc", "val_acc", "val_acc_ema", "lr"):
                if key in row:
                    writer.add_scalar(key.replace("_", "/", 1) if key != "lr" else "lr", row[key], epoch + 1)
            writer.flush()
            _save(out, epoch, model, optimizer, scheduler, ema, rows, cfg, info, data_hash)
            if row["val_acc"] > best:
                best = row["val_acc"]
                ckpt.mark_best(out, f"epoch_{epoch + 1:04d}", {"epoch": epoch + 1, "val_acc": best})
        else:
            _gather_rng(info)  # rank 0 collects every process's RNG state for its checkpoint
        distributed.barrier(info)
    bar.close()
    if writer:
        writer.close()

    summary = {}
    if info.is_main:
        summary = _finish(out, cfg, model, ema, rows, scan, val_loader, device, model_name, n_cls, info,
                          time.perf_counter() - t_start, say, lr_steps)
    distributed.barrier(info)
    distributed.cleanup(info)
    return summary


# ----------------------------------------------------------------------------------------------------
# Checkpoints and resume


def _gather_rng(info) -> list[torch.Tensor]:
    """Every process's CPU RNG state (rank 0 gets the list; with one process, a list of one)."""
    state = torch.get_rng_state()
    if not info.enabled:
        return [state]
    import torch.distributed as dist

    states = [None] * info.world_size
    dist.all_gather_object(states, state)
    return states


def _fingerprint(scan) -> str:
    """A hash of the classes and of which file is in which split with which label."""
    import hashlib

    def rel(p: str) -> str:
        return str(Path(p).relative_to(scan.root)) if Path(p).is_absolute() else p

    items = [scan.classes, [(rel(p), y) for p, y in scan.train], [(rel(p), y) for p, y in scan.val]]
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def _save(out: Path, epoch: int, model, optimizer, scheduler, ema, rows, cfg: RunConfig, info, data_hash: str) -> None:
    state = {
        "data_fingerprint": data_hash,
        "epoch": epoch + 1,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng_cpu": _gather_rng(info),
        "history": rows,
        "run_config": cfg.recipe(),
        "world_size": info.world_size,
    }
    if info.device.type == "cuda":
        state["rng_cuda"] = torch.cuda.get_rng_state(info.device)
    if ema is not None:
        state["ema"] = ema.state_dict()
    ckpt.save_checkpoint(out, f"epoch_{epoch + 1:04d}", model, state)


def _restore(out: Path, cfg: RunConfig, model, optimizer, scheduler, ema, info, data_hash: str) -> tuple[int, list[dict]]:
    from safetensors.torch import load_file

    folder = ckpt.resolve_checkpoint(out / "last.json")
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    saved, now = state.get("run_config", {}), cfg.recipe()
    diff = [f"--{k.replace('_', '-')} {saved.get(k)!r} -> {now[k]!r}" for k in now if saved.get(k) != now[k]]
    if diff:
        raise VitlabError(f"--resume {out}: the options differ from the run being resumed ({'; '.join(diff)}); "
                          "resume with the same options, or start a new run in another --out")
    if state.get("data_fingerprint") not in (None, data_hash):
        raise VitlabError(f"--resume {out}: the data differ from the run being resumed (files added, removed or "
                          "moved between classes or splits); resume with the same folder, or start a new run")
    model.load_state_dict(load_file(folder / "model.safetensors", device=str(info.device)))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if ema is not None:
        ema.load_state_dict(state["ema"])
    rng = state["rng_cpu"]
    if len(rng) == info.world_size:
        torch.set_rng_state(rng[info.rank])
    else:
        seed_everything(cfg.seed + 7919 * state["epoch"] + info.rank)
        if info.is_main:
            print(f"note: the run was saved with {len(rng)} process(es) and resumes with {info.world_size}; "
                  "random augmentation continues with a new stream (not bitwise the original)", file=sys.stderr)
    if "rng_cuda" in state and info.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], info.device)
    return int(state["epoch"]), [dict(r) for r in state["history"]]


# ----------------------------------------------------------------------------------------------------
# The end: best checkpoint's confusion matrix, per-class accuracy, curves, diagnostics, summary


def _finish(out, cfg, model, ema, rows, scan, val_loader, device, model_name, n_cls, info, elapsed, say,
            lr_steps) -> dict:
    from safetensors.torch import load_file

    best_ptr = json.loads((out / "best.json").read_text())
    model.load_state_dict(load_file(ckpt.resolve_checkpoint(out / "best.json") / "model.safetensors", device=str(device)))
    ev = evaluate(model, val_loader, device=device, precision=cfg.precision, num_classes=n_cls)
    confusion = ev["confusion"]
    counts = confusion.sum(1).tolist()
    per_class = [c / n if n else None for c, n in zip(confusion.diag().tolist(), counts)]  # None: no val image
    from vitlab.train import report

    files = {
        "metrics": "metrics.csv",
        "tensorboard": "tensorboard/",
        "confusion": report.plot_confusion(confusion, scan.classes, out / "confusion.png",
                                           title=f"{model_name}, best epoch {best_ptr['epoch']}: val acc {ev['val_acc']:.3f}").name,
        "curves": report.plot_curves(rows, out / "curves.png", freeze_epochs=cfg.freeze_epochs, title=model_name,
                                     lr_steps=lr_steps).name,
        "per_class": report.write_per_class(out / "per_class_accuracy.csv", scan.classes, per_class, counts).name,
        "best": "best.json",
        "last": "last.json",
    }
    if ema is not None:
        files["ema"] = _save_weights(out / "ema", ema.module).name + "/"
    findings = diagnostics.diagnose(rows, warmup_epochs=cfg.warmup_epochs, num_classes=n_cls,
                                    stage_start=cfg.freeze_epochs if cfg.freeze_epochs < cfg.epochs else 0)
    early = diagnostics.tiny_from_scratch(len(scan.train), model_name) if not (cfg.pretrained or cfg.checkpoint) else None
    summary = {
        "model": model_name,
        "data": str(scan.root),
        "classes": scan.classes,
        "images": {"train": len(scan.train), "val": len(scan.val), "skipped": len(scan.skipped)},
        "world_size": info.world_size,
        "global_batch": cfg.batch_size * info.world_size * cfg.grad_accum,
        "best": {"epoch": best_ptr["epoch"], "val_acc": ev["val_acc"], "val_loss": ev["val_loss"]},
        "final": {k: v for k, v in rows[-1].items() if k != "time_s"},
        "per_class_accuracy": dict(zip(scan.classes, per_class)),
        "diagnostics": [str(f) for f in ([early] if early else []) + findings],  # `early` was printed at the start
        "time_s": elapsed,
        "train_time_s": sum(r["time_s"] for r in rows),
        "files": files,
        "config": asdict(cfg),
    }
    ckpt.write_json_atomic(out / "summary.json", summary)
    width = max(5, *(len(c) for c in scan.classes))
    lines = [f"best epoch {best_ptr['epoch']}: val acc {ev['val_acc']:.4f} (val loss {ev['val_loss']:.4f})"
             + (f"; EMA val acc (last epoch) {rows[-1]['val_acc_ema']:.4f}" if ema is not None else ""),
             f"  {'class':<{width}}  {'acc':>6}  {'n':>5}"]
    lines += [f"  {c:<{width}}  {'-' if a is None else f'{a:.3f}':>6}  {n:>5}" for c, a, n in zip(scan.classes, per_class, counts)]
    say("\n".join(lines))
    for f in findings:
        say(str(f))
    say(f"wrote {out}/: " + ", ".join(files.values()) + ", summary.json")
    return summary


def _save_weights(folder: Path, model: nn.Module) -> Path:
    """A checkpoint folder (model.safetensors + config.json) without training state, atomically."""
    import os
    import shutil
    import tempfile

    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, tmp / "model.safetensors")
    ckpt.write_json_atomic(tmp / "config.json", ckpt.model_config(model))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def _epoch_line(row: dict, epochs: int, *, staged: bool) -> str:
    ema = f" val_acc_ema {row['val_acc_ema']:.4f}" if "val_acc_ema" in row else ""
    stage = f" [stage {row['stage']}]" if staged else ""
    return (f"epoch {row['epoch']:>3}/{epochs}{stage} lr {row['lr']:.2e} "
            f"train_loss {row['train_loss']:.4f} train_acc {row['train_acc']:.4f} "
            f"val_loss {row['val_loss']:.4f} val_acc {row['val_acc']:.4f}{ema} ({row['time_s']:.1f}s)")


def _printer(info):
    def say(msg: str) -> None:
        if info.is_main:
            tqdm.write(msg, file=sys.stdout)

    return say


__all__ = ["RunConfig", "run", "build_model", "load_data", "set_stage", "AfterStep"]
