"""The page's models: where each comes from, said as the command line says it, and the loaded copies.

A `ModelSource` is the flags of `vitlab predict` (`--model`, `--pretrained` | `--checkpoint`,
`--img-size`) as data; its `label` is those flags written out, which is what the page lists. The
`ModelStore` holds one copy of each loaded model, shared by every request and every browser tab,
built through `vitlab.create_model`. A source that fails to load raises a VitlabError and changes
nothing: the models already loaded stay loaded. At most `capacity` models are kept, and at most
`memory_limit` bytes of them (each counted as its fp32 weights twice: the model as built and the copy
readied for the top-k; estimated from its configuration or its file before it is loaded, so a model
that cannot fit is refused without being read); the one used longest ago is dropped first (and loaded
again if it is asked for again). What the page's load box may name is `loadable` (`vitlab serve
--page-load`): a page open to other machines can keep visitors to the models it lists.

A loaded model answers at once, as built; in the background a copy of it is readied for the top-k
(`vitlab.inference.engine.serving_engine`: the engine the fixed rules give this machine for one image at a
time, ONNX Runtime or PyTorch on the rules' plan, compiled with `--fast-path compile`), and takes over the
top-k when it is ready. The attention
maps, Figure 7 and the token norms always use the model as built (they read its attention).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import shlex
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from vitlab.data.preprocess import describe
from vitlab.errors import VitlabError, check_range
from vitlab.inference.engine import check_engine, serving_engine
from vitlab.models.factory import check_source, create_model
from vitlab.models.registry import get_config
from vitlab.models.size import BYTES_FP32, format_bytes, parameters
from vitlab.models.vit import VisionTransformer, count_parameters
from vitlab.options import DEFAULT_ENGINE, DEFAULT_FAST_PATH, PAGE_KINDS, check_precision
from vitlab.runtime import machine_memory, resolve_device
from vitlab.speed.fastpath import FastPath, check_fast_path
from vitlab.weights import checkpoint as ckpt
from vitlab.weights.formats import is_hub_id


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a registered name, weights of any library, or a vitlab checkpoint."""

    model: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    img_size: int | None = None

    def __post_init__(self) -> None:
        check_source(self.model, self.pretrained, self.checkpoint)
        check_range("img_size", self.img_size, low=1, integer=True, optional=True)

    @classmethod
    def of(cls, kind: str, value: str, *, img_size: int | None = None) -> ModelSource:
        """The source that the flag `--<kind> <value>` names (kind: checkpoint, pretrained or model)."""
        value = (value or "").strip()
        if kind not in PAGE_KINDS:
            raise VitlabError(f"kind must be one of {', '.join(PAGE_KINDS)}; found {kind!r}", arg="kind")
        if not value:
            raise VitlabError(
                f"--{kind} needs a value: "
                + {
                    "checkpoint": "a run folder, a last.json/best.json, or a checkpoint folder",
                    "pretrained": "a weights file or folder, or a hub id",
                    "model": "a model name that `vitlab info` lists",
                }[kind]
            )
        return cls(**{kind: value}, img_size=img_size)

    @property
    def label(self) -> str:
        """The flags, as a user would type them: `--checkpoint runs/demo/pos_learned --img-size 64`."""
        parts = []
        for flag in ("model", "pretrained", "checkpoint", "img_size"):
            value = getattr(self, flag)
            if value is not None:
                parts += [f"--{flag.replace('_', '-')}", shlex.quote(str(value))]
        return " ".join(parts)

    @property
    def kind(self) -> str:
        """The flag that says where the weights come from: checkpoint, pretrained, or model (a name alone)."""
        return "checkpoint" if self.checkpoint else "pretrained" if self.pretrained else "model"

    def create(self) -> nn.Module:
        """A new copy of the model, through vitlab.create_model with these arguments."""
        return create_model(self.model, pretrained=self.pretrained, checkpoint=self.checkpoint, img_size=self.img_size)

    def weights_estimate(self) -> int | None:
        """Bytes of the model's fp32 weights, known before loading it: from the registry's configuration for a
        name, from the tensor shapes in a .safetensors header (or the file's size) for weights on disk; None
        when that cannot be known without reading it (a hub id, an image size that resamples a file)."""
        try:
            if self.kind == "model":
                return parameters(get_config(self.model, img_size=self.img_size)) * BYTES_FP32
            if self.img_size is not None:
                return None
            if self.kind == "checkpoint":
                path = Path(self.checkpoint).expanduser()
                files = (
                    [path] if path.suffix == ".safetensors" else [ckpt.resolve_checkpoint(path) / "model.safetensors"]
                )
            elif is_hub_id(self.pretrained):
                return None
            else:
                path = Path(self.pretrained).expanduser()
                files = (sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))) if path.is_dir() else [path]
            return sum(_file_weights(f) for f in files) or None
        except (VitlabError, OSError, SafetensorError):
            return None  # the load itself says what is wrong with the source


@dataclass
class LoadedModel:
    """A model in memory, in eval mode on its device, and what the page says about it."""

    source: ModelSource
    model: nn.Module
    device: torch.device
    precision: str
    notes: list[str] = field(default_factory=list)  # load warnings: a new head, dropped parts
    fast_path: FastPath = DEFAULT_FAST_PATH
    engine: str = DEFAULT_ENGINE  # of the top-k (`vitlab.inference.engine`); the attention maps run on PyTorch
    served: Callable | None = None  # what computes the top-k once it is ready (`serving_engine`)
    path: str = "the model as built (a faster copy is being readied)"  # the top-k's path, in words
    ready: threading.Event = field(default_factory=threading.Event)

    def warm_up(self) -> None:
        """Ready the top-k's copy (`serving_engine`); the page keeps answering with the model as built until
        then, and for good if readying fails (the reason is shown as its path)."""
        try:
            self.served, self.path = serving_engine(
                self.model, engine=self.engine, precision=self.precision, device=self.device, fast=self.fast_path
            )
        except Exception as e:  # a kernel this machine lacks: the model as built still answers
            self.path = f"the model as built (readying a faster copy failed: {type(e).__name__}: {e})"
        finally:
            self.ready.set()

    def for_topk(self) -> Callable:
        """What computes the top-k now: the readied copy, or the model as built until it is ready."""
        return self.served if self.served is not None else self.model

    @property
    def is_vit(self) -> bool:
        return isinstance(self.model, VisionTransformer)

    def describe(self) -> str:
        """Markdown: what the model is, where its weights come from, how images are preprocessed."""
        pcfg = self.model.pretrained_cfg
        cfg = self.model.cfg
        if self.is_vit:
            shape = (
                f"ViT, {cfg.depth} layers x {cfg.heads} heads, D={cfg.dim}, patch {cfg.patch_size}, "
                f"{cfg.grid_size[0]}x{cfg.grid_size[1]} patches"
            )
        else:
            shape = "CNN baseline (no attention maps)"
        lines = [
            f"**{pcfg.architecture or type(self.model).__name__}**: {shape}, {count_parameters(self.model) / 1e6:.2f}M "
            f"parameters, {cfg.num_classes} classes; on {self.device}, {self.precision}",
            f"weights: `{pcfg.source}` ({pcfg.format} layout)",
            f"preprocessing: {describe(pcfg)}",
            f"top-k path: {self.path}",
        ]
        lines += [f"warning: {n}" for n in self.notes]
        return "  \n".join(lines)


def _file_weights(path: Path) -> int:
    """fp32 bytes of the tensors in a weights file: the shapes of a .safetensors header, else the file's size."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()) * BYTES_FP32
    return path.stat().st_size


def _give_back_memory() -> None:
    """After a model is dropped: collect it, and ask the C allocator to return the freed pages to the system
    (glibc keeps them otherwise, and the process stays as large as its largest model)."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)


def default_memory_limit() -> int:
    """A quarter of the machine's memory: the page's models never take the machine from its other work."""
    return machine_memory() // 4


class ModelStore:
    """The loaded models, one copy each, keyed by their source's label; safe to use from many threads."""

    def __init__(
        self,
        *,
        device: str | torch.device = "auto",
        precision: str = "fp32",
        capacity: int = 3,
        fast_path: FastPath = DEFAULT_FAST_PATH,
        engine: str = DEFAULT_ENGINE,
        memory_limit: int | None = None,
        loadable: tuple[str, ...] = PAGE_KINDS,
    ):
        check_range("capacity", capacity, low=1, integer=True)
        check_range("memory_limit", memory_limit, low=1, integer=True, optional=True)
        unknown = [k for k in loadable if k not in PAGE_KINDS]
        if unknown:
            raise VitlabError(
                f"loadable must name kinds among {', '.join(PAGE_KINDS)}; found {', '.join(map(str, unknown))}",
                arg="loadable",
            )
        self.device = resolve_device(device)
        self.precision = check_precision(precision)
        self.fast_path = check_fast_path(fast_path)
        self.engine = check_engine(engine)
        self.capacity = capacity
        self.memory_limit = memory_limit or default_memory_limit()
        self.loadable = tuple(loadable)
        self._sources: dict[str, ModelSource] = {}  # every source the page has listed, loaded or not
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def request(self, kind: str, value: str) -> LoadedModel:
        """The page's load box: `--<kind> <value>`, if this page lets visitors load that kind of source."""
        if kind not in self.loadable:
            allowed = ", ".join(f"--{k}" for k in self.loadable) or "no other models"
            raise VitlabError(
                f"this page does not load models given by --{kind} (it was started with "
                f"--page-load {','.join(self.loadable) or 'none'}: {allowed}); choose one from the list"
            )
        return self.load(ModelSource.of(kind, value))

    def memory_used(self) -> int:
        return sum(self._cost(m.model) for m in self._loaded.values())

    @staticmethod
    def _cost(model: nn.Module) -> int:
        """A loaded model's memory: its fp32 weights, twice (the model as built, the copy readied for the top-k)."""
        return 2 * sum(p.numel() for p in model.parameters()) * BYTES_FP32

    def _make_room(self, key: str, need: int) -> None:
        """Drop the models used longest ago until `need` more bytes fit the limit; refuse what never fits."""
        if need > self.memory_limit:
            raise VitlabError(
                f"{key} needs about {format_bytes(need)} (its weights, and the copy readied for the "
                f"top-k), more than the {format_bytes(self.memory_limit)} this page keeps for models "
                "(vitlab serve --max-model-memory GB); choose a smaller model"
            )
        dropped = False
        while self._loaded and self.memory_used() + need > self.memory_limit:
            self._loaded.popitem(last=False)
            dropped = True
        if dropped:
            _give_back_memory()

    def add(self, source: ModelSource) -> str:
        """List a source without loading it (a run found on disk); returns its key."""
        with self._lock:
            self._sources.setdefault(source.label, source)
        return source.label

    def load(self, source: ModelSource) -> LoadedModel:
        """Load `source` now (or return the copy already loaded). A VitlabError leaves the store as it was."""
        return self._get(source.label, source)

    def get(self, key: str) -> LoadedModel:
        """The model listed under `key`, loaded on first use."""
        source = self._sources.get(key)
        if source is None:
            raise VitlabError(
                f"model {key!r} is not one the page knows; choose one from the list or load it first", arg="model"
            )
        return self._get(key, source)

    def keys(self) -> list[str]:
        return list(self._sources)

    def loaded_keys(self) -> list[str]:
        return list(self._loaded)

    def _get(self, key: str, source: ModelSource) -> LoadedModel:
        with self._lock:  # one load at a time: two requests for a new model load it once
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            estimate = source.weights_estimate()
            if estimate is not None:  # before anything is read: a model that cannot fit is never loaded
                self._make_room(key, 2 * estimate)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = source.create()
            try:
                self._make_room(key, self._cost(model))  # what it turned out to be
            except VitlabError:
                del model
                _give_back_memory()
                raise
            model = model.to(self.device).eval().requires_grad_(False)
            loaded = LoadedModel(
                source=source,
                model=model,
                device=self.device,
                precision=self.precision,
                notes=[str(w.message) for w in caught],
                fast_path=self.fast_path,
                engine=self.engine,
            )
            threading.Thread(target=loaded.warm_up, name=f"vitlab-warm-up {key}", daemon=True).start()
            self._sources.setdefault(key, source)
            self._loaded[key] = loaded
            if len(self._loaded) > self.capacity:
                while len(self._loaded) > self.capacity:
                    self._loaded.popitem(last=False)  # the least recently used; its memory goes with it
                _give_back_memory()
            return loaded


def run_sources(runs: list[Path], *, cwd: Path | None = None) -> list[ModelSource]:
    """A `--checkpoint` source for each run folder, written relative to `cwd` when it lies inside it."""
    cwd = (cwd or Path.cwd()).resolve()
    out = []
    for run in runs:
        try:
            shown = run.resolve().relative_to(cwd)
        except ValueError:
            shown = run
        out.append(ModelSource(checkpoint=str(shown)))
    return out


__all__ = ["ModelSource", "LoadedModel", "ModelStore", "run_sources", "default_memory_limit"]
