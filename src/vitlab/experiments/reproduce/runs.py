"""One training run of `vitlab reproduce`: its description (`Run`: data, model, `Recipe`, parent; its hash is
its cache key), training it (`train_run`, which touches no file and so runs on any machine), and the cache of
finished runs, each an ordinary vitlab run folder that `vitlab.create_model(checkpoint=folder)` loads.

Every run trains through `vitlab.train.engine.fit` on data decoded once into uint8 tensors
(`vitlab.data.subsets`, `vitlab.data.memory.MemoryLoader`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load, save
from torch import nn

from vitlab.data.memory import BatchTransform, ImageTensors, MemoryLoader
from vitlab.data.preprocess import eval_resize_crop
from vitlab.data.subsets import ExperimentData, experiment_splits
from vitlab.errors import VitlabError
from vitlab.fileio import write_json
from vitlab.models.factory import create_model
from vitlab.models.vit import VisionTransformer
from vitlab.runtime import num_threads, seed_everything
from vitlab.speed.machine import this_machine
from vitlab.train.engine import evaluate, fit
from vitlab.train.recipe import Recipe
from vitlab.weights.checkpoint import mark_best, resolve_checkpoint, save_checkpoint
from vitlab.weights.plan import resample_position_tables

CACHE_VERSION = 3  # bump when a change to the training code changes what a cached run means
# What every run's recipe starts from: AdamW, a warmup of one epoch then cosine, clipping at 1, the images as they
# are (augmentation off, no crop), and a ViT's weights as its constructor draws them (init_weights is not called).
BASE_RECIPE = Recipe(
    epochs=1,
    batch_size=64,
    warmup_epochs=1.0,
    augment=False,
    hflip=False,
    crop_scale=1.0,
    init="trunc_normal",
    head_init=0,
)


# How a fine-tuning run carries its parent's position table over (`Run.pos_embed`)
POS_EMBED_CARRY = ("interpolate", "reinit")


@dataclass(frozen=True)
class Run:
    """One training run: the images, the model (a registered name and its config overrides), the recipe (seed
    included), and the run whose weights it starts from (`parent`: fine-tuning, with a new head).

    A fine-tuning run at another image size than its parent's (`data.img_size`) starts from the parent's model at
    its own size; `pos_embed` says how the position table comes over (with a parent only): "interpolate", resampled
    in 2-D to the new grid (Section 3.2; at the parent's size, the parent's table itself), or "reinit", a new table
    drawn (truncated normal, std 0.02) while every other weight is loaded."""

    data: ExperimentData
    model: str
    recipe: Recipe
    overrides: tuple = field(default=())  # sorted (key, value) model config overrides; a dict is sorted into one
    parent: Run | None = None
    pos_embed: str = "interpolate"  # one of POS_EMBED_CARRY; in the key only when not the default

    def __post_init__(self) -> None:
        if self.pos_embed not in POS_EMBED_CARRY:
            raise VitlabError(
                f"pos_embed must be one of {', '.join(POS_EMBED_CARRY)}; found {self.pos_embed!r}", arg="pos_embed"
            )
        if self.pos_embed != "interpolate" and self.parent is None:
            raise VitlabError("pos_embed: a run without a parent has no position table to carry over", arg="pos_embed")
        if isinstance(self.overrides, dict):
            frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in self.overrides.items()))
            object.__setattr__(self, "overrides", frozen)

    def to_dict(self) -> dict:
        return {
            "data": asdict(self.data),
            "model": self.model,
            "overrides": dict(self.overrides),
            "recipe": self.recipe.to_dict(),
            "parent": self.parent.to_dict() if self.parent is not None else None,
            # at its default the field is not written, so that every run described before it has its key
            **({"pos_embed": self.pos_embed} if self.pos_embed != "interpolate" else {}),
        }

    @property
    def key(self) -> str:
        blob = json.dumps({"v": CACHE_VERSION, **self.to_dict()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def n_train(self) -> int:
        return self.data.n_train

    @property
    def seed(self) -> int:
        return self.recipe.seed

    @property
    def lr(self) -> float:
        return self.recipe.lr

    @property
    def epochs(self) -> int:
        return self.recipe.epochs

    @property
    def steps(self) -> int:
        """Optimizer steps: epochs x batches per epoch (a run that mixes batches drops the last, short one)."""
        n, b = self.n_train, self.recipe.batch_size
        return self.epochs * (n // b if self.recipe.mixes else -(-n // b))


def build_model(run: Run, num_classes: int) -> nn.Module:
    """The run's model at the data's size and channels (a ViT or the CNN baseline, both through create_model),
    evaluated on the images as they are: no resize or crop (crop_pct 1), normalised (x - 0.5) / 0.5; a ViT
    initialised as the recipe's init and head_init say (("trunc_normal", 0): as its constructor drew it)."""
    model = create_model(
        run.model,
        num_classes=num_classes,
        img_size=run.data.img_size,
        in_chans=run.data.channels,
        **dict(run.overrides),
    )
    model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=1.0)
    rec = run.recipe
    if isinstance(model, VisionTransformer) and (rec.init, rec.head_init) != ("trunc_normal", 0.0):
        model.init_weights(rec.init, head_std=rec.head_init)
    return model


def start_model(run: Run, parent: tuple[int, bytes], num_classes: int) -> nn.Module:
    """The model a fine-tuning run starts from: its parent's, with the parent's weights (`parent`: its number of
    classes and its safetensors bytes), at the run's image size with the position table carried over as
    `run.pos_embed` says, in eval mode (as the parent's run folder loads), and a new zero-initialised head for
    `num_classes` (Section 3.2)."""
    model = build_model(run.parent, parent[0])
    model.load_state_dict(load(parent[1]))
    if run.data.img_size != run.parent.data.img_size or run.pos_embed == "reinit":
        if not isinstance(model, VisionTransformer) or "pos_embed" not in model.state_dict():
            raise VitlabError(
                f"run {run.key}: a new image size or pos_embed {run.pos_embed!r} needs a parent ViT with a learned "
                "1-D position table",
                arg="pos_embed",
            )
        weights, grid = model.state_dict(), model.cfg.grid_size
        data = dataclasses.replace(run.parent.data, img_size=run.data.img_size)
        model = build_model(dataclasses.replace(run.parent, data=data), parent[0])  # (1, 1 + N', D) table
        cfg = model.cfg
        weights = resample_position_tables(weights, grid, cfg.grid_size, num_prefix_tokens=cfg.num_pos_prefix_tokens)
        if run.pos_embed == "reinit":
            weights["pos_embed"] = nn.init.trunc_normal_(torch.empty_like(weights["pos_embed"]), std=0.02)
        model.load_state_dict(weights)
    model.eval()
    model.reset_classifier(num_classes)
    return model


def at_model_size(images: ImageTensors, model: nn.Module) -> ImageTensors:
    """`images` at the model's input size, resized once as the model's eval preprocessing resizes (the model's
    interpolation; no crop, crop_pct 1); as they are where they already have it."""
    size = tuple(model.cfg.img_size)
    if images.size == size:
        return images
    return ImageTensors(eval_resize_crop(model.pretrained_cfg, size)(images.images), images.labels)


def transforms(run: Run, model: nn.Module, source_size: tuple[int, int]) -> tuple[BatchTransform, BatchTransform]:
    """(train, eval) batch transforms of a run: the recipe's augmentation, normalised as the model expects."""
    pcfg, rec = model.pretrained_cfg, run.recipe
    norm = dict(size=tuple(model.cfg.img_size), mean=pcfg.mean, std=pcfg.std, channels=model.cfg.in_chans)
    train = BatchTransform(
        **norm,
        augment=bool(rec.augment),
        source_size=source_size,
        crop_scale=1.0 if rec.crop_scale is None else rec.crop_scale,
        hflip=bool(rec.hflip),
        auto_augment=rec.auto_augment,
        re_prob=rec.reprob,
        interpolation=pcfg.interpolation,
    )
    return train, BatchTransform(**norm)


class RunCache:
    """Finished runs on disk: `<root>/runs/<key>/`, a vitlab run folder (last.json and best.json pointing at
    checkpoints/final/) with the run's result.json, written last.

    A run's record may be kept without its weights (a committed report's cache keeps result.json for every run,
    and the weights only of the runs a later analysis or fine-tuning run loads): such a run counts as finished,
    and asking for its weights is one error naming its folder."""

    def __init__(self, cache_dir: str | Path):
        self.cache_dir = Path(cache_dir)
        self.root = self.cache_dir / "runs"

    def folder(self, run: Run) -> Path:
        return self.root / run.key

    def has(self, run: Run) -> bool:
        return (self.folder(run) / "result.json").exists()

    def result(self, run: Run) -> dict:
        return json.loads((self.folder(run) / "result.json").read_text())

    def has_weights(self, run: Run) -> bool:
        return (self.folder(run) / "checkpoints").is_dir()

    def _checkpoint(self, run: Run) -> Path:
        folder = self.folder(run)
        if self.has(run) and not self.has_weights(run):
            raise VitlabError(
                f"{folder}: this run's record is kept without its weights (result.json only), and they are needed "
                f"now; delete {folder} to train it again"
            )
        return resolve_checkpoint(folder)

    def load_model(self, run: Run) -> nn.Module:
        self._checkpoint(run)  # one message where the weights are not kept
        return create_model(checkpoint=self.folder(run)).eval()

    def weights(self, run: Run) -> tuple[int, bytes]:
        """A finished run's number of classes and weights (the bytes of its model.safetensors): what a run
        that starts from it needs, wherever that one trains."""
        return self.result(run)["num_classes"], (self._checkpoint(run) / "model.safetensors").read_bytes()

    def put(self, run: Run, result: dict, weights: bytes) -> None:
        """Keep a run that `train_run` trained (here or on another machine): its checkpoint, then its result."""
        model = build_model(run, result["num_classes"])
        model.load_state_dict(load(weights))
        metrics = {"epoch": run.epochs, "val_acc": result["val_acc"], "val_loss": result["val_loss"]}
        save_checkpoint(self.folder(run), "final", model, {**metrics, "recipe": run.recipe.to_dict()})
        mark_best(self.folder(run), "final", metrics)  # the one checkpoint: the last is the best
        write_json(self.folder(run) / "result.json", result, indent=1)  # written last: marks the run done


VAL_PER_EPOCH = 100  # the per-epoch curve uses the first 100 validation images; the final number uses all


def train_run(
    run: Run, device: torch.device, parent: tuple[int, bytes] | None = None, fast_path: str = "auto"
) -> tuple[dict, bytes]:
    """Train one run and return its result and its weights (safetensors bytes). `parent`: the number of classes
    and the weights of the run it starts from (`RunCache.weights(run.parent)`), for a fine-tuning run.
    Reads no cache and writes no file: the run depends on its arguments alone (and the dataset's files), so
    any process on any machine trains it the same, and the caller keeps it (`RunCache.put`). `fast_path`:
    fit's (the same numbers to float rounding; the result records the path taken)."""
    if (run.parent is None) != (parent is None):
        raise ValueError(f"run {run.key}: parent weights are needed exactly when the run starts from another run")
    train, val, k = experiment_splits(run.data, run.seed)
    seed_everything(run.seed)  # the model's initialisation depends on the seed too
    model = start_model(run, parent, k) if parent is not None else build_model(run, k)
    train_tf, eval_tf = transforms(run, model, train.size)  # augmentation resizes the training images to the model's
    val = at_model_size(val, model)
    train = train if run.recipe.augment else at_model_size(train, model)
    rec = run.recipe
    loader = MemoryLoader(
        train, train_tf, batch_size=rec.batch_size, shuffle=True, drop_last=rec.mixes, seed=rec.seed, device=device
    )
    curve = MemoryLoader(val.subset(torch.arange(min(len(val), VAL_PER_EPOCH))), eval_tf, batch_size=500, device=device)
    t0, c0 = time.perf_counter(), time.process_time()
    history = fit(model, loader, curve, rec, device=device, fast_path=fast_path)
    train_time, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1, c1 = time.perf_counter(), time.process_time()
    final = evaluate(model, MemoryLoader(val, eval_tf, batch_size=500, device=device), device=device)
    eval_time, eval_cpu = time.perf_counter() - t1, time.process_time() - c1
    result = {
        "key": run.key,
        "run": run.to_dict(),
        "num_classes": k,
        "params": sum(p.numel() for p in model.parameters()),
        "val_acc": final["val_acc"],
        "val_loss": final["val_loss"],
        "train_acc": history.last["train_acc"],
        "train_loss": history.last["train_loss"],
        "train_time_s": train_time,
        "train_cpu_s": train_cpu,
        "eval_time_s": eval_time,  # the final evaluation on all the validation images
        "eval_cpu_s": eval_cpu,
        "device": str(device),
        "machine": machine_name(device),
        "fast_path": history.plan.to_dict(),
        "curve": [{"epoch": r["epoch"], "train_loss": r["train_loss"], "val_acc": r["val_acc"]} for r in history.rows],
    }
    return result, save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})


def machine_name(device: torch.device) -> str:
    """The machine a run trains on, in words: the CPU (its name, kind and vendor) or the GPU."""
    if device.type == "cpu":
        return this_machine().describe()
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def train_task(item: tuple[Run, tuple[int, bytes] | None], device: str, fast_path: str) -> tuple[dict, bytes]:
    """One run, wherever an executor sends it: trained from its description (and its parent's weights) on one
    thread."""
    run, parent = item
    dev = torch.device(device)
    with num_threads(1 if dev.type == "cpu" else None):
        return train_run(run, dev, parent, fast_path=fast_path)


def train_on(
    runs: Sequence[Run], ex, cache: RunCache, fast_path: str, estimates: dict[str, float] | None = None
) -> Iterator[tuple[Run, str]]:
    """Train `runs` on the executor `ex` (vitlab.experiments.executors; each parent already in the cache) and
    keep each in the cache as it comes back; yields (run, the node that trained it). Only this process writes
    the cache, so the executor's machines need no shared disk, and a run is kept once whatever node trained it.
    `estimates`: the seconds the caller priced each run at, by key, kept in its result as `estimate_s` (beside the
    time it took), so that an estimate can be checked against the runs it priced."""
    items = [(run, cache.weights(run.parent) if run.parent is not None else None) for run in runs]
    for i, (result, weights), node in ex.map(partial(train_task, device=str(ex.device), fast_path=fast_path), items):
        if estimates is not None and runs[i].key in estimates:
            result = {**result, "estimate_s": estimates[runs[i].key]}
        cache.put(runs[i], result, weights)
        yield runs[i], node


def machine_of(record: dict) -> str:
    """The machine that trained a run, from its record; where the record predates naming it, what its fast path's
    source says of the CPU ("rules (amx, intel): a small model")."""
    if record.get("machine"):
        return record["machine"]
    source = record["fast_path"]["source"]
    if source.startswith("rules (") and ")" in source:
        return f"a CPU of kind {source[len('rules (') : source.index(')')]} (its fast path's source)"
    return f"{record['device']} (not recorded)"


def all_runs(runs: Sequence[Run]) -> list[Run]:
    """The runs and their parents in execution order, parents first, each once."""
    seen, out = set(), []

    def add(r: Run) -> None:
        if r.parent is not None:
            add(r.parent)
        if r.key not in seen:
            seen.add(r.key)
            out.append(r)

    for r in runs:
        add(r)
    return out


def inference_ms(model: nn.Module, x: torch.Tensor, device: torch.device) -> float:
    """Milliseconds per image of the model's forward pass on the batch `x` (fast attention path), on
    `device`: the median of 5 timed passes after one warm-up."""
    model, x = model.to(device).eval(), x.to(device)
    times = []
    with torch.no_grad():
        for _ in range(6):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            model(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[1:]) / len(x)
