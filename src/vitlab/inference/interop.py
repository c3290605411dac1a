"""A model's weights out to the two libraries ViT users load from: a timm hub folder and a Hugging Face
`save_pretrained` folder, each checked by loading it with that library when the library is installed.

    export_folder(model, "out/vit-timm", format="timm")
        config.json in timm's hub schema (architecture, num_classes, model_args, pretrained_cfg) and
        model.safetensors (timm's names are vitlab's): timm.create_model("local-dir:out/vit-timm",
        pretrained=True) builds the model with its fine-tuned head and its preprocessing, and so does
        transformers' AutoModelForImageClassification.from_pretrained("out/vit-timm") (TimmWrapper).
    export_folder(model, "out/vit-hf", format="hf")
        config.json (ViTConfig, with id2label), model.safetensors (the names of
        `vitlab.weights.formats.to_hf_state_dict`, the table the loader reads the other way) and
        preprocessor_config.json: transformers.ViTForImageClassification.from_pretrained and
        AutoImageProcessor.from_pretrained load it.

What the other library has no counterpart for is refused by name before anything is written (transformers'
ViT has no registers, LayerScale, distillation token, mean pooling or CLIP's pre-norm; timm's ViT no 2-D,
sine-cosine or relative position tables and no hybrid stem). The check loads the folder with the library
and compares its logits with the model's on random images: at most `CHECK_TOLERANCE` apart (fp32).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from vitlab.errors import VitlabError
from vitlab.fileio import whole_folder, write_json
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.models.vit import ViTConfig
from vitlab.weights.formats import to_hf_state_dict

FORMATS = ("timm", "hf")
CHECK_TOLERANCE = 1e-4  # max abs difference of the logits, the other library vs vitlab (fp32)
PIL_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3}  # PIL.Image.Resampling, as HF stores it


def export_folder(model: nn.Module, out, *, format: str, check: bool = True) -> dict:
    """Write `model` as a `format` ("timm" or "hf") folder at `out`, written whole (a failed export leaves
    nothing). Returns a report: the files written and, when checked, the max abs difference of the logits."""
    if format not in FORMATS:
        raise VitlabError(f"format must be one of {', '.join(FORMATS)}; found {format!r}", arg="format")
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ViTConfig):
        raise VitlabError(f"--format {format}: only a ViT exports to {format}; this model is {type(model).__name__}")
    out = Path(out).expanduser()
    model = copy.deepcopy(model).eval().float().cpu()  # the caller's model stays as it is
    config = timm_config(model) if format == "timm" else hf_config(model)  # refusals before any file is written
    tensors = conv_patch_embed(model.state_dict(), cfg)
    if format == "hf":
        tensors = to_hf_state_dict(tensors)
    with whole_folder(out, kind=f"export-{format}") as tmp:
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        write_json(tmp / "config.json", config)
        if format == "hf":
            write_json(tmp / "preprocessor_config.json", hf_preprocessor_config(model_pretrained_cfg(model), cfg))
        if check:
            report = {"max_abs_diff": (check_timm if format == "timm" else check_hf)(model, tmp)}
    files = ["config.json", "model.safetensors"] + (["preprocessor_config.json"] if format == "hf" else [])
    report = {**(report if check else {}), "files": [str(out / f) for f in files]}
    if report.get("max_abs_diff") is not None:
        report["tolerance"] = CHECK_TOLERANCE
    return report


def model_pretrained_cfg(model: nn.Module) -> PretrainedCfg:
    """The model's PretrainedCfg; a model built without create_model gets the defaults at its own size."""
    cfg = model.cfg
    fallback = PretrainedCfg(input_size=(cfg.in_chans, *cfg.img_size), num_classes=cfg.num_classes)
    return getattr(model, "pretrained_cfg", None) or fallback


def conv_patch_embed(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """The state dict with a `linear` patch embedding as the Conv2d both libraries have: the flattening
    order is the kernel's (C, P, P), so the weight is reshaped (D, C*P*P) -> (D, C, P, P)."""
    if cfg.patch_embed != "linear":
        return dict(sd)
    w = sd["patch_embed.proj.weight"]
    return {**sd, "patch_embed.proj.weight": w.reshape(w.shape[0], cfg.in_chans, cfg.patch_size, cfg.patch_size)}


def _refuse(format: str, model: nn.Module, library: str, features: list[str]) -> None:
    if features:
        name = model_pretrained_cfg(model).architecture or "this model"
        raise VitlabError(
            f"--format {format}: {name} has {', '.join(features)}, which {library} has no counterpart for; "
            "export it as .safetensors (vitlab, timm's names) instead"
            + ("" if format == "timm" else ", or --format timm"),
            arg="format",
        )


# ----------------------------------------------------------------------------------------------------
# timm


def timm_architecture(cfg: ViTConfig) -> tuple[str, dict]:
    """(the timm model name whose class and LayerNorm this config needs, its model_args). timm builds the
    name's model with these arguments, so the name only has to bring what no argument says: the class
    (VisionTransformerDistilled for a distillation token) and the LayerNorm epsilon (1e-5: CLIP's)."""
    args = dict(
        img_size=list(cfg.img_size),
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.dim,
        depth=cfg.depth,
        num_heads=cfg.heads,
        mlp_ratio=cfg.hidden_dim / cfg.dim,
        qkv_bias=cfg.qkv_bias,
        class_token=cfg.class_token,
        global_pool="token" if cfg.pool == "cls" else "avg",
        fc_norm=cfg.use_fc_norm,
        reg_tokens=cfg.reg_tokens,
        no_embed_class=cfg.no_embed_class,
        pre_norm=cfg.pre_norm,
        init_values=cfg.layer_scale,
        act_layer=cfg.act,
        pos_embed="learn" if cfg.pos_embed == "learned" else "none",
    )
    if cfg.dist_token:
        return "deit_base_distilled_patch16_224", args
    return ("vit_base_patch16_clip_224" if math.isclose(cfg.norm_eps, 1e-5) else "vit_base_patch16_224"), args


def timm_config(model: nn.Module) -> dict:
    """config.json of a timm hub folder (timm's `push_to_hf_hub` schema), after the refusals."""
    cfg = model.cfg
    features = []
    if cfg.pos_embed not in ("learned", "none"):
        features.append(f"pos_embed {cfg.pos_embed!r} (timm's ViT has a learned 1-D table or none)")
    if cfg.stem == "hybrid":
        features.append("a hybrid CNN stem (vitlab's own)")
    if cfg.pool == "cls+mean":
        features.append("pool 'cls+mean'")
    if cfg.patch_bias == cfg.pre_norm:
        features.append(
            f"pre_norm={cfg.pre_norm} with patch_bias={cfg.patch_bias} (timm ties them: bias = not pre_norm)"
        )
    if cfg.dist_token and not cfg.use_dist_head:
        features.append("a distillation token without its head")
    if cfg.dist_token and not math.isclose(cfg.norm_eps, 1e-6):
        features.append(f"a distillation token with LayerNorm eps {cfg.norm_eps}")
    if not any(math.isclose(cfg.norm_eps, e) for e in (1e-5, 1e-6)):
        features.append(f"LayerNorm eps {cfg.norm_eps} (timm's ViTs have 1e-6, its CLIP towers 1e-5)")
    _refuse("timm", model, "timm's VisionTransformer", features)
    architecture, model_args = timm_architecture(cfg)
    # num_classes at the top level only, as timm's hub writer puts it: transformers' TimmWrapper passes
    # num_labels as num_classes beside **model_args, so a second one there is a TypeError.
    model_args.pop("num_classes")
    if cfg.dynamic_img_size:  # timm's loader then reads fixed_input_size False, as vitlab's pretrained_cfg says
        model_args["dynamic_img_size"] = True
        if cfg.dynamic_img_pad:
            model_args["dynamic_img_pad"] = True
    pcfg = model_pretrained_cfg(model).to_timm()
    for key in ("architecture", "hf_hub_id", "label_names"):
        pcfg.pop(key, None)
    out = {
        "architecture": architecture,
        "num_classes": cfg.num_classes,
        "num_features": cfg.dim,
        "global_pool": model_args["global_pool"],
        "model_args": model_args,
        "pretrained_cfg": {k: list(v) if isinstance(v, tuple) else v for k, v in pcfg.items()},
    }
    labels = model_pretrained_cfg(model).label_names
    if labels is not None and len(labels) == cfg.num_classes:
        out["label_names"] = list(labels)
    return out


def check_timm(model: nn.Module, folder) -> float | None:
    """Max abs difference of timm's logits (the folder loaded by timm.create_model("local-dir:...")) and
    the model's; None when timm is not installed. Over CHECK_TOLERANCE is an error."""
    if importlib.util.find_spec("timm") is None:
        return None
    import timm

    try:
        theirs = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    except Exception as e:  # timm's errors are many
        raise VitlabError(f"--format timm: timm cannot load the export: {type(e).__name__}: {e}") from e
    return _compare(model, lambda x: theirs(x), "timm")


# ----------------------------------------------------------------------------------------------------
# Hugging Face transformers


def hf_config(model: nn.Module) -> dict:
    """config.json of a ViTForImageClassification, after the refusals."""
    cfg = model.cfg
    checks = [
        (cfg.dist_token, "a distillation token (DeiT)"),
        (cfg.reg_tokens > 0, f"{cfg.reg_tokens} register tokens"),
        (cfg.layer_scale is not None, "LayerScale"),
        (cfg.pre_norm, "a LayerNorm before the first block (CLIP's pre-norm)"),
        (not cfg.patch_bias, "a patch embedding without bias"),
        (cfg.no_embed_class, "a position table without the class token's row"),
        (cfg.pos_embed != "learned", f"pos_embed {cfg.pos_embed!r}"),
        (cfg.pool != "cls", f"pool {cfg.pool!r}"),
        (cfg.use_fc_norm, "a LayerNorm after pooling (fc_norm)"),
        (cfg.stem == "hybrid", "a hybrid CNN stem"),
        (cfg.num_classes == 0, "no head (num_classes 0; ViTForImageClassification has one)"),
    ]
    _refuse("hf", model, "transformers' ViT (ViTForImageClassification)", [what for bad, what in checks if bad])
    labels = model_pretrained_cfg(model).label_names
    if labels is None or len(labels) != cfg.num_classes:
        labels = [f"LABEL_{i}" for i in range(cfg.num_classes)]
    return {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.hidden_dim,
        "hidden_act": cfg.act,  # "gelu" (exact) and "quick_gelu" are both transformers' ACT2FN names
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": cfg.norm_eps,
        "image_size": cfg.img_size[0] if cfg.img_size[0] == cfg.img_size[1] else list(cfg.img_size),
        "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": cfg.patch_size,
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "torch_dtype": "float32",
    }


def hf_preprocessor_config(pcfg, cfg: ViTConfig) -> dict:
    """preprocessor_config.json doing the model's eval preprocessing: ViTImageProcessor (both sides to the
    input size) for a squash without crop; DeiTImageProcessor (both sides, then a centre crop) for a squash
    with one; BitImageProcessor (the short side, then a centre crop) for timm's "center" mode."""
    H, W = cfg.img_size
    common = {
        "do_resize": True,
        "resample": PIL_RESAMPLE[pcfg.interpolation],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(pcfg.mean),
        "image_std": list(pcfg.std),
    }
    if pcfg.crop_mode == "squash" and pcfg.crop_pct == 1.0:
        return {"image_processor_type": "ViTImageProcessor", **common, "size": {"height": H, "width": W}}
    crop = {"do_center_crop": True, "crop_size": {"height": H, "width": W}}
    if pcfg.crop_mode == "squash":
        size = {"height": int(H / pcfg.crop_pct), "width": int(W / pcfg.crop_pct)}
        return {"image_processor_type": "DeiTImageProcessor", **common, "size": size, **crop}
    size = {"shortest_edge": int(math.floor(min(H, W) / pcfg.crop_pct))}  # timm's scale_size
    return {"image_processor_type": "BitImageProcessor", **common, "size": size, **crop, "do_convert_rgb": True}


def check_hf(model: nn.Module, folder) -> float | None:
    """Max abs difference of transformers' logits (ViTForImageClassification.from_pretrained on the folder)
    and the model's; None when transformers is not installed."""
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers import ViTForImageClassification
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar, for the one load of the check
    try:
        theirs = ViTForImageClassification.from_pretrained(str(folder)).eval()
    except Exception as e:
        raise VitlabError(f"--format hf: transformers cannot load the export: {type(e).__name__}: {e}") from e
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return _compare(model, lambda x: theirs(pixel_values=x).logits, "transformers")


def _compare(model: nn.Module, theirs, library: str) -> float:
    C, H, W = model.cfg.in_chans, *model.cfg.img_size
    x = torch.randn(2, C, H, W, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = float((theirs(x) - model(x)).abs().max())
    if not diff <= CHECK_TOLERANCE:  # NaN compares false: it fails too
        raise VitlabError(
            f"export checked with {library}: its logits differ from vitlab's by {diff:.2e} (max abs), over the "
            f"tolerance {CHECK_TOLERANCE:.0e}; nothing was written"
        )
    return diff


__all__ = [
    "FORMATS",
    "CHECK_TOLERANCE",
    "export_folder",
    "conv_patch_embed",
    "model_pretrained_cfg",
    "timm_architecture",
    "timm_config",
    "check_timm",
    "hf_config",
    "hf_preprocessor_config",
    "check_hf",
]
