"""Pretrained weights of any source, checked against the architecture and prepared for loading.

After `vitlab.weights.formats` has read a source and renamed its tensors to vitlab's names, this
module works out what they are and how they fit the model asked for:

    load_checkpoint(source)   read, detect, convert (formats.py); refuse a ViT relative vitlab does not
                              build (attention pooling, rotary or relative positions, windows, SwiGLU, ...)
                              naming the feature and its keys; infer_config(): the whole architecture
                              the tensors and the config file show; the source's preprocessing
    plan_load(ckpt, name)     the ViTConfig to build: the named model's, checked field by field (one
                              message lists every difference), or the checkpoint's own (the number of
                              heads, which no tensor shows, from the config or the family's rule, with a
                              warning); the state dict to load: the position table resampled for a new
                              img_size (Section 3.2, "2D interpolation of the pre-trained position
                              embeddings"), the head dropped for a new num_classes (a new zero head, Section 3.2)

`vitlab.create_model(name, pretrained=...)` builds the model from the plan; nothing here builds one.

What the tensors show (vitlab names): patch size, width and channels (patch_embed.proj), depth (blocks.i),
MLP width (fc1), qkv bias, the prefix tokens (cls_token, dist_token, reg_token), LayerScale (ls1.gamma),
CLIP's pre-norm (norm_pre) and bias-free patch embedding, the head (head, head_dist; its input width
says 'cls+mean'), GAP (fc_norm, or no class token), and the grid: the position table's rows are the
patches plus one row per prefix token, or the patches alone (`no_embed_class`). What they do not show
comes from a config file (Hugging Face's config.json, timm's config.json, vitlab's own JSON): the number
of heads, the image size of a non-square grid, LayerNorm's epsilon, the MLP's activation.

Each source preprocesses differently, and a mismatch silently costs accuracy (vision_transformer#39:
83.41% vs 85.08%), so the plan's `PretrainedCfg` carries the source's resize, crop, interpolation and
mean/std (`vitlab.models.pretrained_cfg.PREPROCESSING`); `vitlab.data.preprocess.eval_transform`
applies them.
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
from vitlab.models.pretrained_cfg import PREPROCESSING, PretrainedCfg
from vitlab.models.registry import VARIANTS, get_config
from vitlab.models.size import check_fits
from vitlab.models.vit import ACTS, VisionTransformer, ViTConfig
from vitlab.weights.checkpoint import check_meta
from vitlab.weights.formats import check_tensors, convert_state_dict, detect_format, read_checkpoint, resolve_source

# The ViTConfig fields a checkpoint fixes; a named model that disagrees on any of them cannot load it.
STRUCTURAL_FIELDS = (
    "patch_size",
    "in_chans",
    "dim",
    "depth",
    "heads",
    "mlp_dim",
    "qkv_bias",
    "class_token",
    "pool",
    "fc_norm",
    "pos_embed",
    "dist_token",
    "dist_head",
    "reg_tokens",
    "layer_scale",
    "no_embed_class",
    "pre_norm",
    "patch_bias",
    "act",
)
PREPROCESSING_FIELDS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "resize_backend")
LAYER_SCALE_INIT = 1e-5  # the initial gain of an inferred LayerScale (DINOv2's); the loaded gammas replace it


def _structural(cfg: ViTConfig, f: str):
    """A ViTConfig's value of a STRUCTURAL_FIELDS entry, with the defaults resolved (LayerScale: on/off)."""
    if f == "layer_scale":
        return cfg.layer_scale is not None
    return {"mlp_dim": cfg.hidden_dim, "fc_norm": cfg.use_fc_norm, "dist_head": cfg.use_dist_head}.get(
        f, getattr(cfg, f, None)
    )


def _inferred(inferred: dict, f: str):
    """The same for a checkpoint's inferred fields; None where the checkpoint does not say."""
    value = inferred.get(f)
    if f == "layer_scale":
        return value is not None if "layer_scale" in inferred else None
    return value


class PretrainedWarning(UserWarning):
    """Something about the loaded weights the user should know: a new head, a zero head, dropped parts,
    and what had to be assumed (the number of heads, the preprocessing) because the file does not say."""


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


@dataclass
class LoadPlan:
    """What `create_model` builds and loads: the configuration, the tensors, and the provenance."""

    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    strict: bool  # False when the head is left out (new, absent or none): it keeps its zero init
    pretrained_cfg: PretrainedCfg


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
# Configuration: what the tensors and the config file say


def infer_config(sd: dict[str, torch.Tensor], config: dict | None = None) -> dict:
    """ViTConfig fields (and `grid_size`, the position table's grid) read from a vitlab-named state dict
    and its config file. Fields the checkpoint does not determine (heads, for a timm or torchvision
    file without a config) are left out."""
    config = config or {}
    stored = _vitlab_config(config)
    cfg: dict = dict(stored)
    w = sd.get("patch_embed.proj.weight")
    if w is None:
        raise VitlabError("the checkpoint has no patch embedding (patch_embed.proj.weight or its equivalent)")
    if w.ndim == 4:  # (D, C, P, P)
        cfg.update(dim=w.shape[0], in_chans=w.shape[1], patch_size=w.shape[2])
    else:  # linear patch embedding (D, C*P*P), only written by vitlab, whose config says the rest
        cfg.update(dim=w.shape[0], patch_embed="linear")
    D = cfg["dim"]
    blocks = {int(m.group(1)) for k in sd if (m := re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.weight", k))}
    cfg["depth"] = next(
        i for i in range(len(blocks) + 1) if i not in blocks
    )  # blocks 0, 1, ...: a stray key is no block
    if not blocks:
        cfg["depth"] = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    if "blocks.0.mlp.fc2.weight" in sd:  # the MLP's width is what its second layer takes (a damaged fc1 is then named)
        cfg["mlp_dim"] = sd["blocks.0.mlp.fc2.weight"].shape[-1]
    elif "blocks.0.mlp.fc1.weight" in sd:
        cfg["mlp_dim"] = sd["blocks.0.mlp.fc1.weight"].shape[0]
    cfg["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd
    cfg["patch_bias"] = "patch_embed.proj.bias" in sd
    cfg["class_token"] = "cls_token" in sd
    cfg["dist_token"] = "dist_token" in sd
    cfg["reg_tokens"] = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    cfg["layer_scale"] = (stored.get("layer_scale") or LAYER_SCALE_INIT) if "blocks.0.ls1.gamma" in sd else None
    cfg["pre_norm"] = "norm_pre.weight" in sd
    head = sd.get("head.weight")
    cfg["num_classes"] = head.shape[0] if head is not None else 0
    if cfg["dist_token"] and head is not None:  # HF's DeiTForImageClassification reads the class token only
        cfg["dist_head"] = "head_dist.weight" in sd
    cfg["fc_norm"] = (
        "fc_norm.weight" in sd
    )  # mean pool: LayerNorm after it (timm) or before (JAX 'gap', timm's *_gap_*)
    if head is not None and head.shape[1] == 2 * D:
        cfg["pool"] = "cls+mean"  # DINOv2's linear head reads the class token and the mean patch token
    elif cfg["fc_norm"] or not cfg["class_token"]:
        cfg["pool"] = "mean"
    else:  # a class token and no fc_norm: the class token, unless a config says otherwise (GAP with fc_norm=False)
        cfg["pool"] = stored.get("pool", "cls")
    if "_jax_heads" in sd:
        cfg["heads"] = int(sd["_jax_heads"])
    _read_config_file(cfg, config)
    if "pos_embed" in sd:
        cfg.setdefault("pos_embed", "learned")
        prefix = int(cfg["class_token"]) + int(cfg["dist_token"]) + cfg["reg_tokens"]
        grid, no_embed_class = _pos_table_grid(sd["pos_embed"].shape[-2], prefix, cfg, stored.get("no_embed_class"))
        cfg["grid_size"], cfg["no_embed_class"] = grid, no_embed_class
        cfg.setdefault("img_size", tuple(g * cfg["patch_size"] for g in grid))
    elif "pos_embed_row" in sd:  # learned2d: a row table and a column table
        cfg["grid_size"] = (sd["pos_embed_row"].shape[1], sd["pos_embed_col"].shape[1])
    elif "rel_pos.0.table" in sd and "img_size" in cfg:  # relative: vitlab's own files, whose config has the size
        s = cfg["img_size"]
        cfg["grid_size"] = tuple(n // cfg["patch_size"] for n in ((s, s) if isinstance(s, int) else s))
    if "img_size" in cfg:
        s = cfg["img_size"]
        cfg["img_size"] = (s, s) if isinstance(s, int) else tuple(s)
    return cfg


def _read_config_file(cfg: dict, config: dict) -> None:
    """What only a config file says: Hugging Face's config.json, or timm's (model_args, global_pool)."""
    if "num_attention_heads" in config:  # Hugging Face
        cfg["heads"] = config["num_attention_heads"]
        cfg["norm_eps"] = config.get("layer_norm_eps", 1e-12)
        cfg["qkv_bias"] = config.get("qkv_bias", cfg["qkv_bias"])
        if config.get("hidden_act") in ACTS:
            cfg["act"] = config["hidden_act"]
        if "image_size" in config:
            cfg["img_size"] = config["image_size"]
    model_args = config.get("model_args") or {}  # timm: the arguments the model was created with
    for key, target in (("num_heads", "heads"), ("img_size", "img_size")):
        if key in model_args:
            cfg[target] = model_args[key]
    if model_args.get("act_layer") in ACTS:
        cfg["act"] = model_args["act_layer"]
    elif "quickgelu" in str(config.get("architecture", "")):  # timm's *_clip_quickgelu_* models: OpenAI's weights
        cfg["act"] = "quick_gelu"
    pool = config.get("global_pool", model_args.get("global_pool"))
    if pool == "avg" and cfg["class_token"] and cfg["pool"] == "cls":
        cfg["pool"] = "mean"  # timm GAP with fc_norm=False: the final LayerNorm, then the mean over patches
    if "img_size" not in cfg and "input_size" in (config.get("pretrained_cfg") or {}):
        cfg["img_size"] = tuple(config["pretrained_cfg"]["input_size"][1:])


def _vitlab_config(config: dict) -> dict:
    """The ViTConfig fields stored by vitlab: `{"kind": "vit", "config": {...}}` (vitlab.weights.checkpoint,
    vitlab.inference.export) or `vit_config`."""
    known = {f.name for f in fields(ViTConfig)}
    stored = config.get("config") if config.get("kind") == "vit" else None
    for candidate in (stored, config.get("vit_config")):
        if isinstance(candidate, dict) and {"dim", "depth", "heads"} <= set(candidate):
            return {k: v for k, v in candidate.items() if k in known}
    return {}


def _pos_table_grid(
    rows: int, prefix: int, cfg: dict, stored_no_embed_class: bool | None
) -> tuple[tuple[int, int], bool]:
    """(grid, no_embed_class) of a 1-D position table of `rows` rows: one row per prefix token and then
    the patches (the paper, DeiT, DINOv2), or the patches alone (DeiT III, DINOv2 with registers in
    timm's layout). The config's image size decides when there is one; otherwise the square grid."""
    options = [(rows - prefix, False)] + ([(rows, True)] if prefix else [])
    if stored_no_embed_class is not None:  # vitlab's own config says
        options = [o for o in options if o[1] == bool(stored_no_embed_class)]
    elif cfg["reg_tokens"]:  # registers usually come without position rows (timm, DINOv2): try that first
        options.reverse()
    img_size, patch = cfg.get("img_size"), cfg.get("patch_size")
    if img_size is not None and patch:
        h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
        for n, flag in options:
            if (h // patch) * (w // patch) == n:
                return (h // patch, w // patch), flag
    for n, flag in options:
        s = math.isqrt(max(n, 0))
        if n > 0 and s * s == n:
            return (s, s), flag
    tokens = _describe_prefix(cfg)
    counts = " or ".join(
        f"{n} ({'no rows for the prefix tokens' if flag else 'one row per prefix token'})" for n, flag in options
    )
    raise VitlabError(
        f"the position table has {rows} rows; this checkpoint has {prefix} prefix token(s) ({tokens}), which leaves "
        f"{counts} patch rows, and none of these is a square grid of patches; the config does not give the image "
        "size, so give it (img_size) to place the patches"
    )


def _describe_prefix(cfg: dict) -> str:
    parts = (["a class token"] if cfg.get("class_token") else []) + (
        ["a distillation token"] if cfg.get("dist_token") else []
    )
    if cfg.get("reg_tokens"):
        parts.append(f"{cfg['reg_tokens']} register tokens")
    return ", ".join(parts) or "none"


def _grid_of(n: int) -> tuple[int, int]:
    s = math.isqrt(n)
    if s * s != n:
        raise VitlabError(f"the position table has {n} patch rows, which is not a square grid; give old_grid")
    return s, s


# ----------------------------------------------------------------------------------------------------
# The family's rules, for what a bare weights file does not say

# Widths whose heads are not 64 wide: ViT-H (paper Table 1: 1280, 16 heads of 80) and ViT-g
# (Zhai et al. 2022: 1408, 16 heads of 88). Every other ViT, DeiT, DINO/DINOv2 and CLIP size has heads of 64.
HEADS_BY_WIDTH = {1280: 16, 1408: 16}


def heads_by_rule(dim: int) -> tuple[int, str] | None:
    """(heads, the rule) for a model of width `dim` from the family's naming rule, or None when no rule fits."""
    if dim in HEADS_BY_WIDTH:
        h = HEADS_BY_WIDTH[dim]
        return h, f"width {dim} is {'ViT-H' if dim == 1280 else 'ViT-g'}'s, with {h} heads of {dim // h}"
    if dim % 64 == 0:
        return dim // 64, "heads of width 64, as in every ViT, DeiT, DINO/DINOv2 and CLIP size but ViT-H and ViT-g"
    return None


def family_of(cfg: dict) -> tuple[str, str] | None:
    """(family, what in the tensors shows it) for the members whose preprocessing differs from timm's
    default, or None for a plain ViT."""
    if cfg.get("dist_token"):
        return "deit", "a distillation token"
    if cfg.get("layer_scale") is not None and cfg.get("class_token") and cfg.get("patch_size") == 14:
        return "dinov2", "LayerScale with 14-pixel patches"
    if (
        cfg.get("layer_scale") is not None
        and cfg.get("no_embed_class")
        and cfg.get("class_token")
        and not cfg.get("reg_tokens")
    ):
        return "deit3", "LayerScale and a position table without a class-token row"
    if cfg.get("pre_norm"):
        return "clip", "a LayerNorm before the blocks (norm_pre)"
    return None


# family: (its name, its preprocessing preset, the config fields no tensor shows, and how those read)
FAMILY_RULES = {
    "deit": ("DeiT", "deit", {}, ""),
    "deit3": ("DeiT III", "deit", {}, ""),
    "dinov2": ("DINOv2", "dinov2", {}, ""),
    "clip": (
        "CLIP",
        "clip",
        {"norm_eps": 1e-5},
        "LayerNorm eps 1e-5, and GELU in the MLP as timm's CLIP models (OpenAI's own weights use QuickGELU: "
        "name a *_clip_quickgelu_* model for them)",
    ),
}


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

    The prefix rows (class, distillation and register tokens; none with `no_embed_class`) are kept as
    they are; only the patch rows are resampled, as a D-channel image of the old grid. Grids may be non-square; `old_grid` defaults to a square one.
    """
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n, D = patches.shape[1], patches.shape[2]
    gh, gw = old_grid if old_grid is not None else _grid_of(n)
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


def resample_position_tables(
    sd: dict, old_grid: tuple[int, int], new_grid: tuple[int, int], *, num_prefix_tokens: int
) -> dict:
    """Every position table of `sd` (vitlab names) moved from `old_grid` to `new_grid`: the 1-D table
    by `resample_pos_embed`; learned2d's row and column tables each along its own axis (linear); the
    relative bias tables, per head an image of the (2gh-1) x (2gw-1) offsets, bicubic."""
    sd = dict(sd)
    (gh, gw), (nh, nw) = old_grid, tuple(new_grid)
    if "pos_embed" in sd:
        sd["pos_embed"] = resample_pos_embed(
            sd["pos_embed"], (nh, nw), old_grid=old_grid, num_prefix_tokens=num_prefix_tokens
        )
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
    if fmt == "timm" and _vitlab_config(config):
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
        _check_own_config(cfg, _vitlab_config(config), sd, path)
    architecture = config.get("architecture") or (config.get("pretrained_cfg") or {}).get("architecture")
    pretrained_cfg, origin = _source_pretrained_cfg(fmt, config, preproc)
    return Checkpoint(
        state_dict=sd,
        format=fmt,
        config=cfg,
        pretrained_cfg=pretrained_cfg,
        path=str(path),
        architecture=architecture,
        stated={k: v for k, v in _vitlab_config(config).items() if k not in ("num_classes", "img_size")},
        notes=notes,
        preprocessing=origin,
    )


def _check_own_config(inferred: dict, stored: dict, sd: dict, path) -> None:
    """A vitlab file states its whole config: the tensors must be what it says (a head of 7 rows under a
    config of 10 classes is a damaged file, not a 7-class model)."""
    try:
        stated = ViTConfig(**stored)
    except (VitlabError, TypeError):
        return  # the config's own fields were checked where it was read
    diffs = [
        f"{f}: config {_structural(stated, f)!r} vs tensors {_inferred(inferred, f)!r}"
        for f in (*STRUCTURAL_FIELDS, "num_classes")
        if _inferred(inferred, f) is not None
        and (f != "num_classes" or "num_classes" in stored)
        and _structural(stated, f) != _inferred(inferred, f)
    ]
    if diffs:
        grid = inferred.get("grid_size")
        try:
            size = tuple(g * stated.patch_size for g in grid) if grid else stated.img_size
            report = diff_keys(_meta_state_dict(stated.replace(img_size=size)), sd)
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

    name: a vitlab model name (`vitlab.model_names()`), whose architecture the checkpoint must match
        (one message lists every field that differs); None takes the architecture from the checkpoint:
        its tensors, its config file, and for what neither says (the number of heads, LayerNorm's
        epsilon, the preprocessing) the family's rule, with a PretrainedWarning that names the rule.
    num_classes: None keeps the checkpoint's head (none if it has none: the model returns features,
        unless `name` asks for a head); another number gets a new zero-initialised head (Section 3.2)
        and a PretrainedWarning; 0 leaves the head out (the model returns features).
    img_size: None keeps the named model's resolution; if it differs from the checkpoint's, the
        position tables are resampled (2-D bicubic for the 1-D table, prefix rows kept).
    overrides: other ViTConfig fields (e.g. drop_path=0.1), checked against the checkpoint like the rest.

    The plan's `pretrained_cfg` gives the source's preprocessing and class names, and says whether
    the head was loaded ("loaded"), is all zeros ("zero", e.g. an ImageNet-21k checkpoint), was
    absent ("absent"), is new ("new"), or was left out ("none").
    """
    inferred = {k: v for k, v in ckpt.config.items() if k != "grid_size"}
    named = name is not None
    notes = list(ckpt.notes)
    family = None if named else family_of(inferred)
    if named:  # the user named the architecture: the checkpoint must fit it
        base = get_config(name, **overrides)
        if not isinstance(base, ViTConfig):
            raise VitlabError(f"model {name!r} is a CNN baseline; pretrained ViT weights ({ckpt.path}) do not fit it")
    else:  # the checkpoint describes itself: its config file's architecture, corrected by its tensors
        name = ckpt.architecture if ckpt.architecture in VARIANTS and VARIANTS[ckpt.architecture].is_vit else None
        if name is None and "heads" not in inferred:
            inferred["heads"] = _heads_from_rule(inferred["dim"], ckpt, notes)
        known = {f.name for f in fields(ViTConfig)} - {"num_classes"}
        start = get_config(name) if name is not None else ViTConfig()
        ruled = _family_config(family, inferred, ckpt, notes) if name is None else {}
        try:
            base = start.replace(**{k: v for k, v in {**ruled, **inferred}.items() if k in known}).replace(**overrides)
        except VitlabError as e:  # the tensors describe no model: say which tensors do not fit, not why dim fails
            stated = _stated_config(start, ckpt)
            raise VitlabError(
                f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit "
                f"{name or 'the model its config describes'}: "
                f"{_key_report(stated, ckpt) or e}"
            ) from e
    _check_architecture(name, base, inferred, ckpt, named=named)

    ckpt_classes = inferred["num_classes"]
    head = _head_state(ckpt.state_dict, ckpt_classes)
    if num_classes is not None:
        target_classes = num_classes
    elif ckpt_classes > 0:
        target_classes = ckpt_classes
    else:  # no head in the file: features, unless the user named a model with a head
        target_classes = base.num_classes if named else 0
    target_size = img_size if img_size is not None else overrides.get("img_size", base.img_size)
    keep = {"norm_eps": inferred["norm_eps"]} if "norm_eps" in inferred and "norm_eps" not in overrides else {}
    cfg = base.replace(num_classes=target_classes, img_size=target_size, **keep)
    check_fits(cfg, what=f"the model of {ckpt.path}")  # before a position table is resampled to a size that cannot fit

    sd = dict(ckpt.state_dict)
    old_grid = ckpt.grid_size
    if (
        old_grid is not None
        and tuple(old_grid) != cfg.grid_size
        and cfg.pos_embed in ("learned", "learned2d", "relative")
    ):
        sd = resample_position_tables(sd, old_grid, cfg.grid_size, num_prefix_tokens=cfg.num_pos_prefix_tokens)
        notes.append(
            f"position embedding ({cfg.pos_embed}) resampled from a {old_grid[0]}x{old_grid[1]} to a {cfg.grid_size[0]}x{cfg.grid_size[1]} grid"
        )
    if target_classes != ckpt_classes or head == "absent":
        for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
            sd.pop(key, None)
        if target_classes == 0:  # a feature extractor: no head at all
            notes.append("no head (num_classes=0): the model returns the pooled features")
            head = "none"
        elif head != "absent":
            _warn(
                f"{ckpt.path}: the checkpoint's head has {ckpt_classes} classes; made a new zero-initialised head for {target_classes} classes"
            )
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

    preprocessing = _plan_preprocessing(ckpt, name, family, notes, inferred)
    labels = ckpt.pretrained_cfg.label_names if head in ("loaded", "zero") else None
    if labels is not None and len(labels) != target_classes:
        labels = None
    if labels is None and target_classes == 1000 and head in ("loaded", "zero"):
        labels = tuple(imagenet_class_names())
    pcfg = ckpt.pretrained_cfg.replace(
        **preprocessing,
        input_size=(cfg.in_chans, *cfg.img_size),
        num_classes=target_classes,
        label_names=labels,
        source=str(source if source is not None else ckpt.path),
        architecture=name,
        head=head,
        notes=tuple(notes),
    )
    return LoadPlan(config=cfg, state_dict=sd, strict=strict, pretrained_cfg=pcfg)


def _heads_from_rule(dim: int, ckpt: Checkpoint, notes: list[str]) -> int:
    """The number of heads of a checkpoint that does not say it, from the family's rule (with a warning)."""
    rule = heads_by_rule(dim)
    if rule is None:
        raise VitlabError(
            f"{ckpt.path}: the checkpoint does not say its number of heads, and its width {dim} fits no rule of the "
            "ViT family (heads of width 64); name the model (model=..., e.g. vit_base_patch16_224) or put its "
            "config.json next to the weights",
            arg="model",
        )
    heads, why = rule
    note = f"the checkpoint does not say its number of heads: {heads}, from the family's rule ({why})"
    notes.append(note)
    _warn(f"{ckpt.path}: {note}; if that is wrong, name the model or put its config.json next to the weights")
    return heads


def _family_config(family, inferred: dict, ckpt: Checkpoint, notes: list[str]) -> dict:
    """The config fields no tensor shows (CLIP's LayerNorm eps) from the family's rule, with a warning."""
    if family is None:
        return {}
    label, _, config, text = FAMILY_RULES[family[0]]
    ruled = {k: v for k, v in config.items() if k not in inferred}
    if ruled:
        note = f"the tensors show {family[1]}, a {label} model, and the file does not say the rest: taken as {label}'s, {text}"
        notes.append(note)
        _warn(f"{ckpt.path}: {note}")
    return ruled


def bare_file_preprocessing(cfg: dict, family) -> tuple[dict, list[str]]:
    """The preprocessing of a file that does not say it, from what its tensors show, following the conventions
    of the models it looks like, as timm's pretrained configs give them (timm 1.0.31,
    `timm.create_model(name).pretrained_cfg`). Returns (the preprocessing fields, the rules that decided
    them, each with the models it follows; none: timm's default, bicubic, crop 0.9, mean = std = 0.5).

    - the family the tensors show (`family_of`): DeiT's, DINOv2's or CLIP's mean and std (CLIP-style towers:
      OpenAI CLIP's, as every vit_*_clip_* of timm); an image-text CLIP tower keeps OpenAI's crop 1.0;
    - a CLIP-style tower with an ImageNet-1k head at 224 px: crop 0.95, as timm's vit_base_patch16_clip_224
      (laion2b_ft_in12k_in1k, openai_ft_in12k_in1k: its default weights);
    - a GAP ViT at 256 px with a classifier (no class token, the mean of the patch tokens): crop 0.95, as timm's
      vit_medium_patch16_gap_256 (sw_in12k_ft_in1k) and the *_gap_256 ViTs of its SBB family;
    - a model at 384 px or more: crop 1.0, as timm's vit_{tiny,small,base,large}_patch*_384 (augreg), deit_base_patch16_384
      and the CLIP fine-tunes at 336-448 px: at that size the whole image is the input.
    """
    out = dict(PREPROCESSING["timm"])
    rules = []
    if family is not None:
        label, preset, _, _ = FAMILY_RULES[family[0]]
        out = dict(PREPROCESSING[preset])
        rules.append(f"{family[1]}, a {label} model: {label}'s preprocessing")
    size = cfg.get("img_size") or (224, 224)
    side = min(size) if isinstance(size, (tuple, list)) else size
    classes = cfg.get("num_classes", 0)
    if family is not None and family[0] == "clip" and classes == 1000 and side == 224:
        out["crop_pct"] = 0.95
        rules.append(
            "an ImageNet-1k head on a CLIP tower at 224 px: crop 0.95, as timm's vit_base_patch16_clip_224 "
            "(laion2b_ft_in12k_in1k)"
        )
    if not cfg.get("class_token") and cfg.get("pool") == "mean" and side == 256 and classes:
        out["crop_pct"] = 0.95
        rules.append(
            "a GAP ViT at 256 px (no class token, the mean of the patches): crop 0.95, as timm's "
            "vit_medium_patch16_gap_256"
        )
    if side >= 384:
        out["crop_pct"] = 1.0
        rules.append(
            f"{side} px images: crop 1.0, as timm's ViTs at 384 px (vit_base_patch16_384.augreg_in21k_ft_in1k)"
        )
    return out, rules


def _plan_preprocessing(ckpt: Checkpoint, name: str | None, family, notes: list[str], inferred: dict) -> dict:
    """The preprocessing fields to use. A bare timm-layout file says none: the named model's source's
    (registry), else what its structure shows (`bare_file_preprocessing`, with a warning that says so and
    how to override it)."""
    if ckpt.preprocessing != "default":
        return {}
    if name is not None:
        pcfg = VARIANTS[name].pretrained_cfg
        return {f: getattr(pcfg, f) for f in PREPROCESSING_FIELDS}
    p, rules = bare_file_preprocessing(inferred, family)
    if not rules:
        return {}
    what = f"{p['interpolation']}, crop_pct {p['crop_pct']}, mean {tuple(p['mean'])}, std {tuple(p['std'])}"
    note = (
        f"the file does not say how its images were preprocessed; inferred from its tensors ({'; '.join(rules)}): "
        f'{what}. If it was trained otherwise, put a config.json next to it with "pretrained_cfg": '
        '{"mean": [...], "std": [...], "crop_pct": ...} (timm\'s hub layout), or name the model (model=..., --model)'
    )
    notes.append(note)
    _warn(f"{ckpt.path}: {note}")
    return p


def _head_state(sd: dict, num_classes: int) -> str:
    if "head.weight" not in sd or num_classes == 0:
        return "absent"
    if not sd["head.weight"].any() and ("head.bias" not in sd or not sd["head.bias"].any()):
        return "zero"
    return "loaded"


def _warn(message: str) -> None:
    warnings.warn(message, PretrainedWarning, stacklevel=4)


def _check_architecture(name: str | None, cfg: ViTConfig, inferred: dict, ckpt: Checkpoint, *, named: bool) -> None:
    """The model's structure must be the checkpoint's: one message lists every field that differs,
    and how to load the file instead."""
    diffs = []  # (field, "model ... vs checkpoint ...", the checkpoint's value)
    for f in STRUCTURAL_FIELDS:
        theirs = _inferred(inferred, f)
        if theirs is None:  # the checkpoint does not say (heads without a config, mlp_dim of a linear stem, ...)
            continue
        if _structural(cfg, f) != theirs:
            mine = getattr(cfg, f) if f == "layer_scale" else _structural(cfg, f)
            diffs.append((f, f"model {mine!r} vs checkpoint {inferred[f]!r}", inferred[f]))
    if diffs and "fc_norm" in inferred and all(f != "fc_norm" for f, _, _ in diffs):
        # fc_norm's default follows pool: with the other fixes applied it may be the one left to differ
        pool = next((t for f, _, t in diffs if f == "pool"), cfg.pool)
        fixed = (pool == "mean") if cfg.fc_norm is None else cfg.fc_norm
        if fixed != inferred["fc_norm"]:
            diffs.append(
                (
                    "fc_norm",
                    f"model {fixed!r} once pool is {pool!r} vs checkpoint {inferred['fc_norm']!r}",
                    inferred["fc_norm"],
                )
            )
    if not diffs:
        return
    listing = ", ".join(f"{f}: {text}" for f, text, _ in diffs)
    fix = ", ".join(f"{f}={t!r}" for f, _, t in diffs)
    like = _matching_variants(inferred)
    hint = f" (it looks like {', '.join(like)})" if like else ""
    what = f"model {name!r}" if named else "the model asked for"
    try:  # the overrides are offered only when some model has them (not dim 7 with 4 heads)
        cfg.replace(**{f: t for f, _, t in diffs})
        also = f"; from Python, the overrides {fix} also fit it"
    except VitlabError:
        also = ""
    raise VitlabError(
        f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit {what}: {listing}. Leave the model name out "
        f"and the architecture is read from the checkpoint, or name the model it was trained as{hint}{also}. "
        + _key_report(cfg, ckpt)
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
        if all(
            _structural(variant.config, f) == _inferred(inferred, f)
            for f in STRUCTURAL_FIELDS
            if _inferred(inferred, f) is not None
        ):
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
        model_sd = _meta_state_dict(
            cfg.replace(img_size=size, num_classes=ckpt.config.get("num_classes", cfg.num_classes))
        )
    except VitlabError:
        return ""
    return diff_keys(model_sd, ckpt.state_dict)


def diff_keys(model_sd: dict, sd: dict, skip: tuple[str, ...] = ()) -> str:
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
    skip = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias") if skip_head else ()
    report = diff_keys(_meta_state_dict(cfg), sd, skip)
    if report:
        what = f"model {name!r}" if name else "the model its tensors and config describe"
        raise VitlabError(f"checkpoint {ckpt.path} ({ckpt.format} layout) does not load into {what}: {report}")


__all__ = [
    "Checkpoint",
    "LoadPlan",
    "PretrainedWarning",
    "PREPROCESSING",
    "STRUCTURAL_FIELDS",
    "OUT_OF_SCOPE",
    "infer_config",
    "heads_by_rule",
    "family_of",
    "refuse_out_of_scope",
    "resample_pos_embed",
    "resample_position_tables",
    "load_checkpoint",
    "plan_load",
    "imagenet_class_names",
    "diff_keys",
    "bare_file_preprocessing",
]
