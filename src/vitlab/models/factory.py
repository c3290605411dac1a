"""`create_model`: the one door to a model, for the library, every command, experiment and the page.

    create_model("vit_base_patch16_224")                                 # random init, the registry's config
    create_model("vit_base_patch16_224", pretrained="hf-hub:timm/...")   # weights from any source
    create_model(pretrained="model.safetensors")                         # the architecture read from the file
    create_model(checkpoint="runs/digits")                               # a vitlab run (its last.json), any kind
    create_model("vit_mini", num_classes=5, img_size=64, drop_path=0.1)  # checked overrides
    create_model("vit_small_patch16_224", pretrained=True)               # timm's default weights, local cache
    create_model("vit_small_patch16_224", drop_path_rate=0.1, embed_dim=192, num_heads=3)  # timm's keywords
    create_model("vit_base_patch16_224", dynamic_img_size=True)          # any image size, as timm's
    create_model("vit_base_patch16_224", features_only=True, out_indices=(3, 7, 11))  # timm's feature maps

The arguments mean the same whatever the source: `name` is a registered model (vitlab.model_names()),
checked field by field against the weights when both are given; `num_classes` different from the
weights' gives a new zero-initialised head (paper Section 3.2); `img_size` different from the weights'
resamples the position embedding (Section 3.2); `in_chans` different from the weights' adapts the patch
projection (`vitlab.weights.plan.adapt_input_conv`); `overrides` are other config fields, by vitlab's
names or timm's (`TIMM_KEYWORDS`; `dynamic_img_size` and `dynamic_img_pad` are fields).
`features_only=True` wraps the ViT in `FeatureGetter`, timm's FeatureGetterNet: a list of block outputs
(`out_indices`, default the last 3) as maps, `feature_info` to describe them. As in timm,
`pretrained=False` is a random init and `pretrained=True` the variant's default weights (its
`pretrained_cfg.hf_hub_id`), read from the local Hugging Face cache only. Every model comes
with a typed `model.pretrained_cfg` (vitlab.models.pretrained_cfg.PretrainedCfg): its preprocessing,
class names and provenance. Loaded weights come in eval mode; a new model in train mode.

This is the one place outside the model files that constructs a model class (tests/test_layout.py reads
every module): `build_on_meta` gives the shapes-only model that counting and FLOP tracing need, and
`meta_state_dict` the tensors vitlab.weights checks a file against, so vitlab.weights never builds one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vitlab.errors import VitlabError, check_range
from vitlab.models.cnn import ResNetConfig, ResNetMini
from vitlab.models.features import FeatureGetter, feature_options
from vitlab.models.registry import get_config, get_variant
from vitlab.models.size import check_fits
from vitlab.models.vit import VisionTransformer, ViTConfig
from vitlab.weights import checkpoint as ckpt_format
from vitlab.weights.formats import find_in_hub_cache, is_hub_id
from vitlab.weights.infer import diff_keys
from vitlab.weights.plan import plan_load
from vitlab.weights.source import load_checkpoint

# timm's create_model keywords -> ViTConfig fields (timm's global_pool values are translated by GLOBAL_POOLS)
TIMM_KEYWORDS = {
    "embed_dim": "dim",
    "num_heads": "heads",
    "drop_rate": "dropout",
    "attn_drop_rate": "attn_dropout",
    "drop_path_rate": "drop_path",
    "init_values": "layer_scale",
    "global_pool": "pool",
}
GLOBAL_POOLS = {"token": "cls", "avg": "mean"}  # timm's "map", "max", "avgmax" and "" (no pooling): none here


def create_model(
    name: str | None = None,
    *,
    pretrained: bool | str | Path | None = None,
    checkpoint: str | Path | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides,
) -> nn.Module:
    """Build a model, like timm.create_model; see the module docstring for the arguments.

    pretrained: weights of timm, Hugging Face, torchvision or the JAX release: a .safetensors/.pth/
        .bin/.npz file, a folder (save_pretrained, timm hub layout), or a hub id (vitlab.weights);
        True: the named variant's default weights from the local hub cache; False or None: random init.
    checkpoint: a vitlab checkpoint: a run folder (its last.json), a last.json/best.json pointer, a
        checkpoint folder, or an exported .safetensors with its .json.
    """
    features = feature_options(overrides)  # timm's features_only keywords, taken out of the overrides
    model = _create(name, pretrained, checkpoint, num_classes, img_size, timm_keywords(overrides))
    if isinstance(model, VisionTransformer):  # what the built model takes, whatever the source said
        model.pretrained_cfg = model.pretrained_cfg.replace(fixed_input_size=not model.cfg.dynamic_img_size)
    if features is not None:
        return FeatureGetter(model, **features)
    return model


def _create(name, pretrained, checkpoint, num_classes, img_size, overrides) -> nn.Module:
    label = pretrained
    if isinstance(pretrained, bool):
        pretrained, label = default_weights(name, checkpoint) if pretrained else (None, None)
    check_source(name, pretrained, checkpoint)
    for side in (img_size,) if img_size is None or isinstance(img_size, int) else img_size:
        check_range("img_size", side, low=1, integer=True, optional=True)  # before any weights are read
    check_range("num_classes", num_classes, low=0, integer=True, optional=True)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if checkpoint is not None:
        return _from_checkpoint(name, Path(checkpoint).expanduser(), num_classes, img_size, overrides)
    if pretrained is not None:
        return _from_weights(name, pretrained, str(label), num_classes, img_size, overrides)
    variant = get_variant(name)
    config = get_config(name, num_classes=num_classes, img_size=img_size, **overrides)
    check_fits(config, what=f"model {name}")  # counted from the config: nothing is allocated for a size that cannot fit
    model = _build(config)
    model.pretrained_cfg = variant.pretrained_cfg.replace(
        architecture=name, input_size=(config.in_chans, *config.img_size), num_classes=config.num_classes
    )
    return model


def timm_keywords(overrides: dict) -> dict:
    """`overrides` with timm's keyword names (TIMM_KEYWORDS) in vitlab's; a timm name and its vitlab field
    both given with different values is refused, naming both."""
    out = {k: v for k, v in overrides.items() if k not in TIMM_KEYWORDS}
    for timm_name, field in TIMM_KEYWORDS.items():
        if overrides.get(timm_name) is None:
            continue
        value = overrides[timm_name]
        if field == "pool":
            if value not in GLOBAL_POOLS:
                raise VitlabError(
                    f"global_pool must be one of {', '.join(map(repr, GLOBAL_POOLS))} (timm's names for pool "
                    f"'cls' and 'mean'); found {value!r}, which vitlab's ViT does not implement",
                    arg="global_pool",
                )
            value = GLOBAL_POOLS[value]
        if overrides.get(field) is not None and overrides[field] != value:
            raise VitlabError(
                f"{timm_name} (timm's name for {field}) and {field} are both given, as {overrides[timm_name]!r} "
                f"and {overrides[field]!r}; give one of them",
                arg=timm_name,
            )
        out[field] = value
    return out


def default_weights(name: str | None, checkpoint) -> tuple[Path, str]:
    """pretrained=True: (the local folder of `name`'s default weights, their hub id), from the variant's
    `pretrained_cfg.hf_hub_id` and the local Hugging Face cache only (nothing is downloaded)."""
    if checkpoint is not None:
        raise VitlabError("give pretrained=True (the variant's default weights) or a checkpoint, not both")
    if name is None:
        raise VitlabError("pretrained=True needs a model name, whose default weights it loads", arg="pretrained")
    variant = get_variant(name)
    repo = variant.pretrained_cfg.hf_hub_id
    if repo is None:
        what = "a CNN baseline" if not variant.is_vit else "a vitlab model timm has no weights for"
        raise VitlabError(
            f"pretrained=True: model {name!r} is {what}, with no default pretrained weights; give "
            "pretrained=PATH or a hub id, or pretrained=False for random weights",
            arg="pretrained",
        )
    return find_in_hub_cache(repo, what=f"pretrained=True: the default weights of {name}"), f"hf-hub:{repo}"


def build_on_meta(cfg: ViTConfig | ResNetConfig) -> nn.Module:
    """The model of `cfg` with shapes only (device "meta"): instant and free even for ViT-H, for what needs
    the module but runs no numbers (parameters counted, FLOPs traced, the tensors a file must hold)."""
    with torch.device("meta"):
        return _build(cfg)


def meta_state_dict(cfg: ViTConfig | ResNetConfig) -> dict[str, torch.Tensor]:
    """The tensors a model of `cfg` holds, shapes only: what vitlab.weights checks a file against
    (`vitlab.weights.infer.ModelTensors`)."""
    return build_on_meta(cfg).state_dict()


def _build(cfg: ViTConfig | ResNetConfig) -> nn.Module:
    """A new model of `cfg`, its weights initialised: the one constructor call of every model class."""
    return VisionTransformer(cfg) if isinstance(cfg, ViTConfig) else ResNetMini(cfg)


def check_source(name: str | None, pretrained, checkpoint) -> None:
    """The one rule for where a model comes from: a name, weights, or both; never two kinds of weights."""
    if pretrained is not None and checkpoint is not None:
        raise VitlabError("give pretrained weights (of any library) or a checkpoint (a vitlab run), not both")
    if name is None and pretrained is None and checkpoint is None:
        raise VitlabError(
            "model is required: name one of the models `vitlab info` lists, or give weights (pretrained "
            "or checkpoint) that say what the model is",
            arg="model",
        )


def _from_weights(name, source, label: str, num_classes, img_size, overrides) -> nn.Module:
    """A ViT from weights of any format (vitlab's own ViT checkpoints included)."""
    if name is not None and not get_variant(name).is_vit:
        raise VitlabError(
            f"model {name!r} is a CNN baseline and has no pretrained weights; a vitlab checkpoint of it "
            "loads with checkpoint=",
            arg="model",
        )
    ckpt = load_checkpoint(source, model_tensors=meta_state_dict)
    plan = plan_load(
        ckpt, name, model_tensors=meta_state_dict, num_classes=num_classes, img_size=img_size, source=label, **overrides
    )
    model = _build(plan.config)
    model.load_state_dict(plan.state_dict, strict=plan.strict)
    model.pretrained_cfg = plan.pretrained_cfg
    if is_hub_id(label):  # weights from the hub (pretrained=True too): timm's key names the repository
        model.pretrained_cfg = model.pretrained_cfg.replace(hf_hub_id=label.removeprefix("hf-hub:"))
    return model.eval()


def _from_checkpoint(name, path: Path, num_classes, img_size, overrides) -> nn.Module:
    exported = path.suffix == ".safetensors" and path.with_suffix(".json").is_file()  # `vitlab export` output
    folder = path if exported else ckpt_format.resolve_checkpoint(path)
    meta = ckpt_format.read_meta(folder)
    if meta["kind"] == "vit":
        return _from_weights(name, folder, str(folder), num_classes, img_size, overrides)
    # The CNN baseline: its config rebuilds it exactly; only a new head can change.
    if name is not None and name != meta["pretrained_cfg"].architecture:
        raise VitlabError(
            f"checkpoint {folder} holds a {meta['pretrained_cfg'].architecture or meta['kind']} "
            f"model, not {name!r}; drop the model name or give its checkpoint",
            arg="model",
        )
    if img_size is not None:
        overrides["img_size"] = img_size
    config = ckpt_format.config_from_meta(meta, **overrides)
    check_fits(config, what=f"the model of checkpoint {folder}")
    model = _build(config)
    weights = ckpt_format.read_weights(folder)
    differences = diff_keys(model.state_dict(), weights)
    if differences:
        raise VitlabError(
            f"checkpoint {folder}: its weights do not fit the {meta['kind']} model its config describes "
            f"({config.width} channels, {config.blocks} block(s) per stage, {config.num_classes} classes): "
            f"{differences}"
        )
    model.load_state_dict(weights)
    pcfg = meta["pretrained_cfg"].replace(
        source=str(folder), format="vitlab", head="loaded", input_size=(model.cfg.in_chans, *model.cfg.img_size)
    )
    if num_classes is not None and num_classes != model.num_classes:
        model.reset_classifier(num_classes)
        pcfg = pcfg.replace(num_classes=num_classes, label_names=None, head="new")
    model.pretrained_cfg = pcfg
    return model.eval()


__all__ = [
    "create_model",
    "build_on_meta",
    "meta_state_dict",
    "check_source",
    "timm_keywords",
    "default_weights",
    "TIMM_KEYWORDS",
    "GLOBAL_POOLS",
]
