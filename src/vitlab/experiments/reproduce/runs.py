"""One training run of `vitlab reproduce`: its description (`RunSpec`, whose hash is its cache key), the
dataset and model it describes, the on-disk cache of finished runs, and training one run (`execute_run`,
with a FLOPs count and an inference timing for the patch-size claim)."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitlab.data.digits import load_digits
from vitlab.data.split import stratified_split
from vitlab.data.shapes import class_names, make_shapes
from vitlab.data.synthetic import dataset_x_splits
from vitlab.errors import VitlabError
from vitlab.fileio import atomic_write, write_json
from vitlab.runtime import seed_everything
from vitlab.models.factory import create_model
from vitlab.models.registry import get_variant
from vitlab.models.vit import VisionTransformer
from vitlab.train.engine import Callback, TensorLoader, evaluate, fit
from vitlab.train.recipe import Recipe


CACHE_VERSION = 1  # bump when a change to the training code changes what a cached run means


@dataclass(frozen=True)
class RunSpec:
    """Data, model, recipe and seed of one training run. `init` is the run whose weights it starts
    from (fine-tuning); `measure` asks for FLOPs and timing after training (patch-size claim)."""

    data: tuple  # sorted (key, value) pairs: name, n_train, n_val, img_size, ...
    model: str
    overrides: tuple  # sorted (key, value) ViTConfig overrides
    epochs: int
    lr: float
    batch_size: int = 64
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    seed: int = 0
    init: "RunSpec | None" = None
    measure: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["data"], d["overrides"] = dict(self.data), dict(self.overrides)
        d["init"] = self.init.to_dict() if self.init is not None else None
        return d

    @property
    def key(self) -> str:
        blob = json.dumps({"v": CACHE_VERSION, **self.to_dict()}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def n_train(self) -> int:
        return int(dict(self.data)["n_train"])


def run_spec(data: dict, model: str, *, overrides: dict | None = None, **kwargs) -> RunSpec:
    def freeze(d: dict) -> tuple:
        return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))

    return RunSpec(data=freeze(data), model=model, overrides=freeze(overrides or {}), **kwargs)


@lru_cache(maxsize=6)
def _dataset(data: tuple, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(x_train, y_train, x_val, y_val, num_classes) for a run's data description and seed."""
    d = dict(data)
    name, n_train, n_val = d["name"], int(d["n_train"]), int(d["n_val"])
    if name == "x":
        (xt, yt), (xv, yv) = dataset_x_splits(n_train, n_val, seed=seed)
        return xt, yt, xv, yv, 2
    if name in ("shape", "arrangement", "position"):
        size, kw = int(d["img_size"]), ({"scale": tuple(d["scale"])} if "scale" in d else {})
        xt, yt = make_shapes(n_train, seed=seed, task=name, img_size=size, **kw)
        xv, yv = make_shapes(n_val, seed=seed, task=name, img_size=size, split="val", **kw)
        return xt, yt, xv, yv, len(class_names(name))
    if name == "digits":
        x, y = load_digits(int(d["img_size"]))
        train, val = stratified_split(y, 1 - n_train / len(y), seed=seed)
        return x[train], y[train], x[val][:n_val], y[val][:n_val], 10
    raise VitlabError(f"unknown dataset {name!r} in an experiment's plan")


def build_model(spec: RunSpec, num_classes: int) -> nn.Module:
    img = int(dict(spec.data)["img_size"])
    if not get_variant(spec.model).is_vit:
        return create_model(spec.model, num_classes=num_classes)
    return create_model(spec.model, num_classes=num_classes, img_size=img, **dict(spec.overrides))


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

    def save(self, spec: RunSpec, result: dict, model: nn.Module) -> None:
        folder = self.folder(spec)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        atomic_write(folder / "model.safetensors", lambda tmp: save_file(state, str(tmp)))
        write_json(folder / "result.json", result, indent=1)  # written last: marks the run done


VAL_PER_EPOCH = 500  # the per-epoch curve uses the first 500 validation images; the final number uses all


class _OnEpoch(Callback):
    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def on_epoch_end(self, row: dict) -> None:
        self.fn()


def execute_run(spec: RunSpec, cache: RunCache, device: torch.device, on_epoch: Callable[[], None] | None = None,
                fast_path: str = "auto") -> dict:
    """Train one run (or read it from the cache) and return its result. `fast_path`: fit's (the same
    numbers to float rounding; the result records the path taken)."""
    if cache.has(spec):
        return cache.result(spec)
    if spec.init is not None and not cache.has(spec.init):
        execute_run(spec.init, cache, device, fast_path=fast_path)
    xt, yt, xv, yv, k = _dataset(spec.data, spec.seed)
    seed_everything(spec.seed)  # the model's initialisation depends on the seed too
    if spec.init is not None:
        model = cache.load_model(spec.init)
        model.reset_classifier(k)  # Section 3.2: a new zero-initialised head for the new classes
    else:
        model = build_model(spec, k)
    recipe = Recipe(epochs=spec.epochs, batch_size=spec.batch_size, lr=spec.lr, weight_decay=spec.weight_decay,
                    warmup_epochs=spec.warmup_epochs, seed=spec.seed)  # AdamW, warmup + cosine, clipping at 1
    t0 = time.perf_counter()
    history = fit(model, TensorLoader(xt, yt, batch_size=spec.batch_size, shuffle=True, seed=spec.seed),
                  TensorLoader(xv[:VAL_PER_EPOCH], yv[:VAL_PER_EPOCH], batch_size=500), recipe, device=device,
                  callbacks=[_OnEpoch(on_epoch)] if on_epoch else [], fast_path=fast_path)
    train_time = time.perf_counter() - t0
    final = evaluate(model, TensorLoader(xv, yv, batch_size=500), device=device)
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
        "device": str(device),
        "fast_path": history.fast_path,
        "curve": [{"epoch": r["epoch"], "train_loss": r["train_loss"], "val_acc": r["val_acc"]} for r in history.rows],
    }
    if spec.measure:
        result.update(_measure(model, xv[:64].to(device), device))
    cache.save(spec, result, model)
    return result


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass (2 per multiply-add), attention matmuls included: counted on the
    explicit attention path, since counters miss fused SDPA kernels (paper.md, user issue 8)."""
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        if isinstance(model, VisionTransformer):
            model(x, return_attention=True)
        else:
            model(x)
    return int(counter.get_total_flops())


def _measure(model: nn.Module, x: torch.Tensor, device: torch.device) -> dict:
    flops = forward_flops(model, x[:1])
    model.eval()
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
    seq = model.cfg.num_patches + model.cfg.num_prefix_tokens if isinstance(model, VisionTransformer) else None
    return {"flops": flops, "infer_ms_per_image": 1000 * statistics.median(times) / len(x), "seq_len": seq}
