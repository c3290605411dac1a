"""Checkpoints that survive a kill at any moment.

A checkpoint is a folder: `model.safetensors` (weights), `config.json` (how to rebuild the model) and
`state.pt` (optimizer, scheduler, RNG, epoch, metrics; read back with torch.load(weights_only=True)).
It is written under a temporary name and renamed into place; then a small pointer file (`last.json`,
`best.json`) is replaced atomically. A process killed mid-save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitlab.errors import VitlabError
from vitlab.fileio import write_json


write_json_atomic = write_json  # the name the other modules import


def model_config(model: nn.Module) -> dict:
    """What `build_model_from_config` needs to rebuild `model`."""
    if hasattr(model, "cfg"):
        return {"kind": "vit", "config": model.cfg.to_dict(), "pretrained_cfg": _jsonable(model.pretrained_cfg)}
    from vitlab.cnn import ResNetMini

    if isinstance(model, ResNetMini):
        width = model.stem[0].out_channels
        blocks = len(model.layer1)
        return {"kind": "resnet_mini", "config": {"num_classes": model.num_classes, "width": width, "blocks": blocks,
                                                   "in_chans": model.stem[0].in_channels},
                "pretrained_cfg": _jsonable(model.pretrained_cfg)}
    raise TypeError(f"cannot describe a {type(model).__name__} for a checkpoint")


def build_model_from_config(meta: dict) -> nn.Module:
    from vitlab.cnn import ResNetMini
    from vitlab.model import ViTConfig, VisionTransformer

    if meta.get("kind") == "vit":
        model = VisionTransformer(ViTConfig(**meta["config"]))
    elif meta.get("kind") == "resnet_mini":
        model = ResNetMini(**meta["config"])
    else:
        raise VitlabError(f"checkpoint config has unknown kind {meta.get('kind')!r}; expected 'vit' or 'resnet_mini'")
    model.pretrained_cfg = dict(meta.get("pretrained_cfg") or {})
    return model


def save_checkpoint(out_dir: str | Path, name: str, model: nn.Module, state: dict, *, keep: int = 2) -> Path:
    """Write checkpoint folder `out_dir/checkpoints/<name>` and point `out_dir/last.json` at it.

    `state` holds whatever resume needs (optimizer, scheduler, RNG, epoch, metrics). Only the newest
    `keep` epoch folders are kept, plus whatever `best.json` points at.
    """
    out_dir = Path(out_dir)
    root = out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    weights = {k: v.detach().contiguous().cpu() for k, v in _unwrap(model).state_dict().items()}
    save_file(weights, tmp / "model.safetensors")
    write_json_atomic(tmp / "config.json", model_config(_unwrap(model)))
    torch.save(state, tmp / "state.pt")
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json_atomic(out_dir / "last.json", {"checkpoint": f"checkpoints/{name}", "epoch": state.get("epoch")})
    _prune(out_dir, keep)
    return final


def mark_best(out_dir: str | Path, name: str, metrics: dict) -> None:
    write_json_atomic(Path(out_dir) / "best.json", {"checkpoint": f"checkpoints/{name}", **metrics})


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from: the folder itself, a run folder (its last.json), or a pointer file."""
    path = Path(path)
    if path.is_dir() and (path / "model.safetensors").exists():
        return path
    if path.is_dir() and (path / "last.json").exists():
        path = path / "last.json"
    if path.is_file() and path.suffix == ".json":
        target = path.parent / json.loads(path.read_text())["checkpoint"]
        if (target / "model.safetensors").exists():
            return target
        raise VitlabError(f"checkpoint pointer {path} names {target}, which has no model.safetensors")
    if path.is_file() and path.suffix == ".safetensors" and (path.parent / "config.json").exists():
        return path.parent
    raise VitlabError(
        f"--checkpoint {path}: expected a checkpoint folder (model.safetensors + config.json), "
        "a run folder with last.json, or a last.json/best.json pointer; found nothing of the kind"
    )


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """Rebuild a model from a checkpoint (see `resolve_checkpoint` for what `path` may be)."""
    folder = resolve_checkpoint(path)
    meta = json.loads((folder / "config.json").read_text())
    model = build_model_from_config(meta)
    model.load_state_dict(load_file(folder / "model.safetensors", device=str(map_location)))
    return model


def load_state(path: str | Path) -> dict:
    return torch.load(resolve_checkpoint(path) / "state.pt", map_location="cpu", weights_only=True)


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile


def _prune(out_dir: Path, keep: int) -> None:
    root = out_dir / "checkpoints"
    protected = set()
    for pointer in ("last.json", "best.json"):
        p = out_dir / pointer
        if p.exists():
            protected.add(Path(json.loads(p.read_text())["checkpoint"]).name)
    epochs = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith("epoch_"))
    for d in epochs[:-keep]:
        if d.name not in protected:
            shutil.rmtree(d, ignore_errors=True)
    for d in root.iterdir():  # temp folders of a save that was killed
        if d.name.startswith("."):
            shutil.rmtree(d, ignore_errors=True)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
