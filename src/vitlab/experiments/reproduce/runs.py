"""One training run of `vitlab reproduce`: its description (`RunSpec`, whose hash is its cache key), the
dataset and model it describes, the on-disk cache of finished runs, and training one run (`train_run`,
which touches no file and so runs on any machine; `execute_run`, which reads and writes the cache around
it), and the FLOPs count and inference timing of the patch-size claim.

Every run trains through `vitlab.train.engine.fit` on data decoded once into uint8 tensors
(`vitlab.data.memory.MemoryLoader`): Fashion-MNIST (a seeded, nested subset of the training split; the
test split, or its first images, for validation), the digits, dataset X."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitlab.data.digits import load_digits
from vitlab.data.fashion_mnist import load_fashion_mnist, nested_subset
from vitlab.data.memory import BatchTransform, ImageTensors, MemoryLoader
from vitlab.data.split import stratified_split
from vitlab.data.synthetic import dataset_x_splits
from vitlab.errors import VitlabError
from vitlab.fileio import write_bytes, write_json
from vitlab.models.factory import create_model
from vitlab.models.vit import VisionTransformer
from vitlab.runtime import num_threads, seed_everything
from vitlab.train.engine import Callback, evaluate, fit
from vitlab.train.recipe import Recipe

CACHE_VERSION = 2  # bump when a change to the training code changes what a cached run means


@dataclass(frozen=True)
class RunSpec:
    """Data, model, recipe and seed of one training run. `init` is the run whose weights it starts
    from (fine-tuning)."""

    data: tuple  # sorted (key, value) pairs: name, n_train, n_val, img_size, channels
    model: str
    overrides: tuple  # sorted (key, value) model config overrides
    epochs: int
    lr: float
    aug: tuple = ()  # sorted (key, value) augmentation fields of the Recipe; () = none
    batch_size: int = 64
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    seed: int = 0
    init: RunSpec | None = None
    weight_init: str = (
        "default"  # a ViT's initial weights: "default" (the constructor's) or "release" (init_weights("jax"))
    )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["data"], d["overrides"] = dict(self.data), dict(self.overrides)
        d["init"] = self.init.to_dict() if self.init is not None else None
        if self.weight_init == "default":  # the key of a run from before the field is unchanged
            del d["weight_init"]
        return d

    @property
    def key(self) -> str:
        blob = json.dumps({"v": CACHE_VERSION, **self.to_dict()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def n_train(self) -> int:
        return int(dict(self.data)["n_train"])

    @property
    def steps(self) -> int:
        """Optimizer steps: epochs x batches per epoch (a run that mixes batches drops the last, short one)."""
        aug = dict(self.aug)
        per_epoch = (
            self.n_train // self.batch_size
            if aug.get("mixup") or aug.get("cutmix")
            else -(-self.n_train // self.batch_size)
        )
        return self.epochs * per_epoch


def run_spec(data: dict, model: str, *, overrides: dict | None = None, aug: dict | None = None, **kwargs) -> RunSpec:
    def freeze(d: dict) -> tuple:
        return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))

    return RunSpec(data=freeze(data), model=model, overrides=freeze(overrides or {}), aug=freeze(aug or {}), **kwargs)


@lru_cache(maxsize=2)
def _fashion(train: bool) -> ImageTensors:
    return ImageTensors(*load_fashion_mnist(train=train))


HELD_OUT = 10_000  # training images the recipe search validates on (`split: "search"`); never the test images
HELD_OUT_SEED = 28  # the one permutation of the 60,000 training images that splits them
DIGITS_HELD_OUT = (
    400  # of the digits a run does not train on, those a claim chooses its lr and budget on (`split: "held_out"`)
)


def search_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe search's split of the 60,000 Fashion-MNIST training images: (the 50,000 it trains on,
    the 10,000 it validates on), index tensors of one fixed permutation. The 10,000 test images, which
    decide the verdicts, are in neither."""
    perm = torch.randperm(60_000, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    return perm[: 60_000 - HELD_OUT], perm[60_000 - HELD_OUT :]


@lru_cache(maxsize=6)
def dataset(data: tuple, seed: int) -> tuple[ImageTensors, ImageTensors, int]:
    """(train, val, num_classes) for a run's data description and seed: uint8 images (N, C, H, W).
    Fashion-MNIST's `split`: "test" (the claims: trained on the training images, validated on the test
    images) or "search" (the recipe search: trained on 50,000 training images, validated on the other 10,000). The
    digits' `split`: "test" (validated on the digits not trained on, but for DIGITS_HELD_OUT of them, drawn per seed)
    or "held_out" (validated on those)."""
    d = dict(data)
    name, n_train, n_val, channels = d["name"], int(d["n_train"]), int(d["n_val"]), int(d.get("channels", 3))
    if name == "fashion-mnist" and d.get("split", "test") == "search":
        pool, held_out = search_split()
        train = _fashion(True).subset(pool[nested_subset(len(pool), n_train, seed=seed)])
        return train, _fashion(True).subset(held_out[:n_val]), 10
    if name == "fashion-mnist":  # the first n_train of one permutation seeded by `seed`: nested training sets
        train = _fashion(True).subset(nested_subset(60_000, n_train, seed=seed))
        return train, _fashion(False).subset(torch.arange(n_val)), 10
    if name == "x":
        (xt, yt), (xv, yv) = dataset_x_splits(n_train, n_val, seed=seed, normalize=False)
        return ImageTensors.from_float(xt, yt), ImageTensors.from_float(xv, yv), 2
    if name == "digits":  # `split`: "test" (the claim's verdict) or "held_out" (the digits it chooses on)
        x, y = load_digits(int(d["img_size"]), channels=channels, normalize=False)
        train, rest = stratified_split(y, 1 - n_train / len(y), seed=seed)
        rest = rest[torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))]
        val = (rest[:DIGITS_HELD_OUT] if d.get("split", "test") == "held_out" else rest[DIGITS_HELD_OUT:]).sort().values
        return ImageTensors.from_float(x[train], y[train]), ImageTensors.from_float(x[val][:n_val], y[val][:n_val]), 10
    raise VitlabError(f"unknown dataset {name!r} in an experiment's plan")


def build_model(spec: RunSpec, num_classes: int) -> nn.Module:
    """The spec's model at the data's size and channels (a ViT or the CNN baseline, both through create_model),
    evaluated on the images as they are: no resize or crop (crop_pct 1), normalised (x - 0.5) / 0.5; a ViT's
    weights initialised as `spec.weight_init` says."""
    d = dict(spec.data)
    model = create_model(
        spec.model,
        num_classes=num_classes,
        img_size=int(d["img_size"]),
        in_chans=int(d.get("channels", 3)),
        **dict(spec.overrides),
    )
    model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=1.0)
    if spec.weight_init == "release":  # the original release's (VisionTransformer.init_weights' "jax")
        model.init_weights("jax")
    elif spec.weight_init != "default":
        raise VitlabError(f"weight_init must be default or release; found {spec.weight_init!r}")
    return model


def transforms(spec: RunSpec, model: nn.Module, source_size: tuple[int, int]) -> tuple[BatchTransform, BatchTransform]:
    """(train, eval) batch transforms of a run: the spec's augmentation, normalised as the model expects."""
    pcfg, aug = model.pretrained_cfg, dict(spec.aug)
    norm = dict(size=tuple(model.cfg.img_size), mean=pcfg.mean, std=pcfg.std, channels=model.cfg.in_chans)
    train = BatchTransform(
        **norm,
        augment=bool(aug),
        source_size=source_size,
        crop_scale=aug.get("crop_scale", 1.0),
        hflip=aug.get("hflip", False),
        auto_augment=aug.get("auto_augment", "none"),
        re_prob=aug.get("reprob", 0.0),
        interpolation=pcfg.interpolation,
    )
    return train, BatchTransform(**norm)


def recipe(spec: RunSpec) -> Recipe:
    """AdamW, warmup + cosine, clipping at 1; and the batch mixing of the spec's augmentation (fit applies it)."""
    aug = dict(spec.aug)
    return Recipe(
        epochs=spec.epochs,
        batch_size=spec.batch_size,
        lr=spec.lr,
        weight_decay=spec.weight_decay,
        warmup_epochs=spec.warmup_epochs,
        seed=spec.seed,
        augment=bool(aug),
        mixup=aug.get("mixup", 0.0),
        cutmix=aug.get("cutmix", 0.0),
    )


class RunCache:
    """Finished runs on disk: `<root>/runs/<key>/result.json` and `model.safetensors`."""

    def __init__(self, cache_dir: str | Path):
        self.cache_dir = Path(cache_dir)
        self.root = self.cache_dir / "runs"

    def folder(self, spec: RunSpec) -> Path:
        return self.root / spec.key

    def has(self, spec: RunSpec) -> bool:
        return (self.folder(spec) / "result.json").exists()

    def result(self, spec: RunSpec) -> dict:
        return json.loads((self.folder(spec) / "result.json").read_text())

    def load_model(self, spec: RunSpec) -> nn.Module:
        result = self.result(spec)
        model = build_model(spec, result["num_classes"])
        model.load_state_dict(load_file(self.folder(spec) / "model.safetensors"))
        return model.eval()

    def weights(self, spec: RunSpec) -> tuple[int, bytes]:
        """A finished run's number of classes and weights (the bytes of its model.safetensors): what a run
        that starts from it needs, wherever that one trains."""
        return self.result(spec)["num_classes"], (self.folder(spec) / "model.safetensors").read_bytes()

    def put(self, spec: RunSpec, result: dict, weights: bytes) -> None:
        """Keep a run that `train_run` trained (here or on another machine)."""
        folder = self.folder(spec)
        write_bytes(folder / "model.safetensors", weights)
        write_json(folder / "result.json", result, indent=1)  # written last: marks the run done


VAL_PER_EPOCH = 100  # the per-epoch curve uses the first 100 validation images; the final number uses all


class _OnEpoch(Callback):
    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def on_epoch_end(self, row: dict) -> None:
        self.fn()


def execute_run(
    spec: RunSpec,
    cache: RunCache,
    device: torch.device,
    on_epoch: Callable[[], None] | None = None,
    fast_path: str = "auto",
) -> dict:
    """Train one run (or read it from the cache; its parent first, if that is not there either), keep it in the
    cache and return its result."""
    if cache.has(spec):
        return cache.result(spec)
    if spec.init is not None and not cache.has(spec.init):
        execute_run(spec.init, cache, device, fast_path=fast_path)
    init = cache.weights(spec.init) if spec.init is not None else None
    result, weights = train_run(spec, device, init, on_epoch=on_epoch, fast_path=fast_path)
    cache.put(spec, result, weights)
    return result


def train_run(
    spec: RunSpec,
    device: torch.device,
    init: tuple[int, bytes] | None = None,
    on_epoch: Callable[[], None] | None = None,
    fast_path: str = "auto",
) -> tuple[dict, bytes]:
    """Train one run and return its result and its weights (safetensors bytes). `init`: the number of classes
    and the weights of the run it starts from (`RunCache.weights(spec.init)`), for a fine-tuning run.
    Reads no cache and writes no file: the run depends on its arguments alone (and the dataset's files), so
    any process on any machine trains it the same, and the caller keeps it (`RunCache.put`). `fast_path`:
    fit's (the same numbers to float rounding; the result records the path taken)."""
    if (spec.init is None) != (init is None):
        raise ValueError(f"run {spec.key}: init weights are needed exactly when the run starts from another run")
    train, val, k = dataset(spec.data, spec.seed)
    seed_everything(spec.seed)  # the model's initialisation depends on the seed too
    if init is not None:
        model = build_model(spec.init, init[0])
        model.load_state_dict(load(init[1]))
        model.eval()  # as RunCache.load_model gives it
        model.reset_classifier(k)  # Section 3.2: a new zero-initialised head for the new classes
    else:
        model = build_model(spec, k)
    train_tf, eval_tf = transforms(spec, model, train.size)
    rec = recipe(spec)
    loader = MemoryLoader(
        train, train_tf, batch_size=spec.batch_size, shuffle=True, drop_last=rec.mixes, seed=spec.seed, device=device
    )
    curve = MemoryLoader(val.subset(torch.arange(min(len(val), VAL_PER_EPOCH))), eval_tf, batch_size=500, device=device)
    t0, c0 = time.perf_counter(), time.process_time()
    history = fit(
        model,
        loader,
        curve,
        rec,
        device=device,
        callbacks=[_OnEpoch(on_epoch)] if on_epoch else [],
        fast_path=fast_path,
    )
    train_time, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    final = evaluate(model, MemoryLoader(val, eval_tf, batch_size=500, device=device), device=device)
    result = {
        "key": spec.key,
        "spec": spec.to_dict(),
        "num_classes": k,
        "params": sum(p.numel() for p in model.parameters()),
        "val_acc": final["val_acc"],
        "val_loss": final["val_loss"],
        "train_acc": history.last["train_acc"],
        "train_loss": history.last["train_loss"],
        "train_time_s": train_time,
        "train_cpu_s": train_cpu,
        "device": str(device),
        "fast_path": history.plan.to_dict(),
        "curve": [{"epoch": r["epoch"], "train_loss": r["train_loss"], "val_acc": r["val_acc"]} for r in history.rows],
    }
    return result, save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()})


def train_task(item: tuple[RunSpec, tuple[int, bytes] | None], device: str, fast_path: str) -> tuple[dict, bytes]:
    """One run, wherever an executor sends it: trained from its spec (and its parent's weights) on one thread."""
    spec, init = item
    dev = torch.device(device)
    with num_threads(1 if dev.type == "cpu" else None):
        return train_run(spec, dev, init, fast_path=fast_path)


def train_on(specs: Sequence[RunSpec], ex, cache: RunCache, fast_path: str) -> Iterator[tuple[RunSpec, str]]:
    """Train `specs` on the executor `ex` (vitlab.experiments.executors; each parent already in the cache) and
    keep each in the cache as it comes back; yields (spec, the node that trained it). Only this process writes
    the cache, so the executor's machines need no shared disk, and a run is kept once whatever node trained it."""
    items = [(spec, cache.weights(spec.init) if spec.init is not None else None) for spec in specs]
    for i, (result, weights), node in ex.map(partial(train_task, device=str(ex.device), fast_path=fast_path), items):
        cache.put(specs[i], result, weights)
        yield specs[i], node


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass (2 per multiply-add), attention matmuls included: counted on the
    explicit attention path, since FLOP counters (torch's FlopCounterMode among them) do not see inside
    the fused attention kernels."""
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        if isinstance(model, VisionTransformer):
            model(x, return_attention=True)
        else:
            model(x)
    return int(counter.get_total_flops())


def inference_ms(model: nn.Module, x: torch.Tensor, device: torch.device) -> float:
    """Milliseconds per image of the model's forward pass on the batch `x` (fast attention path), on
    `device`: the median of 5 timed passes after one warm-up."""
    model = model.to(device).eval()
    x = x.to(device)
    times = []
    with torch.no_grad():
        model(x)
        for _ in range(5):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            model(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times) / len(x)
