"""Attention maps, rollout, mean attention distance, Figure 7 analyses, figures and the CLI commands.

Numbers are checked against hand computations (qkv weights -> softmax, a 2-layer rollout worked out
on paper, the grid's mean pairwise distance by brute force) and against models whose attention is
set by hand, so a flipped, transposed or CLS-shifted map fails.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.analysis import attention as A
from vitlab.analysis import plots
from vitlab.errors import VitlabError


def tiny(**overrides):
    """A 16x24 image, patch 4: a 4x6 grid (non-square, so a transpose shows), 2 heads, 2 layers."""
    torch.manual_seed(0)
    cfg = dict(img_size=(16, 24), patch_size=4, dim=16, depth=2, heads=2, mlp_dim=32, num_classes=3)
    return vitlab.VisionTransformer(vitlab.ViTConfig(**{**cfg, **overrides}))


def sharpen(model, factor=25.0):
    """Scale up the q/k weights so the attention is far from uniform (random init is nearly uniform)."""
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight.mul_(factor)
    return model


def controlled(target=(1, 5), *, img=32, patch=4, depth=2, pool="cls", class_token=True):
    """A model in which every query, in every layer and head, attends (almost) only to patch `target`
    = (row, col): the patch tokens carry only their position embedding, only the target's is nonzero,
    every query is the same vector and only the target's key is nonzero along it."""
    torch.manual_seed(0)
    m = vitlab.create_model(
        "vit_mini_x", img_size=img, patch_size=patch, depth=depth, pool=pool, class_token=class_token
    )
    gh, gw = m.cfg.grid_size
    D = m.cfg.dim
    p = m.cfg.num_prefix_tokens
    v = torch.tensor([1.0, -1.0] * (D // 2))  # zero mean: LayerNorm keeps its direction
    with torch.no_grad():
        m.patch_embed.proj.weight.zero_()
        m.patch_embed.proj.bias.zero_()
        m.pos_embed.zero_()
        m.pos_embed[0, p + target[0] * gw + target[1]] = v
        for b in m.blocks:
            b.attn.qkv.weight.zero_()
            b.attn.qkv.bias.zero_()
            b.attn.qkv.bias[:D] = 10.0  # q = 10 for every token
            b.attn.qkv.weight[D : 2 * D] = 10.0 * torch.outer(torch.ones(D), v) / D  # k != 0 only for the target
            b.attn.proj.weight.zero_()  # the tokens pass through the blocks unchanged
            b.mlp.fc2.weight.zero_()
    return m


# ----------------------------------------------------------------------------------------------------
# attention_maps


def test_attention_rows_sum_to_one_and_equal_a_hand_computation():
    model = sharpen(tiny()).eval()
    x = torch.randn(3, 3, 16, 24)
    maps = A.attention_maps(model, x)  # {layer: (B, h, T, T)}
    T, h, d = 4 * 6 + 1, 2, 8
    z = model.embed(x)  # (B, T, D)
    for layer, block in enumerate(model.blocks):
        attn = maps[layer]
        assert attn.shape == (3, h, T, T)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, h, T), atol=1e-5, rtol=0)
        assert attn.max() > 0.5, "the test needs attention far from uniform to mean something"
        # By hand: LN, then q and k of each head from the rows of the qkv weight, softmax(q k^T / sqrt(d)).
        y = block.norm1(z)
        W, b = block.attn.qkv.weight, block.attn.qkv.bias  # (3D, D), (3D,)
        for head in range(h):
            rows_q = slice(head * d, (head + 1) * d)
            rows_k = slice(16 + head * d, 16 + (head + 1) * d)
            q = y @ W[rows_q].T + b[rows_q]  # (B, T, d)
            k = y @ W[rows_k].T + b[rows_k]
            logits = q @ k.transpose(1, 2) / math.sqrt(d)
            e = torch.exp(logits - logits.amax(-1, keepdim=True))
            torch.testing.assert_close(attn[:, head], e / e.sum(-1, keepdim=True), atol=1e-5, rtol=1e-4)
        z = block(z)[0]


def test_attention_maps_match_forward_and_leave_the_fast_path(monkeypatch):
    model = sharpen(tiny(attn_dropout=0.5))
    model.train()
    x = torch.randn(4, 3, 16, 24)
    model.eval()
    logits_before = model(x)
    _, ref = model(x, return_attention=True)
    model.train()
    maps = A.attention_maps(model, x, layers="all")
    assert model.training, "attention_maps must restore the training flag"
    for layer in range(2):
        torch.testing.assert_close(maps[layer], ref[layer], atol=1e-6, rtol=0)
    # One image per pass and a byte budget of one layer for one image: same numbers.
    one = 2 * 25 * 25 * 4
    chunked = A.attention_maps(model, x, layers=[-1, 0], batch_size=1, max_bytes=one)
    assert sorted(chunked) == [0, 1]
    torch.testing.assert_close(chunked[1], ref[1], atol=1e-6, rtol=0)
    # The default forward still takes the fused path, once per block, and gives the same logits.
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    model.eval()
    torch.testing.assert_close(model(x), logits_before, atol=0, rtol=0)
    assert len(calls) == 2


def test_plan_keeps_each_pass_under_the_byte_budget():
    model = types.SimpleNamespace(cfg=vitlab.get_config("vit_base_patch16_384"))  # 577 tokens, 12 heads
    per = 12 * 577 * 577 * 4  # one layer, one image: 16 MB
    layers = list(range(12))
    batch, groups = A._plan(model, layers, None, 1 << 30)
    assert [layer for g in groups for layer in g] == layers
    assert batch * max(map(len, groups)) * per <= 1 << 30 and batch >= 5  # 192 MB per image -> 5 per pass
    batch, groups = A._plan(model, layers, None, 3 * per)
    assert batch == 1 and max(map(len, groups)) == 3 and len(groups) == 4


def test_bad_layers_and_models_are_user_errors():
    model = tiny()
    with pytest.raises(VitlabError, match="layers 0..1"):
        A.attention_maps(model, torch.randn(1, 3, 16, 24), layers=[2])
    with pytest.raises(VitlabError, match="no attention"):
        A.attention_maps(vitlab.create_model("resnet_mini"), torch.randn(1, 3, 32, 32))


# ----------------------------------------------------------------------------------------------------
# Rollout


def test_rollout_of_identity_attention_is_the_identity():
    eye = torch.eye(7).expand(2, 3, 7, 7)  # (B, h, T, T)
    for kwargs in ({}, {"discard_ratio": 0.5}, {"head_fusion": "max"}, {"add_residual": False}):
        torch.testing.assert_close(A.attention_rollout([eye, eye, eye], **kwargs), torch.eye(7).expand(2, 7, 7))


def test_rollout_by_hand_on_two_layers():
    # Tokens (CLS, patch). Layer 1: head 0 everyone -> patch, head 1 identity. Layer 2: everyone -> CLS.
    l1 = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])[None]  # (1, 2, 2, 2)
    l2 = torch.tensor([[1.0, 0.0], [1.0, 0.0]]).expand(1, 2, 2, 2)
    # mean: A1 = [[.5,.5],[0,1]]; +I, rows / (2, 2) -> [[.75,.25],[0,1]]. A2 + I -> [[1,0],[.5,.5]].
    # R = A2~ @ A1~ = [[.75,.25],[.375,.625]].
    r = A.attention_rollout([l1, l2], head_fusion="mean")
    torch.testing.assert_close(r[0], torch.tensor([[0.75, 0.25], [0.375, 0.625]]))
    # max: A1 = [[1,1],[0,1]]; +I = [[2,1],[0,2]], rows / (3, 2): the keepdim bug would divide by columns.
    # R = [[1,0],[.5,.5]] @ [[2/3,1/3],[0,1]] = [[2/3,1/3],[1/3,2/3]].
    r = A.attention_rollout([l1, l2], head_fusion="max")
    torch.testing.assert_close(r[0], torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]]))
    # discard_ratio 1/3 of 3 keys: each row loses its lowest off-diagonal weight, then + I and renormalise.
    a = torch.tensor([[0.5, 0.1, 0.4], [0.3, 0.2, 0.5], [0.6, 0.3, 0.1]])[None, None]
    r = A.attention_rollout([a], discard_ratio=1 / 3)
    expected = torch.tensor([[1.5, 0.0, 0.4], [0.0, 1.2, 0.5], [0.6, 0.0, 1.1]])
    torch.testing.assert_close(r[0], expected / expected.sum(-1, keepdim=True))
    # start_layer=1: layer 2 alone.
    r = A.attention_rollout({0: l1, 1: l2}, start_layer=1)
    torch.testing.assert_close(r[0], torch.tensor([[1.0, 0.0], [0.5, 0.5]]))


def test_rollout_and_cls_maps_point_at_the_controlled_patch():
    model = controlled(target=(1, 5), depth=2)
    x = torch.randn(2, 3, 32, 32)
    cls = A.cls_attention(model, x, layers="all")
    for layer in (0, 1):
        m = cls[layer].mean(1)  # (B, 8, 8)
        assert m.shape == (2, 8, 8) and float(m[:, 1, 5].min()) > 0.99
    # Rollout: CLS row after two layers of (A + I) / 2 is 0.25 on CLS and 0.75 on the target.
    r = A.rollout(model, x)
    assert r.shape == (2, 8, 8)
    torch.testing.assert_close(r[:, 1, 5], torch.full((2,), 0.75), atol=1e-4, rtol=0)
    assert float(r.sum(dim=(1, 2)).min()) == pytest.approx(0.75, abs=1e-4)
    # A mean-pooled model without class token: the average over the patch queries.
    gap = controlled(target=(6, 2), pool="mean", class_token=False)
    m = A.cls_attention(gap, x, layers=-1)[1].mean(1)
    assert tuple(np.unravel_index(int(m[0].argmax()), (8, 8))) == (6, 2)


# ----------------------------------------------------------------------------------------------------
# Mean attention distance


def brute_force_mean_distance(gh, gw, P):
    cells = [(r, c) for r in range(gh) for c in range(gw)]
    total = sum(math.hypot(r1 - r2, c1 - c2) for r1, c1 in cells for r2, c2 in cells)
    return P * total / len(cells) ** 2


def test_uniform_attention_distance_equals_the_grids_mean_pairwise_distance():
    gh, gw, P = 4, 5, 8
    T = gh * gw + 1
    uniform = torch.full((2, 3, T, T), 1.0 / T)
    d = A.attention_distance(uniform, num_prefix_tokens=1, grid_size=(gh, gw), patch_size=P)
    assert d.shape == (2, 3)
    torch.testing.assert_close(d, torch.full((2, 3), brute_force_mean_distance(gh, gw, P)), atol=1e-4, rtol=0)


def test_local_attention_is_shorter_than_global():
    gh, gw, P = 6, 6, 16
    N = gh * gw
    local = torch.zeros(N, N)
    for i in range(N):
        r, c = divmod(i, gw)
        for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
            if 0 <= r + dr < gh and 0 <= c + dc < gw:
                local[i, (r + dr) * gw + c + dc] = 1.0
    local = local / local.sum(-1, keepdim=True)
    both = torch.stack([local, torch.full((N, N), 1.0 / N)])[None]  # (1, 2 heads, N, N), no prefix
    d = A.attention_distance(both, num_prefix_tokens=0, grid_size=(gh, gw), patch_size=P)[0]
    assert d[0] < 16.0 < d[1]  # local: at most one patch (16 px) away; global: ~2.6 patches on average


def test_mean_attention_distance_of_a_model_that_looks_at_one_patch():
    model = controlled(target=(2, 3))
    layers, d = A.mean_attention_distance(model, torch.randn(3, 3, 32, 32), batch_size=2)
    expected = 4 * sum(math.hypot(r - 2, c - 3) for r in range(8) for c in range(8)) / 64
    assert layers == [0, 1] and d.shape == (2, 4)
    torch.testing.assert_close(d, torch.full((2, 4), expected), atol=1e-3, rtol=0)


# ----------------------------------------------------------------------------------------------------
# Position embeddings and patch-embedding filters


def test_sincos_position_similarity_is_higher_for_neighbours():
    model = tiny(pos_embed="sincos2d", dim=64)
    sim = A.position_embedding_similarity(model)  # (24, 24)
    torch.testing.assert_close(sim.diagonal(), torch.ones(24), atol=1e-5, rtol=0)
    near, far = plots._neighbour_vs_far(sim, (4, 6))
    assert near > far + 0.05
    i = 1 * 6 + 2  # patch (1, 2)
    assert sim[i, i + 1] > sim[i, i + 3] and sim[i, i + 6] > sim[i, 3 * 6 + 2]  # row and column directions
    assert A.position_embedding_similarity(tiny(pos_embed="learned")).shape == (24, 24)  # class token row dropped
    assert A.position_embedding_similarity(tiny(pos_embed="learned2d")).shape == (24, 24)
    with pytest.raises(VitlabError, match="relative"):
        A.position_embedding_similarity(tiny(pos_embed="relative"))


def test_patch_embedding_pca_recovers_planted_filters():
    model = tiny(dim=32)
    g = torch.Generator().manual_seed(0)
    f = torch.linalg.qr(torch.randn(48, 2, generator=g))[0].T  # two orthonormal 3x4x4 filters
    coef = torch.randn(32, 2, generator=g) * torch.tensor([3.0, 1.0])
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_((coef @ f).reshape(32, 3, 4, 4) + 1.0)  # + a constant, removed by centring
    comps, ratio = A.patch_embedding_pcs(model, k=28)
    assert comps.shape == (28, 3, 4, 4) and ratio.shape == (28,)
    assert float(ratio[:2].sum()) > 0.999 and ratio[0] > ratio[1]
    assert abs(float(comps[0].flatten() @ f[0])) > 0.98


# ----------------------------------------------------------------------------------------------------
# The mini experiment's boundary claim


def test_boundary_attention_share():
    x = torch.randn(6, 3, 32, 32)
    on = A.boundary_attention_share(controlled(target=(5, 4)), x)
    assert on.columns == (3, 4) and on.uniform == 0.25 and on.layer == 1 and on.n_images == 6
    assert on.share > 0.99 and on.ratio > 3.9
    off = A.boundary_attention_share(controlled(target=(5, 0)), [(x[:4], 0), (x[4:], 1)])  # a loader's batches
    assert off.share < 0.01 and off.n_images == 6
    rand = A.boundary_attention_share(vitlab.create_model("vit_mini_x"), x)
    assert abs(rand.share - 0.25) < 0.02  # random init: nearly uniform
    assert set(on.to_dict()) >= {"share", "uniform", "ratio", "columns"}
    assert A.boundary_columns(28, 4) == (3,)  # the boundary x = 14 cuts through column 3


# ----------------------------------------------------------------------------------------------------
# Figures


def test_overlay_lights_the_right_patch_and_figures_have_their_size(tmp_path):
    gh, gw, P = 4, 6, 8
    heat = torch.zeros(gh, gw)
    heat[1, 4] = 1.0
    image = np.full((gh * P, gw * P, 3), 0.5, dtype=np.float32)
    out = plots.overlay(image, heat, alpha=0.5, mode="nearest")
    hot = np.all(out == out[1 * P, 4 * P], axis=-1)  # pixels with the colour of the hot patch
    expected = np.zeros((gh * P, gw * P), dtype=bool)
    expected[1 * P : 2 * P, 4 * P : 5 * P] = True
    assert np.array_equal(hot, expected)
    smooth = plots.overlay(image, heat, mode="bilinear").astype(int)
    peak = np.unravel_index(np.abs(smooth - smooth[0, 0]).sum(-1).argmax(), (gh * P, gw * P))
    assert 1 * P <= peak[0] < 2 * P and 4 * P <= peak[1] < 5 * P

    path = plots.save_image(out, tmp_path / "overlay.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (gw * P, gh * P)
    maps = torch.rand(2, 3, gh, gw)
    grid = plots.attention_grid(
        image, maps, tmp_path / "grid.png", row_labels=["l0", "l1"], col_labels=["h0", "h1", "h2"]
    )
    with Image.open(grid) as im:
        assert im.size == (4 * 160, 2 * 190)  # (1 + 3) tiles of 1.6 in, 2 rows of 1.6 + 0.3 in, at 100 dpi
    model = tiny(pos_embed="sincos2d", dim=64)
    summary = plots.write_figure7(model, torch.randn(2, 3, 16, 24), tmp_path / "fig7")
    sizes = {p.name: Image.open(p).size for p in summary["files"] if p.suffix == ".png"}
    # (a): 7 in wide; 4 x 7 tiles of 4 px with 1 px gaps -> 19 x 34 px -> 0.96 * 7 * 19/34 + 0.7 in high, to 0.1 in.
    assert sizes == {
        "fig7a_patch_embedding_pcs.png": (700, 450),
        "fig7b_position_embedding_similarity.png": (640, 560),
        "fig7c_mean_attention_distance.png": (560, 440),
    }
    assert not list((tmp_path / "fig7").glob(".*"))  # no temporary files left behind
    rows = (tmp_path / "fig7" / "fig7c_mean_attention_distance.csv").read_text().splitlines()
    assert rows[0] == "layer,head,mean_distance_px" and len(rows) == 1 + 2 * 2


# ----------------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vitlab.weights.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(root, "epoch1", controlled(target=(2, 6)), {"epoch": 1})
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(images / f"{name}.png")
    return root


def test_cli_attention_maps_and_rollout_peak_at_the_controlled_patch(checkpoint, tmp_path, capsys):
    from vitlab.cli import main

    out = tmp_path / "att"
    code = main(
        [
            "attention",
            str(checkpoint / "images"),
            "--checkpoint",
            str(checkpoint),
            "--layer",
            "all",
            "--head",
            "all",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "peak at patch (row 2, col 6) of 8x8" in capsys.readouterr().out
    rows = (out / "attention.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 4  # images x layers x heads
    assert all(r.split(",")[4:6] == ["2", "6"] for r in rows[1:])
    for name in ("a_cls.png", "a_cls_overlay.png", "b_cls.png"):
        with Image.open(out / name) as im:
            assert im.format == "PNG"
    with Image.open(out / "a_cls_overlay.png") as im:
        assert im.size == (224, 224)  # the 32 px input shown 7x larger
    code = main(
        [
            "attention",
            str(checkpoint / "images" / "a.png"),
            "--checkpoint",
            str(checkpoint),
            "--method",
            "rollout",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and "rollout 0-1" in capsys.readouterr().out
    assert (
        main(
            [
                "attention",
                str(checkpoint / "images"),
                "--checkpoint",
                str(checkpoint),
                "--method",
                "rollout",
                "--head",
                "0",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "rollout fuses the heads" in capsys.readouterr().err
    assert main(["attention", str(tmp_path / "missing.png"), "--model", "vit_mini_x", "--out", str(out)]) == 2
    assert "missing.png" in capsys.readouterr().err
    both = tmp_path / "both"  # a model name with a checkpoint is checked against it, field by field, not ignored
    assert (
        main(
            [
                "attention",
                str(checkpoint / "images"),
                "--checkpoint",
                str(checkpoint),
                "--model",
                "vit_base_patch16_224",
                "--out",
                str(both),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "does not fit model 'vit_base_patch16_224': patch_size: model 16 vs checkpoint 4, dim: model 768" in err
    assert "it looks like vit_mini_x" in err and not both.exists()


def test_cli_inspect_writes_figure7(checkpoint, tmp_path, capsys):
    from vitlab.cli import main

    out = tmp_path / "inspect"
    code = main(["inspect", "--checkpoint", str(checkpoint), "--images", str(checkpoint / "images"), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "(c) mean attention distance" in printed and "2 images" in printed
    names = sorted(p.name for p in out.iterdir())  # the figures, and the marker naming the folder's command
    assert names == sorted(
        [".vitlab"]
        + [
            f"fig7{p}.{ext}"
            for p in ("a_patch_embedding_pcs", "b_position_embedding_similarity", "c_mean_attention_distance")
            for ext in ("png", "csv")
        ]
        + ["token_norms.csv", "token_norms.png"]
    )  # (d), Darcet et al. 2023
    expected = 4 * sum(math.hypot(r - 2, c - 6) for r in range(8) for c in range(8)) / 64
    rows = (out / "fig7c_mean_attention_distance.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 * 4 and all(abs(float(r.split(",")[2]) - expected) < 1e-2 for r in rows)


@pytest.mark.slow
def test_vit_b_384_all_layers_in_bounded_chunks():
    model = vitlab.create_model("vit_base_patch16_384")
    maps = A.attention_maps(model, torch.randn(3, 3, 384, 384), max_bytes=256 << 20)  # 192 MB per image
    assert sorted(maps) == list(range(12)) and maps[11].shape == (3, 12, 577, 577)
    torch.testing.assert_close(maps[5].sum(-1), torch.ones(3, 12, 577), atol=1e-4, rtol=0)
