"""What a timm user's detection, segmentation and deployment code calls next, against timm's own results on the
same weights: forward_intermediates and features_only (timm's FeatureGetterNet), dynamic_img_size and
set_input_size, torch.fx (symbolic_trace, torchvision's create_feature_extractor with timm's tracer settings),
torch.jit.script's refusal. Small models (width 64, 3 blocks, a 4x4 grid), so the file runs in seconds.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import vitlab
from vitlab.errors import VitlabError

timm = pytest.importorskip("timm")
feature_extraction = pytest.importorskip("torchvision.models.feature_extraction")
from timm.models import get_notrace_functions, get_notrace_modules  # noqa: E402

# One of each kind timm builds: plain (class token), DINOv2 with registers (patch 14, LayerScale, no class row in
# the table), DeiT distilled (two prefix tokens, two heads), CLIP (pre-norm, eps 1e-5), GAP without class token.
KINDS = {
    "vit_small_patch16_224": {},
    "vit_small_patch14_reg4_dinov2": {},
    "deit_tiny_distilled_patch16_224": {},
    "vit_base_patch16_clip_224": {},
    "vit_small_patch16_224-gap": dict(global_pool="avg", class_token=False),
}
TRACER = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())  # timm's tests'


def pair(kind: str, **kw):
    """(timm's model, vitlab's) of `kind`, small, vitlab's holding timm's random weights; both in eval mode."""
    name, extra = kind.split("-")[0], KINDS[kind]
    P = 14 if "patch14" in name else 16
    args = dict(embed_dim=64, depth=3, num_heads=2, img_size=4 * P, num_classes=10, **extra, **kw)
    torch.manual_seed(0)
    theirs = timm.create_model(name, **args).eval()
    ours = vitlab.create_model(name, **args).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def batch(*hw: int) -> torch.Tensor:
    return torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(1))


def flat(outs) -> list[torch.Tensor]:
    return [t for o in outs for t in (o if isinstance(o, tuple) else (o,))]


# ----------------------------------------------------------------------------------------------------
# Feature maps: forward_intermediates, features_only, feature_info


INTERMEDIATES = [
    dict(),
    dict(indices=2),
    dict(indices=[0, -1], norm=True),
    dict(indices=[1, 2], output_fmt="NLC"),
    dict(indices=2, return_prefix_tokens=True),
    dict(indices=[1], stop_early=True, intermediates_only=True),
]


@pytest.mark.parametrize("kind", list(KINDS))
def test_forward_intermediates_equals_timms_on_the_same_weights(kind):
    theirs, ours = pair(kind)
    x = batch(*ours.cfg.img_size)
    with torch.no_grad():
        for args in INTERMEDIATES:
            a, b = theirs.forward_intermediates(x, **args), ours.forward_intermediates(x, **args)
            if not args.get("intermediates_only"):
                torch.testing.assert_close(b[0], a[0], atol=0, rtol=0)  # the final features
                a, b = a[1], b[1]
            assert [t.shape for t in flat(b)] == [t.shape for t in flat(a)], args
            for t, o in zip(flat(a), flat(b)):
                torch.testing.assert_close(o, t, atol=0, rtol=0)
    assert ours.feature_info == theirs.feature_info


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    "options", [dict(), dict(out_indices=(0, 2)), dict(out_indices=2, output_fmt="NLC", norm=True)]
)
def test_features_only_equals_timms_feature_getter(kind, options):
    """timm's create_model(features_only=True) takes out_indices; its ViTs take output_fmt and norm through
    FeatureGetterNet itself (their feature_cfg is fixed), vitlab's through feature_cfg."""
    from timm.models._features import FeatureGetterNet

    name, extra = kind.split("-")[0], KINDS[kind]
    P = 14 if "patch14" in name else 16
    args = dict(embed_dim=64, depth=3, num_heads=2, img_size=4 * P, **extra)
    getter = {k: options[k] for k in ("output_fmt", "norm") if k in options}
    if getter:
        theirs = FeatureGetterNet(timm.create_model(name, **args), out_indices=options["out_indices"], **getter)
        ours = vitlab.create_model(
            name, features_only=True, out_indices=options["out_indices"], feature_cfg=getter, **args
        )
    else:
        theirs = timm.create_model(name, features_only=True, **args, **options)
        ours = vitlab.create_model(name, features_only=True, **args, **options)
    theirs, ours = theirs.eval(), ours.eval()
    assert ours.state_dict().keys() == theirs.state_dict().keys()  # timm's "model." prefix, pruned alike
    ours.load_state_dict(theirs.state_dict())
    for what in ("channels", "reduction", "module_name"):
        assert getattr(ours.feature_info, what)() == getattr(theirs.feature_info, what)(), what
    assert ours.feature_info.get_dicts() == [
        {k: d[k] for k in ("module", "num_chs", "reduction")} | {"index": d["index"]}
        for d in theirs.feature_info.get_dicts()
    ]
    x = batch(4 * P, 4 * P)
    with torch.no_grad():
        a, b = theirs(x), ours(x)
    assert [t.shape for t in b] == [t.shape for t in a]
    for t, o in zip(a, b):
        torch.testing.assert_close(o, t, atol=0, rtol=0)


def test_feature_options_are_checked_by_name():
    with pytest.raises(VitlabError, match="out_indices: feature options need features_only=True"):
        vitlab.create_model("vit_mini", out_indices=(1, 2))
    with pytest.raises(VitlabError, match="feature_cls must be 'getter'.*found 'fx'"):
        vitlab.create_model("vit_mini", features_only=True, feature_cfg={"feature_cls": "fx"})
    with pytest.raises(VitlabError, match=r"indices \[9\]: this model has blocks 0\.\.3"):
        vitlab.create_model("vit_mini", features_only=True, out_indices=(9,))


# ----------------------------------------------------------------------------------------------------
# Any image size: dynamic_img_size=True and set_input_size


@pytest.mark.parametrize("kind", list(KINDS))
def test_dynamic_img_size_equals_timms_at_other_sizes(kind):
    theirs, ours = pair(kind, dynamic_img_size=True)
    assert ours.pretrained_cfg["fixed_input_size"] is False
    P = ours.cfg.patch_size
    for hw in [(4 * P, 4 * P), (6 * P, 3 * P), (2 * P, 7 * P)]:
        x = batch(*hw)
        with torch.no_grad():
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
            maps = ours.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
            for t, o in zip(theirs.forward_intermediates(x, indices=[0, 2], intermediates_only=True), maps):
                assert o.shape == (2, 64, hw[0] // P, hw[1] // P)
                torch.testing.assert_close(o, t, atol=0, rtol=0)
    with pytest.raises(
        VitlabError,
        match=rf"input image is {4 * P + 1}x{4 * P}: dynamic_img_size takes sides that are multiples.*dynamic_img_pad",
    ):
        ours(batch(4 * P + 1, 4 * P))


@pytest.mark.parametrize("kind", list(KINDS))
def test_dynamic_img_pad_equals_timms_at_sides_that_are_no_multiples_of_the_patch(kind):
    theirs, ours = pair(kind, dynamic_img_size=True, dynamic_img_pad=True)
    P = ours.cfg.patch_size
    for hw in [(4 * P + 1, 4 * P), (3 * P - 5, 5 * P + 7), (128, 96)]:
        x = batch(*hw)
        grid = (-(-hw[0] // P), -(-hw[1] // P))  # rounded up: the padded image's grid
        with torch.no_grad():
            torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
            (o,), (t,) = (
                ours.forward_intermediates(x, indices=1, intermediates_only=True),
                theirs.forward_intermediates(x, indices=1, intermediates_only=True),
            )
        assert o.shape == t.shape == (2, 64, *grid)
        torch.testing.assert_close(o, t, atol=0, rtol=0)
    with pytest.raises(VitlabError, match="dynamic_img_pad=True pads images of other sizes.*give both"):
        vitlab.create_model("vit_mini", dynamic_img_pad=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_set_input_size_equals_timms(kind):
    theirs, ours = pair(kind)
    P = ours.cfg.patch_size
    theirs.set_input_size(img_size=(6 * P, 5 * P))
    ours.set_input_size(img_size=(6 * P, 5 * P))
    assert ours.pos_embed.shape == theirs.pos_embed.shape and ours.patch_embed.grid_size == (6, 5)
    assert ours.pretrained_cfg["input_size"] == (3, 6 * P, 5 * P)  # vitlab's preprocessing follows
    x = batch(6 * P, 5 * P)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=0, rtol=0)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
    with pytest.raises(VitlabError, match="build the model with img_size"):
        ours(batch(4 * P, 4 * P))  # built for the new size only


def test_fixed_input_size_follows_the_model_and_other_position_tables_are_refused_by_name():
    assert vitlab.create_model("vit_mini").pretrained_cfg["fixed_input_size"] is True
    assert vitlab.create_model("vit_mini", dynamic_img_size=True).pretrained_cfg["fixed_input_size"] is False
    with pytest.raises(VitlabError, match="dynamic_img_size=True resamples the 1-D position table.*'sincos2d'"):
        vitlab.create_model("vit_mini", pos_embed="sincos2d", dynamic_img_size=True)
    with pytest.raises(VitlabError, match="set_input_size resamples the 1-D position table.*'relative'"):
        vitlab.create_model("vit_mini", pos_embed="relative").set_input_size(img_size=64)


# ----------------------------------------------------------------------------------------------------
# torch.fx and TorchScript


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_fx_graph_is_the_models_forward_and_timms_feature_extractor_reads_its_blocks(kind, dynamic):
    theirs, ours = pair(kind, dynamic_img_size=dynamic, dynamic_img_pad=dynamic)
    x = batch(*ours.cfg.img_size)
    graph = torch.fx.symbolic_trace(ours)
    train_nodes, eval_nodes = feature_extraction.get_graph_node_names(ours, tracer_kwargs=TRACER)
    assert "blocks.1.add_1" in eval_nodes and train_nodes[-1] == eval_nodes[-1]
    extractor = feature_extraction.create_feature_extractor(
        ours, return_nodes={"blocks.0": "b0", "blocks.1": "b1", eval_nodes[-1]: "logits"}, tracer_kwargs=TRACER
    )
    fixed = pair(kind)[0]  # timm's DeiT does not trace with dynamic_img_size (its _pos_embed branches on shapes)
    fixed.load_state_dict(theirs.state_dict())
    timms = feature_extraction.create_feature_extractor(
        fixed, return_nodes={"blocks.0": "b0", "blocks.1": "b1"}, tracer_kwargs=TRACER
    )
    with torch.no_grad():
        logits = ours(x)
        assert torch.equal(graph(x), logits)  # the same computation, bit for bit (timm's test_model_forward_fx)
        got, want = extractor(x), timms(x)
    assert torch.equal(got["logits"], logits)
    for key in ("b0", "b1"):
        torch.testing.assert_close(got[key], want[key], atol=0, rtol=0)
    if dynamic:  # the traced graph resamples the table for each input's grid, as the model does
        P = ours.cfg.patch_size
        y = batch(6 * P, 3 * P - 1)
        with torch.no_grad():
            torch.testing.assert_close(graph(y), theirs(y), atol=1e-6, rtol=0)
    else:  # and checks each input, as the model does
        with pytest.raises(VitlabError, match="build the model with img_size"):
            graph(batch(8 * ours.cfg.patch_size, 4 * ours.cfg.patch_size))


def test_fx_backward_reaches_every_parameter_in_train_mode():
    _, ours = pair("vit_small_patch16_224")
    graph = torch.fx.symbolic_trace(ours.train())
    graph(batch(64, 64)).mean().backward()
    assert all(p.grad is not None for p in graph.parameters())


def test_fx_graph_with_return_attention_concrete_gives_the_maps():
    _, ours = pair("vit_small_patch16_224")
    graph = torch.fx.symbolic_trace(ours, concrete_args={"return_attention": True})
    x = batch(64, 64)
    with torch.no_grad():
        logits, maps = graph(x, True)  # fx checks the concrete argument it was traced with
        want_logits, want_maps = ours(x, return_attention=True)
    assert torch.equal(logits, want_logits) and all(torch.equal(m, w) for m, w in zip(maps, want_maps))


def test_torch_jit_script_is_refused_with_what_to_use_instead():
    _, ours = pair("vit_small_patch16_224")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(VitlabError, match=r"^torch\.jit\.script: .*torch\.fx\.symbolic_trace"):
            torch.jit.script(ours)
        features = vitlab.create_model("vit_mini", features_only=True)
        with pytest.raises(VitlabError, match=r"^torch\.jit\.script: "):
            torch.jit.script(features)
