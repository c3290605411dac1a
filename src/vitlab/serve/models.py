"""The page's models: where each comes from, said as the command line says it, and the loaded copies.

A `ModelSource` is the flags of `vitlab predict` (`--model`, `--pretrained` | `--checkpoint`,
`--img-size`) as data; its `label` is those flags written out, which is what the page lists. The
`ModelStore` holds one copy of each loaded model, shared by every request and every browser tab,
built through `vitlab.create_model`. A source that fails to load raises a VitlabError and changes
nothing: the models already loaded stay loaded. At most `capacity` models are kept; the one used
longest ago is dropped first (and loaded again if it is asked for again).

A loaded model answers at once, as built; in the background a copy of it is readied for the top-k
(`vitlab.speed.fastpath.serving_model`: the plan the fixed rules give this machine for one image at a
time, compiled with `--fast-path compile`), and takes over the top-k when it is ready. The attention
maps, Figure 7 and the token norms always use the model as built (they read its attention).
"""

from __future__ import annotations

import shlex
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from vitlab.data.preprocess import describe
from vitlab.errors import VitlabError, check_range
from vitlab.models.factory import check_source, create_model
from vitlab.models.vit import VisionTransformer, count_parameters
from vitlab.runtime import check_precision, resolve_device
from vitlab.speed.fastpath import check_fast_path, serving_model

KINDS = ("checkpoint", "pretrained", "model")  # what the page's "load" box can name, as the flags


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
    def of(cls, kind: str, value: str, *, img_size: int | None = None) -> "ModelSource":
        """The source that the flag `--<kind> <value>` names (kind: checkpoint, pretrained or model)."""
        value = (value or "").strip()
        if kind not in KINDS:
            raise VitlabError(f"kind must be one of {', '.join(KINDS)}; found {kind!r}", arg="kind")
        if not value:
            raise VitlabError(f"--{kind} needs a value: "
                              + {"checkpoint": "a run folder, a last.json/best.json, or a checkpoint folder",
                                 "pretrained": "a weights file or folder, or a hub id",
                                 "model": "a model name that `vitlab info` lists"}[kind])
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

    def create(self) -> nn.Module:
        """A new copy of the model, through vitlab.create_model with these arguments."""
        return create_model(self.model, pretrained=self.pretrained, checkpoint=self.checkpoint, img_size=self.img_size)


@dataclass
class LoadedModel:
    """A model in memory, in eval mode on its device, and what the page says about it."""

    source: ModelSource
    model: nn.Module
    device: torch.device
    precision: str
    notes: list[str] = field(default_factory=list)  # load warnings: a new head, dropped parts
    fast_path: str = "off"
    served: Callable | None = None  # what computes the top-k once it is ready (`serving_model`)
    path: str = "the model as built (a faster copy is being readied)"  # the top-k's path, in words
    ready: threading.Event = field(default_factory=threading.Event)

    def warm_up(self) -> None:
        """Ready the top-k's copy (`serving_model`); the page keeps answering with the model as built until
        then, and for good if readying fails (the reason is shown as its path)."""
        try:
            self.served, self.path = serving_model(self.model, precision=self.precision, device=self.device,
                                                   fast=self.fast_path)
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
            shape = (f"ViT, {cfg.depth} layers x {cfg.heads} heads, D={cfg.dim}, patch {cfg.patch_size}, "
                     f"{cfg.grid_size[0]}x{cfg.grid_size[1]} patches")
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


class ModelStore:
    """The loaded models, one copy each, keyed by their source's label; safe to use from many threads."""

    def __init__(self, *, device: str | torch.device = "auto", precision: str = "fp32", capacity: int = 3,
                 fast_path: str = "auto"):
        check_range("capacity", capacity, low=1, integer=True)
        self.device = resolve_device(device)
        self.precision = check_precision(precision)
        self.fast_path = check_fast_path(fast_path)
        self.capacity = capacity
        self._sources: dict[str, ModelSource] = {}  # every source the page has listed, loaded or not
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

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
            raise VitlabError(f"model {key!r} is not one the page knows; choose one from the list or load it first",
                              arg="model")
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
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = source.create()
            model = model.to(self.device).eval().requires_grad_(False)
            loaded = LoadedModel(source=source, model=model, device=self.device, precision=self.precision,
                                 notes=[str(w.message) for w in caught], fast_path=self.fast_path)
            threading.Thread(target=loaded.warm_up, name=f"vitlab-warm-up {key}", daemon=True).start()
            self._sources.setdefault(key, source)
            self._loaded[key] = loaded
            while len(self._loaded) > self.capacity:
                self._loaded.popitem(last=False)  # the least recently used; its memory goes with it
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


__all__ = ["KINDS", "ModelSource", "LoadedModel", "ModelStore", "run_sources"]
