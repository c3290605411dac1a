"""Pretrained weights of any source, checked against the architecture and prepared for loading.

After `vitlab.weights.formats` has read a source and renamed its tensors to vitlab's names, this
module works out what they are and how they fit the model asked for:

    load_checkpoint(source)   read, detect, convert (formats.py); infer_config(): patch, dim, depth,
                              heads, MLP, classes, grid, class token, pooling; the source's preprocessing
    plan_load(ckpt, name)     the ViTConfig to build (checked field by field against the named model),
                              the state dict to load: the position table resampled for a new img_size
                              (Section 3.2, "2D interpolation of the pre-trained position embeddings"),
                              the head dropped for a new num_classes (a new zero head, Section 3.2)

`vitlab.create_model(name, pretrained=...)` builds the model from the plan; nothing here builds one.

Each source preprocesses differently, and a mismatch silently costs accuracy (vision_transformer#39:
83.41% vs 85.08%), so the plan's `PretrainedCfg` carries the source's resize, crop, interpolation and
mean/std; `vitlab.data.preprocess.eval_transform(model.pretrained_cfg)` applies them.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.errors import VitlabError
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.models.registry import VARIANTS, get_config
from vitlab.models.vit import ViTConfig, VisionTransformer
from vitlab.weights.checkpoint import check_meta
from vitlab.weights.formats import convert_state_dict, detect_format, read_checkpoint, resolve_source

# Eval preprocessing per weight source (../shared/docs/paper.md, "Preprocessing differs per weight source").
# crop_mode "squash" resizes both sides to input_size / crop_pct; "center" resizes the short side, then crops.
PREPROCESSING = {
    # timm augreg ViTs (the default of timm's vit_* configs): mean = std = 0.5, crop 0.9, bicubic.
    "timm": dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=0.9, crop_mode="center", interpolation="bicubic"),
    # Original JAX release and HF google/vit-*: resize straight to the input size, bilinear, no crop.
    "jax": dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=1.0, crop_mode="squash", interpolation="bilinear"),
    # HF's ViTImageProcessor (transformers >= 5) resizes the uint8 tensor with torchvision (antialiased), not PIL.
    "hf": dict(
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=1.0, crop_mode="squash", interpolation="bilinear", resize_backend="tensor"
    ),
    # torchvision vit_b_16 IMAGENET1K_V1: resize 256 bilinear, centre crop 224 (224/256 = 0.875), ImageNet stats.
    "torchvision": dict(
        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), crop_pct=0.875, crop_mode="center", interpolation="bilinear"
    ),
}

# The ViTConfig fields a checkpoint fixes; a named model that disagrees on any of them cannot load it.
STRUCTURAL_FIELDS = ("patch_size", "in_chans", "dim", "depth", "heads", "mlp_dim", "qkv_bias", "class_token", "pool",
                     "fc_norm", "pos_embed")


def _structural(cfg, f: str):
    """A ViTConfig's value of a STRUCTURAL_FIELDS entry, with the defaults resolved."""
    return {"mlp_dim": cfg.hidden_dim, "fc_norm": cfg.use_fc_norm}.get(f, getattr(cfg, f, None))


class PretrainedWarning(UserWarning):
    """Something about the loaded weights the user should know: a new head, a zero head, dropped parts."""


@dataclass
class Checkpoint:
    """A checkpoint converted to vitlab names, with what could be read about it."""

    state_dict: dict[str, torch.Tensor]
    format: str  # one of formats.FORMATS, or "vitlab" for a file written by vitlab
    config: dict  # ViTConfig fields inferred from the tensors and the config file
    pretrained_cfg: PretrainedCfg  # preprocessing and labels of the source
    path: str = ""
    architecture: str | None = None  # a vitlab model name, when the config file gives one
    stated: dict = field(default_factory=dict)  # ViTConfig fields as a vitlab config file states them
    notes: list[str] = field(default_factory=list)  # parts dropped in conversion

    @property
    def grid_size(self) -> tuple[int, int] | None:
        return self.config.get("grid_size")


@dataclass
class LoadPlan:
    """What `create_model` builds and loads: the configuration, the tensors, and the provenance."""

    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    strict: bool  # False when the head is left out (new, absent or none): it keeps its zero init
    pretrained_cfg: PretrainedCfg


# ----------------------------------------------------------------------------------------------------
# Configuration: what the tensors and the config file say


def infer_config(sd: dict[str, torch.Tensor], config: dict | None = None) -> dict:
    """ViTConfig fields (and `grid_size`, the position table's grid) read from a vitlab-named state dict
    and its config file. Fields the checkpoint does not determine (heads, for a timm or torchvision
    file without a config) are left out."""
    config = config or {}
    vit_cfg = _vitlab_config(config)
    cfg: dict = dict(vit_cfg)
    w = sd.get("patch_embed.proj.weight")
    if w is None:
        raise VitlabError("the checkpoint has no patch embedding (patch_embed.proj.weight or its equivalent)")
    if w.ndim == 4:  # (D, C, P, P)
        cfg.update(dim=w.shape[0], in_chans=w.shape[1], patch_size=w.shape[2])
    else:  # linear patch embedding (D, C*P*P), only written by vitlab, whose config says the rest
        cfg.update(dim=w.shape[0], patch_embed="linear")
    cfg["depth"] = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    if "blocks.0.mlp.fc1.weight" in sd:
        cfg["mlp_dim"] = sd["blocks.0.mlp.fc1.weight"].shape[0]
    cfg["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd
    cfg["class_token"] = "cls_token" in sd
    cfg["pool"] = "mean" if "fc_norm.weight" in sd or not cfg["class_token"] else "cls"
    cfg["fc_norm"] = "fc_norm.weight" in sd  # mean pool: LayerNorm after it (timm) or before (JAX 'gap', timm's *_gap_*)
    head = sd.get("head.weight")
    cfg["num_classes"] = head.shape[0] if head is not None else 0
    if "_jax_heads" in sd:
        cfg["heads"] = int(sd["_jax_heads"])
    # Config files: HF config.json, timm's config.json (model_args), vitlab's JSON (vit_config).
    if "num_attention_heads" in config:
        cfg["heads"] = config["num_attention_heads"]
        cfg["norm_eps"] = config.get("layer_norm_eps", 1e-12)
        cfg["qkv_bias"] = config.get("qkv_bias", cfg["qkv_bias"])
        if "image_size" in config:
            cfg["img_size"] = config["image_size"]
    model_args = config.get("model_args") or {}
    for key, target in (("num_heads", "heads"), ("img_size", "img_size")):
        if key in model_args:
            cfg[target] = model_args[key]
    if "img_size" not in cfg and "input_size" in (config.get("pretrained_cfg") or {}):
        cfg["img_size"] = tuple(config["pretrained_cfg"]["input_size"][1:])
    if "pos_embed" in sd:
        cfg.setdefault("pos_embed", "learned")
        n = sd["pos_embed"].shape[-2] - (1 if cfg["class_token"] else 0)  # patch rows
        cfg["grid_size"] = _grid_of(n, cfg.get("img_size"), cfg.get("patch_size"))
        cfg.setdefault("img_size", tuple(g * cfg["patch_size"] for g in cfg["grid_size"]))
    elif "pos_embed_row" in sd:  # learned2d: a row table and a column table
        cfg["grid_size"] = (sd["pos_embed_row"].shape[1], sd["pos_embed_col"].shape[1])
    elif "rel_pos.0.table" in sd and "img_size" in cfg:  # relative: vitlab's own files, whose config has the size
        s = cfg["img_size"]
        cfg["grid_size"] = tuple(n // cfg["patch_size"] for n in ((s, s) if isinstance(s, int) else s))
    if "img_size" in cfg:
        s = cfg["img_size"]
        cfg["img_size"] = (s, s) if isinstance(s, int) else tuple(s)
    return cfg


def _vitlab_config(config: dict) -> dict:
    """The ViTConfig fields stored by vitlab: `{"kind": "vit", "config": {...}}` (vitlab.weights.checkpoint,
    vitlab.inference.export) or `vit_config`."""
    known = {f.name for f in fields(ViTConfig)}
    stored = config.get("config") if config.get("kind") == "vit" else None
    for candidate in (stored, config.get("vit_config")):
        if isinstance(candidate, dict) and {"dim", "depth", "heads"} <= set(candidate):
            return {k: v for k, v in candidate.items() if k in known}
    return {}


def _grid_of(n: int, img_size, patch_size) -> tuple[int, int]:
    """The (rows, cols) grid of n position-table rows: from the config's image size if it fits, else square."""
    if img_size is not None and patch_size:
        h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
        if (h // patch_size) * (w // patch_size) == n:
            return h // patch_size, w // patch_size
    s = math.isqrt(n)
    if s * s != n:
        raise VitlabError(
            f"the position table has {n} patch rows, which is not a square grid, and the checkpoint's config "
            "does not give the image size; add img_size to its config"
        )
    return s, s


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    *,
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Section 3.2: "we perform 2D interpolation of the pre-trained position embeddings, according to
    their location in the original image". (1, prefix + gh*gw, D) -> (1, prefix + new_gh*new_gw, D).

    The prefix rows (class token) are kept as they are; only the patch rows are resampled, as a
    D-channel image of the old grid. Grids may be non-square; `old_grid` defaults to a square one.
    """
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n, D = patches.shape[1], patches.shape[2]
    gh, gw = old_grid if old_grid is not None else _grid_of(n, None, None)
    if gh * gw != n:
        raise VitlabError(f"old_grid {gh}x{gw} = {gh * gw} does not match the {n} patch rows of the position table")
    new_grid = tuple(new_grid)
    if (gh, gw) == new_grid:
        return pos_embed
    dtype = patches.dtype
    grid = patches.reshape(1, gh, gw, D).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    grid = F.interpolate(grid, size=new_grid, mode=interpolation, antialias=antialias, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(dtype)  # (1, N', D)
    return torch.cat([prefix, grid], dim=1)


def resample_position_tables(sd: dict, old_grid: tuple[int, int], new_grid: tuple[int, int], *,
                             num_prefix_tokens: int) -> dict:
    """Every position table of `sd` (vitlab names) moved from `old_grid` to `new_grid`: the 1-D table
    by `resample_pos_embed`; learned2d's row and column tables each along its own axis (linear); the
    relative bias tables, per head an image of the (2gh-1) x (2gw-1) offsets, bicubic."""
    sd = dict(sd)
    (gh, gw), (nh, nw) = old_grid, tuple(new_grid)
    if "pos_embed" in sd:
        sd["pos_embed"] = resample_pos_embed(sd["pos_embed"], (nh, nw), old_grid=old_grid, num_prefix_tokens=num_prefix_tokens)
    for key, n in (("pos_embed_row", nh), ("pos_embed_col", nw)):
        if key in sd:  # (1, g, D/2) -> (1, n, D/2)
            table = sd[key].transpose(1, 2).float()  # (1, D/2, g)
            sd[key] = F.interpolate(table, size=n, mode="linear", align_corners=False).transpose(1, 2).to(sd[key].dtype)
    for key in [k for k in sd if re.fullmatch(r"rel_pos\.\d+\.table", k)]:  # (h, (2gh-1)(2gw-1))
        table = sd[key].reshape(1, -1, 2 * gh - 1, 2 * gw - 1).float()  # (1, h, 2gh-1, 2gw-1)
        table = F.interpolate(table, size=(2 * nh - 1, 2 * nw - 1), mode="bicubic", align_corners=False)
        sd[key] = table.reshape(table.shape[1], -1).to(sd[key].dtype)
    return sd


# ----------------------------------------------------------------------------------------------------
# Reading a source into a Checkpoint


def load_checkpoint(source: str | Path, *, cache_dir: str | Path | None = None) -> Checkpoint:
    """Read, detect, convert and describe `source` (a file, a directory or a hub id)."""
    path = resolve_source(source, cache_dir=cache_dir)
    raw, config, preproc = read_checkpoint(path)
    if "kind" in config:  # vitlab's own metadata (a checkpoint's config.json, an export's .json): its rules
        check_meta(config, _config_path(path))
    if not raw:
        raise VitlabError(f"{path} holds no tensors")
    fmt = detect_format(raw)
    sd, notes = convert_state_dict(raw, fmt)
    if fmt == "timm" and _vitlab_config(config):
        fmt = "vitlab"
    cfg = infer_config(sd, config)
    sd.pop("_jax_heads", None)
    architecture = config.get("architecture") or (config.get("pretrained_cfg") or {}).get("architecture")
    return Checkpoint(
        state_dict=sd,
        format=fmt,
        config=cfg,
        pretrained_cfg=_source_pretrained_cfg(fmt, config, preproc),
        path=str(path),
        architecture=architecture,
        stated={k: v for k, v in _vitlab_config(config).items() if k not in ("num_classes", "img_size")},
        notes=notes,
    )


def _config_path(path: Path) -> Path:
    """The config file read_checkpoint took for `path` (for messages)."""
    if path.is_dir():
        return path / "config.json"
    return path.with_suffix(".json") if path.with_suffix(".json").is_file() else path.parent / "config.json"


def _source_pretrained_cfg(fmt: str, config: dict, preproc: dict) -> PretrainedCfg:
    """Preprocessing and class names as the source defines them."""
    out = dict(PREPROCESSING["timm" if fmt == "vitlab" else fmt])
    saved = config.get("pretrained_cfg") or {}
    for key in ("mean", "std", "crop_pct", "crop_mode", "interpolation", "resize_backend"):
        if saved.get(key) is not None:
            out[key] = tuple(saved[key]) if isinstance(saved[key], list) else saved[key]
    if preproc:  # HF preprocessor_config.json
        if "image_mean" in preproc:
            out["mean"], out["std"] = tuple(preproc["image_mean"]), tuple(preproc["image_std"])
        out["interpolation"] = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}.get(preproc.get("resample"), out["interpolation"])
        if preproc.get("do_center_crop") and "crop_size" in preproc and "size" in preproc:
            size, crop = preproc["size"], preproc["crop_size"]
            short = size.get("shortest_edge", size.get("height"))
            out.update(crop_mode="center", crop_pct=crop.get("height", short) / short)
    labels = config.get("label_names") or saved.get("label_names")
    if labels is None and isinstance(config.get("id2label"), dict):
        id2label = {int(k): v for k, v in config["id2label"].items()}
        labels = [id2label.get(i, str(i)) for i in range(len(id2label))]
        if all(re.fullmatch(r"LABEL_\d+", str(lab)) for lab in labels):
            labels = None  # transformers' placeholders say nothing
    return PretrainedCfg(format=fmt, label_names=tuple(labels) if labels else None, **out)


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in the order of every 1000-class ImageNet head."""
    text = resources.files("vitlab").joinpath("resources/imagenet_classes.txt").read_text()
    names = text.splitlines()
    assert len(names) == 1000, f"resources/imagenet_classes.txt should have 1000 lines, has {len(names)}"
    return names


# ----------------------------------------------------------------------------------------------------
# The plan: which model, which tensors


def plan_load(
    ckpt: Checkpoint,
    name: str | None = None,
    *,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    source: str | Path | None = None,
    **overrides,
) -> LoadPlan:
    """The model to build for checkpoint `ckpt` and the tensors to load into it.

    name: a vitlab model name (`vitlab.model_names()`), whose architecture the checkpoint must match;
        None takes the architecture from the checkpoint (its config must give the number of heads).
    num_classes: None keeps the checkpoint's head; another number gets a new zero-initialised head
        (Section 3.2) and a PretrainedWarning; 0 leaves the head out (the model returns features).
    img_size: None keeps the named model's resolution; if it differs from the checkpoint's, the
        position tables are resampled (2-D bicubic for the 1-D table, class token kept).
    overrides: other ViTConfig fields (e.g. drop_path=0.1), checked against the checkpoint like the rest.

    The plan's `pretrained_cfg` gives the source's preprocessing and class names, and says whether
    the head was loaded ("loaded"), is all zeros ("zero", e.g. an ImageNet-21k checkpoint), was
    absent ("absent"), is new ("new"), or was left out ("none").
    """
    inferred = {k: v for k, v in ckpt.config.items() if k != "grid_size"}
    if name is not None:  # the user named the architecture: the checkpoint must fit it
        base = get_config(name, **overrides)
        if not isinstance(base, ViTConfig):
            raise VitlabError(f"model {name!r} is a CNN baseline; pretrained ViT weights ({ckpt.path}) do not fit it")
    else:  # the checkpoint describes itself: its config file's architecture, corrected by its tensors
        name = ckpt.architecture if ckpt.architecture in VARIANTS and VARIANTS[ckpt.architecture].is_vit else None
        if name is None and "heads" not in inferred:
            raise VitlabError(
                f"{ckpt.path}: the checkpoint does not say its number of heads; name the model "
                "(model=..., e.g. vit_base_patch16_224) so vitlab knows the architecture", arg="model"
            )
        known = {f.name for f in fields(ViTConfig)} - {"num_classes"}
        start = get_config(name) if name is not None else ViTConfig()
        try:
            base = start.replace(**{k: v for k, v in inferred.items() if k in known}).replace(**overrides)
        except VitlabError as e:  # the tensors describe no model: say which tensors do not fit, not why dim fails
            stated = _stated_config(start, ckpt)
            raise VitlabError(f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit "
                              f"{name or 'the model its config describes'}: "
                              f"{_key_report(stated, ckpt) or e}") from e
    _check_architecture(name, base, inferred, ckpt)

    ckpt_classes = inferred["num_classes"]
    head = _head_state(ckpt.state_dict, ckpt_classes)
    target_classes = num_classes if num_classes is not None else (ckpt_classes if ckpt_classes > 0 else base.num_classes)
    target_size = img_size if img_size is not None else overrides.get("img_size", base.img_size)
    keep = {"norm_eps": inferred["norm_eps"]} if "norm_eps" in inferred and "norm_eps" not in overrides else {}
    cfg = base.replace(num_classes=target_classes, img_size=target_size, **keep)

    sd = dict(ckpt.state_dict)
    notes = list(ckpt.notes)
    old_grid = ckpt.grid_size
    if old_grid is not None and tuple(old_grid) != cfg.grid_size and cfg.pos_embed in ("learned", "learned2d", "relative"):
        sd = resample_position_tables(sd, old_grid, cfg.grid_size, num_prefix_tokens=cfg.num_prefix_tokens)
        notes.append(f"position embedding ({cfg.pos_embed}) resampled from a {old_grid[0]}x{old_grid[1]} to a {cfg.grid_size[0]}x{cfg.grid_size[1]} grid")
    if target_classes != ckpt_classes or head == "absent":
        sd.pop("head.weight", None), sd.pop("head.bias", None)
        if target_classes == 0:  # asked for a feature extractor: no head at all
            notes.append("no head (num_classes=0): the model returns the pooled features")
            head = "none"
        elif head != "absent":
            _warn(f"{ckpt.path}: the checkpoint's head has {ckpt_classes} classes; made a new zero-initialised head for {target_classes} classes")
            head = "new"
    if head == "absent":
        _warn(
            f"{ckpt.path}: the checkpoint has no classification head (a backbone or pre-training checkpoint); "
            f"the model's {target_classes}-class head is zero-initialised and must be fine-tuned"
        )
    elif head == "zero":
        _warn(
            f"{ckpt.path}: the checkpoint's {ckpt_classes}-class head is all zeros (ImageNet-21k pre-training "
            "checkpoints ship it zeroed); its predictions are meaningless until it is fine-tuned"
        )
    for note in ckpt.notes:
        _warn(f"{ckpt.path}: {note}")
    strict = head not in ("new", "absent", "none")
    _check_keys(cfg, sd, name, ckpt, skip_head=not strict)

    labels = ckpt.pretrained_cfg.label_names if head in ("loaded", "zero") else None
    if labels is not None and len(labels) != target_classes:
        labels = None
    if labels is None and target_classes == 1000 and head in ("loaded", "zero"):
        labels = tuple(imagenet_class_names())
    pcfg = ckpt.pretrained_cfg.replace(
        input_size=(cfg.in_chans, *cfg.img_size),
        num_classes=target_classes,
        label_names=labels,
        source=str(source if source is not None else ckpt.path),
        architecture=name,
        head=head,
        notes=tuple(notes),
    )
    return LoadPlan(config=cfg, state_dict=sd, strict=strict, pretrained_cfg=pcfg)


def _head_state(sd: dict, num_classes: int) -> str:
    if "head.weight" not in sd or num_classes == 0:
        return "absent"
    if not sd["head.weight"].any() and ("head.bias" not in sd or not sd["head.bias"].any()):
        return "zero"
    return "loaded"


def _warn(message: str) -> None:
    warnings.warn(message, PretrainedWarning, stacklevel=4)


def _check_architecture(name: str | None, cfg, inferred: dict, ckpt: Checkpoint) -> None:
    """The named model's structure must be the checkpoint's: list every field that differs, with a fix."""
    diffs = []
    for f in STRUCTURAL_FIELDS:
        if f not in inferred:
            continue
        mine = _structural(cfg, f)
        theirs = inferred[f] if f != "mlp_dim" or inferred[f] is not None else cfg.hidden_dim
        if mine != theirs:
            diffs.append((f, mine, theirs))
    try:  # the named model with the checkpoint's values: None when no model has them (dim 7 with 4 heads)
        fixed = cfg.replace(**{f: t for f, _, t in diffs}) if diffs else cfg
    except VitlabError:
        fixed = None
    if diffs and fixed is not None and "fc_norm" in inferred and all(f != "fc_norm" for f, _, _ in diffs):
        # fc_norm's default follows pool: with the other fixes applied it may be the one left to differ
        if fixed.use_fc_norm != inferred["fc_norm"]:
            diffs.append(("fc_norm", fixed.use_fc_norm, inferred["fc_norm"]))
    if diffs:
        listing = ", ".join(f"{f}: model {m!r} vs checkpoint {t!r}" for f, m, t in diffs)
        fix = ", ".join(f"{f}={t!r}" for f, _, t in diffs)
        like = _matching_variants(inferred)
        hint = f" (it looks like {', '.join(like)})" if like else ""
        overrides = f", or pass the overrides {fix}" if fixed is not None else ""
        raise VitlabError(
            f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit model {name!r}: {listing}. "
            f"Name the model the checkpoint was trained as{hint}{overrides}. " + _key_report(cfg, ckpt)
        )


def _stated_config(start: ViTConfig, ckpt: Checkpoint) -> ViTConfig:
    """The configuration a checkpoint's own config file states (vitlab's files state every field)."""
    try:
        return start.replace(**ckpt.stated)
    except (VitlabError, TypeError):
        return start


def _matching_variants(inferred: dict) -> list[str]:
    """vitlab model names whose structure agrees with everything the checkpoint says."""
    out = []
    for vname, variant in VARIANTS.items():
        if not variant.is_vit:
            continue
        values = {f: _structural(variant.config, f) for f in STRUCTURAL_FIELDS}
        if all(values[f] == inferred[f] for f in STRUCTURAL_FIELDS if f in inferred):
            out.append(vname)
    return out[:4]


def _meta_state_dict(cfg: ViTConfig) -> dict:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        return VisionTransformer(cfg).state_dict()


def _key_report(cfg, ckpt: Checkpoint) -> str:
    """Missing keys, unexpected keys and shape differences between a model of `cfg` and the checkpoint."""
    try:
        grid = ckpt.grid_size
        size = tuple(g * cfg.patch_size for g in grid) if grid else cfg.img_size
        model_sd = _meta_state_dict(cfg.replace(img_size=size, num_classes=ckpt.config.get("num_classes", cfg.num_classes)))
    except VitlabError:
        return ""
    return _diff_keys(model_sd, ckpt.state_dict)


def _diff_keys(model_sd: dict, sd: dict, skip: tuple[str, ...] = ()) -> str:
    missing = sorted(k for k in model_sd if k not in sd and k not in skip)
    unexpected = sorted(k for k in sd if k not in model_sd)
    shapes = sorted(
        f"{k} model {tuple(model_sd[k].shape)} vs checkpoint {tuple(sd[k].shape)}"
        for k in sd
        if k in model_sd and model_sd[k].shape != sd[k].shape
    )
    parts = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape differences", shapes)):
        if items:
            more = f" ... and {len(items) - 8} more" if len(items) > 8 else ""
            parts.append(f"{title} ({len(items)}): {'; '.join(items[:8])}{more}")
    return ". ".join(parts)


def _check_keys(cfg: ViTConfig, sd: dict, name, ckpt: Checkpoint, *, skip_head: bool) -> None:
    skip = ("head.weight", "head.bias") if skip_head else ()
    report = _diff_keys(_meta_state_dict(cfg), sd, skip)
    if report:
        raise VitlabError(f"checkpoint {ckpt.path} ({ckpt.format} layout) does not load into model {name!r}: {report}")


__all__ = [
    "Checkpoint",
    "LoadPlan",
    "PretrainedWarning",
    "PREPROCESSING",
    "STRUCTURAL_FIELDS",
    "infer_config",
    "resample_pos_embed",
    "resample_position_tables",
    "load_checkpoint",
    "plan_load",
    "imagenet_class_names",
]
