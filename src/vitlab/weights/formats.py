"""Weight files of every source, read safely and renamed to vitlab's names: the one place that knows
the other libraries' layouts.

    source (file | directory | hub id)
      -> resolve_source()       a local path; a hub id through the Hugging Face cache (HF_HUB_OFFLINE honoured)
      -> read_checkpoint()      safetensors / torch.load(weights_only=True) / np.load(allow_pickle=False)
      -> detect_format()        "timm" | "hf" | "torchvision" | "jax" | "dinov2", from the key names alone
      -> convert_state_dict()   one function per layout, all to vitlab names (which are timm's)

The layouts (names of block i):

    vitlab / timm   blocks.i.attn.qkv (3D, D)                    patch_embed.proj (D, C, P, P)
                    DeiT: dist_token, head_dist; registers: reg_token; LayerScale: blocks.i.ls1.gamma
    HF ViT, DeiT,   {vit,deit,dinov2}.encoder.layer.i.attention.attention.{query,key,value}; embeddings.*;
    Dinov2          embeddings.distillation_token, register_tokens; layer_scale1.lambda1; cls_classifier
    torchvision     encoder.layers.encoder_layer_i.self_attention.in_proj_weight; conv_proj; class_token
    JAX .npz        Transformer/encoderblock_i/MultiHeadDotProductAttention_1/query/kernel (D, h, d);
                    embedding/kernel (P, P, C, D), permuted (3, 2, 0, 1) to PyTorch's (D, C, P, P)
    DINOv2 .pth     timm's names, plus mask_token and register_tokens (facebookresearch/dinov2's release)

What the converted tensors say about the architecture is `vitlab.weights.infer`; the source read and
described, `vitlab.weights.source`; the plan of loading them into a model, `vitlab.weights.plan`.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from vitlab.errors import VitlabError

FORMATS = ("timm", "hf", "torchvision", "jax", "dinov2")
HF_PREFIXES = ("vit.", "deit.", "dinov2.", "dinov2_with_registers.")  # the backbone inside *ForImageClassification
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".tar")  # .tar: timm training checkpoints (model_best.pth.tar)
WEIGHT_SUFFIXES = (".safetensors", ".npz", *TORCH_SUFFIXES)


# ----------------------------------------------------------------------------------------------------
# Reading files safely


def read_weights_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of one weights file. Nothing here runs code from the file.

    .safetensors: safetensors (the default, a flat table of tensors).
    .pth/.pt/.bin: torch.load(weights_only=True), which refuses any pickled object that is not a
    tensor or a plain container, so a malicious pickle cannot run code. .npz: np.load(allow_pickle=False).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise VitlabError(f"weights file {path} does not exist")
    try:
        if suffix == ".safetensors":
            return load_file(str(path))
        if suffix in TORCH_SUFFIXES:
            with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then reads
                warnings.simplefilter("ignore")
                obj = torch.load(str(path), map_location="cpu", weights_only=True)
            return _unwrap_torch_checkpoint(obj, path)
        if suffix == ".npz":
            with np.load(str(path), allow_pickle=False) as npz:
                return {k: torch.from_numpy(np.array(npz[k])) for k in npz.files}
    except VitlabError:
        raise
    except pickle.UnpicklingError as e:
        if not refused_global(e):
            raise VitlabError(
                f"could not read weights file {path}: it is not a torch file (truncated, or another "
                "format with a .pth/.bin name)"
            ) from e
        raise VitlabError(
            f"refused to load {path}: it holds pickled objects other than tensors, which could run code "
            f"(torch.load(weights_only=True) said: {refused_global(e)}); "
            "get the weights as .safetensors, or re-save a trusted file's state_dict with torch.save"
        ) from e
    except Exception as e:  # safetensors, zip and numpy errors have no common base class
        raise VitlabError(f"could not read weights file {path}: {type(e).__name__}: {e}") from e
    raise VitlabError(f"weights file {path} has suffix {suffix!r}; expected one of {', '.join(WEIGHT_SUFFIXES)}")


# Integer tensors a state dict may hold besides its weights: BatchNorm's step counter, Hugging Face's position ids.
INTEGER_BUFFERS = ("num_batches_tracked", "position_ids")


def check_tensors(tensors: dict[str, torch.Tensor], path) -> dict[str, torch.Tensor]:
    """Weights are floating-point numbers, all finite: a NaN or an infinity in any of them makes every output
    NaN, and an integer or boolean tensor where a weight belongs is not one. Raise a VitlabError naming the
    file and the first tensor that fails; return `tensors` otherwise."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise VitlabError(f"{path}: {name} is a {type(t).__name__}, not a tensor of weights")
        if not t.is_floating_point():
            if name.endswith(INTEGER_BUFFERS) and not t.dtype == torch.bool:
                continue
            raise VitlabError(
                f"{path}: tensor {name} holds {str(t.dtype).removeprefix('torch.')} values; weights are "
                "floating-point numbers (is the file damaged, or not a model's weights?)"
            )
        finite = torch.isfinite(t)
        if not bool(finite.all()):
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            what = " and ".join(w for w in (f"{nan:,} NaN" if nan else "", f"{inf:,} infinite" if inf else "") if w)
            raise VitlabError(
                f"{path}: tensor {name} holds {what} value(s) of {t.numel():,}; a model with them gives NaN "
                "for every image (a run that diverged saved them?): use an earlier checkpoint"
            )
    return tensors


def refused_global(e: pickle.UnpicklingError) -> str | None:
    """What torch.load(weights_only=True) refused to unpickle ("Unsupported global: GLOBAL posix.system ..."),
    or None when the file is simply not a pickle it can read."""
    for line in str(e).splitlines():
        if "global" in line.lower() or "Unsupported class" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ").rstrip(".")
    return None


def _unwrap_torch_checkpoint(obj, path: Path) -> dict[str, torch.Tensor]:
    """A training checkpoint often nests the weights ({"model": ..., "optimizer": ...}) or prefixes
    them with "module." (DistributedDataParallel); take the weights out."""
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise VitlabError(f"{path} is not a state dict (a mapping from names to tensors); found {type(obj).__name__}")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}
    return dict(obj)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise VitlabError(f"could not read the JSON config {path}: {e}") from e
    if not isinstance(data, dict):
        raise VitlabError(f"the JSON config {path} should hold an object, found {type(data).__name__}")
    return data


def _sibling_config(weights: Path) -> Path | None:
    """The config next to a weights file: `<stem>.json` (vitlab export, fine-tuning) or `config.json`."""
    for candidate in (weights.with_suffix(".json"), weights.parent / "config.json"):
        if candidate.is_file() and candidate != weights:
            return candidate
    return None


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """(tensors, config.json contents, preprocessor_config.json contents) of a file or a directory.

    A directory may be a Hugging Face `save_pretrained` folder (config.json + model.safetensors or
    pytorch_model.bin), a timm hub folder (config.json + model.safetensors or pytorch_model.bin), or
    a folder holding one weights file (and its `<stem>.json`).
    """
    path = Path(path)
    if path.is_dir():
        weights = _weights_in_dir(path)
        config_path = path / "config.json" if (path / "config.json").is_file() else _sibling_config(weights)
    else:
        weights = path
        config_path = _sibling_config(path)
    config = read_json(config_path) if config_path is not None else {}
    preproc_path = weights.parent / "preprocessor_config.json"
    preproc = read_json(preproc_path) if preproc_path.is_file() else {}
    index = weights.name.endswith(".index.json")
    tensors = _read_sharded(weights) if index else read_weights_file(weights)
    return tensors, config, preproc


def _weights_in_dir(folder: Path) -> Path:
    for name in (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "open_clip_pytorch_model.bin",
    ):
        if (folder / name).is_file():
            return folder / name
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() in WEIGHT_SUFFIXES)
    if len(found) == 1:
        return found[0]
    what = f"{len(found)} candidates ({', '.join(p.name for p in found)})" if found else "none"
    raise VitlabError(
        f"directory {folder} has no weights file vitlab can pick: expected model.safetensors or pytorch_model.bin "
        f"(Hugging Face / timm layout) or exactly one *.safetensors/*.npz/*.pth file, found {what}"
    )


def _read_sharded(index_path: Path) -> dict[str, torch.Tensor]:
    shards = sorted(set(read_json(index_path).get("weight_map", {}).values()))
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(read_weights_file(index_path.parent / shard))
    return tensors


# ----------------------------------------------------------------------------------------------------
# Sources: local file, local directory, or a Hugging Face hub id


def is_hub_id(source: str) -> bool:
    """`hf-hub:org/name` always; a bare `org/name` when no such local path exists and it is not a file name."""
    if source.startswith("hf-hub:"):
        return True
    return (
        re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source) is not None
        and not Path(source).exists()
        and not source.lower().endswith(WEIGHT_SUFFIXES + (".json",))
    )


def resolve_source(source: str | Path, *, cache_dir: str | Path | None = None) -> Path:
    """A local file or directory for `source`; a hub id is looked up in the Hugging Face cache first,
    and downloaded only when it is not there and HF_HUB_OFFLINE is not set."""
    text = str(source)
    if Path(text).expanduser().exists():
        return Path(text).expanduser()
    if is_hub_id(text):
        return download_from_hub(text.removeprefix("hf-hub:"), cache_dir=cache_dir)
    raise VitlabError(
        f"pretrained source {text!r} is neither an existing file or directory nor a hub id; expected a "
        ".safetensors/.pth/.bin/.npz file, a save_pretrained directory, or an id such as "
        "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k or google/vit-base-patch16-224"
    )


def find_in_hub_cache(repo_id: str, *, cache_dir: str | Path | None = None, what: str | None = None) -> Path:
    """The snapshot folder of hub repo `repo_id` in the local Hugging Face cache (huggingface_hub with
    local_files_only: never the network); a one-line VitlabError naming the cache when it is not there."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as e:
        raise VitlabError(
            f"{what or 'hub id'} {repo_id!r}: not in the local Hugging Face cache {cache} (looked for "
            f"{cache / ('models--' + repo_id.replace('/', '--'))}); download it once with network access "
            f"(huggingface-cli download {repo_id}) or give a local file",
            arg="pretrained",
        ) from e


def download_from_hub(repo_id: str, *, cache_dir: str | Path | None = None) -> Path:
    """The local snapshot folder of hub repo `repo_id`: the cache first, then the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:  # before any file or network access: "../../etc/passwd" is no repository
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise VitlabError(
            f"pretrained hub id {repo_id!r} is not a Hugging Face repository name: expected org/name "
            "of letters, digits, '-', '_' and '.', such as hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
            arg="pretrained",
        ) from e
    cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return find_in_hub_cache(repo_id, cache_dir=cache)
    except VitlabError:
        pass
    if constants.is_offline_mode():
        raise VitlabError(
            f"hub id {repo_id!r} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE is set, so it "
            "cannot be downloaded; download it once with network access (or copy the cache), or pass a local file"
        )
    try:
        folder = Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=["*.json", "model.safetensors"]))
        if not (folder / "model.safetensors").is_file():
            folder = Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=["*.json", "pytorch_model.bin"]))
    except Exception as e:  # network, authentication, missing repository
        raise VitlabError(
            f"could not download hub id {repo_id!r} into the cache {cache}: {type(e).__name__}: {e}"
        ) from e
    return folder


# ----------------------------------------------------------------------------------------------------
# Formats: detection and conversion to vitlab names (the one place that knows the other layouts)


def detect_format(keys) -> str:
    """Which layout a state dict is in, from its key names alone."""
    keys = list(keys)
    if any(k.endswith("embedding/kernel") or "Transformer/encoder" in k for k in keys):
        return "jax"
    if any(k in ("conv_proj.weight", "class_token") or k.startswith("encoder.layers.encoder_layer_") for k in keys):
        return "torchvision"
    if any(k.startswith((*HF_PREFIXES, "embeddings.patch_embeddings", "embeddings.position_embeddings")) for k in keys):
        return "hf"
    if any(k.startswith(("patch_embed.", "blocks.")) for k in keys):
        # facebookresearch/dinov2 keeps its mask token (for iBOT) and names its registers differently;
        # an MAE pre-training file has a mask token too, for its decoder
        mae = any(k.startswith("decoder_") for k in keys)
        return "dinov2" if "register_tokens" in keys or ("mask_token" in keys and not mae) else "timm"
    shown = ", ".join(sorted(keys)[:6])
    raise VitlabError(
        f"unrecognised checkpoint layout (first keys: {shown}); expected timm (patch_embed.proj, blocks.0...), "
        "Hugging Face ViT, DeiT or Dinov2 (vit.embeddings..., embeddings.patch_embeddings...), torchvision (conv_proj, "
        "encoder.layers...) or JAX .npz (embedding/kernel, Transformer/encoderblock_0/...)"
    )


def convert_state_dict(
    state_dict: dict[str, torch.Tensor], fmt: str | None = None
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a checkpoint's tensors to vitlab's (timm's) names. Returns (state dict, notes on dropped parts)."""
    fmt = fmt or detect_format(state_dict)
    if fmt == "vitlab":
        return dict(state_dict), []
    converters = {
        "timm": _convert_timm,
        "dinov2": _convert_dinov2,
        "hf": _convert_hf,
        "torchvision": _convert_torchvision,
        "jax": _convert_jax,
    }
    return converters[fmt](state_dict)


def _convert_timm(sd: dict) -> tuple[dict, list[str]]:
    """timm's names are vitlab's. Two older layouts that timm also loads: DeiT III's original
    checkpoints name LayerScale `blocks.i.gamma_1/2` (timm: `ls1/ls2.gamma`), and MAE pre-training
    checkpoints carry the decoder, which only reconstructs masked patches."""
    out, notes = {}, []
    for key, value in sd.items():
        if key.startswith("decoder_") or key == "mask_token":
            notes.append("dropped the MAE decoder (decoder_*, mask_token): it only serves masked-patch pre-training")
            continue
        out[re.sub(r"^(blocks\.\d+)\.gamma_([12])$", r"\1.ls\2.gamma", key)] = value
    return out, sorted(set(notes))


def _fold_class_position(out: dict) -> None:
    """DINOv2 with registers (its release and HF's Dinov2WithRegisters): the position table has a row
    for the class token but none for the registers, which are inserted after the position is added.
    timm's equivalent (`no_embed_class`): the class token's row is added to the token once, here, and
    the table keeps the patch rows only. The sums the model computes are the same."""
    pos = out["pos_embed"]  # (1, 1+N, D)
    out["cls_token"] = out["cls_token"] + pos[:, :1]  # (1, 1, D)
    out["pos_embed"] = pos[:, 1:].contiguous()  # (1, N, D)


def _convert_dinov2(sd: dict) -> tuple[dict, list[str]]:
    """facebookresearch/dinov2's checkpoints (the torch.hub .pth files): timm's names, plus the mask
    token of its iBOT loss and `register_tokens`, as timm converts them (vision_transformer._convert_dinov2)."""
    out, notes = {}, []
    for key, value in sd.items():
        if key == "mask_token":
            notes.append("dropped mask_token (only used for masked-patch pre-training)")
        elif key == "register_tokens":
            out["reg_token"] = value  # (1, R, D)
        else:
            out[key] = value
    if "reg_token" in out:
        _fold_class_position(out)
    return out, notes


def _fuse_qkv(out: dict, parts: dict) -> None:
    """Concatenate per-block q, k, v (each (D, D) / (D,)) into vitlab's one qkv Linear (3D, D) / (3D,)."""
    for (i, kind), qkv in sorted(parts.items()):
        missing = [n for n in "qkv" if n not in qkv]
        if missing:
            raise VitlabError(f"block {i} of the checkpoint lacks the {', '.join(missing)} projection {kind}")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)


# Hugging Face's names <-> vitlab's, one table read both ways (`_convert_hf` in, `to_hf_state_dict` out).
# Inside block i (HF encoder.layer.i / transformers 5's layers.i, vitlab's blocks.i); "{}" is weight or bias.
# The first HF name of each vitlab name is the one save_pretrained writes (ViTModel's).
HF_BLOCK_NAMES = (
    ("attention.output.dense.{}", "attn.proj.{}"),
    ("intermediate.dense.{}", "mlp.fc1.{}"),
    ("output.dense.{}", "mlp.fc2.{}"),
    ("layernorm_before.{}", "norm1.{}"),
    ("layernorm_after.{}", "norm2.{}"),
    ("attention.o_proj.{}", "attn.proj.{}"),  # transformers 5's in-memory layout
    ("mlp.fc1.{}", "mlp.fc1.{}"),  # Dinov2
    ("mlp.fc2.{}", "mlp.fc2.{}"),
    ("norm1.{}", "norm1.{}"),
    ("norm2.{}", "norm2.{}"),
    ("layer_scale1.lambda1", "ls1.gamma"),  # Dinov2's LayerScale
    ("layer_scale2.lambda1", "ls2.gamma"),
)
# q, k and v, which vitlab keeps as one qkv Linear: (the HF name, with {q} the projection and {} weight or bias).
HF_QKV_NAMES = (("attention.attention.{q}.{}", ("query", "key", "value")), ("attention.{q}_proj.{}", ("q", "k", "v")))
HF_TOP_NAMES = {
    "embeddings.cls_token": "cls_token",
    "embeddings.distillation_token": "dist_token",  # DeiT
    "embeddings.register_tokens": "reg_token",  # Dinov2WithRegisters
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "cls_classifier.weight": "head.weight",  # DeiTForImageClassificationWithTeacher
    "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight",
    "distillation_classifier.bias": "head_dist.bias",
}


def _hf_pattern(template: str) -> str:
    return re.escape(template).replace(r"\{q\}", r"(\w+)").replace(r"\{\}", "(weight|bias)")


def _convert_hf(sd: dict) -> tuple[dict, list[str]]:
    """Hugging Face ViT, DeiT and Dinov2 (with or without registers), bare or *ForImageClassification
    (DeiT's WithTeacher too), both the saved layout (encoder.layer.i.attention.attention.query) and
    transformers 5's in-memory one (layers.i.attention.q_proj)."""
    out, qkv, notes = {}, {}, []
    block_rules = [(_hf_pattern(hf), ours) for hf, ours in HF_BLOCK_NAMES]
    qkv_rules = [(_hf_pattern(hf), {name: name[0] for name in names}) for hf, names in HF_QKV_NAMES]
    top_rules = HF_TOP_NAMES
    for key, value in sd.items():
        name = next((key[len(p) :] for p in HF_PREFIXES if key.startswith(p)), key)
        if name in top_rules:
            out[top_rules[name]] = value
            continue
        m = re.fullmatch(r"(?:encoder\.layer|layers)\.(\d+)\.(.+)", name)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            q = next(
                (mm for pattern, names in qkv_rules if (mm := re.fullmatch(pattern, rest)) and mm[1] in names), None
            )
            if q is not None:
                qkv.setdefault((i, q.group(2)), {})[q.group(1)[0]] = value
                continue
            for pattern, target in block_rules:
                mm = re.fullmatch(pattern, rest)
                if mm:
                    out[f"blocks.{i}." + target.format(*mm.groups())] = value
                    break
            else:
                out[key] = value  # left for the key check to report
            continue
        if name.startswith("pooler."):
            notes.append("dropped the Hugging Face pooler (a tanh Dense layer that the image classifiers do not use)")
        elif name == "embeddings.mask_token":
            notes.append("dropped embeddings.mask_token (only used for masked image modelling)")
        else:
            out[key] = value
    _fuse_qkv(out, qkv)
    if "reg_token" in out and "pos_embed" in out:
        _fold_class_position(out)
    return out, sorted(set(notes))


def to_hf_state_dict(sd: dict[str, torch.Tensor], prefix: str = "vit.") -> dict[str, torch.Tensor]:
    """vitlab's (timm's) names -> the names ViTForImageClassification.save_pretrained writes: the tables
    above read the other way (the first HF name of each vitlab name), qkv split into query, key and
    value, the backbone under `prefix` and the head as `classifier`."""
    top, block = {}, {}
    for hf, ours in HF_TOP_NAMES.items():
        top.setdefault(ours, hf)
    for hf, ours in HF_BLOCK_NAMES:
        for kind in ("weight", "bias") if "{}" in ours else ("",):
            block.setdefault(ours.format(kind), hf.format(kind))
    qkv_template, qkv_names = HF_QKV_NAMES[0]
    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
        if key in top:
            out[top[key] if top[key].startswith("classifier") else prefix + top[key]] = value
        elif m and m[2] in ("attn.qkv.weight", "attn.qkv.bias"):
            for q, part in zip(qkv_names, value.chunk(3, dim=0)):  # (3D, ...) -> three (D, ...)
                out[f"{prefix}encoder.layer.{m[1]}." + qkv_template.format(m[2].rsplit(".", 1)[1], q=q)] = part
        elif m and m[2] in block:
            out[f"{prefix}encoder.layer.{m[1]}.{block[m[2]]}"] = value
        else:
            raise VitlabError(f"tensor {key!r} has no counterpart in Hugging Face's ViT", arg="format")
    return out


def _convert_torchvision(sd: dict) -> tuple[dict, list[str]]:
    """torchvision.models.VisionTransformer (vit_b_16 and friends)."""
    out, notes = {}, []
    top_rules = {
        "class_token": "cls_token",
        "encoder.pos_embedding": "pos_embed",
        "conv_proj.weight": "patch_embed.proj.weight",
        "conv_proj.bias": "patch_embed.proj.bias",
        "encoder.ln.weight": "norm.weight",
        "encoder.ln.bias": "norm.bias",
        "heads.head.weight": "head.weight",
        "heads.head.bias": "head.bias",
    }
    block_rules = {
        "ln_1": "norm1",
        "ln_2": "norm2",
        "self_attention.in_proj_weight": "attn.qkv.weight",
        "self_attention.in_proj_bias": "attn.qkv.bias",
        "self_attention.out_proj": "attn.proj",
        "mlp.0": "mlp.fc1",
        "mlp.3": "mlp.fc2",
        "mlp.linear_1": "mlp.fc1",
        "mlp.linear_2": "mlp.fc2",
    }
    pre_logits = any(k.startswith("heads.pre_logits") for k in sd)
    for key, value in sd.items():
        if key in top_rules:
            if not (pre_logits and key.startswith("heads.head")):
                out[top_rules[key]] = value
            continue
        m = re.fullmatch(r"encoder\.layers\.encoder_layer_(\d+)\.(.+?)(\.weight|\.bias)?", key)
        if m and m.group(2) in block_rules:
            out[f"blocks.{m.group(1)}.{block_rules[m.group(2)]}{m.group(3) or ''}"] = value
        elif key.startswith("heads.pre_logits"):
            continue
        else:
            out[key] = value
    if pre_logits:
        notes.append(
            "dropped heads.pre_logits and heads.head: the checkpoint has the paper's pre-training head "
            "(a tanh hidden layer) which vitlab does not build; the classifier must be fine-tuned"
        )
    return out, notes


def _convert_jax(sd: dict) -> tuple[dict, list[str]]:
    """The .npz files of google-research/vision_transformer (and big_vision's variant of the names).

    JAX stores Dense kernels as (in, out), attention kernels per head, (D, h, d) for q/k/v and
    (h, d, D) for the output, and the patch embedding as a (P, P, C, D) conv kernel.
    """
    prefix = next((p for p in ("opt/target/", "params/img/", "params/") if f"{p}embedding/kernel" in sd), "")
    w = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    out, notes = {}, []
    out["patch_embed.proj.weight"] = w["embedding/kernel"].permute(3, 2, 0, 1)  # (P, P, C, D) -> (D, C, P, P)
    out["patch_embed.proj.bias"] = w["embedding/bias"]
    if "cls" in w:
        out["cls_token"] = w["cls"].reshape(1, 1, -1)  # (1, 1, D)
    else:  # classifier "gap": no class token; encoder_norm, then the mean over patches (infer_config: fc_norm=False)
        notes.append("no class token (JAX classifier 'gap'): the patch tokens are averaged after the final LayerNorm")
    pos = w.get("Transformer/posembed_input/pos_embedding", w.get("pos_embedding"))
    out["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])  # (1, N(+1), D)
    out["norm.weight"] = w["Transformer/encoder_norm/scale"]
    out["norm.bias"] = w["Transformer/encoder_norm/bias"]

    stacked = "Transformer/encoderblock/LayerNorm_0/scale" in w  # big_vision's scanned layers: a leading depth axis
    if stacked:
        depth = w["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        blocks = [
            {k.split("/", 2)[2]: v[i] for k, v in w.items() if k.startswith("Transformer/encoderblock/")}
            for i in range(depth)
        ]
    else:
        idx = sorted({int(m.group(1)) for k in w if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
        blocks = [
            {k.split("/", 2)[2]: v for k, v in w.items() if k.startswith(f"Transformer/encoderblock_{i}/")} for i in idx
        ]
    for i, b in enumerate(blocks):
        lns = sorted({k.split("/")[0] for k in b if k.startswith("LayerNorm_")}, key=lambda s: int(s.split("_")[1]))
        mha = next(k.split("/")[0] for k in b if k.startswith("MultiHeadDotProductAttention_"))
        mlp = next(k.split("/")[0] for k in b if k.startswith("MlpBlock_"))
        p = f"blocks.{i}."
        out[p + "norm1.weight"], out[p + "norm1.bias"] = b[f"{lns[0]}/scale"], b[f"{lns[0]}/bias"]
        out[p + "norm2.weight"], out[p + "norm2.bias"] = b[f"{lns[1]}/scale"], b[f"{lns[1]}/bias"]
        q, k, v = (b[f"{mha}/{n}/kernel"] for n in ("query", "key", "value"))  # each (D, h, d)
        D = q.shape[0]
        out[p + "attn.qkv.weight"] = torch.cat([t.reshape(D, -1).T for t in (q, k, v)])  # (3D, D): (out, in)
        out[p + "attn.qkv.bias"] = torch.cat([b[f"{mha}/{n}/bias"].reshape(-1) for n in ("query", "key", "value")])
        out[p + "attn.proj.weight"] = b[f"{mha}/out/kernel"].reshape(-1, D).T  # (h, d, D) -> (h*d, D) -> (D, h*d)
        out[p + "attn.proj.bias"] = b[f"{mha}/out/bias"]
        out[p + "mlp.fc1.weight"] = b[f"{mlp}/Dense_0/kernel"].T  # (D, hidden) -> (hidden, D)
        out[p + "mlp.fc1.bias"] = b[f"{mlp}/Dense_0/bias"]
        out[p + "mlp.fc2.weight"] = b[f"{mlp}/Dense_1/kernel"].T
        out[p + "mlp.fc2.bias"] = b[f"{mlp}/Dense_1/bias"]
        if i == 0:
            out["_jax_heads"] = torch.tensor(q.shape[1])  # h, read by infer_config then removed
    if "pre_logits/kernel" in w:
        notes.append(
            "dropped pre_logits and head: the checkpoint has the paper's pre-training head (a tanh hidden "
            "layer before the classifier), which vitlab does not build; the classifier must be fine-tuned"
        )
    elif "head/kernel" in w:
        out["head.weight"] = w["head/kernel"].T  # (D, K) -> (K, D)
        out["head.bias"] = w["head/bias"]
    out = {k: v.contiguous() for k, v in out.items()}
    return out, notes


__all__ = [
    "FORMATS",
    "HF_PREFIXES",
    "WEIGHT_SUFFIXES",
    "INTEGER_BUFFERS",
    "check_tensors",
    "read_weights_file",
    "read_json",
    "read_checkpoint",
    "is_hub_id",
    "resolve_source",
    "download_from_hub",
    "find_in_hub_cache",
    "detect_format",
    "convert_state_dict",
    "to_hf_state_dict",
    "HF_TOP_NAMES",
    "HF_BLOCK_NAMES",
    "HF_QKV_NAMES",
]
