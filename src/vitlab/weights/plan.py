"""The plan of a load: which model to build for a `Checkpoint`, and the tensors to load into it.

    plan_load(ckpt, name)     the ViTConfig to build: the named model's, checked field by field (one
                              message lists every difference), or the checkpoint's own (the number of
                              heads, which no tensor shows, from the config or the family's rule, with a
                              warning); the state dict to load: the position table resampled for a new
                              img_size (Section 3.2, "2D interpolation of the pre-trained position
                              embeddings"), the head dropped for a new num_classes (a new zero head, Section 3.2);
                              the preprocessing, class names and provenance (a PretrainedCfg)

`vitlab.create_model(name, pretrained=...)` builds the model from the plan; nothing here builds one: the
keys are checked against the tensors a model of the config holds (`model_tensors`, the factory's
`meta_state_dict`).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.errors import VitlabError
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.models.registry import VARIANTS, get_config
from vitlab.models.size import check_fits
from vitlab.models.vit import ViTConfig, resample_pos_embed  # the one resampling, the model's own
from vitlab.weights.infer import (
    FAMILY_RULES,
    STRUCTURAL_FIELDS,
    ModelTensors,
    bare_file_preprocessing,
    diff_keys,
    family_of,
    heads_by_rule,
    inferred_value,
    structural_value,
)
from vitlab.weights.source import PREPROCESSING_FIELDS, Checkpoint, imagenet_class_names

HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")


class PretrainedWarning(UserWarning):
    """Something about the loaded weights the user should know: a new head, a zero head, dropped parts,
    and what had to be assumed (the number of heads, the preprocessing) because the file does not say."""


@dataclass
class LoadPlan:
    """What `create_model` builds and loads: the configuration, the tensors, and the provenance."""

    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    strict: bool  # False when the head is left out (new, absent or none): it keeps its zero init
    pretrained_cfg: PretrainedCfg


def plan_load(
    ckpt: Checkpoint,
    name: str | None = None,
    *,
    model_tensors: ModelTensors,
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
    model_tensors: the tensors a model of a config holds, shapes only (`vitlab.models.factory.meta_state_dict`):
        the keys are checked against them.
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
    chans, from_chans = overrides.get("in_chans"), inferred.get("in_chans")
    adapted = chans is not None and from_chans not in (None, chans)
    if adapted:  # grayscale (or more channels) from RGB weights
        ckpt = _adapt_input_channels(ckpt, chans, notes)
        inferred["in_chans"] = chans
    family = None if named else family_of(inferred)
    if named:  # the user named the architecture: the checkpoint must fit it
        base = get_config(name, **overrides)
        if not isinstance(base, ViTConfig):
            raise VitlabError(f"model {name!r} is a CNN baseline; pretrained ViT weights ({ckpt.path}) do not fit it")
    else:  # the checkpoint describes itself: its config file's architecture, corrected by its tensors
        name, base = _own_config(ckpt, inferred, family, notes, overrides, model_tensors)
    _check_architecture(name, base, inferred, ckpt, named=named, model_tensors=model_tensors)

    ckpt_classes = inferred["num_classes"]
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

    sd, head = _fit_tensors(ckpt, cfg, ckpt_classes, notes)
    strict = head not in ("new", "absent", "none")
    _check_keys(cfg, sd, name, ckpt, skip_head=not strict, model_tensors=model_tensors)
    pcfg = _plan_pretrained_cfg(ckpt, cfg, name, family, notes, inferred, head, source)
    if adapted:
        pcfg = _per_channel_stats(pcfg, from_chans, chans)
    return LoadPlan(config=cfg, state_dict=sd, strict=strict, pretrained_cfg=pcfg)


def _own_config(
    ckpt: Checkpoint, inferred: dict, family, notes: list[str], overrides: dict, model_tensors: ModelTensors
) -> tuple[str | None, ViTConfig]:
    """(the registered name, when its config file gives one; the ViTConfig) of a checkpoint that describes
    itself: the named config corrected by the tensors, or the tensors with the family's rules."""
    name = ckpt.architecture if ckpt.architecture in VARIANTS and VARIANTS[ckpt.architecture].is_vit else None
    if name is None and "heads" not in inferred:
        inferred["heads"] = _heads_from_rule(inferred["dim"], ckpt, notes)
    known = {f.name for f in fields(ViTConfig)} - {"num_classes"}
    start = get_config(name) if name is not None else ViTConfig()
    ruled = _family_config(family, inferred, ckpt, notes) if name is None else {}
    fields_read = {k: v for k, v in {**ruled, **inferred}.items() if k in known}
    try:
        return name, start.replace(**fields_read).replace(**overrides)
    except VitlabError as e:  # the tensors describe no model: say which tensors do not fit, not why dim fails
        stated = _stated_config(start, ckpt)
        raise VitlabError(
            f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit "
            f"{name or 'the model its config describes'}: "
            f"{_key_report(stated, ckpt, model_tensors) or e}"
        ) from e


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
        note = (
            f"the tensors show {family[1]}, a {label} model, and the file does not say the rest: "
            f"taken as {label}'s, {text}"
        )
        notes.append(note)
        _warn(f"{ckpt.path}: {note}")
    return ruled


def _stated_config(start: ViTConfig, ckpt: Checkpoint) -> ViTConfig:
    """The configuration a checkpoint's own config file states (vitlab's files state every field)."""
    try:
        return start.replace(**ckpt.stated)
    except (VitlabError, TypeError):
        return start


def _key_report(cfg: ViTConfig, ckpt: Checkpoint, model_tensors: ModelTensors) -> str:
    """Missing keys, unexpected keys and shape differences between a model of `cfg` and the checkpoint."""
    try:
        grid = ckpt.grid_size
        size = tuple(g * cfg.patch_size for g in grid) if grid else cfg.img_size
        model_sd = model_tensors(
            cfg.replace(img_size=size, num_classes=ckpt.config.get("num_classes", cfg.num_classes))
        )
    except VitlabError:
        return ""
    return diff_keys(model_sd, ckpt.state_dict)


def _check_architecture(
    name: str | None, cfg: ViTConfig, inferred: dict, ckpt: Checkpoint, *, named: bool, model_tensors: ModelTensors
) -> None:
    """The model's structure must be the checkpoint's: one message lists every field that differs,
    and how to load the file instead."""
    diffs = []  # (field, "model ... vs checkpoint ...", the checkpoint's value)
    for f in STRUCTURAL_FIELDS:
        theirs = inferred_value(inferred, f)
        if theirs is None:  # the checkpoint does not say (heads without a config, mlp_dim of a linear stem, ...)
            continue
        if structural_value(cfg, f) != theirs:
            mine = getattr(cfg, f) if f == "layer_scale" else structural_value(cfg, f)
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
        + _key_report(cfg, ckpt, model_tensors)
    )


def _matching_variants(inferred: dict) -> list[str]:
    """vitlab model names whose structure agrees with everything the checkpoint says."""
    out = []
    for vname, variant in VARIANTS.items():
        if not variant.is_vit:
            continue
        if all(
            structural_value(variant.config, f) == inferred_value(inferred, f)
            for f in STRUCTURAL_FIELDS
            if inferred_value(inferred, f) is not None
        ):
            out.append(vname)
    return out[:4]


def _fit_tensors(ckpt: Checkpoint, cfg: ViTConfig, ckpt_classes: int, notes: list[str]) -> tuple[dict, str]:
    """(the state dict to load into a model of `cfg`, the head's state): the position tables resampled to
    its grid, the head dropped for another number of classes; a warning for each change to the head."""
    sd = dict(ckpt.state_dict)
    head = _head_state(sd, ckpt_classes)
    target_classes = cfg.num_classes
    old_grid = ckpt.grid_size
    if (
        old_grid is not None
        and tuple(old_grid) != cfg.grid_size
        and cfg.pos_embed in ("learned", "learned2d", "relative")
    ):
        sd = resample_position_tables(sd, old_grid, cfg.grid_size, num_prefix_tokens=cfg.num_pos_prefix_tokens)
        notes.append(
            f"position embedding ({cfg.pos_embed}) resampled from a {old_grid[0]}x{old_grid[1]} to a "
            f"{cfg.grid_size[0]}x{cfg.grid_size[1]} grid"
        )
    if target_classes != ckpt_classes or head == "absent":
        for key in HEAD_KEYS:
            sd.pop(key, None)
        if target_classes == 0:  # a feature extractor: no head at all
            notes.append("no head (num_classes=0): the model returns the pooled features")
            head = "none"
        elif head != "absent":
            _warn(
                f"{ckpt.path}: the checkpoint's head has {ckpt_classes} classes; made a new zero-initialised head "
                f"for {target_classes} classes"
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
    return sd, head


def _head_state(sd: dict, num_classes: int) -> str:
    """The checkpoint's head: "absent" (none, or no classes), "zero" (all zeros), or "loaded"."""
    if "head.weight" not in sd or num_classes == 0:
        return "absent"
    if not sd["head.weight"].any() and ("head.bias" not in sd or not sd["head.bias"].any()):
        return "zero"
    return "loaded"


def _check_keys(
    cfg: ViTConfig, sd: dict, name, ckpt: Checkpoint, *, skip_head: bool, model_tensors: ModelTensors
) -> None:
    """Every tensor of `sd` is one of the model's, of its shape, and none is missing (but a dropped head)."""
    report = diff_keys(model_tensors(cfg), sd, HEAD_KEYS if skip_head else ())
    if report:
        what = f"model {name!r}" if name else "the model its tensors and config describe"
        raise VitlabError(f"checkpoint {ckpt.path} ({ckpt.format} layout) does not load into {what}: {report}")


def _plan_pretrained_cfg(
    ckpt: Checkpoint, cfg: ViTConfig, name: str | None, family, notes: list[str], inferred: dict, head: str, source
) -> PretrainedCfg:
    """The source's PretrainedCfg made the model's: its preprocessing (a bare file's inferred, with a
    warning), class names where the head was loaded, input size, head state and provenance."""
    preprocessing = _plan_preprocessing(ckpt, name, family, notes, inferred)
    labels = ckpt.pretrained_cfg.label_names if head in ("loaded", "zero") else None
    if labels is not None and len(labels) != cfg.num_classes:
        labels = None
    if labels is None and cfg.num_classes == 1000 and head in ("loaded", "zero"):
        labels = tuple(imagenet_class_names())
    return ckpt.pretrained_cfg.replace(
        **preprocessing,
        input_size=(cfg.in_chans, *cfg.img_size),
        num_classes=cfg.num_classes,
        label_names=labels,
        source=str(source if source is not None else ckpt.path),
        architecture=name,
        head=head,
        notes=tuple(notes),
    )


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


def adapt_input_conv(in_chans: int, weight: torch.Tensor) -> torch.Tensor:
    """The patch projection (D, C, P, P) made to take `in_chans` channels, as timm's adapt_input_conv: one
    channel sums the filters (a gray image is R = G = B, so the response is the RGB model's), others repeat
    them cyclically and scale by C / in_chans (the response to an input of equal channels is unchanged)."""
    C = weight.shape[1]
    if in_chans == C:
        return weight
    w = weight.float()
    if in_chans == 1:
        w = w.sum(dim=1, keepdim=True)  # (D, 1, P, P)
    else:
        w = w.repeat(1, -(-in_chans // C), 1, 1)[:, :in_chans] * (C / in_chans)  # (D, in_chans, P, P)
    return w.to(weight.dtype)


def _adapt_input_channels(ckpt: Checkpoint, in_chans: int, notes: list[str]) -> Checkpoint:
    """A copy of `ckpt` whose patch projection takes `in_chans` channels (adapt_input_conv), with a note."""
    key = "patch_embed.proj.weight"
    weight = ckpt.state_dict.get(key)
    if weight is None or weight.ndim != 4:
        raise VitlabError(
            f"in_chans {in_chans}: checkpoint {ckpt.path} has no convolutional patch projection ({key}) to adapt "
            f"from its {ckpt.config.get('in_chans')} channels; load it with its own in_chans",
            arg="in_chans",
        )
    C = weight.shape[1]
    notes.append(f"patch projection adapted from {C} to {in_chans} input channel(s), as timm's adapt_input_conv")
    return replace(
        ckpt,
        state_dict={**ckpt.state_dict, key: adapt_input_conv(in_chans, weight)},
        config={**ckpt.config, "in_chans": in_chans},
    )


def _per_channel_stats(pcfg: PretrainedCfg, from_chans: int, in_chans: int) -> PretrainedCfg:
    """The mean and std of an adapted model, one per input channel: their average for one channel (the
    summed filters see a gray image), repeated cyclically for others (as the filters are)."""
    out = {}
    for field in ("mean", "std"):
        values = getattr(pcfg, field)
        if len(values) != from_chans:
            continue
        if in_chans == 1:
            out[field] = (sum(values) / from_chans,)
        elif in_chans <= 4:
            out[field] = tuple(values[i % from_chans] for i in range(in_chans))
    return pcfg.replace(**out)


def _warn(message: str) -> None:
    warnings.warn(message, PretrainedWarning, stacklevel=4)


# ----------------------------------------------------------------------------------------------------
# Position tables resampled to a new grid (Section 3.2)


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


__all__ = [
    "PretrainedWarning",
    "LoadPlan",
    "HEAD_KEYS",
    "plan_load",
    "adapt_input_conv",
    "resample_pos_embed",
    "resample_position_tables",
]
