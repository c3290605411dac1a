"""A source of pretrained weights (a file, a folder or a hub id) read into a `Checkpoint`: its tensors in
vitlab's names, the architecture they show, and the source's preprocessing.

    load_checkpoint(source)   read, detect, convert (vitlab.weights.formats); refuse a ViT relative vitlab
                              does not build (attention pooling, rotary or relative positions, windows,
                              SwiGLU, ...) naming the feature and its keys; check the tensors (floating
                              point, finite; a vitlab file against its own config); infer the whole
                              architecture the tensors and the config file show (vitlab.weights.infer);
                              the source's preprocessing and class names

Each source preprocesses differently, and a mismatch silently costs accuracy (vision_transformer#39:
83.41% vs 85.08%), so the checkpoint's `PretrainedCfg` carries the source's resize, crop, interpolation
and mean/std (`vitlab.models.pretrained_cfg.PREPROCESSING`), and says where they came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from vitlab.errors import VitlabError
from vitlab.models.pretrained_cfg import PREPROCESSING, PretrainedCfg
from vitlab.models.vit import ViTConfig
from vitlab.weights.checkpoint import check_meta
from vitlab.weights.formats import check_tensors, convert_state_dict, detect_format, read_checkpoint, resolve_source
from vitlab.weights.infer import (
    STRUCTURAL_FIELDS,
    ModelTensors,
    diff_keys,
    infer_config,
    inferred_value,
    structural_value,
    vitlab_config,
)

PREPROCESSING_FIELDS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "resize_backend")


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
    # Where the preprocessing came from: "file" (the checkpoint's own config), "layout" (the convention
    # of its library: HF, JAX, torchvision, the DINOv2 release), or "default" (a bare timm-layout file).
    preprocessing: str = "default"

    @property
    def grid_size(self) -> tuple[int, int] | None:
        return self.config.get("grid_size")


def load_checkpoint(
    source: str | Path, *, model_tensors: ModelTensors, cache_dir: str | Path | None = None
) -> Checkpoint:
    """Read, detect, convert and describe `source` (a file, a directory or a hub id). `model_tensors`: the
    tensors a model of a config holds (`vitlab.models.factory.meta_state_dict`), against which a vitlab
    file whose tensors disagree with its own config is reported key by key."""
    path = resolve_source(source, cache_dir=cache_dir)
    raw, config, preproc = read_checkpoint(path)
    if "kind" in config:  # vitlab's own metadata (a checkpoint's config.json, an export's .json): its rules
        check_meta(config, _config_path(path))
    if not raw:
        raise VitlabError(f"{path} holds no tensors")
    fmt = detect_format(raw)
    if fmt == "timm" and vitlab_config(config):
        fmt = "vitlab"
    else:  # vitlab's own files may hold its hybrid stem or relative tables, which are in scope
        refuse_out_of_scope(raw, config, path)
    sd, notes = convert_state_dict(raw, fmt)
    check_tensors({k: v for k, v in sd.items() if k != "_jax_heads"}, path)  # floating point and finite, every one
    _check_mlp_shapes(sd, path)
    try:
        cfg = infer_config(sd, config)
    except VitlabError as e:
        raise VitlabError(f"{path}: {e}") from e
    sd.pop("_jax_heads", None)
    if fmt == "vitlab":
        _check_own_config(cfg, vitlab_config(config), sd, path, model_tensors)
    architecture = config.get("architecture") or (config.get("pretrained_cfg") or {}).get("architecture")
    pretrained_cfg, origin = _source_pretrained_cfg(fmt, config, preproc)
    return Checkpoint(
        state_dict=sd,
        format=fmt,
        config=cfg,
        pretrained_cfg=pretrained_cfg,
        path=str(path),
        architecture=architecture,
        stated={k: v for k, v in vitlab_config(config).items() if k not in ("num_classes", "img_size")},
        notes=notes,
        preprocessing=origin,
    )


# ----------------------------------------------------------------------------------------------------
# Relatives of the ViT that vitlab does not build: refused by name, with the keys that show them

OUT_OF_SCOPE = (
    # (the feature, as its papers name it; the keys that show it, in any layout)
    (
        "an attention-pooling head (MAP, as in SigLIP and big_vision's 'map' classifier)",
        r"(^|[./])(attn_pool|MAPHead_\d+)[./]",
    ),
    ("windowed attention in stages (Swin)", r"^layers\.\d+\.blocks\.\d+\."),
    ("windowed attention with decomposed relative positions (ViTDet, SAM)", r"attn\.rel_pos_[hw]$"),
    (
        "relative position biases (BEiT, ViT-relpos)",
        r"relative_position_(bias_table|index)|rel_pos_bias\.|attn\.rel_pos\.mlp",
    ),
    ("a SwiGLU MLP (DINOv2 ViT-g, EVA-02)", r"mlp\.(w12|w3|fc1_g|fc1_x|gate_proj|up_proj|weights_in|weights_out)\."),
    ("BEiT/EVA-style attention (separate q and v biases)", r"attn\.(q_bias|v_bias)$"),
    ("query-key normalisation (QK-norm)", r"attn\.(q_norm|k_norm)\."),
    ("extra LayerNorms inside the attention or MLP (NormFormer-style)", r"blocks\.\d+\.(attn|mlp)\.norm\."),
    ("class-attention layers (CaiT)", r"^blocks_token_only\."),
    ("parallel attention and MLP branches", r"^blocks\.\d+\.(attns|ffns)\."),
    ("a normalised patch embedding", r"^patch_embed\.norm\."),
    ("a CNN stem (hybrid R50+ViT and similar)", r"^patch_embed\.backbone\."),
)


def refuse_out_of_scope(keys, config: dict, path) -> None:
    """Raise a one-line VitlabError naming the feature, and the keys that show it, when a checkpoint is a
    ViT relative vitlab does not implement; return quietly otherwise. Runs on the file's own key names."""
    keys = list(keys)
    for feature, pattern in OUT_OF_SCOPE:
        shown = [k for k in keys if re.search(pattern, k)]
        if shown:
            _refuse(path, feature, shown)
    has_table = any(
        re.search(r"(^|\.)(pos_embed|position_embeddings|pos_embedding)", k)
        or k.endswith("posembed_input/pos_embedding")
        for k in keys
    )
    layer_scale_v1 = [k for k in keys if re.fullmatch(r"blocks\.\d+\.gamma_[12]", k)]
    if layer_scale_v1 and not has_table:  # timm's Eva / RoPE-ViT: LayerScale named gamma_1 and no position table
        _refuse(
            path,
            "rotary position embeddings (RoPE-ViT, EVA-02): no position table, and timm Eva's gamma_1",
            layer_scale_v1,
        )
    pool = config.get("global_pool") or (config.get("model_args") or {}).get("global_pool")
    if pool in ("max", "avgmax", "map"):
        _refuse(path, f"global_pool {pool!r} pooling", ["config.json: global_pool"])


def _refuse(path, feature: str, shown: list[str]) -> None:
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    raise VitlabError(
        f"{path}: this checkpoint has {feature}, which vitlab's ViT does not implement (keys: "
        f"{', '.join(shown[:3])}{more}); vitlab loads the paper's ViT and DeiT, DINO/DINOv2 and CLIP-style ViTs"
    )


def _check_mlp_shapes(sd: dict, path) -> None:
    """timm's packed SwiGLU (DINOv2 ViT-g) keeps the names fc1/fc2: fc1's output is twice fc2's input. Any
    other disagreement is a damaged file, which the key check reports tensor by tensor."""
    fc1, fc2 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.ndim == fc2.ndim == 2 and fc1.shape[0] == 2 * fc2.shape[1]:
        _refuse(
            path,
            f"a gated MLP (SwiGLU, as DINOv2 ViT-g: fc1 gives {fc1.shape[0]} channels, fc2 takes {fc2.shape[1]})",
            ["blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight"],
        )


# ----------------------------------------------------------------------------------------------------
# Checks and descriptions of what was read


def _check_own_config(inferred: dict, stored: dict, sd: dict, path, model_tensors: ModelTensors) -> None:
    """A vitlab file states its whole config: the tensors must be what it says (a head of 7 rows under a
    config of 10 classes is a damaged file, not a 7-class model)."""
    try:
        stated = ViTConfig(**stored)
    except (VitlabError, TypeError):
        return  # the config's own fields were checked where it was read
    # A hybrid's patch embedding is a 1x1 projection of the stem's feature map: its kernel is not the patch size
    # (the stem's downsampling is; the load itself checks every tensor's shape).
    stem_fields = ("patch_size",) if stated.stem == "hybrid" else ()
    diffs = [
        f"{f}: config {structural_value(stated, f)!r} vs tensors {inferred_value(inferred, f)!r}"
        for f in (*STRUCTURAL_FIELDS, "num_classes")
        if f not in stem_fields
        and inferred_value(inferred, f) is not None
        and (f != "num_classes" or "num_classes" in stored)
        and structural_value(stated, f) != inferred_value(inferred, f)
    ]
    if diffs:
        grid = inferred.get("grid_size")
        try:
            size = tuple(g * stated.patch_size for g in grid) if grid else stated.img_size
            report = diff_keys(model_tensors(stated.replace(img_size=size)), sd)
        except VitlabError:
            report = ""
        raise VitlabError(
            f"{path}: its tensors do not match its own config ({'; '.join(diffs)}{': ' + report if report else ''})"
            "; the file is damaged or was edited: use another checkpoint, or export this one again"
        )


def _config_path(path: Path) -> Path:
    """The config file read_checkpoint took for `path` (for messages)."""
    if path.is_dir():
        return path / "config.json"
    return path.with_suffix(".json") if path.with_suffix(".json").is_file() else path.parent / "config.json"


def _source_pretrained_cfg(fmt: str, config: dict, preproc: dict) -> tuple[PretrainedCfg, str]:
    """Preprocessing and class names as the source defines them, and where the preprocessing came from:
    "file" (its config), "layout" (its library's convention) or "default" (a bare timm-layout file)."""
    preset, origin = {
        "timm": ("timm", "default"),
        "vitlab": ("timm", "default"),
        "jax": ("jax", "layout"),
        "torchvision": ("torchvision", "layout"),
        "dinov2": ("dinov2_repo", "layout"),
    }.get(fmt, (fmt, "layout"))
    if fmt == "hf":  # each model type has its image processor's defaults
        model_type = config.get("model_type", "vit")
        preset = {"deit": "hf_deit", "dinov2": "hf_dinov2", "dinov2_with_registers": "hf_dinov2"}.get(model_type, "hf")
    out = dict(PREPROCESSING[preset])
    saved = config.get("pretrained_cfg") or {}
    for key in PREPROCESSING_FIELDS:
        if saved.get(key) is not None:
            out[key] = tuple(saved[key]) if isinstance(saved[key], list) else saved[key]
            origin = "file"
    if preproc:  # HF preprocessor_config.json
        origin = "file"
        if "image_mean" in preproc:
            out["mean"], out["std"] = tuple(preproc["image_mean"]), tuple(preproc["image_std"])
        out["interpolation"] = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}.get(
            preproc.get("resample"), out["interpolation"]
        )
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
    return PretrainedCfg(format=fmt, label_names=tuple(labels) if labels else None, **out), origin


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in the order of every 1000-class ImageNet head."""
    text = resources.files("vitlab").joinpath("resources/imagenet_classes.txt").read_text()
    names = text.splitlines()
    assert len(names) == 1000, f"resources/imagenet_classes.txt should have 1000 lines, has {len(names)}"
    return names


__all__ = [
    "Checkpoint",
    "PREPROCESSING_FIELDS",
    "OUT_OF_SCOPE",
    "load_checkpoint",
    "refuse_out_of_scope",
    "imagenet_class_names",
]
