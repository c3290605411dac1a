"""A training run on a dataset, as `vitlab train` and `vitlab finetune` start it: your image folder or a
bundled dataset, a model from any source, a Recipe, a run folder; under torchrun on several processes.

    from vitlab.train import RECIPES, TrainJob, run
    run(TrainJob(dataset="fashion-mnist", model="vit_mini", train_size=10_000, recipe=RECIPES["scratch"],
                 out="runs/vit"))
    run(TrainJob(data="my_photos", model="vit_tiny_patch16_224", pretrained="weights.safetensors", img_size=64,
                 recipe=RECIPES["finetune"], out="runs/ft"))

Fine-tuning: the model gets a new zero-initialised head for the folder's
classes (paper Section 3.2), then `fit` trains it with the recipe's stages. Training from scratch is
the same run with a model of random weights and a one-stage recipe; on a bundled dataset such a model
is built for the images as they are (Fashion-MNIST: 28x28, one grey channel), unless `img_size` says
otherwise.

The run folder gets what `fit` writes every epoch (metrics.csv, checkpoints, last.json/best.json),
TensorBoard scalars, and at the end (vitlab.train.report): the best checkpoint's confusion matrix and
per-class accuracy, the curves, the EMA weights, the diagnostics, and summary.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from torch import nn
from tqdm.auto import tqdm

from vitlab.data.datasets import BUNDLED, RunData, bundled, load_data, make_loaders
from vitlab.data.memory import MemoryLoader
from vitlab.errors import VitlabError, check_range
from vitlab.fileio import mark_folder
from vitlab.models.factory import check_source, create_model
from vitlab.models.size import check_fits
from vitlab.models.vit import VisionTransformer
from vitlab.options import DEFAULT_FAST_PATH
from vitlab.runtime import seed_everything
from vitlab.speed.fastpath import FastPath, check_fast_path
from vitlab.train import diagnostics, distributed, report
from vitlab.train.callbacks import EpochPrinter, TensorBoardLogger
from vitlab.train.engine import check_run_folder, fit
from vitlab.train.recipe import RECIPES, Recipe, describe, in_force
from vitlab.weights import checkpoint as ckpt


@dataclass
class TrainJob:
    """What to train on, what to train, how, and where the run goes (the CLI flags, one to one)."""

    # data: an image folder, or a bundled dataset
    data: str | None = None
    dataset: str | None = None
    root: str | None = None  # where Fashion-MNIST's files are (default: searched, see vitlab.data.fashion_mnist)
    train_size: int | None = None  # train on a seeded, nested subset of this many training images
    val_split: float | None = None  # validation fraction of a one-folder layout (seeded, stratified; default 0.2)
    # model: a registered name, pretrained weights of any library, or a vitlab checkpoint
    model: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    img_size: int | None = None
    crop_pct: float | None = (
        None  # eval resize to size / crop_pct, centre crop; None: 1 from random weights, else the weights'
    )
    drop_path: float = 0.0  # stochastic depth of the last block (ViTs)
    recipe: Recipe = field(default_factory=lambda: RECIPES["scratch"])
    # where and how it runs (nothing here changes the numbers)
    out: str = "runs/train"
    resume: bool = False
    force: bool = False  # write a new run into a non-empty folder that holds no vitlab run
    device: str = "auto"
    workers: int | None = None  # data-loading processes (default: 0 on CPU, up to 8 on GPU)
    fast_path: FastPath = DEFAULT_FAST_PATH  # vitlab.speed.fastpath: auto | tuned | compile | eager | off, or a Plan

    def check(self) -> None:
        if (self.data is None) == (self.dataset is None):
            raise VitlabError(
                f"give exactly one of data (an image folder) or dataset ({' | '.join(BUNDLED)})", arg="data"
            )
        info = bundled(self.dataset) if self.dataset is not None else None
        n_train = info.n_train if info is not None else None
        check_range(
            "train_size",
            self.train_size,
            low=1,
            high=n_train,
            integer=True,
            optional=True,
            hint=f" (there are {n_train:,} training images in {self.dataset})" if n_train else "",
        )
        if self.root is not None and self.dataset != "fashion-mnist":
            raise VitlabError(
                f"root {self.root}: only the fashion-mnist dataset is read from files; drop root", arg="root"
            )
        if self.val_split is not None and info is not None and info.own_val:
            raise VitlabError(
                f"val_split {self.val_split:g}: the {self.dataset} dataset has its own validation split; "
                "drop val_split",
                arg="val_split",
            )
        check_source(self.model, self.pretrained, self.checkpoint)
        exported = self.checkpoint is not None and str(self.checkpoint).endswith(".safetensors")
        if self.checkpoint is not None and not exported:
            ckpt.resolve_checkpoint(self.checkpoint)  # a missing checkpoint is found before the data is scanned
        check_range("val_split", self.val_split, low=0, high=1, low_open=True, high_open=True, optional=True)
        check_range("img_size", self.img_size, low=1, integer=True, optional=True)
        check_range("crop_pct", self.crop_pct, low=0, high=1, low_open=True, optional=True)
        check_range("drop_path", self.drop_path, low=0, high=1, high_open=True)
        check_range("workers", self.workers, low=0, integer=True, optional=True)
        check_fast_path(self.fast_path)

    def identity(self, data_fingerprint: str) -> dict:
        """What a resumed run must share with the run it resumes, besides the recipe."""
        return {
            "data": data_fingerprint,
            "dataset": self.dataset,
            "train_size": self.train_size,
            "val_split": self.val_split,
            "model": self.model,
            "pretrained": self.pretrained,
            "checkpoint": self.checkpoint,
            "img_size": self.img_size,
            "crop_pct": self.crop_pct,
            "drop_path": self.drop_path,
        }


def run(job: TrainJob, *, progress: bool | None = None) -> dict:
    """Train as `job` says; returns the summary (also written to out/summary.json)."""
    job.check()
    t_start = time.perf_counter()
    dist = distributed.setup(job.device)
    say = _printer(dist)
    show = (sys.stderr.isatty() if progress is None else progress) and dist.is_main
    out = Path(job.out).expanduser()
    distributed.on_main(lambda: check_run_folder(out, job.resume, job.force), dist)  # rank 0's folder
    recipe = job.recipe

    seed_everything(recipe.seed)
    from_scratch = not (job.pretrained or job.checkpoint)
    info = BUNDLED[job.dataset] if job.dataset is not None else None
    data = None if info is not None else _folder(job, dist, say, show)
    names = list(info.classes) if info is not None else data.scan.classes
    model = _model(job, names, info, from_scratch)
    if info is not None:
        data = load_data(
            dataset=job.dataset,
            root=job.root,
            train_size=job.train_size,
            val_split=job.val_split,
            seed=recipe.seed,
            img_size=model.cfg.img_size,
        )
        say(data.scan.report())
    scan = data.scan
    data_print = _same_data_everywhere(job, scan, dist)
    name = job.model or model.pretrained_cfg.architecture or type(model).__name__
    recipe = _batch_for(recipe, len(scan.train), dist, say)
    job = replace(job, recipe=recipe)
    check_fits(model.cfg, what=name, batch_size=recipe.batch_size, training=True)
    if from_scratch:
        finding = diagnostics.tiny_from_scratch(len(scan.train), name)
        if finding:
            say(str(finding))
    given = recipe
    recipe = given.resolve(img_size=min(model.cfg.img_size), flips=data.flips)  # the auto augmentation fields chosen
    train_loader, val_loader = make_loaders(data, model, recipe, dist=dist, workers=job.workers)
    if isinstance(train_loader, MemoryLoader):
        say(
            f"data in memory as uint8 tensors; augmentation per batch on {dist.device}: "
            f"{train_loader.transform.describe()}"
        )

    say(_describe_run(name, model, len(names), recipe, dist))
    weights = None if from_scratch else ("pretrained" if job.pretrained else "checkpoint")
    own_init = None if isinstance(model, VisionTransformer) else "PyTorch's defaults (the recipe's init is a ViT's)"
    used = in_force(
        given,
        img_size=min(model.cfg.img_size),
        flips=data.flips,
        world_size=dist.world_size,
        steps_per_epoch=math.ceil(len(train_loader) / recipe.grad_accum),
        weights=weights,
        drop_path=job.drop_path,
        own_init=own_init,
    )
    for line in describe(used):
        say(line)
    start = int(ckpt.read_pointer(out / "last.json").get("epoch") or 0) if job.resume and dist.is_main else 0
    callbacks = [EpochPrinter(say, recipe.epochs, staged=recipe.freeze_epochs > 0, unfreeze=recipe.unfreeze)]
    if dist.is_main:
        mark_folder(out, "run")
        callbacks.append(TensorBoardLogger(out, start_epoch=start))
    history = fit(
        model,
        train_loader,
        val_loader,
        recipe,
        dist=dist,
        out=out,
        resume=job.resume,
        identity=job.identity(data_print),
        callbacks=callbacks,
        log=say,
        progress=show,
        desc="epochs",
        fast_path=job.fast_path,
    )

    summary = {}
    if dist.is_main:
        summary = report.finish_run(
            out,
            model=model,
            history=history,
            scan=scan,
            val_loader=val_loader,
            recipe=recipe,
            in_force=used,
            name=name,
            from_scratch=from_scratch,
            world_size=dist.world_size,
            elapsed=time.perf_counter() - t_start,
            settings=_settings(job),
            say=say,
        )
    distributed.barrier(dist)
    distributed.cleanup(dist)
    return summary


def _model(job: TrainJob, names: list[str], info, from_scratch: bool) -> nn.Module:
    """The job's model for these classes: from random weights at the bundled data's size and channels, or from
    weights with a new head; its preprocessing's labels, head and crop set for the run."""
    recipe = job.recipe
    shape = {}
    if info is not None and from_scratch:  # a model for the images as they are: their size, their channels
        shape = {"img_size": job.img_size or info.img_size, "in_chans": info.channels}
    model = create_model(
        job.model,
        pretrained=job.pretrained,
        checkpoint=job.checkpoint,
        num_classes=len(names),
        img_size=shape.get("img_size", job.img_size),
        in_chans=shape.get("in_chans"),
        drop_path=job.drop_path if job.drop_path > 0 else None,
    )
    if not from_scratch:  # pre-trained weights: a new zero-initialised head for these classes (paper Section 3.2)
        model.reset_classifier(len(names))
    elif isinstance(model, VisionTransformer) and (recipe.init, recipe.head_init) != ("trunc_normal", 0.0):
        model.init_weights(recipe.init, head_std=recipe.head_init)  # the recipe's (create_model's is trunc_normal)
    model.pretrained_cfg = model.pretrained_cfg.replace(num_classes=len(names), label_names=tuple(names), head="new")
    # Evaluated (and trained, without augmentation) on the whole image, resized to the model's input, when the
    # model starts from random weights: no weights' own preprocessing to keep, and a centre crop of a small
    # image cuts off what training saw (docs/recipe.md)
    crop_pct = job.crop_pct if job.crop_pct is not None else (1.0 if from_scratch else None)
    if crop_pct is not None:
        model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=crop_pct)
    return model


def _same_data_everywhere(job: TrainJob, scan, dist) -> str:
    """The data's fingerprint, the same on every process (each machine reads its own copy of the data)."""
    data_print = fingerprint(scan)
    prints = distributed.all_gather_object(data_print, dist)  # every machine reads its own copy of the data
    if len(set(prints)) > 1:
        others = [r for r, p in enumerate(prints) if p != prints[0]]
        raise VitlabError(
            f"data {job.data or job.dataset}: process(es) {others} read other images or classes than "
            "rank 0 (another folder at that path on their machine, or a different copy); every machine "
            "needs the same data at the same path",
            arg="data",
        )
    return data_print


def _describe_run(name: str, model: nn.Module, n_classes: int, recipe: Recipe, dist) -> str:
    """The run in one line: the model, the classes, the stages and the global batch."""
    K = recipe.freeze_epochs
    stages = f"{K} head-only, then unfreeze {recipe.unfreeze}" if K else f"unfreeze {recipe.unfreeze}"
    accum = f" x {recipe.grad_accum} accumulation" if recipe.grad_accum > 1 else ""
    return (
        f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters, {n_classes} classes; {recipe.epochs} "
        f"epochs ({stages}), global batch {recipe.batch_size * dist.world_size * recipe.grad_accum} = "
        f"{recipe.batch_size} x {dist.world_size} process(es){accum}, {dist.device}, {recipe.precision}"
    )


def _batch_for(recipe: Recipe, n_train: int, dist, say) -> Recipe:
    """The recipe with its batch no larger than a process's share of the training images: a larger batch
    would only be the whole set padded out in memory (and measured at a size no step has)."""
    share = max(1, math.ceil(n_train / dist.world_size))
    if recipe.batch_size <= share:
        return recipe
    each = f" ({share:,} per process of {dist.world_size})" if dist.world_size > 1 else ""
    say(
        f"note: batch size {recipe.batch_size:,} is more than the {n_train:,} training images{each}; training with "
        f"batch {share:,}, one step per epoch"
    )
    return recipe.replace(batch_size=share)


def _folder(job: TrainJob, dist, say, show: bool) -> RunData:
    data = load_data(
        data=job.data, train_size=job.train_size, val_split=job.val_split, seed=job.recipe.seed, progress=show
    )
    if dist.is_main:
        if data.scan.warning():
            print(data.scan.warning(), file=sys.stderr)
        say(data.scan.report())
    return data


def fingerprint(scan) -> str:
    """A hash of the classes and of which file is in which split with which label; paths are taken
    relative to the folder, so a moved folder still resumes."""

    def rel(p: str) -> str:
        return str(Path(p).relative_to(scan.root)) if Path(p).is_absolute() else p

    items = [scan.classes, [(rel(p), y) for p, y in scan.train], [(rel(p), y) for p, y in scan.val]]
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def _settings(job: TrainJob) -> dict:
    settings = asdict(job)
    settings["recipe"] = job.recipe.to_dict()
    return settings


def _printer(dist):
    def say(msg: str) -> None:
        if dist.is_main:
            tqdm.write(msg, file=sys.stdout)

    return say


__all__ = ["TrainJob", "run", "fingerprint"]
