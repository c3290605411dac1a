"""Fine-tuning: layer-decay groups, the stage-1 freeze, accuracy from a saved checkpoint, exact
resume after a real SIGKILL, NaN handling and the diagnostics table."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vitlab import create_model
from vitlab.cli import main
from vitlab.data.datasets import RunData, make_loaders
from vitlab.data.digits import load_digits, write_digits_folder
from vitlab.data.folder import FolderScan
from vitlab.data.memory import ImageTensors
from vitlab.data.split import stratified_split
from vitlab.train import RECIPES, diagnostics
from vitlab.train.distributed import DistInfo
from vitlab.train.engine import TensorLoader, fit
from vitlab.train.optim import build_optimizer, freeze_threshold, layer_decay_groups, layer_ids, staged_warmup_cosine
from vitlab.weights.checkpoint import save_checkpoint

TINY = dict(img_size=16, dim=32, depth=2, heads=2, mlp_dim=64)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one intra-op thread


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    write_digits_folder(root / "small", size=16, per_class=30)  # 240 train / 60 val
    torch.manual_seed(0)
    save_checkpoint(root / "init", "init", create_model("vit_mini", num_classes=5, **TINY), {"epoch": 0})
    return root


def _weights(run: Path, epoch: int) -> dict:
    return load_file(run / "checkpoints" / f"epoch_{epoch:04d}" / "model.safetensors")


def test_layer_ids_drive_freezing_and_layer_decay():
    model = create_model("vit_mini", num_classes=10)  # depth 4
    ids, L = layer_ids(model)
    assert L == 4
    assert ids["patch_embed.proj.weight"] == ids["cls_token"] == ids["pos_embed"] == 0
    assert ids["blocks.0.attn.qkv.weight"] == 1 and ids["blocks.3.mlp.fc2.bias"] == 4
    assert ids["norm.weight"] == 5 and ids["head.weight"] == 6
    assert freeze_threshold("all", L) == 0 and freeze_threshold("last:2", L) == 3 and freeze_threshold("head", L) == 6
    groups = layer_decay_groups(model, lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    opt = build_optimizer(groups, lr=1e-3)
    sched = staged_warmup_cosine(opt, stage_steps=[10, 30], warmup_steps=4)
    for _ in range(17):
        opt.step()
        sched.step()
    head_lr = next(g["lr"] for g in opt.param_groups if g["layer_id"] == 6)
    assert 0 < head_lr < 1e-3
    for g in opt.param_groups:  # block i of L: lr x 0.5^(L+1-i); norm and head the full rate
        assert g["lr"] == pytest.approx(head_lr * 0.5 ** (L + 1 - min(g["layer_id"], L + 1)), rel=1e-12)
        no_decay = all(p.ndim <= 1 or n in model.no_weight_decay() for p, n in zip(g["params"], g["param_names"]))
        assert g["weight_decay"] == (0.0 if no_decay else 0.05)
    cnn_ids, cnn_L = layer_ids(create_model("resnet_mini", num_classes=3))
    assert (
        cnn_L == 3
        and cnn_ids["stem.0.weight"] == 0
        and cnn_ids["layer3.0.conv1.weight"] == 3
        and cnn_ids["head.weight"] == 5
    )


def test_stage_one_freezes_everything_but_the_head(data, tmp_path):
    run = tmp_path / "run"
    assert (
        main(
            [
                "finetune",
                "--data",
                str(data / "small"),
                "--checkpoint",
                str(data / "init"),
                "--epochs",
                "2",
                "--freeze-epochs",
                "1",
                "--unfreeze",
                "last:1",
                "--lr",
                "1e-3",
                "--batch-size",
                "16",
                "--no-hflip",
                "--device",
                "cpu",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    init, e1, e2 = (
        load_file(data / "init" / "checkpoints" / "init" / "model.safetensors"),
        _weights(run, 1),
        _weights(run, 2),
    )
    for name, w in init.items():
        if name.startswith("head."):
            assert w.shape != e1[name].shape or not torch.equal(w, e1[name])  # a new head, and it trained
            assert e1[name].abs().sum() > 0
        else:
            assert torch.equal(w, e1[name]), f"{name} moved in stage 1"
    for name in e1:  # stage 2, last:1 of 2 blocks: blocks.1, the final norm and the head train
        moved = not torch.equal(e1[name], e2[name])
        assert moved == name.startswith(("blocks.1.", "norm.", "head.")), name


@pytest.fixture(scope="module")
def digits_pretrained(tmp_path_factory):
    """A ViT trained on the digits tensors (engine.fit, 10 classes), saved as a vitlab checkpoint."""
    root = tmp_path_factory.mktemp("pre")
    torch.set_num_threads(1)
    x, y = load_digits(16)
    tr, va = stratified_split(y, 0.2)
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=10, img_size=16, dim=64, depth=2, heads=4, mlp_dim=128)
    fit(
        model,
        TensorLoader(x[tr], y[tr], batch_size=32, shuffle=True),
        TensorLoader(x[va], y[va], batch_size=256),
        RECIPES["mini"].replace(epochs=6, warmup_epochs=1),
        device="cpu",
        out=root / "run",
    )
    write_digits_folder(root / "digits", size=16)
    return root


def test_finetune_from_checkpoint_beats_chance_and_writes_the_report(digits_pretrained, tmp_path):
    run = tmp_path / "ft"
    assert (
        main(
            [
                "finetune",
                "--data",
                str(digits_pretrained / "digits"),
                "--checkpoint",
                str(digits_pretrained / "run"),
                "--epochs",
                "3",
                "--freeze-epochs",
                "1",
                "--unfreeze",
                "last:1",
                "--lr",
                "1e-3",
                "--no-hflip",
                "--crop-scale",
                "0.7",
                "--device",
                "cpu",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    print("fine-tuned val acc", summary["best"]["val_acc"])
    assert summary["best"]["val_acc"] > 0.6, summary["best"]  # chance is 0.1
    assert len(summary["per_class_accuracy"]) == 10
    for name in ("confusion.png", "curves.png", "metrics.csv", "per_class_accuracy.csv", "best.json", "last.json"):
        assert (run / name).stat().st_size > 0, name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len((run / "metrics.csv").read_text().splitlines()) == 4


def test_kill_and_resume_is_bitwise_identical(data, tmp_path):
    """SIGKILL mid-epoch (after the epoch-2 checkpoint, in stage 2), then --resume: the same weights,
    EMA and metrics as an uninterrupted run, with every source of randomness on.

    The killed run is a real `python -m vitlab finetune` process; the uninterrupted reference runs
    in this process meanwhile (one intra-op thread in both, so the arithmetic is the same)."""
    args = [
        "finetune",
        "--data",
        str(data / "small"),
        "--checkpoint",
        str(data / "init"),
        "--epochs",
        "4",
        "--freeze-epochs",
        "1",
        "--unfreeze",
        "last:1",
        "--lr",
        "1e-3",
        "--batch-size",
        "8",
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--smoothing",
        "0.1",
        "--ema",
        "0.99",
        "--drop-path",
        "0.1",
        "--auto-augment",
        "rand",
        "--reprob",
        "0.25",
        "--no-hflip",
        "--device",
        "cpu",
    ]
    full, killed = tmp_path / "full", tmp_path / "killed"
    victim = subprocess.Popen(
        [sys.executable, "-m", "vitlab", *args, "--out", str(killed)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def kill_after_epoch_2():
        deadline = time.time() + 180
        while time.time() < deadline and victim.poll() is None:
            try:
                if json.loads((killed / "last.json").read_text())["epoch"] >= 2:
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)

    watcher = threading.Thread(target=kill_after_epoch_2)
    watcher.start()
    assert main(args + ["--out", str(full)]) == 0
    watcher.join()
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, victim.stderr.read()[-2000:]
    saved = json.loads((killed / "last.json").read_text())["epoch"]
    assert 2 <= saved < 4 and not (killed / "summary.json").exists()  # it really died mid-run
    assert main(args + ["--out", str(killed), "--resume"]) == 0
    a, b = _weights(full, 4), _weights(killed, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(full / "checkpoints/epoch_0004/state.pt", weights_only=True)
    sb = torch.load(killed / "checkpoints/epoch_0004/state.pt", weights_only=True)
    assert all(torch.equal(v, sb["ema"][k]) for k, v in sa["ema"].items())
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time_s"} for r in rows]  # noqa: E731
    assert strip(sa["history"]) == strip(sb["history"]) and len(sa["history"]) == 4
    csv_a = [line.rsplit(",", 1)[0] for line in (full / "metrics.csv").read_text().splitlines()]
    csv_b = [line.rsplit(",", 1)[0] for line in (killed / "metrics.csv").read_text().splitlines()]
    assert csv_a == csv_b
    assert json.loads((full / "best.json").read_text()) == json.loads((killed / "best.json").read_text())


def test_resume_refuses_changed_options_or_data(data, tmp_path, capsys):
    write_digits_folder(tmp_path / "d", size=16, per_class=6)
    run = tmp_path / "run"
    base = [
        "finetune",
        "--data",
        str(tmp_path / "d"),
        "--checkpoint",
        str(data / "init"),
        "--epochs",
        "2",
        "--freeze-epochs",
        "0",
        "--batch-size",
        "32",
        "--no-aug",
        "--device",
        "cpu",
        "--out",
        str(run),
    ]
    assert main(base) == 0
    assert main(base) == 2 and "already holds a run (last.json); resume it" in capsys.readouterr().err
    assert main(base + ["--resume", "--lr", "3e-4"]) == 2
    assert "other settings (lr 0.0001 -> 0.0003)" in capsys.readouterr().err
    next((tmp_path / "d" / "train" / "3").iterdir()).unlink()
    assert main(base + ["--resume"]) == 2
    assert re.search(r"other settings \(data '\w+' -> '\w+'\)", capsys.readouterr().err)


def test_nan_loss_stops_with_a_diagnosis(data, tmp_path, capsys):
    """Finite weights that overflow (weights holding NaN are refused when they are read): the position table
    at +-3e38, whose LayerNorm means are infinite, so the loss is NaN from the first step."""
    model = create_model("vit_mini", num_classes=5, **TINY)
    with torch.no_grad():
        model.pos_embed.fill_(3e38)
        model.pos_embed[..., ::2] = -3e38
    save_checkpoint(tmp_path / "bad", "bad", model, {"epoch": 0})
    run = tmp_path / "run"
    code = main(
        [
            "finetune",
            "--data",
            str(data / "small"),
            "--checkpoint",
            str(tmp_path / "bad"),
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--device",
            "cpu",
            "--out",
            str(run),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert "diagnosis: loss became non-finite" in out and "no checkpoint was written yet" in out
    lines = err.strip().splitlines()  # the new head's warning, one line, then the error
    assert lines[0].startswith("warning: ") and "made a new zero-initialised head for 10 classes" in lines[0]
    assert lines[-1].startswith("error: training stopped") and len(lines) == 2 and not (run / "last.json").exists()


def _rows(train_loss, val_acc, train_acc=None):
    train_acc = train_acc or [0.5] * len(train_loss)
    return [
        {"train_loss": a, "val_acc": b, "train_acc": c, "val_loss": 1.0}
        for a, b, c in zip(train_loss, val_acc, train_acc)
    ]


def test_diagnostics_fire_only_when_they_apply():
    good = _rows([2.0, 1.5, 1.0, 0.7, 0.5, 0.4], [0.3, 0.5, 0.6, 0.7, 0.75, 0.78], [0.3, 0.5, 0.6, 0.7, 0.8, 0.82])
    assert diagnostics.diagnose(good, warmup_epochs=1, num_classes=10) == []
    flat = _rows([2.30, 2.30, 2.29, 2.30, 2.30, 2.29], [0.1] * 6, [0.1] * 6)
    assert [f.symptom for f in diagnostics.diagnose(flat, warmup_epochs=1, num_classes=10)] == [
        "training loss is not falling after warmup"
    ]
    wobble = _rows([2.0, 1.5, 1.0, 0.8, 0.7, 0.6, 0.5], [0.3, 0.6, 0.4, 0.7, 0.45, 0.7, 0.5], [0.5] * 7)
    assert "validation accuracy oscillates" in [
        f.symptom for f in diagnostics.diagnose(wobble, warmup_epochs=1, num_classes=10)
    ]
    overfit = _rows([2.0, 1.0, 0.5, 0.2, 0.1], [0.4, 0.5, 0.55, 0.55, 0.55], [0.5, 0.7, 0.9, 0.97, 0.99])
    assert [f.symptom for f in diagnostics.diagnose(overfit, warmup_epochs=1, num_classes=10)] == [
        "training accuracy is far above validation accuracy (overfitting)"
    ]
    assert diagnostics.tiny_from_scratch(1_000, "vit_mini") is not None
    assert diagnostics.tiny_from_scratch(1_000, "resnet_mini") is None
    assert diagnostics.tiny_from_scratch(50_000, "vit_mini") is None
    assert "kept in runs/x/checkpoints/epoch_0003" in str(
        diagnostics.nan_loss(4, float("nan"), "runs/x/checkpoints/epoch_0003")
    )


def test_train_command_trains_the_cnn_baseline_on_bundled_digits(tmp_path, capsys):
    run = tmp_path / "cnn"
    assert (
        main(
            [
                "train",
                "--dataset",
                "digits",
                "--model",
                "resnet_mini",
                "--img-size",
                "16",
                "--epochs",
                "2",
                "--warmup-epochs",
                "0.5",
                "--lr",
                "3e-3",
                "--batch-size",
                "64",
                "--no-hflip",
                "--device",
                "cpu",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "resnet_mini" and summary["images"] == {"train": 1438, "val": 359, "skipped": 0}
    # the recipe's init (jax, a small random head) is a ViT's: the CNN keeps its own, and says so
    assert summary["recipe"]["init"].startswith("PyTorch's defaults"), summary["recipe"]["init"]
    assert "  init: PyTorch's defaults" in capsys.readouterr().out
    assert summary["best"]["val_acc"] > 0.3, summary["best"]  # chance is 0.1


def test_flips_default_on_for_folders_and_fashion_and_off_for_digits_and_x():
    y = torch.tensor([0, 1, 0, 1])
    images = ImageTensors.from_float(torch.rand(4, 3, 16, 16), y)
    scan = FolderScan(
        Path("t"),
        "in-memory",
        ["a", "b"],
        [(f"t:{i}", int(c)) for i, c in enumerate(y)],
        [(f"v:{i}", int(c)) for i, c in enumerate(y)],
    )
    model = create_model("vit_mini", num_classes=2, **TINY)

    def flips(dataset: str | None, **kw) -> bool:  # in a run that augments (a short one does not: docs/recipe.md)
        data = RunData(scan, images, images, dataset)
        return make_loaders(data, model, RECIPES["finetune"].replace(augment=True, **kw), dist=DistInfo())[
            0
        ].transform.hflip

    assert flips(None) and not flips(None, hflip=False)
    assert flips("fashion-mnist")
    assert not flips("digits") and flips("digits", hflip=True) and not flips("x")


def _old_checkpoint(run: Path, model, kind: str, config: dict, pretrained_cfg: dict) -> Path:
    """A run folder as vitlab wrote it before the one training engine: an untyped pretrained_cfg, no
    "version" in config.json, and the old state.pt layout (run_config, a list of RNG states)."""
    folder = run / "checkpoints" / "epoch_0001"
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"kind": kind, "config": config, "pretrained_cfg": pretrained_cfg}))
    torch.save(
        {
            "data_fingerprint": "0" * 16,
            "epoch": 1,
            "optimizer": {},
            "scheduler": {},
            "rng_cpu": [torch.get_rng_state()],
            "history": [{"epoch": 1, "val_acc": 0.5}],
            "run_config": {"lr": 1e-3},
            "world_size": 1,
        },
        folder / "state.pt",
    )
    (run / "last.json").write_text(json.dumps({"checkpoint": "checkpoints/epoch_0001", "epoch": 1}))
    (run / "best.json").write_text(json.dumps({"checkpoint": "checkpoints/epoch_0001", "epoch": 1, "val_acc": 0.5}))
    return run


def test_checkpoints_of_earlier_versions_predict_and_fine_tune_but_do_not_resume(data, tmp_path, capsys):
    torch.manual_seed(0)
    vit = create_model("vit_mini", num_classes=10, **TINY)
    torch.nn.init.normal_(vit.head.weight, std=0.5)
    labels = [str(i) for i in range(10)]
    old_vit = _old_checkpoint(
        tmp_path / "old_vit",
        vit,
        "vit",
        vit.cfg.to_dict(),
        {
            "input_size": [3, 16, 16],
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.5, 0.5],
            "crop_pct": 0.9,
            "interpolation": "bicubic",
            "num_classes": 10,
            "label_names": labels,
            "source": "random init",
            "architecture": "vit_mini",
        },
    )
    cnn = create_model("resnet_mini", num_classes=10)
    old_cnn = _old_checkpoint(
        tmp_path / "old_cnn",
        cnn,
        "resnet_mini",
        {"num_classes": 10, "width": 16, "blocks": 1, "in_chans": 3},
        {"input_size": [3, 32, 32], "num_classes": 10, "label_names": labels},
    )
    image = str(next((data / "small" / "val" / "3").iterdir()))
    for run in (old_vit, old_cnn):
        model = create_model(checkpoint=run)
        assert model.pretrained_cfg.label_names == tuple(labels) and model.pretrained_cfg.format == "vitlab"
        ref = vit if run is old_vit else cnn
        x = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            assert torch.equal(model(x), ref.eval()(x))
        assert main(["predict", image, "--checkpoint", str(run / "best.json"), "--topk", "2"]) == 0
        assert f"with weights {run / 'checkpoints' / 'epoch_0001'} (vitlab layout)" in capsys.readouterr().out
        assert (
            main(
                [
                    "finetune",
                    "--data",
                    str(data / "small"),
                    "--checkpoint",
                    str(run),
                    "--epochs",
                    "1",
                    "--freeze-epochs",
                    "0",
                    "--batch-size",
                    "32",
                    "--no-aug",
                    "--device",
                    "cpu",
                    "--out",
                    str(tmp_path / f"ft_{run.name}"),
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "finetune",
                    "--data",
                    str(data / "small"),
                    "--checkpoint",
                    str(run),
                    "--epochs",
                    "1",
                    "--resume",
                    "--freeze-epochs",
                    "0",
                    "--device",
                    "cpu",
                    "--out",
                    str(run),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert "was written by an earlier vitlab (state version 1" in err and "cannot be resumed" in err, err
    assert main(["attention", image, "--checkpoint", str(old_vit), "--out", str(tmp_path / "attn")]) == 0
