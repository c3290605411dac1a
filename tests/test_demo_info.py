"""`vitlab demo` and `vitlab info` through `vitlab.cli.main`, the FLOP and memory counts of
vitlab.analysis.flops against torch's own counters, and the CLI's error messages."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from vitlab import create_model
from vitlab.analysis import flops
from vitlab.cli import main
from vitlab.data.synthetic import dataset_x_splits
from vitlab.experiments import demo
from vitlab.experiments.demo import last_layer_cls_attention
from vitlab.models import size
from vitlab.models.size import estimate_memory, format_bytes


@pytest.fixture(autouse=True)
def one_thread():
    """The mini model is far too small for intra-op threads; on a shared 2-core machine they only
    make each step wait for the other processes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _png(path) -> np.ndarray:
    with Image.open(path) as im:
        im.verify()  # a complete, valid PNG
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


# ----------------------------------------------------------------------------------------------------
# vitlab demo


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    torch.set_num_threads(2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["demo", "--epochs", "3", "--out", str(out), "--no-progress", "--device", "cpu"])
    assert torch.get_num_threads() == 2  # the demo's one thread (its default) is undone afterwards
    return rc, out, printed.getvalue()


def test_demo_writes_metrics_figures_weights_and_summary(demo_run):
    rc, out, _ = demo_run
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["threads"] == 1
    assert set(summary["runs"]) == {"learned", "none"}
    for pos in ("learned", "none"):
        with open(out / f"pos_{pos}" / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
        run = summary["runs"][pos]
        assert float(rows[-1]["val_acc"]) == pytest.approx(run["final_val_acc"])
        # the weights on disk are the model that scored that accuracy
        model = create_model(checkpoint=out / f"pos_{pos}")
        assert model.cfg.pos_embed == pos
        x, y = dataset_x_splits(2000, 500, seed=0)[1]
        with torch.no_grad():
            acc = (model.eval()(x).argmax(-1) == y).float().mean().item()
        assert acc == pytest.approx(run["final_val_acc"], abs=1e-6)
        b = run["boundary_attention"]
        assert b["uniform"] == pytest.approx(2 / 8) and 0.0 < b["share"] < 1.0
    # the mini experiment's claim, already after 3 epochs: position embedding solves it, without it ~chance
    assert summary["runs"]["learned"]["final_val_acc"] >= 0.9
    assert summary["runs"]["none"]["final_val_acc"] <= 0.6
    hidden = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert hidden == [".vitlab"] and json.loads((out / ".vitlab").read_text()) == {"kind": "demo"}  # no temp folders
    for name in ("curves.png", "attention_pos_learned.png", "attention_pos_none.png"):
        pixels = _png(out / name)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 600
        assert pixels.std() > 20  # not blank


def test_demo_prints_progress_table_and_wall_time(demo_run):
    rc, out, text = demo_run
    summary = json.loads((out / "summary.json").read_text())
    for pos in ("learned", "none"):
        assert f"[{pos}] epoch   3/3" in text  # a progress line per epoch shown
    table = text[text.index("vit_mini_x on dataset X ") :]
    with_pos, without = table.splitlines()[1:3]
    assert with_pos.startswith("with position embedding")
    assert f"{summary['runs']['learned']['final_val_acc']:.1%}" in with_pos
    assert f"{summary['runs']['none']['final_val_acc']:.1%}" in without
    assert "same set of patches" in table
    assert f"demo wall time: {summary['wall_time_s']:.1f} s" in text


def test_demo_side_by_side_gives_the_same_runs_as_one_after_the_other(tmp_path):
    """workers=2 trains the two runs in two spawned processes; the weights and every metric (but the
    timings) are bitwise those of workers=1."""
    from safetensors.torch import load_file

    from vitlab.experiments.demo import run_demo

    quiet = dict(epochs=2, n_train=256, n_val=64, device="cpu", progress=False, echo=lambda line: None)
    one = run_demo(out=tmp_path / "one", workers=1, **quiet)
    two = run_demo(out=tmp_path / "two", workers=2, **quiet)
    assert (one["workers"], two["workers"]) == (1, 2)
    for pos in ("learned", "none"):
        for key in ("final_val_acc", "final_train_loss", "final_val_loss", "boundary_attention"):
            assert one["runs"][pos][key] == two["runs"][pos][key], (pos, key)
        a = load_file(tmp_path / f"one/pos_{pos}/checkpoints/epoch_0002/model.safetensors")
        b = load_file(tmp_path / f"two/pos_{pos}/checkpoints/epoch_0002/model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)
        first = load_file(tmp_path / f"one/pos_{pos}/checkpoints/epoch_0001/model.safetensors")
        assert any(not torch.equal(a[k], first[k]) for k in a)  # the runs did train
    assert not list((tmp_path / "two").glob(".pos_*"))  # no temporary folders left


def test_cls_attention_map_is_neither_shifted_nor_transposed():
    """The map at grid cell (r, c) must be the class token's attention to the patch cut from image rows
    4r..4r+3 and columns 4c..4c+3, computed here by hand from that patch's pixels."""
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mini_x", depth=1, pos_embed="none").eval()
    with torch.no_grad():
        model.cls_token.normal_()
    x = torch.randn(1, 3, 32, 32)
    _, maps = last_layer_cls_attention(model, x)  # (1, h, 8, 8)
    blk, P, h, d = model.blocks[0], 4, 4, 8
    W = model.patch_embed.proj.weight.reshape(32, -1)  # (D, C*P*P) in (C, P, P) order
    with torch.no_grad():

        def qkv(token):  # (D,) -> q, k of every head: (h, d) each
            q, k, _ = blk.attn.qkv(blk.norm1(token)).reshape(3, h, d)
            return q, k

        q_cls, k_cls = qkv(model.cls_token[0, 0])
        keys = {
            (r, c): qkv(W @ x[0, :, P * r : P * r + P, P * c : P * c + P].reshape(-1) + model.patch_embed.proj.bias)[1]
            for r in range(8)
            for c in range(8)
        }
        logit = {key: (q_cls * k).sum(-1) / math.sqrt(d) for key, k in keys.items()}  # (h,)
        denom = torch.exp((q_cls * k_cls).sum(-1) / math.sqrt(d)) + sum(torch.exp(v) for v in logit.values())
        for (r, c), v in logit.items():
            torch.testing.assert_close(maps[0, :, r, c], torch.exp(v) / denom, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------
# vitlab info and the counts behind it


def test_info_vit_b16(capsys):
    assert main(["info", "vit_base_patch16_224", "--batch-size", "32"]) == 0
    text = capsys.readouterr().out
    assert "86,567,656" in text  # torchvision's count for B/16 with 1000 classes
    assert "197 tokens" in text
    assert "17.56 GMACs" in text and "35.13 GFLOPs" in text  # the 17.6 GMACs the paper's tables count
    assert "analytic / counted = 1.0000" in text
    assert "304,326,632" in text  # ViT-L/16 in the paper's Table 1
    assert "196" in text and "784" in text and "15.9x the attention products" in text


def _fused_forward_flops(model, img_size, in_chans=3, device="cpu"):
    """FlopCounterMode over the fused attention path (SDPA), every token through every block."""
    x = torch.randn(1, in_chans, *img_size, device=device)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval().forward_head(model.forward_features(x))
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "name, overrides, meta",
    [
        ("vit_base_patch16_224", {}, True),
        ("vit_base_patch16_224", {"img_size": 384}, True),
        ("vit_mini_x", {"pos_embed": "relative"}, False),  # real CPU tensors: SDPA with a bias is counted
        ("vit_mini", {"pool": "mean", "class_token": False}, False),
        ("vit_tiny_patch16_224", {"stem": "hybrid", "img_size": 64}, True),
        ("deit_tiny_distilled_patch16_224", {}, True),  # two prefix tokens, two heads
    ],
)
def test_analytic_flops_equal_the_flop_counter(name, overrides, meta):
    cfg = vitlab.get_config(name, **overrides)
    model = flops.build_on_meta(cfg) if meta else vitlab.VisionTransformer(cfg)
    analytic = flops.count_macs(cfg)
    assert analytic.flops == 2 * analytic.macs
    x = torch.randn(2, cfg.in_chans, *cfg.img_size, device="meta" if meta else "cpu")
    model.train()
    assert flops.forward_flops(model, x) == 2 * analytic.flops  # exactly: a batch of two, the explicit path
    assert model.training  # the count leaves the model as it found it
    fused = _fused_forward_flops(model, cfg.img_size, device="meta" if meta else "cpu")
    if meta:  # on "meta", SDPA runs as its math decomposition, whose two matmuls the counter sees
        assert fused == analytic.flops
    else:
        # on CPU the fused kernel (_scaled_dot_product_flash_attention_for_cpu) is invisible to
        # FlopCounterMode in torch 2.14: then exactly QK^T and AV are missing
        assert fused in (analytic.flops, analytic.flops - 2 * analytic.attention_macs)
    if name == "vit_base_patch16_224" and not overrides:
        assert analytic.macs / 1e9 == pytest.approx(17.56, abs=0.01)


def test_a_training_run_costs_three_forward_passes_per_image_seen():
    """The FLOPs torch counts over a real training run (two AdamW steps of three images, explicit
    attention, every token through every block) are `training_flops`: 3 x the forward FLOPs of one
    image x the images seen, less what the backward pass never computes, the image's own gradient
    (one patch projection per image)."""
    model = vitlab.create_model("vit_mini", pool="mean", class_token=False)
    model.set_fused_attention(False)
    cfg = model.cfg
    optimizer = torch.optim.AdamW(model.parameters())
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, cfg.in_chans, *cfg.img_size, generator=g), torch.randint(0, 10, (6,), generator=g)
    with FlopCounterMode(display=False) as counter:
        for xb, yb in zip(x.split(3), y.split(3)):
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            optimizer.zero_grad()
    predicted = flops.training_flops(model, (cfg.in_chans, *cfg.img_size), images_seen=6)
    per_image = flops.forward_flops(model, x[:1])
    assert predicted == 3 * per_image * 6 and per_image == flops.count_macs(cfg).flops
    no_image_gradient = 6 * 2 * flops.count_macs(cfg).rows["patch embedding"]
    assert counter.get_total_flops() == predicted - no_image_gradient
    assert model.training  # counting left the model training
    with pytest.raises(vitlab.VitlabError, match="images_seen"):
        flops.training_flops(model, (cfg.in_chans, *cfg.img_size), images_seen=-1)


def test_attention_macs_grow_as_n_squared():
    a, b = flops.patch_size_tradeoff(vitlab.get_config("vit_base_patch16_224"))
    assert (a["N"], b["N"]) == (196, 784)
    assert b["attention_macs"] / a["attention_macs"] == pytest.approx((785 / 197) ** 2)


@pytest.mark.parametrize("name, img", [("vit_mini_x", None), ("vit_tiny_patch16_224", 64)])
def test_activation_estimate_matches_what_autograd_saves(name, img):
    model = vitlab.create_model(name, img_size=img)
    x, y = torch.randn(3, 3, *model.cfg.img_size), torch.zeros(3, dtype=torch.long)
    measured = flops.measure_saved_activations(model, x, y)
    estimate = estimate_memory(model.cfg, 3)
    assert estimate["activations"] == pytest.approx(measured, rel=0.02)
    assert estimate["weights"] == 4 * vitlab.count_parameters(model)


def test_the_memory_info_prints_is_the_one_check_fits_refuses_with(monkeypatch, capsys):
    cfg = vitlab.get_config("vit_base_patch16_224")
    need = estimate_memory(cfg, 32, train=True)
    assert need["total"] == sum(v for k, v in need.items() if k != "total")
    # ViT-B/16 at batch 32: the gradient of the MLP's hidden layer, 197 x 2 x 3072 floats an image
    assert need["backward"] == 32 * 197 * 2 * 3072 * 4
    assert main(["info", "vit_base_patch16_224", "--batch-size", "32"]) == 0
    text = capsys.readouterr().out
    assert f"total                   {format_bytes(need['total']):>12}" in text
    monkeypatch.setattr(size, "machine_memory", lambda: need["total"])
    size.check_fits(cfg, batch_size=32, training=True)  # exactly enough
    monkeypatch.setattr(size, "machine_memory", lambda: need["total"] - 1)
    with pytest.raises(vitlab.VitlabError, match=f"at batch 32 would need about {format_bytes(need['total'])}"):
        size.check_fits(cfg, batch_size=32, training=True)


def test_parameter_breakdown_sums_to_the_model():
    model = vitlab.create_model("vit_small_patch16_224", pos_embed="learned2d")
    parts = flops.parameter_breakdown(model)
    assert parts["total"] == vitlab.count_parameters(model)
    assert parts["cls_token + pos_embed"] == 384 + 14 * 192 + 14 * 192
    assert parts["head"] == 384 * 1000 + 1000
    assert parts.get("other", 0) == 0


# ----------------------------------------------------------------------------------------------------
# Errors: one line, exit 2, no traceback, no files


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_unknown_model_lists_the_valid_choices(capsys):
    err = _error(capsys, ["info", "vit_base_patch16"])
    assert "vit_base_patch16" in err
    for valid in ("vit_base_patch16_224", "vit_mini_x", "vit_huge_patch14_224"):
        assert valid in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["info", "vit_base_patch16_224", "--img-size", "225"], ["225", "16"]),
        (["info", "vit_base_patch16_224", "--patch-size", "15"], ["224", "15"]),
        (["info", "vit_base_patch16_224", "--heads", "7"], ["768", "7"]),
        (["info", "vit_base_patch16_224", "--batch-size", "0"], ["--batch-size", "0"]),
        (["info", "vit_base_patch16_224", "--img-size", "-32"], ["--img-size", "-32"]),
        (["info", "vit_base_patch16_224", "--img-size", "big"], ["--img-size", "big"]),
        (["demo", "--epochs", "0"], ["--epochs", "0"]),
        (["demo", "--seed", "-1"], ["--seed", "-1"]),
        (["demo", "--threads", "-2"], ["--threads", "-2"]),
    ],
)
def test_bad_sizes_and_options(capsys, argv, words):
    err = _error(capsys, argv)
    for word in words:
        assert word in err


def test_demo_errors_leave_no_files(tmp_path, capsys, monkeypatch):
    out = tmp_path / "never"
    _error(capsys, ["demo", "--epochs", "0", "--out", str(out)])
    _error(capsys, ["demo", "--device", "nonsense:device", "--out", str(out)])
    assert not out.exists()
    (tmp_path / "file").write_text("x")
    _error(capsys, ["demo", "--epochs", "1", "--out", str(tmp_path / "file")])

    # a run that fails half-way (here: a fake `fit` that writes a metrics file, then fails)
    def failing_fit(model, train_loader, val_loader, recipe, *, out, **kwargs):
        (out / "metrics.csv").write_text("epoch\n1\n")
        raise vitlab.VitlabError("training stopped: train loss nan in epoch 1")

    monkeypatch.setattr(demo, "fit", failing_fit)
    err = _error(capsys, ["demo", "--epochs", "1", "--out", str(out), "--no-progress", "--workers", "1"])
    assert "nan" in err
    assert not out.exists()
