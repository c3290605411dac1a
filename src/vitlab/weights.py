"""Pretrained weights: timm, Hugging Face, torchvision and the original JAX release, loaded into vitlab.

Every conversion between weight layouts lives in this file, in one direction: a checkpoint is read
(safely), its layout is detected from its keys, its tensors are renamed to vitlab's names (which are
timm's), its configuration is inferred, and the result is checked against the model you named.

    source (file | directory | hub id)
      -> read_checkpoint()      safetensors / torch.load(weights_only=True) / np.load(allow_pickle=False)
      -> detect_format()        "timm" | "hf" | "torchvision" | "jax"
      -> convert_state_dict()   one function per layout, all to vitlab names
      -> infer_config()         patch, dim, depth, heads, MLP, classes, grid, class token, pooling
      -> load_pretrained()      build the named model; resample the position table for a new img_size
                                (Section 3.2, "2D interpolation of the pre-trained position
                                embeddings"); a new zero head for a new num_classes (Section 3.2)

The layouts (names of block i):

    vitlab / timm   blocks.i.attn.qkv (3D, D)                    patch_embed.proj (D, C, P, P)
    HF ViT          vit.encoder.layer.i.attention.attention.{query,key,value}; embeddings.*
    torchvision     encoder.layers.encoder_layer_i.self_attention.in_proj_weight; conv_proj; class_token
    JAX .npz        Transformer/encoderblock_i/MultiHeadDotProductAttention_1/query/kernel (D, h, d);
                    embedding/kernel (P, P, C, D), permuted (3, 2, 0, 1) to PyTorch's (D, C, P, P)

Each source preprocesses differently, and a mismatch silently costs accuracy (vision_transformer#39:
83.41% vs 85.08%), so the loaded model's `pretrained_cfg` carries the source's resize, crop,
interpolation and mean/std; `vitlab.preprocess.eval_transform(model.pretrained_cfg)` applies them.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vitlab.errors import VitlabError

FORMATS = ("timm", "hf", "torchvision", "jax")
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".tar")  # .tar: timm training checkpoints (model_best.pth.tar)
WEIGHT_SUFFIXES = (".safetensors", ".npz", *TORCH_SUFFIXES)

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
    format: str  # one of FORMATS, or "vitlab" for a file written by vitlab
    config: dict  # ViTConfig fields inferred from the tensors and the config file
    pretrained_cfg: dict  # preprocessing and labels of the source
    path: str = ""
    architecture: str | None = None  # a vitlab model name, when the config file gives one
    notes: list[str] = field(default_factory=list)  # parts dropped in conversion

    @property
    def grid_size(self) -> tuple[int, int] | None:
        return self.config.get("grid_size")


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
            from safetensors.torch import load_file

            return load_file(str(path))
        if suffix in TORCH_SUFFIXES:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
            return _unwrap_torch_checkpoint(obj, path)
        if suffix == ".npz":
            with np.load(str(path), allow_pickle=False) as npz:
                return {k: torch.from_numpy(np.array(npz[k])) for k in npz.files}
    except VitlabError:
        raise
    except pickle.UnpicklingError as e:
        raise VitlabError(
            f"refused to load {path}: it holds pickled objects other than tensors, which could run code "
            f"(torch.load(weights_only=True) said: {str(e).splitlines()[0]}); "
            "get the weights as .safetensors, or re-save a trusted file's state_dict with torch.save"
        ) from e
    except Exception as e:  # safetensors, zip and numpy errors have no common base class
        raise VitlabError(f"could not read weights file {path}: {type(e).__name__}: {e}") from e
    raise VitlabError(f"weights file {path} has suffix {suffix!r}; expected one of {', '.join(WEIGHT_SUFFIXES)}")


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
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
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


def download_from_hub(repo_id: str, *, cache_dir: str | Path | None = None) -> Path:
    """The local snapshot folder of hub repo `repo_id`: the cache first, then the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
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
        raise VitlabError(f"could not download hub id {repo_id!r} into the cache {cache}: {type(e).__name__}: {e}") from e
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
    if any(k.startswith(("vit.", "embeddings.patch_embeddings", "embeddings.position_embeddings")) for k in keys):
        return "hf"
    if any(k.startswith(("patch_embed.", "blocks.")) for k in keys):
        return "timm"
    shown = ", ".join(sorted(keys)[:6])
    raise VitlabError(
        f"unrecognised checkpoint layout (first keys: {shown}); expected timm (patch_embed.proj, blocks.0...), "
        "Hugging Face ViT (vit.embeddings...), torchvision (conv_proj, encoder.layers...) or JAX .npz "
        "(embedding/kernel, Transformer/encoderblock_0/...)"
    )


def convert_state_dict(state_dict: dict[str, torch.Tensor], fmt: str | None = None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a checkpoint's tensors to vitlab's (timm's) names. Returns (state dict, notes on dropped parts)."""
    fmt = fmt or detect_format(state_dict)
    if fmt in ("timm", "vitlab"):
        return dict(state_dict), []
    return {"hf": _convert_hf, "torchvision": _convert_torchvision, "jax": _convert_jax}[fmt](state_dict)


def _fuse_qkv(out: dict, parts: dict) -> None:
    """Concatenate per-block q, k, v (each (D, D) / (D,)) into vitlab's one qkv Linear (3D, D) / (3D,)."""
    for (i, kind), qkv in sorted(parts.items()):
        missing = [n for n in "qkv" if n not in qkv]
        if missing:
            raise VitlabError(f"block {i} of the checkpoint lacks the {', '.join(missing)} projection {kind}")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)


def _convert_hf(sd: dict) -> tuple[dict, list[str]]:
    """Hugging Face ViTModel / ViTForImageClassification, both the saved layout
    (encoder.layer.i.attention.attention.query) and transformers 5's in-memory one (layers.i.attention.q_proj)."""
    out, qkv, notes = {}, {}, []
    block_rules = [
        (r"attention\.attention\.(query|key|value)\.(weight|bias)", "qkv"),
        (r"attention\.(q|k|v)_proj\.(weight|bias)", "qkv"),
        (r"attention\.output\.dense\.(weight|bias)", "attn.proj.{}"),
        (r"attention\.o_proj\.(weight|bias)", "attn.proj.{}"),
        (r"intermediate\.dense\.(weight|bias)", "mlp.fc1.{}"),
        (r"output\.dense\.(weight|bias)", "mlp.fc2.{}"),
        (r"mlp\.(fc1|fc2)\.(weight|bias)", "mlp.{}.{}"),
        (r"layernorm_before\.(weight|bias)", "norm1.{}"),
        (r"layernorm_after\.(weight|bias)", "norm2.{}"),
    ]
    top_rules = {
        "embeddings.cls_token": "cls_token",
        "embeddings.position_embeddings": "pos_embed",
        "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "layernorm.weight": "norm.weight",
        "layernorm.bias": "norm.bias",
        "classifier.weight": "head.weight",
        "classifier.bias": "head.bias",
    }
    for key, value in sd.items():
        name = key.removeprefix("vit.")
        if name in top_rules:
            out[top_rules[name]] = value
            continue
        m = re.fullmatch(r"(?:encoder\.layer|layers)\.(\d+)\.(.+)", name)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            for pattern, target in block_rules:
                mm = re.fullmatch(pattern, rest)
                if not mm:
                    continue
                if target == "qkv":
                    qkv.setdefault((i, mm.group(2)), {})[mm.group(1)[0]] = value
                else:
                    out[f"blocks.{i}." + target.format(*mm.groups())] = value
                break
            else:
                out[key] = value  # left for the key check to report
            continue
        if name.startswith("pooler."):
            notes.append("dropped the Hugging Face pooler (a tanh Dense layer that ViTForImageClassification does not use)")
        elif name == "embeddings.mask_token":
            notes.append("dropped embeddings.mask_token (only used for masked image modelling)")
        else:
            out[key] = value
    _fuse_qkv(out, qkv)
    return out, sorted(set(notes))


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
        "ln_1": "norm1", "ln_2": "norm2",
        "self_attention.in_proj_weight": "attn.qkv.weight", "self_attention.in_proj_bias": "attn.qkv.bias",
        "self_attention.out_proj": "attn.proj",
        "mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2", "mlp.linear_1": "mlp.fc1", "mlp.linear_2": "mlp.fc2",
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
        blocks = [{k.split("/", 2)[2]: v[i] for k, v in w.items() if k.startswith("Transformer/encoderblock/")} for i in range(depth)]
    else:
        idx = sorted({int(m.group(1)) for k in w if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
        blocks = [{k.split("/", 2)[2]: v for k, v in w.items() if k.startswith(f"Transformer/encoderblock_{i}/")} for i in idx]
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
    """The ViTConfig fields stored by vitlab: `{"kind": "vit", "config": {...}}` (vitlab.train.checkpoint,
    vitlab.export) or `vit_config`."""
    from vitlab.model import ViTConfig

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
        pretrained_cfg=_source_pretrained_cfg(fmt, config, preproc, cfg),
        path=str(path),
        architecture=architecture,
        notes=notes,
    )


def _source_pretrained_cfg(fmt: str, config: dict, preproc: dict, cfg: dict) -> dict:
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
    out["label_names"] = list(labels) if labels else None
    return out


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in the order of every 1000-class ImageNet head."""
    text = resources.files("vitlab").joinpath("resources/imagenet_classes.txt").read_text()
    names = text.splitlines()
    assert len(names) == 1000, f"resources/imagenet_classes.txt should have 1000 lines, has {len(names)}"
    return names


# ----------------------------------------------------------------------------------------------------
# The entry point


def load_pretrained(
    name: str | None,
    source: str | Path,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    *,
    cache_dir: str | Path | None = None,
    **overrides,
):
    """Build model `name` and load the weights of `source` into it.

    name: a vitlab model name (`vitlab.model_names()`), whose architecture the checkpoint must match;
        None takes the architecture from the checkpoint (its config must give the number of heads).
    source: a .safetensors/.pth/.pt/.bin/.npz file, a directory (Hugging Face `save_pretrained`, timm
        hub, or vitlab export layout), or a hub id (`hf-hub:timm/...`, `google/vit-base-patch16-224`).
    num_classes: None keeps the checkpoint's head; another number gets a new zero-initialised head
        (Section 3.2) and a PretrainedWarning.
    img_size: None keeps the named model's resolution; if it differs from the checkpoint's, the
        position embedding is resampled (2-D bicubic, class token kept).
    overrides: other ViTConfig fields (e.g. depth=2), checked against the checkpoint like the rest.

    Returns a VisionTransformer in eval mode whose `pretrained_cfg` gives the source's preprocessing
    (input_size, mean, std, crop_pct, crop_mode, interpolation) and class names, and says whether the
    head was loaded ("loaded"), is all zeros ("zero", e.g. an ImageNet-21k checkpoint), was absent
    ("absent"), is new ("new"), or was left out (num_classes=0: "none", the model returns features).
    """
    from vitlab.model import VisionTransformer, ViTConfig
    from vitlab.zoo import VARIANTS, get_config

    ckpt = load_checkpoint(source, cache_dir=cache_dir)
    inferred = {k: v for k, v in ckpt.config.items() if k != "grid_size"}
    if name is not None:  # the user named the architecture: the checkpoint must fit it
        base = get_config(name, **overrides)
    else:  # the checkpoint describes itself: its config file's architecture, corrected by its tensors
        name = ckpt.architecture if ckpt.architecture in VARIANTS else None
        if name is None and "heads" not in inferred:
            raise VitlabError(
                f"{ckpt.path}: the checkpoint does not say its number of heads; name the model "
                "(--model, e.g. vit_base_patch16_224) so vitlab knows the architecture"
            )
        known = {f.name for f in fields(ViTConfig)} - {"num_classes"}
        start = get_config(name) if name is not None else ViTConfig()
        base = start.replace(**{k: v for k, v in inferred.items() if k in known}).replace(**overrides)
    _check_architecture(name, base, inferred, ckpt)

    ckpt_classes = inferred["num_classes"]
    head = _head_state(ckpt.state_dict, ckpt_classes)
    target_classes = num_classes if num_classes is not None else (ckpt_classes if ckpt_classes > 0 else base.num_classes)
    target_size = img_size if img_size is not None else overrides.get("img_size", base.img_size)
    keep = {"norm_eps": inferred["norm_eps"]} if "norm_eps" in inferred and "norm_eps" not in overrides else {}
    cfg = base.replace(num_classes=target_classes, img_size=target_size, **keep)
    model = VisionTransformer(cfg)

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

    _check_keys(model, sd, name, ckpt, skip_head=head in ("new", "absent", "none"))
    model.load_state_dict(sd, strict=head not in ("new", "absent", "none"))
    model.eval()

    pcfg = dict(ckpt.pretrained_cfg)
    labels = pcfg.get("label_names") if head == "loaded" or head == "zero" else None
    if labels is not None and len(labels) != target_classes:
        labels = None
    if labels is None and target_classes == 1000 and head in ("loaded", "zero"):
        labels = imagenet_class_names()
    pcfg.update(
        input_size=(cfg.in_chans, *cfg.img_size),
        num_classes=target_classes,
        label_names=labels,
        source=str(source),
        format=ckpt.format,
        architecture=name,
        head=head,
        notes=notes,
    )
    model.pretrained_cfg = pcfg
    return model


def _head_state(sd: dict, num_classes: int) -> str:
    if "head.weight" not in sd or num_classes == 0:
        return "absent"
    if not sd["head.weight"].any() and ("head.bias" not in sd or not sd["head.bias"].any()):
        return "zero"
    return "loaded"


def _warn(message: str) -> None:
    warnings.warn(message, PretrainedWarning, stacklevel=3)


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
    if diffs and "fc_norm" in inferred and all(f != "fc_norm" for f, _, _ in diffs):
        # fc_norm's default follows pool: with the other fixes applied it may be the one left to differ
        fixed = cfg.replace(**{f: t for f, _, t in diffs})
        if fixed.use_fc_norm != inferred["fc_norm"]:
            diffs.append(("fc_norm", fixed.use_fc_norm, inferred["fc_norm"]))
    if diffs:
        listing = ", ".join(f"{f}: model {m!r} vs checkpoint {t!r}" for f, m, t in diffs)
        fix = ", ".join(f"{f}={t!r}" for f, _, t in diffs)
        like = _matching_variants(inferred)
        hint = f" (it looks like {', '.join(like)})" if like else ""
        raise VitlabError(
            f"checkpoint {ckpt.path} ({ckpt.format} layout) does not fit model {name!r}: {listing}. "
            f"Name the model the checkpoint was trained as{hint}, or pass the overrides {fix}. "
            + _key_report(name, cfg, ckpt)
        )


def _matching_variants(inferred: dict) -> list[str]:
    """vitlab model names whose structure agrees with everything the checkpoint says."""
    from vitlab.zoo import VARIANTS

    out = []
    for vname, variant in VARIANTS.items():
        c = variant.config
        values = {f: _structural(c, f) for f in STRUCTURAL_FIELDS}
        if all(values[f] == inferred[f] for f in STRUCTURAL_FIELDS if f in inferred):
            out.append(vname)
    return out[:4]


def _key_report(name, cfg, ckpt: Checkpoint) -> str:
    """Missing keys, unexpected keys and shape differences between a model of `cfg` and the checkpoint."""
    from vitlab.model import VisionTransformer

    try:
        grid = ckpt.grid_size
        size = tuple(g * cfg.patch_size for g in grid) if grid else cfg.img_size
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model_sd = VisionTransformer(cfg.replace(img_size=size, num_classes=ckpt.config.get("num_classes", cfg.num_classes))).state_dict()
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


def _check_keys(model, sd: dict, name, ckpt: Checkpoint, *, skip_head: bool) -> None:
    skip = ("head.weight", "head.bias") if skip_head else ()
    report = _diff_keys(model.state_dict(), sd, skip)
    if report:
        raise VitlabError(f"checkpoint {ckpt.path} ({ckpt.format} layout) does not load into model {name!r}: {report}")


__all__ = [
    "Checkpoint",
    "PretrainedWarning",
    "PREPROCESSING",
    "read_weights_file",
    "read_checkpoint",
    "resolve_source",
    "download_from_hub",
    "detect_format",
    "convert_state_dict",
    "infer_config",
    "resample_pos_embed",
    "load_checkpoint",
    "load_pretrained",
    "imagenet_class_names",
]
