"""vitlab.weights: every weight layout loads and gives the reference implementation's logits.

Reference models are random-init timm / transformers / torchvision models saved by the tests (no
network). Every parameter of a reference is perturbed first, so a swapped LayerNorm, a transposed
kernel or a wrong q/k/v order changes the logits. Depth is reduced (depth=2) for the larger
architectures to keep the suite fast; the named widths, heads and patch sizes are kept.
"""

from __future__ import annotations

import builtins
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vitlab import create_model
from vitlab.errors import VitlabError
from vitlab.weights import PretrainedWarning, detect_format, resample_pos_embed
from vitlab.weights.formats import read_weights_file

timm = pytest.importorskip("timm")
TOL = 1e-4


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Add noise to every parameter (LayerNorm scales become != 1, biases != 0, heads != 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def images(n: int, size, seed: int = 1) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def load_quietly(name, source, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainedWarning)
        return create_model(name, pretrained=source, **kwargs)


# ----------------------------------------------------------------------------------------------------
# timm


TIMM_CASES = [
    # (timm name, timm kwargs, vitlab name, vitlab kwargs, image size, layout)
    ("vit_tiny_patch16_224", {}, "vit_tiny_patch16_224", {}, 224, "file"),
    ("vit_small_patch16_384", {"depth": 2}, "vit_small_patch16_224", {"depth": 2, "img_size": 384}, 384, "hub-dir"),
    ("vit_base_patch32_224", {"depth": 2}, "vit_base_patch32_224", {"depth": 2}, 224, "file"),
    (
        "vit_tiny_patch16_224",
        {"class_token": False, "global_pool": "avg", "depth": 2},
        "vit_tiny_patch16_224",
        {"class_token": False, "pool": "mean", "depth": 2},
        224,
        "file",
    ),
]


@pytest.mark.parametrize("case", TIMM_CASES, ids=["tiny", "small384", "base32", "gap-no-cls"])
def test_timm_checkpoints_match_timm_logits(case, tmp_path):
    timm_name, timm_kwargs, name, kwargs, size, layout = case
    torch.manual_seed(0)
    ref = perturb(timm.create_model(timm_name, pretrained=False, **timm_kwargs))
    if layout == "file":
        source = tmp_path / "model.safetensors"
        save_file(ref.state_dict(), source)
    else:  # timm's hub layout: config.json + model.safetensors
        from timm.models._hub import save_for_hf

        source = tmp_path / "hub"
        save_for_hf(ref, source, safe_serialization=True)
        assert (source / "model.safetensors").is_file() and (source / "config.json").is_file()
    model = create_model(name, pretrained=str(source), **kwargs)
    x = images(2, size)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) <= TOL
    assert model.pretrained_cfg.format == "timm"
    assert model.pretrained_cfg.head == "loaded"
    assert model.pretrained_cfg.input_size == (3, size, size)
    assert model.pretrained_cfg.mean == (0.5, 0.5, 0.5) and model.pretrained_cfg.interpolation == "bicubic"
    assert len(model.pretrained_cfg.label_names) == 1000  # bundled ImageNet-1k names


# ----------------------------------------------------------------------------------------------------
# Hugging Face


def hf_config(**kw):
    from transformers import ViTConfig

    base = dict(
        hidden_size=192,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=768,
        image_size=224,
        patch_size=16,
        num_labels=5,
        id2label={i: f"kind_{i}" for i in range(5)},
    )
    return ViTConfig(**{**base, **kw})


def test_hf_vit_for_image_classification_matches(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ref = perturb(transformers.ViTForImageClassification(hf_config()))
    ref.save_pretrained(tmp_path / "hf")
    x = images(2, 224)
    with torch.no_grad():
        expected = ref(pixel_values=x).logits
    # with the model named, and with the architecture read from config.json
    for name, kw in (("vit_tiny_patch16_224", {"depth": 2}), (None, {})):
        model = create_model(name, pretrained=str(tmp_path / "hf"), **kw)
        with torch.no_grad():
            assert max_diff(model(x), expected) <= TOL
    assert model.pretrained_cfg.format == "hf"
    assert model.pretrained_cfg.label_names == tuple(f"kind_{i}" for i in range(5))  # from id2label
    assert model.cfg.norm_eps == 1e-12  # HF's layer_norm_eps, not vitlab's default
    assert model.pretrained_cfg.crop_mode == "squash" and model.pretrained_cfg.crop_pct == 1.0


def test_hf_vitmodel_without_head_is_reported(tmp_path):
    transformers = pytest.importorskip("transformers")
    ref = perturb(transformers.ViTModel(hf_config()))
    ref.save_pretrained(tmp_path / "backbone")
    with pytest.warns(PretrainedWarning) as record:
        model = create_model(pretrained=str(tmp_path / "backbone"), num_classes=3)
    messages = " ".join(str(w.message) for w in record)
    assert "no classification head" in messages and "pooler" in messages
    assert model.pretrained_cfg.head == "absent"
    assert not model.head.weight.any()
    x = images(1, 224)
    with torch.no_grad():  # the backbone is intact: the features match HF's final LayerNorm output
        assert max_diff(model.forward_features(x), ref(pixel_values=x).last_hidden_state) <= TOL


# ----------------------------------------------------------------------------------------------------
# torchvision


def test_torchvision_vit_b_16_matches(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ref = torchvision.models.vit_b_16(weights=None)
    ref.encoder.layers = ref.encoder.layers[:2]  # vit_b_16's layout and widths, 2 of its 12 layers
    perturb(ref)
    torch.save(ref.state_dict(), tmp_path / "vit_b_16.pth")  # read back with weights_only=True
    model = create_model("vit_base_patch16_224", pretrained=str(tmp_path / "vit_b_16.pth"), depth=2)
    x = images(2, 224)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) <= TOL
    pcfg = model.pretrained_cfg
    assert pcfg.format == "torchvision"
    assert pcfg.mean == (0.485, 0.456, 0.406) and pcfg.crop_pct == 0.875 and pcfg.interpolation == "bilinear"


# ----------------------------------------------------------------------------------------------------
# JAX .npz (google-research/vision_transformer naming)


def write_jax_npz(model, path: Path, *, pre_logits: bool = False) -> None:
    """Write a timm ViT in the original JAX checkpoint layout (the inverse of the loaders)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    D = sd["pos_embed"].shape[-1]
    h = model.blocks[0].attn.num_heads
    w = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (D, C, P, P) -> (P, P, C, D)
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    if "cls_token" in sd:  # absent for the classifier="gap" checkpoints
        w["cls"] = sd["cls_token"]
    if pre_logits:
        w["pre_logits/kernel"], w["pre_logits/bias"] = np.eye(D, dtype=np.float32), np.zeros(D, np.float32)
    for i in range(len(model.blocks)):
        s, b = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = b + "MultiHeadDotProductAttention_1/"
        q, k, v = np.split(sd[s + "attn.qkv.weight"], 3)  # each (D_out, D_in)
        qb, kb, vb = np.split(sd[s + "attn.qkv.bias"], 3)
        for n, wt, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            w[mha + n + "/kernel"] = wt.T.reshape(D, h, D // h)  # (in, h, d)
            w[mha + n + "/bias"] = bias.reshape(h, D // h)
        w[mha + "out/kernel"] = sd[s + "attn.proj.weight"].T.reshape(h, D // h, D)
        w[mha + "out/bias"] = sd[s + "attn.proj.bias"]
        w[b + "LayerNorm_0/scale"], w[b + "LayerNorm_0/bias"] = sd[s + "norm1.weight"], sd[s + "norm1.bias"]
        w[b + "LayerNorm_2/scale"], w[b + "LayerNorm_2/bias"] = sd[s + "norm2.weight"], sd[s + "norm2.bias"]
        for j, fc in ((0, "fc1"), (1, "fc2")):
            w[b + f"MlpBlock_3/Dense_{j}/kernel"] = sd[s + f"mlp.{fc}.weight"].T
            w[b + f"MlpBlock_3/Dense_{j}/bias"] = sd[s + f"mlp.{fc}.bias"]
    np.savez(path, **w)


def to_big_vision(path: Path, out: Path) -> None:
    """Rename an original-layout .npz to big_vision's: params/ prefix, top-level pos_embedding,
    MultiHeadDotProductAttention_0, LayerNorm_0/1, MlpBlock_0."""
    w = dict(np.load(path))
    renamed = {}
    for k, v in w.items():
        k = k.replace("Transformer/posembed_input/pos_embedding", "pos_embedding")
        k = k.replace("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0")
        k = k.replace("LayerNorm_2", "LayerNorm_1").replace("MlpBlock_3", "MlpBlock_0")
        renamed["params/" + k] = v
    np.savez(out, **renamed)


def test_jax_npz_matches_and_timm_agrees_on_the_file(tmp_path):
    from timm.models.vision_transformer import _load_weights

    torch.manual_seed(0)
    ref = perturb(timm.create_model("vit_tiny_patch16_224", depth=2))
    path = tmp_path / "ViT-Ti_16.npz"
    write_jax_npz(ref, path)
    assert "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel" in np.load(path).files
    x = images(2, 224)
    with torch.no_grad():
        expected = ref(x)
        # The file really is in the JAX layout: timm's own .npz loader reproduces the reference.
        other = timm.create_model("vit_tiny_patch16_224", depth=2).eval()
        _load_weights(other, str(path))
        assert max_diff(other(x), expected) <= TOL
        model = create_model("vit_tiny_patch16_224", pretrained=str(path), depth=2)
        assert max_diff(model(x), expected) <= TOL
    assert model.pretrained_cfg.format == "jax"
    assert model.pretrained_cfg.crop_mode == "squash" and model.pretrained_cfg.interpolation == "bilinear"
    # big_vision's names for the same tensors: timm's loader and vitlab's agree again
    to_big_vision(path, tmp_path / "big_vision.npz")
    with torch.no_grad():
        other = timm.create_model("vit_tiny_patch16_224", depth=2).eval()
        _load_weights(other, str(tmp_path / "big_vision.npz"))
        assert max_diff(other(x), expected) <= TOL
        model = create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "big_vision.npz"), depth=2)
        assert max_diff(model(x), expected) <= TOL


def test_jax_gap_checkpoint_without_class_token(tmp_path):
    """classifier='gap' (no class token; the encoder's LayerNorm, then the mean over patches): timm's
    *_gap_* models. The named model refuses it with the overrides to pass; with them it loads."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer import _load_weights

    torch.manual_seed(0)
    ref = perturb(
        TimmViT(
            img_size=224,
            patch_size=16,
            embed_dim=192,
            depth=2,
            num_heads=3,
            num_classes=5,
            class_token=False,
            global_pool="avg",
            fc_norm=False,
        )
    ).eval()
    path = tmp_path / "gap.npz"
    write_jax_npz(ref, path)
    assert "cls" not in np.load(path).files
    x = images(2, 224)
    with pytest.raises(VitlabError, match="class_token=False, pool='mean', fc_norm=False"):
        create_model("vit_tiny_patch16_224", pretrained=str(path), depth=2, num_classes=5)
    with torch.no_grad():
        expected = ref(x)
        other = TimmViT(
            img_size=224,
            patch_size=16,
            embed_dim=192,
            depth=2,
            num_heads=3,
            num_classes=5,
            class_token=False,
            global_pool="avg",
            fc_norm=False,
        ).eval()
        _load_weights(other, str(path))
        assert max_diff(other(x), expected) <= TOL  # the file is what timm's loader reads
        model = create_model(
            "vit_tiny_patch16_224",
            pretrained=str(path),
            depth=2,
            num_classes=5,
            class_token=False,
            pool="mean",
            fc_norm=False,
        )
        assert max_diff(model(x), expected) <= TOL
    assert model.cls_token is None and isinstance(model.fc_norm, torch.nn.Identity)


def test_jax_pre_logits_checkpoint_drops_the_pretraining_head(tmp_path):
    ref = perturb(timm.create_model("vit_tiny_patch16_224", depth=1))
    write_jax_npz(ref, tmp_path / "in21k.npz", pre_logits=True)
    with pytest.warns(PretrainedWarning) as record:
        model = create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "in21k.npz"), depth=1)
    messages = " ".join(str(w.message) for w in record)
    assert "pre-training head" in messages and "no classification head" in messages
    assert model.pretrained_cfg.head == "absent" and not model.head.weight.any()


# ----------------------------------------------------------------------------------------------------
# Heads, resolution, mismatches


def test_new_num_classes_gives_zero_head_and_warning(tmp_path):
    ref = perturb(timm.create_model("vit_tiny_patch16_224", depth=1))
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    with pytest.warns(PretrainedWarning, match="1000 classes; made a new zero-initialised head for 10"):
        model = create_model(
            "vit_tiny_patch16_224", pretrained=str(tmp_path / "w.safetensors"), num_classes=10, depth=1
        )
    assert model.head.weight.shape == (10, 192) and not model.head.weight.any() and not model.head.bias.any()
    assert model.pretrained_cfg.head == "new" and model.pretrained_cfg.label_names is None
    x = images(1, 224)
    with torch.no_grad():  # the backbone still matches
        assert (
            max_diff(
                model.forward_head(model.forward_features(x), pre_logits=True),
                ref.forward_head(ref.forward_features(x), pre_logits=True),
            )
            <= TOL
        )


def test_zeroed_in21k_head_is_reported(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=21843)
    torch.nn.init.zeros_(ref.head.weight), torch.nn.init.zeros_(ref.head.bias)
    save_file(ref.state_dict(), tmp_path / "in21k.safetensors")
    with pytest.warns(PretrainedWarning, match="all zeros"):
        model = create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "in21k.safetensors"), depth=1)
    assert model.pretrained_cfg.head == "zero" and model.cfg.num_classes == 21843


def test_resample_pos_embed_matches_timm_including_non_square():
    from timm.layers import resample_abs_pos_embed

    g = torch.Generator().manual_seed(0)
    pe = torch.randn(1, 1 + 14 * 14, 32, generator=g)
    ours = resample_pos_embed(pe, (24, 24), num_prefix_tokens=1)
    assert ours.shape == (1, 1 + 24 * 24, 32)
    assert torch.equal(ours[:, :1], pe[:, :1])  # the class token's row is kept
    assert max_diff(ours, resample_abs_pos_embed(pe, (24, 24), num_prefix_tokens=1)) <= 1e-5
    pe2 = torch.randn(1, 12 * 16, 32, generator=g)  # no prefix token, 12x16 grid
    ours2 = resample_pos_embed(pe2, (20, 10), old_grid=(12, 16), num_prefix_tokens=0)
    ref2 = resample_abs_pos_embed(pe2, (20, 10), old_size=(12, 16), num_prefix_tokens=0)
    assert ours2.shape == (1, 200, 32) and max_diff(ours2, ref2) <= 1e-5


def test_learned2d_and_relative_tables_follow_a_new_img_size(tmp_path):
    """A vitlab checkpoint with 2-D position tables loads at another (non-square) size: learned2d's row
    and column tables are each resampled along their own axis; each relative table, an image of the
    (2gh-1) x (2gw-1) offsets, bicubic. Tables that are linear in the offset stay (nearly) linear inside."""
    import vitlab
    from vitlab.weights.checkpoint import save_checkpoint

    # grid rows x cols: 32x48 px -> 48x32 px at patch 4 (8 x 12 -> 12 x 8)
    for kind in ("learned2d", "relative"):
        model = vitlab.create_model("vit_mini", pos_embed=kind, img_size=(32, 48), num_classes=3)
        with torch.no_grad():
            if kind == "learned2d":
                model.pos_embed_row.copy_(torch.arange(8.0)[None, :, None].expand(1, 8, 32))
                model.pos_embed_col.copy_(-2 * torch.arange(12.0)[None, :, None].expand(1, 12, 32))
            else:
                dy, dx = torch.meshgrid(torch.arange(-7.0, 8), torch.arange(-11.0, 12), indexing="ij")
                for rel in model.rel_pos:
                    rel.table.copy_((dy + 2 * dx).flatten().expand_as(rel.table))
        folder = save_checkpoint(tmp_path / kind, "e1", model, {"epoch": 1})
        same = create_model(checkpoint=folder)
        x = torch.randn(2, 3, 32, 48)
        with torch.no_grad():
            assert max_diff(same(x), model.eval()(x)) <= 1e-6
        moved = create_model(checkpoint=folder, img_size=(48, 32))
        assert any("resampled from a 8x12 to a 12x8 grid" in n for n in moved.pretrained_cfg.notes)
        with torch.no_grad():
            assert moved(torch.randn(2, 3, 48, 32)).shape == (2, 3)

        def src(i, n_old, n_new):  # F.interpolate's source coordinate (align_corners=False)
            return (i + 0.5) * n_old / n_new - 0.5

        if kind == "learned2d":
            rows, cols = moved.pos_embed_row[0, :, 0], moved.pos_embed_col[0, :, 0]
            assert rows.shape == (12,) and cols.shape == (8,)
            i, j = torch.arange(1, 11.0), torch.arange(1, 7.0)  # inside: no clamping at the ends
            assert max_diff(rows[1:11], src(i, 8, 12)) <= 1e-5 and max_diff(cols[1:7], -2 * src(j, 12, 8)) <= 1e-5
        else:
            table = moved.rel_pos[1].table[0].reshape(23, 15)  # (2*12-1) x (2*8-1) offsets
            i, j = torch.meshgrid(torch.arange(23.0), torch.arange(15.0), indexing="ij")
            expected = (src(i, 15, 23) - 7) + 2 * (src(j, 23, 15) - 11)
            # bicubic (a = -0.75) follows a line to within ~1% of this +-30 range; a swapped axis misses by units
            assert max_diff(table[3:-3, 3:-3], expected[3:-3, 3:-3]) <= 0.3
            assert not torch.allclose(table, table.T.reshape(23, 15))  # rows and columns not swapped somewhere


def test_224_checkpoint_at_img_size_384_matches_timm_resampling(tmp_path):
    ref = perturb(timm.create_model("vit_tiny_patch16_224", depth=2))
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    model = create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "w.safetensors"), img_size=384, depth=2)
    assert model.pos_embed.shape == (1, 1 + 24 * 24, 192)
    assert model.pretrained_cfg.input_size == (3, 384, 384)
    assert any("resampled" in n for n in model.pretrained_cfg.notes)
    # timm resamples the same file the same way (bicubic, class token kept) when it builds a 384 model.
    timm384 = timm.create_model(
        "vit_tiny_patch16_224",
        img_size=384,
        depth=2,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(tmp_path / "w.safetensors")),
    ).eval()
    x = images(1, 384)
    with torch.no_grad():
        assert max_diff(model(x), timm384(x)) <= TOL


def test_mismatched_model_lists_fields_and_keys(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", depth=2)
    save_file(ref.state_dict(), tmp_path / "tiny.safetensors")
    with pytest.raises(VitlabError) as err:
        create_model("vit_small_patch16_224", pretrained=str(tmp_path / "tiny.safetensors"), depth=3)
    msg = str(err.value)
    assert "dim: model 384 vs checkpoint 192" in msg and "depth: model 3 vs checkpoint 2" in msg
    assert "missing keys (12): blocks.2.attn.proj.bias" in msg  # block 2's 12 tensors
    assert "shape differences" in msg and "(1152, 384) vs checkpoint (576, 192)" in msg
    assert "tiny.safetensors" in msg


def test_unknown_layout_and_missing_source_are_clear_errors(tmp_path):
    with pytest.raises(VitlabError, match="unrecognised checkpoint layout"):
        detect_format(["features.0.weight", "classifier.1.weight"])
    with pytest.raises(VitlabError, match="neither an existing file"):
        create_model("vit_tiny_patch16_224", pretrained=str(tmp_path / "nope" / "missing.safetensors"))


# ----------------------------------------------------------------------------------------------------
# Safe loading and the hub


class _CreatesFile:
    """Unpickling this calls open(path, "w"): a stand-in for arbitrary code in a malicious .pth."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


def test_malicious_pth_is_refused_and_runs_nothing(tmp_path):
    target = tmp_path / "pwned.txt"
    bad = tmp_path / "evil.pth"
    torch.save({"patch_embed.proj.weight": torch.zeros(1), "payload": _CreatesFile(str(target))}, bad)
    with pytest.raises(VitlabError, match="refused to load"):
        read_weights_file(bad)
    with pytest.raises(VitlabError, match="refused to load"):
        create_model("vit_tiny_patch16_224", pretrained=str(bad))
    assert not target.exists()
    # The file is genuinely malicious: an unsafe load would have created the file.
    control = tmp_path / "control.txt"
    torch.save({"payload": _CreatesFile(str(control))}, tmp_path / "control.pth")
    torch.load(tmp_path / "control.pth", weights_only=False)
    assert control.exists()


def _fill_hub_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> None:
    """The Hugging Face cache layout: models--org--name/{refs/main, snapshots/<commit>/<files>}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, src in files.items():
        (snap / name).write_bytes(src.read_bytes())


def test_hub_id_from_offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants
    from timm.models._hub import save_for_hf

    ref = perturb(timm.create_model("vit_tiny_patch16_224", depth=2))
    save_for_hf(ref, tmp_path / "export", safe_serialization=True)
    cache = tmp_path / "hub"
    _fill_hub_cache(
        cache,
        "timm/vit_tiny_patch16_224.test",
        {
            "config.json": tmp_path / "export" / "config.json",
            "model.safetensors": tmp_path / "export" / "model.safetensors",
        },
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    model = create_model("vit_tiny_patch16_224", pretrained="hf-hub:timm/vit_tiny_patch16_224.test", depth=2)
    x = images(1, 224)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) <= TOL
    with pytest.raises(VitlabError) as err:
        create_model("vit_base_patch16_224", pretrained="google/vit-base-patch16-224")
    msg = str(err.value)
    assert "'google/vit-base-patch16-224'" in msg and str(cache) in msg and "HF_HUB_OFFLINE" in msg


def test_a_hybrid_run_checkpoint_loads_back_as_the_same_model(tmp_path):
    """A hybrid's patch embedding is a 1x1 projection of its conv stem's map: its kernel and input channels are the
    stem's, and the checkpoint's own config (patch size 4, one grey channel) is what the model is built from."""
    import vitlab
    from vitlab.weights.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = vitlab.create_model(
        "vit_mini", stem="hybrid", stem_width=16, patch_size=4, img_size=28, in_chans=1, num_classes=10
    ).eval()
    torch.nn.init.normal_(model.head.weight)
    back = vitlab.create_model(checkpoint=save_checkpoint(tmp_path / "run", "e1", model, {"epoch": 1})).eval()
    assert (back.cfg.stem, back.cfg.patch_size, back.cfg.in_chans, back.cfg.stem_width) == ("hybrid", 4, 1, 16)
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(model(x), back(x))
