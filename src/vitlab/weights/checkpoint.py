"""vitlab's own checkpoints: one format for every run, written so that a kill at any moment leaves
the previous checkpoint intact, and read as untrusted input.

A run folder holds `checkpoints/epoch_NNNN/` folders and two pointer files:

    out/last.json                 {"checkpoint": "checkpoints/epoch_0012", "epoch": 12}
    out/best.json                 {"checkpoint": "checkpoints/epoch_0009", "epoch": 9, "val_acc": ...}
    out/checkpoints/epoch_0012/
        model.safetensors         the weights (timm's names for a ViT)
        config.json               how to rebuild the model: {"kind": "vit" | "resnet_mini", "config": {...},
                                  "pretrained_cfg": {...}, "version": 2}
        state.pt                  what resuming needs (vitlab.train.engine.fit): optimizer, scheduler, RNG,
                                  metrics, recipe; read back with torch.load(weights_only=True)

A checkpoint folder is written under a temporary name and renamed into place, then the pointer file
is replaced atomically. Files from disk are not trusted: a pointer that is not the JSON object
expected, a config of an unknown kind, a truncated or unsafe state.pt, each is a VitlabError that
names the file and what was expected. Checkpoints written by earlier vitlab versions (no "version";
an untyped pretrained_cfg) load the same way.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from vitlab.errors import VitlabError
from vitlab.fileio import ordinary_permissions, temporary_folder, write_error, write_json
from vitlab.models.cnn import ResNetConfig, ResNetMini
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.weights.formats import check_tensors, refused_global

VERSION = 2
# kind -> (configuration class, model class); the kind names are the ones earlier versions wrote
KINDS = {"vit": (ViTConfig, VisionTransformer), "resnet_mini": (ResNetConfig, ResNetMini)}


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel and torch.compile wrappers."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile


def model_meta(model: nn.Module) -> dict:
    """The config.json of a checkpoint of `model`: what rebuilding it needs."""
    model = unwrap(model)
    kind = next((k for k, (_, cls) in KINDS.items() if isinstance(model, cls)), None)
    if kind is None:
        raise TypeError(f"cannot describe a {type(model).__name__} for a checkpoint")
    pcfg = model.pretrained_cfg or PretrainedCfg()
    return {"kind": kind, "config": model.cfg.to_dict(), "pretrained_cfg": pcfg.to_dict(), "version": VERSION}


def save_weights(folder: str | Path, model: nn.Module) -> Path:
    """A checkpoint folder with weights and config only (no training state), written atomically."""
    return _write_folder(Path(folder), model, state=None)


def save_checkpoint(out_dir: str | Path, name: str, model: nn.Module, state: dict, *, keep: int = 2) -> Path:
    """Write checkpoint folder `out_dir/checkpoints/<name>` and point `out_dir/last.json` at it.

    `state` holds whatever resume needs (optimizer, scheduler, RNG, epoch, metrics). Only the newest
    `keep` epoch folders are kept, plus whatever `best.json` points at.
    """
    out_dir = Path(out_dir)
    final = _write_folder(out_dir / "checkpoints" / name, model, state)
    write_json(out_dir / "last.json", {"checkpoint": f"checkpoints/{name}", "epoch": state.get("epoch")})
    _prune(out_dir, keep)
    return final


def _write_folder(final: Path, model: nn.Module, state: dict | None) -> Path:
    """Write the folder under a temporary name, then rename it into place (vitlab.fileio.temporary_folder).
    A write that fails (a full disk) is a VitlabError naming the folder, and leaves no partial folder behind."""
    try:
        with temporary_folder(final) as tmp:
            weights = {k: v.detach().contiguous().cpu() for k, v in unwrap(model).state_dict().items()}
            save_file(weights, tmp / "model.safetensors")
            ordinary_permissions(tmp / "model.safetensors")  # safetensors creates its files private (0600)
            write_json(tmp / "config.json", model_meta(model))
            if state is not None:
                try:
                    torch.save(state, tmp / "state.pt")
                except RuntimeError as e:  # torch's zip writer reports a failed write as a RuntimeError
                    raise write_error(final / "state.pt", e) from e
    except SafetensorError as e:
        raise write_error(final, e) from e
    return final


def mark_best(out_dir: str | Path, name: str, metrics: dict) -> None:
    write_json(Path(out_dir) / "best.json", {"checkpoint": f"checkpoints/{name}", **metrics})


def read_pointer(path: str | Path) -> dict:
    """A last.json/best.json pointer: a JSON object whose "checkpoint" is a folder inside the run."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise VitlabError(
            f"checkpoint pointer {path} is not readable JSON ({type(e).__name__}); expected "
            '{"checkpoint": "checkpoints/epoch_NNNN", ...} as vitlab writes it'
        ) from e
    target = data.get("checkpoint") if isinstance(data, dict) else None
    if not isinstance(target, str) or not target or Path(target).is_absolute() or ".." in Path(target).parts:
        raise VitlabError(
            f'checkpoint pointer {path} should be a JSON object whose "checkpoint" names a folder '
            f"inside the run (e.g. checkpoints/epoch_0003); found {json.dumps(data)[:120]}"
        )
    epoch = data.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
        raise VitlabError(f'checkpoint pointer {path} should give "epoch" as a whole number >= 0; found {epoch!r}')
    return data


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from: the folder itself, a run folder (its last.json), or a pointer file."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / "model.safetensors").exists():
        return path
    if path.is_dir() and (path / "last.json").exists():
        path = path / "last.json"
    if path.is_file() and path.suffix == ".json":
        target = path.parent / read_pointer(path)["checkpoint"]
        if (target / "model.safetensors").exists():
            return target
        raise VitlabError(f"checkpoint pointer {path} names {target}, which has no model.safetensors")
    if path.is_file() and path.suffix == ".safetensors" and (path.parent / "config.json").exists():
        return path.parent
    what = "does not exist" if not path.exists() else "holds no vitlab checkpoint"
    raise VitlabError(
        f"checkpoint {path} {what}: expected a checkpoint folder (model.safetensors + config.json), "
        "a run folder with last.json, or a last.json/best.json pointer",
        arg="checkpoint",
    )


def read_meta(folder: str | Path) -> dict:
    """config.json of a checkpoint folder (or the .json next to an exported .safetensors), checked:
    {"kind", "config", "pretrained_cfg" (typed)}."""
    folder = Path(folder)
    path = folder.with_suffix(".json") if folder.suffix == ".safetensors" else folder / "config.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise VitlabError(
            f"checkpoint config {path} is not readable JSON ({type(e).__name__}); "
            'expected {"kind": "vit", "config": {...}} as vitlab writes it'
        ) from e
    meta = check_meta(meta, path)
    pcfg = meta.get("pretrained_cfg")
    meta["pretrained_cfg"] = PretrainedCfg.from_dict(pcfg if isinstance(pcfg, dict) else {})
    return meta


def check_meta(meta, path: str | Path) -> dict:
    """The one schema of vitlab's model metadata, wherever it is read (a checkpoint's config.json, an
    export's .json): an object with a known "kind", a "config" object whose every field is the right
    type and in range for that kind (the config class checks them), and a "pretrained_cfg" object (or
    none) whose preprocessing fields are valid. A file that fails is one VitlabError naming the file and
    the field; nothing is built from it."""
    if not isinstance(meta, dict) or meta.get("kind") not in KINDS:
        found = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise VitlabError(
            f"checkpoint config {path} has model kind {found!r}; expected one of "
            f'{", ".join(KINDS)} with a "config" object (is it a vitlab checkpoint?)'
        )
    if not isinstance(meta.get("config"), dict):
        found = type(meta.get("config")).__name__ if "config" in meta else "nothing"
        raise VitlabError(
            f'checkpoint config {path}: "config" should be an object of {meta["kind"]} fields; found '
            f"{found} (is it damaged? re-export it, or give its checkpoint folder)"
        )
    version = meta.get("version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION
    ):
        raise VitlabError(
            f"checkpoint config {path} has version {version!r}; this vitlab reads versions 1..{VERSION} "
            "(a newer vitlab wrote it?)"
        )
    pcfg = meta.get("pretrained_cfg")
    try:
        config_from_meta(meta)
        if pcfg is not None and not isinstance(pcfg, dict):
            raise VitlabError(f"pretrained_cfg must be an object of preprocessing fields; found {type(pcfg).__name__}")
        PretrainedCfg.from_dict(pcfg)
    except VitlabError as e:  # the file's field, not a command-line flag of the same name
        raise VitlabError(
            f"checkpoint config {path}: {e} (is it damaged? re-export it, or give its checkpoint folder)"
        ) from e
    return meta


def config_from_meta(meta: dict, **overrides):
    """The configuration (ViTConfig, ResNetConfig) that checked metadata describes, with `overrides`."""
    config_cls, _ = KINDS[meta["kind"]]
    known = {k: v for k, v in meta["config"].items() if k in config_cls.__dataclass_fields__}
    return config_cls(**known).replace(**overrides) if overrides else config_cls(**known)


def read_weights(folder: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The weights of a checkpoint folder (or an exported .safetensors file), checked: floating point, all
    finite (formats.check_tensors)."""
    folder = Path(folder)
    path = folder if folder.suffix == ".safetensors" else folder / "model.safetensors"
    try:
        tensors = load_file(path, device=str(device))
    except (OSError, SafetensorError) as e:
        raise VitlabError(f"checkpoint weights {path} are unreadable or truncated ({type(e).__name__}: {e})") from e
    return check_tensors(tensors, path)


def read_state(folder: str | Path) -> dict:
    """state.pt of a checkpoint folder: torch.load(weights_only=True), so it runs no code."""
    path = Path(folder) / "state.pt"
    if not path.is_file():
        raise VitlabError(f"{path} does not exist: the checkpoint holds weights only, not a training state to resume")
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then reads
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not refused_global(e):
            raise VitlabError(
                f"{path} is truncated or not a training state (not a torch file); "
                "resume from an earlier checkpoint or start a new run"
            ) from e
        raise VitlabError(
            f"refused {path}: it holds objects other than tensors and plain containers, which could "
            f"run code (torch.load(weights_only=True) said: {refused_global(e)})"
        ) from e
    except (OSError, RuntimeError, EOFError, zipfile.BadZipFile) as e:
        raise VitlabError(
            f"{path} is truncated or not a training state ({type(e).__name__}); "
            "resume from an earlier checkpoint or start a new run"
        ) from e
    if not isinstance(state, dict):
        raise VitlabError(f"{path} should hold a dict of training state; found {type(state).__name__}")
    return state


def find_runs(root: str | Path) -> list[Path]:
    """The run folders under `root` (root itself included): folders with a last.json or best.json
    pointer, sorted by path. A run's own sub-folders (checkpoints/, tensorboard/, ...) and hidden
    folders (a run still being written) are not searched; a `root` that does not exist has no runs."""
    root = Path(root).expanduser()
    found, seen = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):  # runs may be symlinked in
        real = os.path.realpath(folder)
        if real in seen:  # a symlink loop, or the same folder reached twice
            subfolders.clear()
            continue
        seen.add(real)
        if "last.json" in files or "best.json" in files:
            found.append(Path(folder))
            subfolders.clear()  # a run does not hold other runs
        else:
            subfolders[:] = [d for d in subfolders if not d.startswith(".")]
    return sorted(found)


def _prune(out_dir: Path, keep: int) -> None:
    root = out_dir / "checkpoints"
    protected = set()
    for pointer in ("last.json", "best.json"):
        p = out_dir / pointer
        if p.exists():
            protected.add(Path(read_pointer(p)["checkpoint"]).name)
    epochs = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith("epoch_"))
    for d in epochs[:-keep]:
        if d.name not in protected:
            shutil.rmtree(d, ignore_errors=True)
    for d in root.iterdir():  # temp folders of a save that was killed
        if d.name.startswith("."):
            shutil.rmtree(d, ignore_errors=True)


__all__ = [
    "VERSION",
    "KINDS",
    "unwrap",
    "model_meta",
    "save_weights",
    "save_checkpoint",
    "mark_best",
    "read_pointer",
    "resolve_checkpoint",
    "read_meta",
    "check_meta",
    "read_weights",
    "read_state",
    "find_runs",
]
