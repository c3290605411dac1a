"""What a converted checkpoint is: the architecture read from its tensors and its config file, and the
family's rules for what neither says.

What the tensors show (vitlab names): patch size, width and channels (patch_embed.proj), depth (blocks.i),
MLP width (fc1), qkv bias, the prefix tokens (cls_token, dist_token, reg_token), LayerScale (ls1.gamma),
CLIP's pre-norm (norm_pre) and bias-free patch embedding, the head (head, head_dist; its input width
says 'cls+mean'), GAP (fc_norm, or no class token), and the grid: the position table's rows are the
patches plus one row per prefix token, or the patches alone (`no_embed_class`). What they do not show
comes from a config file (Hugging Face's config.json, timm's config.json, vitlab's own JSON): the number
of heads, the image size of a non-square grid, LayerNorm's epsilon, the MLP's activation. What no file
says comes from the family's rules (`heads_by_rule`, `family_of`, `bare_file_preprocessing`), which
`vitlab.weights.plan` applies with a warning that names the rule.

Nothing here builds a model: a config is compared with a file through the tensors a model of it holds
(`ModelTensors`, given by the caller; `vitlab.models.factory.meta_state_dict`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import fields

import torch

from vitlab.errors import VitlabError
from vitlab.models.pretrained_cfg import PREPROCESSING
from vitlab.models.vit import ACTS, ViTConfig

LAYER_SCALE_INIT = 1e-5  # the initial gain of an inferred LayerScale (DINOv2's); the loaded gammas replace it


# ----------------------------------------------------------------------------------------------------
# Configuration: what the tensors and the config file say


def infer_config(sd: dict[str, torch.Tensor], config: dict | None = None) -> dict:
    """ViTConfig fields (and `grid_size`, the position table's grid) read from a vitlab-named state dict
    and its config file. Fields the checkpoint does not determine (heads, for a timm or torchvision
    file without a config) are left out."""
    config = config or {}
    stored = vitlab_config(config)
    cfg: dict = dict(stored)
    w = sd.get("patch_embed.proj.weight")
    if w is None:
        raise VitlabError("the checkpoint has no patch embedding (patch_embed.proj.weight or its equivalent)")
    if w.ndim == 4 and "patch_embed.backbone.stem.0.weight" in sd:  # a hybrid: a 1x1 projection of the stem's map
        stem = sd["patch_embed.backbone.stem.0.weight"]  # (width, C, 3, 3)
        cfg.update(dim=w.shape[0], in_chans=stem.shape[1], stem="hybrid", stem_width=stem.shape[0])
    elif w.ndim == 4:  # (D, C, P, P)
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


def vitlab_config(config: dict) -> dict:
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
    - a model at 384 px or more: crop 1.0, as timm's vit_{tiny,small,base,large}_patch*_384 (augreg),
      deit_base_patch16_384 and the CLIP fine-tunes at 336-448 px: at that size the whole image is the input.
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


# ----------------------------------------------------------------------------------------------------
# Comparing a config with a checkpoint: the fields it fixes, the tensors a model of the config holds

# The tensors (shapes only, on the meta device) a model of a config holds: what a file is checked against.
ModelTensors = Callable[[ViTConfig], dict[str, torch.Tensor]]

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


def structural_value(cfg: ViTConfig, f: str):
    """A ViTConfig's value of a STRUCTURAL_FIELDS entry, with the defaults resolved (LayerScale: on/off)."""
    if f == "layer_scale":
        return cfg.layer_scale is not None
    return {"mlp_dim": cfg.hidden_dim, "fc_norm": cfg.use_fc_norm, "dist_head": cfg.use_dist_head}.get(
        f, getattr(cfg, f, None)
    )


def inferred_value(inferred: dict, f: str):
    """The same for a checkpoint's inferred fields; None where the checkpoint does not say."""
    value = inferred.get(f)
    if f == "layer_scale":
        return value is not None if "layer_scale" in inferred else None
    return value


def diff_keys(model_sd: dict, sd: dict, skip: tuple[str, ...] = ()) -> str:
    """Missing keys, unexpected keys and shape differences of `sd` against a model's state dict, in one
    line (at most 8 of each); "" when they agree. `skip`: keys the model may miss (a new head)."""
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


__all__ = [
    "ModelTensors",
    "STRUCTURAL_FIELDS",
    "LAYER_SCALE_INIT",
    "structural_value",
    "inferred_value",
    "diff_keys",
    "infer_config",
    "vitlab_config",
    "HEADS_BY_WIDTH",
    "heads_by_rule",
    "family_of",
    "FAMILY_RULES",
    "bare_file_preprocessing",
]
