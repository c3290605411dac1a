"""vitlab as a timm drop-in: what timm's tests/test_models.py asserts of a ViT classifier, over every registered
name (vitlab.models.registry.VARIANTS), each at a small size (width 32, 1 block, a 2x2 patch grid) so that the
whole file runs in seconds on one CPU core. timm is the reference where the two must agree (its data helpers,
its layer-decay optimiser, its default pretrained configs); no network: hub weights come from a local cache
made by the test.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from vitlab import create_model
from vitlab.errors import VitlabError
from vitlab.models.registry import VARIANTS, hub_id
from vitlab.models.vit import VisionTransformer

timm = pytest.importorskip("timm")
from timm.data import resolve_data_config  # noqa: E402
from timm.models import get_pretrained_cfg  # noqa: E402

VITS = [n for n, v in VARIANTS.items() if v.is_vit]
CNNS = [n for n, v in VARIANTS.items() if not v.is_vit]
B = 2


def small_args(name: str) -> dict:
    """Overrides that make `name` small: width 32, 2 heads, 1 block, a 2x2 grid of its own patch size."""
    cfg = VARIANTS[name].config
    if not VARIANTS[name].is_vit:
        return dict(width=4, blocks=1, img_size=16)
    return dict(dim=32, heads=2, depth=1, mlp_dim=64, img_size=2 * cfg.patch_size)


def small(name: str, **kw) -> nn.Module:
    torch.manual_seed(0)
    model = create_model(name, pretrained=False, **{**small_args(name), **kw})
    with torch.no_grad():  # a zero head would hide every difference the tests look for
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def images(model, chans: int | None = None) -> torch.Tensor:
    C, (H, W) = chans or model.cfg.in_chans, model.cfg.img_size
    return torch.randn(B, C, H, W, generator=torch.Generator().manual_seed(1))


def out_width(model) -> int:
    return model.num_classes or model.head_hidden_size


# ----------------------------------------------------------------------------------------------------
# Forward, backward, and the classifier API (timm's test_model_forward, test_model_backward, test_model_default_cfgs)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_and_backward_reach_every_parameter(name):
    model = small(name).train()
    x = images(model)
    out = model(x)
    assert out.shape == (B, out_width(model)) and torch.isfinite(out).all()
    out.float().pow(2).mean().backward()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert trainable and not no_grad, no_grad
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_pretrained_cfg_is_the_dict_timm_reads(name):
    model = small(name)
    cfg = model.pretrained_cfg
    assert model.default_cfg is cfg  # timm's older name, which its own tests read
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    assert {"input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation", "num_classes"} <= set(cfg)
    assert cfg["input_size"] == (model.cfg.in_chans, *model.cfg.img_size)
    assert cfg["num_classes"] == model.num_classes and cfg["architecture"] == name
    assert isinstance(model.get_submodule(cfg["first_conv"]), nn.Conv2d)
    assert model.get_submodule(cfg["first_conv"]).in_channels == model.cfg.in_chans
    assert model.get_submodule(cfg["classifier"]) is (
        model.get_classifier()[0] if isinstance(model.get_classifier(), tuple) else model.get_classifier()
    )
    data = resolve_data_config(model=model)  # timm's data helper reads vitlab's model as one of its own
    assert data == {k: cfg[k] for k in ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")}
    assert cfg.crop_pct == cfg["crop_pct"] and dict(cfg) == cfg.to_timm()  # vitlab's typed fields, the same values
    assert cfg["hf_hub_id"] == hub_id(name)


@pytest.mark.parametrize("name", [n for n in VITS if hub_id(n) is not None])
def test_each_name_has_timms_default_preprocessing_and_hub_id(name):
    """A name timm has carries the preprocessing of timm's default weights for that name, and their hub id."""
    timm_cfg = get_pretrained_cfg(hub_id(name).removeprefix("timm/"))
    ours = VARIANTS[name].pretrained_cfg
    as_tuple = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    for key in ("mean", "std", "crop_pct", "crop_mode", "interpolation"):
        assert as_tuple(ours[key]) == as_tuple(getattr(timm_cfg, key)), key
    assert timm_cfg.hf_hub_id == hub_id(name)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_features_and_forward_head(name):
    model = small(name).eval()
    x = images(model)
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        logits = model.forward_head(feats)
        full = model(x)
    assert pre.shape == (B, model.head_hidden_size)
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)  # forward's class-token shortcut agrees
    if isinstance(model, VisionTransformer):
        assert feats.shape == (B, model.num_prefix_tokens + model.cfg.num_patches, model.num_features)
    else:
        assert feats.shape[:2] == (B, model.num_features)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reset_classifier_to_none_and_to_new_classes(name):
    model = small(name).eval()
    x = images(model)
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    model.reset_classifier(0)
    assert model.num_classes == 0
    with torch.no_grad():
        torch.testing.assert_close(model(x), pooled, atol=1e-5, rtol=1e-5)  # no head: the pooled features
    model.reset_classifier(7)
    heads = model.get_classifier()
    for head in heads if isinstance(heads, tuple) else (heads,):
        assert isinstance(head, nn.Linear) and head.out_features == 7 and not head.weight.any()  # Section 3.2
    assert model(x).shape == (B, 7) and model.num_classes == 7


@pytest.mark.parametrize("name", VITS)
def test_reset_classifier_changes_the_pooling_by_timms_name(name):
    model = small(name)
    if not model.cfg.class_token:
        with pytest.raises(VitlabError, match="class_token"):
            model.reset_classifier(3, "token")
        return
    if model.cfg.dist_token:  # DeiT's second head reads the distillation token: the class token's pooling only
        with pytest.raises(VitlabError, match="dist_token needs class_token=True and pool='cls'"):
            model.reset_classifier(3, "avg")
        return
    model.reset_classifier(3, "avg")
    assert model.global_pool == "avg" and model.cfg.pool == "mean" and model(images(model)).shape == (B, 3)
    with pytest.raises(VitlabError, match="global_pool must be 'token' or 'avg'.*'map'"):
        model.reset_classifier(3, "map")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_num_features_and_no_weight_decay(name):
    model = small(name)
    params = dict(model.named_parameters())
    assert set(model.no_weight_decay()) <= set(params)
    if isinstance(model, VisionTransformer):
        assert model.num_features == model.cfg.dim == 32
        assert {n for n in ("cls_token", "pos_embed", "reg_token", "dist_token") if n in params} <= set(
            model.no_weight_decay()
        )
    else:
        assert model.num_features == model.get_classifier().in_features


@pytest.mark.parametrize("name", VITS)
def test_grad_checkpointing_gives_the_same_outputs_and_gradients(name):
    plain, ckpt = small(name).train(), small(name).train()
    ckpt.set_grad_checkpointing(True)
    x = images(plain)
    grads = []
    for model in (plain, ckpt):
        model(x).pow(2).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_jit_trace_and_fx_trace_work_and_script_is_refused_by_name(name):
    model = small(name).eval()
    x = images(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation and tracer warnings
        traced = torch.jit.trace(model, x, check_trace=False)  # compared below, once
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), atol=1e-5, rtol=1e-5)
    if isinstance(model, VisionTransformer):  # the ViTs timm's fx tests trace (the CNN baselines are vitlab's own)
        graph = torch.fx.symbolic_trace(model)
        with torch.no_grad():
            assert torch.equal(graph(x), model(x))  # the same computation (timm's test_model_forward_fx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(VitlabError, match=r"^torch\.jit\.script: .*use torch\.fx\.symbolic_trace"):
                torch.jit.script(model)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_other_in_chans(name):
    model = small(name, in_chans=1)
    assert model(images(model, 1)).shape == (B, out_width(model))
    assert model.pretrained_cfg["input_size"][0] == 1


@pytest.mark.parametrize("name", VITS)
def test_dynamic_img_size_takes_other_sizes_and_a_fixed_model_says_what_to_do(name):
    cfg = VARIANTS[name].config
    P = cfg.patch_size
    if cfg.pos_embed not in ("learned", "none") or cfg.stem != "patch":
        with pytest.raises(VitlabError, match="dynamic_img_size=True resamples the 1-D position table"):
            create_model(name, dynamic_img_size=True, **small_args(name))
    else:
        model = small(name, dynamic_img_size=True).eval()
        assert model.pretrained_cfg["fixed_input_size"] is False
        with torch.no_grad():
            assert model(torch.zeros(1, model.cfg.in_chans, 4 * P, 3 * P)).shape == (1, out_width(model))
    model = small(name)
    assert model.pretrained_cfg["fixed_input_size"] is True
    with pytest.raises(VitlabError, match="build the model with img_size.*or dynamic_img_size=True"):
        model(torch.zeros(1, 3, 4 * P, 4 * P))


@pytest.mark.parametrize("name", VITS)
def test_forward_intermediates(name):
    model = small(name, depth=2).eval()
    x = images(model)
    D, (gh, gw), p = model.num_features, model.cfg.grid_size, model.num_prefix_tokens
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[0, -1])
        tokens = model.forward_intermediates(x, indices=1, output_fmt="NLC", norm=True, intermediates_only=True)
        feats = model.forward_features(x)
        pairs = model.forward_intermediates(x, indices=[1], return_prefix_tokens=True, intermediates_only=True)
    assert [m.shape for m in maps] == [(B, D, gh, gw)] * 2
    torch.testing.assert_close(final, feats, atol=1e-5, rtol=1e-5)
    assert len(tokens) == 1 and tokens[0].shape == (B, gh * gw, D)
    torch.testing.assert_close(tokens[0], feats[:, p:], atol=1e-5, rtol=1e-5)  # the last block, normed: the features
    if p:  # (patches, prefix) pairs; a model without prefix tokens gives the maps alone, as timm's
        torch.testing.assert_close(maps[1], pairs[0][0])
        assert pairs[0][1].shape == (B, p, D)
    else:
        torch.testing.assert_close(maps[1], pairs[0])
    with pytest.raises(VitlabError, match="output_fmt must be 'NCHW' or 'NLC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(VitlabError, match=r"indices \[5\]: this model has blocks 0\.\.1"):
        model.forward_intermediates(x, indices=[5])


# ----------------------------------------------------------------------------------------------------
# timm's create_model keywords, pretrained=True/False, and the optimiser helpers


def test_timm_keywords_map_to_vitlab_fields_and_a_conflict_is_refused_by_name():
    model = create_model(
        "vit_small_patch16_224",
        pretrained=False,
        embed_dim=48,
        num_heads=3,
        depth=1,
        img_size=32,
        drop_path_rate=0.1,
        global_pool="avg",
    )
    assert (model.cfg.dim, model.cfg.heads, model.cfg.drop_path, model.cfg.pool) == (48, 3, 0.1, "mean")
    assert model.global_pool == "avg" and model.training  # a new model, as timm's, in train mode
    with pytest.raises(VitlabError, match=r"^embed_dim \(timm's name for dim\) and dim are both given, as 48 and 64"):
        create_model("vit_small_patch16_224", embed_dim=48, dim=64)
    with pytest.raises(VitlabError, match="global_pool must be one of 'token', 'avg'.*found 'map'"):
        create_model("vit_small_patch16_224", global_pool="map")


def _hub_cache(root, repo: str, files: dict) -> None:
    """A Hugging Face cache holding `repo` at one snapshot, as huggingface_hub lays it out."""
    folder = root / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    for fname, write in files.items():
        write(snap / fname)


def test_pretrained_true_loads_the_default_weights_from_the_local_hub_cache_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    name = "vit_small_patch16_224"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        VitlabError,
        match=rf"^pretrained=True: the default weights of {name} '{hub_id(name)}'.*"
        rf"not in the local Hugging Face cache {tmp_path}",
    ):
        create_model(name, pretrained=True)
    ref = small(name, num_classes=5)
    config = {"architecture": name, "num_classes": 5, "pretrained_cfg": {"crop_pct": 0.9, "mean": [0.5] * 3}}
    _hub_cache(
        tmp_path,
        hub_id(name),
        {
            "model.safetensors": lambda p: save_file(ref.state_dict(), str(p)),
            "config.json": lambda p: p.write_text(json.dumps(config)),
        },
    )
    model = create_model(name, pretrained=True, **{k: v for k, v in small_args(name).items()})
    assert model.num_classes == 5 and not model.training
    assert model.pretrained_cfg.source == f"hf-hub:{hub_id(name)}"
    assert model.pretrained_cfg["hf_hub_id"] == model.pretrained_cfg.hf_hub_id == hub_id(name)  # as timm's
    by_id = create_model(name, pretrained=f"hf-hub:{hub_id(name)}", **small_args(name))  # the same weights by their id
    assert by_id.pretrained_cfg.hf_hub_id == hub_id(name)
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref.eval()(x))
    assert not create_model(name, pretrained=False, **small_args(name)).pretrained_cfg.head == "loaded"
    with pytest.raises(VitlabError, match="resnet_mini.*no default pretrained weights"):
        create_model("resnet_mini", pretrained=True)


@pytest.mark.parametrize("chans", [1, 2, 6])
def test_pretrained_weights_load_with_other_in_chans_as_timms_adapt_input_conv(chans, tmp_path):
    """One channel sums the RGB filters, so a gray image gives the RGB model's output on that image repeated
    3 times; six channels repeat the filters twice at half their weight, the same on a gray image."""
    name = "vit_base_patch16_224"
    ref = small(name).eval()
    source = tmp_path / "rgb.safetensors"
    save_file(ref.state_dict(), str(source))
    model = create_model(name, pretrained=source, in_chans=chans, **small_args(name))
    assert model.cfg.in_chans == chans and any("adapt_input_conv" in n for n in model.pretrained_cfg.notes)
    assert len(model.pretrained_cfg.mean) == min(chans, 3) if chans > 3 else len(model.pretrained_cfg.mean) == chans
    assert model.pretrained_cfg["input_size"][0] == chans
    gray = images(model, 1)
    with torch.no_grad():
        ours = model(gray.expand(-1, chans, -1, -1))
        theirs = ref(gray.expand(-1, 3, -1, -1))
    if chans == 2:  # the filters of R and G at 3/2 their weight: another function, of the right shape
        assert ours.shape == theirs.shape and not torch.allclose(ours, theirs, atol=1e-4)
    else:
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_timms_layer_decay_optimiser_groups_vitlabs_blocks():
    from timm.optim import create_optimizer_v2

    model = small("vit_small_patch16_224", depth=4)  # 4 blocks: 6 groups
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g["lr_scale"] for g in opt.param_groups})
    assert len(scales) == 6 and scales[-1] == 1.0 and scales[0] == pytest.approx(0.5**5)  # stem, 4 blocks, head
    head = next(g for g in opt.param_groups if any(p is model.head.weight for p in g["params"]))
    assert head["lr_scale"] == 1.0 and head["weight_decay"] == 0.05


def test_a_named_bare_file_gets_the_named_variants_preprocessing(tmp_path):
    """vit_base_patch16_clip_224 named for a bare .safetensors: timm's crop 0.95 for that name, not OpenAI's 1.0."""
    name = "vit_base_patch16_clip_224"
    ref = small(name)
    source = tmp_path / "bare.safetensors"
    save_file(ref.state_dict(), str(source))
    model = create_model(name, pretrained=source, **small_args(name))
    timm_cfg = get_pretrained_cfg(name)  # timm.create_model(name).pretrained_cfg, without building it
    assert model.pretrained_cfg.crop_pct == timm_cfg.crop_pct == 0.95
    assert tuple(model.pretrained_cfg.mean) == tuple(timm_cfg.mean)
