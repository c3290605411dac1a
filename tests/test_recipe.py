"""The recipe a run trains with: defaults that fit the run's length and image size (a warmup of at most a
tenth of the run, augmentation only where it pays, milder crops for small images, the original release's
initialisation), what a run prints is what summary.json records and what the optimiser did, and a flag
that contradicts the run's length gets a note."""

import json
import math
import re

import pytest
import torch
from PIL import Image

from vitlab import create_model
from vitlab.cli import main
from vitlab.experiments.reproduce.runs import BASE_RECIPE
from vitlab.models.vit import VisionTransformer
from vitlab.train import RECIPES, TensorLoader, fit
from vitlab.train.recipe import AUG_MIN_EPOCHS, auto_crop_scale, in_force, schedule

STEPS_PER_EPOCH = (1, 2, 7, 8, 63, 1875)
EPOCHS = (1, 2, 3, 5, 10, 30, 60, 300)


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_no_default_warmup_exceeds_a_tenth_of_the_run(preset):
    """Whatever the run's length, the presets' warmup (each stage's, and all of them together) is at most a
    tenth of the run's optimizer steps; only an explicit warmup_epochs can ask for more."""
    base = RECIPES[preset]
    assert base.warmup_epochs is None  # auto in every preset: a length in epochs cannot fit every run
    for epochs in EPOCHS:
        for freeze in sorted({0, min(base.freeze_epochs, epochs), min(1, epochs)}):
            recipe = base.replace(epochs=epochs, freeze_epochs=freeze)
            for spe in STEPS_PER_EPOCH:
                stages = schedule(recipe, spe)
                total = sum(s.steps for s in stages)
                assert total == epochs * spe
                assert all(s.warmup_steps <= 0.1 * s.steps for s in stages), (preset, epochs, freeze, spe, stages)
                assert sum(s.warmup_steps for s in stages) <= 0.1 * total
    asked = schedule(RECIPES["scratch"].replace(epochs=3, warmup_epochs=5), 63)
    assert [(s.steps, s.warmup_steps) for s in asked] == [(189, 315)]  # asked for: longer than the run


def test_the_mini_experiment_keeps_its_five_epoch_warmup():
    """The demo's recipe at its 60 epochs of 63 steps: the 315 warmup steps (5 epochs) it always had."""
    assert [(s.steps, s.warmup_steps) for s in schedule(RECIPES["mini"], 63)] == [(3780, 315)]


def test_the_optimiser_warms_up_for_the_steps_the_schedule_says(one_thread):
    """fit's learning rate rises for exactly the schedule's warmup steps, then only falls, towards 0."""
    x = torch.randn(40, 3, 32, 32)
    y = torch.arange(40) % 2
    train = TensorLoader(x, y, batch_size=4, shuffle=True)  # 10 steps per epoch
    recipe = RECIPES["scratch"].replace(epochs=3)
    history = fit(
        create_model("vit_mini_x"), train, TensorLoader(x, y, batch_size=40), recipe, device="cpu", fast_path="off"
    )
    lrs = history.lr_steps[1]
    (stage,) = schedule(recipe, 10)
    assert len(lrs) == stage.steps == 30 and stage.warmup_steps == 3
    peak = max(range(len(lrs)), key=lrs.__getitem__)
    assert peak == stage.warmup_steps - 1 and lrs[peak] == pytest.approx(recipe.lr)
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1 : peak + 1]))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :])) and lrs[-1] < 0.01 * recipe.lr


def test_augmentation_is_off_in_short_runs_unless_asked_and_crops_are_milder_for_small_images():
    scratch = RECIPES["scratch"]
    assert scratch.augment is None and scratch.crop_scale is None
    assert not scratch.replace(epochs=AUG_MIN_EPOCHS - 1).resolve(img_size=32).augment
    assert scratch.replace(epochs=AUG_MIN_EPOCHS).resolve(img_size=32).augment
    for asked in (
        dict(crop_scale=0.5),
        dict(hflip=True),
        dict(auto_augment="rand"),
        dict(reprob=0.25),
        dict(augment=True),
    ):
        assert scratch.replace(epochs=2, **asked).resolve(img_size=32).augment, asked  # an asked option wins
    assert not scratch.replace(epochs=50, augment=False).resolve(img_size=32).augment
    sides = [8, 28, 32, 48, 64, 96, 128, 224, 384]
    scales = [auto_crop_scale(s) for s in sides]
    assert scales[0] == scales[1] == scales[2] > scales[-2] == scales[-1] == 0.35
    assert all(a >= b for a, b in zip(scales, scales[1:]))  # the larger the image, the stronger the crop
    assert scratch.replace(epochs=50).resolve(img_size=28, flips=False).crop_scale == auto_crop_scale(28)
    assert scratch.replace(epochs=50, crop_scale=0.2).resolve(img_size=28).crop_scale == 0.2


def test_the_jax_initialisation_has_the_release_scales_and_the_default_is_unchanged():
    """init_weights("jax"): Xavier for each of q, k, v (D x D) and the MLP, LeCun for the patch projection;
    the constructor's trunc_normal init is what create_model always gave (std 0.02, a zero head)."""
    torch.manual_seed(0)
    model = create_model("vit_mini")
    D = model.cfg.dim
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.count_nonzero(model.head.weight) == 0
    model.init_weights("jax", head_std=0.02)
    q, k, v = model.blocks[0].attn.qkv.weight.chunk(3)
    for part in (q, k, v):
        assert part.std().item() == pytest.approx(math.sqrt(2 / (2 * D)), rel=0.1)  # Xavier, fan_in = fan_out = D
    fc1 = model.blocks[0].mlp.fc1.weight  # (128, 64)
    assert fc1.std().item() == pytest.approx(math.sqrt(2 / sum(fc1.shape)), rel=0.1)
    proj = model.patch_embed.proj.weight  # (64, 3, 4, 4): fan_in 48
    assert proj.std().item() == pytest.approx(1 / math.sqrt(48), rel=0.15)
    assert model.head.weight.std().item() == pytest.approx(0.02, rel=0.15) and torch.count_nonzero(model.head.bias) == 0
    assert torch.count_nonzero(model.cls_token) == 0
    model.init_weights("jax")
    assert torch.count_nonzero(model.head.weight) == 0  # head_std 0: the paper's zero head


def _printed(out: str) -> dict:
    """The numbers of the recipe block a run prints."""
    recipe = re.search(
        r"^recipe: AdamW lr ([\d.e-]+), weight decay ([\d.e-]+), batch (\d+), gradient clipping ([\d.]+)", out, re.M
    )
    sched = re.search(r"^  schedule: (\d+) steps \((\d+) epochs x (\d+)\): (.*)$", out, re.M)
    stages = [
        (int(w), int(d)) for w, d in re.findall(r"(\d+) warmup steps, then cosine to 0 over (\d+)", sched.group(4))
    ]
    return {
        "lr": float(recipe.group(1)),
        "weight_decay": float(recipe.group(2)),
        "batch": int(recipe.group(3)),
        "clip_grad": float(recipe.group(4)),
        "steps": int(sched.group(1)),
        "epochs": int(sched.group(2)),
        "steps_per_epoch": int(sched.group(3)),
        "stages": stages,
        "init": re.search(r"^  init: (.*)$", out, re.M).group(1),
        "augmentation": re.search(r"^  augmentation: (.*)$", out, re.M).group(1),
        "regularisation": re.search(r"^  regularisation: (.*)$", out, re.M).group(1),
    }


@pytest.mark.parametrize(
    "command, extra",
    [
        ("train", []),
        ("finetune", ["--freeze-epochs", "1", "--lr", "1e-3"]),  # two stages, each with its own warmup
    ],
)
def test_the_printed_recipe_is_what_summary_json_records_and_what_the_optimiser_did(
    one_thread, tmp_path, capsys, command, extra
):
    out = tmp_path / "run"
    assert (
        main(
            [
                command,
                "--dataset",
                "x",
                "--model",
                "vit_mini_x",
                "--train-size",
                "320",
                "--epochs",
                "3",
                "--batch-size",
                "16",
                "--device",
                "cpu",
                "--fast-path",
                "off",
                "--out",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    printed = _printed(capsys.readouterr().out)
    recorded = json.loads((out / "summary.json").read_text())["recipe"]
    for key in (
        "lr",
        "weight_decay",
        "batch",
        "clip_grad",
        "steps",
        "epochs",
        "steps_per_epoch",
        "init",
        "augmentation",
        "regularisation",
    ):
        assert printed[key] == recorded[key], key
    assert printed["stages"] == [(s["warmup_steps"], s["decay_steps"]) for s in recorded["stages"]]
    assert printed["steps_per_epoch"] == 20 and printed["augmentation"] == "none"  # 3 epochs: too short to augment
    assert printed["init"] == "jax, head N(0, 0.02)"  # random weights: the recipe's initialisation, in either command
    # what the optimiser did: the lr after each epoch is the printed schedule's
    rows = (out / "metrics.csv").read_text().splitlines()
    lr_col = rows[0].split(",").index("lr")
    lrs = [float(r.split(",")[lr_col]) for r in rows[1:]]
    spe, bounds, expected = printed["steps_per_epoch"], [0], []
    for warm, decay in printed["stages"]:
        bounds.append(bounds[-1] + warm + decay)
    for epoch in range(1, 4):
        k = epoch * spe  # optimizer steps done; LambdaLR's factor for step k
        i = next((j for j in range(len(printed["stages"])) if k < bounds[j + 1]), len(printed["stages"]) - 1)
        warm, decay = printed["stages"][i]
        local = k - bounds[i]
        f = (
            (local + 1) / warm
            if local < warm
            else 0.5 * (1 + math.cos(math.pi * min(1.0, (local - warm) / max(1, decay))))
        )
        expected.append(printed["lr"] * f)
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_a_flag_that_contradicts_the_run_length_gets_a_one_line_note(one_thread, tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--dataset",
                "x",
                "--model",
                "vit_mini_x",
                "--train-size",
                "64",
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--warmup-epochs",
                "5",
                "--crop-scale",
                "0.5",
                "--no-aug",
                "--device",
                "cpu",
                "--fast-path",
                "off",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: --warmup-epochs 5 covers the 1-epoch run (10 warmup steps of 2): the learning rate rises to the end "
        "and never decays; without the flag the warmup is 0.1 of it (0 steps)",
        "note: --crop-scale has no effect: augmentation is off (--no-aug)",
    ]
    record = in_force(RECIPES["scratch"].replace(epochs=3, ema=0.999), img_size=32, flips=True, steps_per_epoch=63)
    assert record["notes"] == [
        "--ema 0.999 averages over about 1,000 steps, more than the run's 189: the averaged "
        "weights stay close to the initial ones"
    ]
    assert in_force(RECIPES["scratch"], img_size=32, flips=True, steps_per_epoch=63)["notes"] == []


def test_a_model_from_random_weights_is_evaluated_on_the_whole_image(one_thread, tmp_path):
    """From random weights a folder's images are resized whole to the model's input (crop_pct 1), and the
    checkpoint says so, so that `vitlab predict` sees them as validation did."""
    root = tmp_path / "imgs"
    for part, n in (("train", 6), ("val", 2)):
        for c in ("a", "b"):
            (root / part / c).mkdir(parents=True)
            for i in range(n):
                Image.new("L", (28, 28), 60 if c == "a" else 200).save(root / part / c / f"{i}.png")
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(root),
                "--model",
                "vit_mini",
                "--epochs",
                "1",
                "--batch-size",
                "4",
                "--device",
                "cpu",
                "--fast-path",
                "off",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    model = create_model(checkpoint=str(out))
    assert isinstance(model, VisionTransformer) and model.pretrained_cfg.crop_pct == 1.0


def test_the_demo_and_reproduce_train_the_model_as_built_with_their_own_schedules(one_thread):
    """The new defaults are `vitlab train`'s: `fit` (which the demo and `vitlab reproduce` call) trains the model
    it is given with the weights it has, whatever the recipe's init says, and reproduce's runs keep their
    warmup in epochs and their augmentation as their specs say."""
    torch.manual_seed(0)
    model = create_model("vit_mini_x")  # trunc_normal 0.02, a zero head
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(16, 3, 32, 32), torch.arange(16) % 2
    recipe = RECIPES["scratch"].replace(epochs=1, lr=1e-9)  # init "jax", head_init 0.02: not fit's to apply
    assert (recipe.init, recipe.head_init) == ("jax", 0.02)
    fit(
        model,
        TensorLoader(x, y, batch_size=8),
        TensorLoader(x, y, batch_size=16),
        recipe,
        device="cpu",
        fast_path="off",
    )
    after = model.state_dict()
    assert torch.count_nonzero(before["head.weight"]) == 0 and after["head.weight"].abs().max() < 1e-6  # still ~zero
    assert max((after[k] - before[k]).abs().max().item() for k in before) < 1e-6  # two steps of lr 1e-9, no re-init
    rec = BASE_RECIPE.replace(epochs=7, lr=1e-3, warmup_epochs=1.5, augment=True, hflip=True, crop_scale=0.8)
    assert [(s.steps, s.warmup_steps) for s in schedule(rec, 16)] == [(112, 24)]  # round(1.5 x 16), as before
    assert BASE_RECIPE.augment is False
