"""The page's logic without a browser: the same numbers as `vitlab predict`, the same pictures as
`vitlab attention`, the same Figure 7 and token-norm map as `vitlab inspect`; one loaded copy per
model, and a failed load that changes nothing; the runs and reports found on disk; bad uploads in the
command line's words; `vitlab serve` without Gradio. (tests/test_serve_browser.py drives the served page itself.)"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.cli import main
from vitlab.errors import VitlabError
from vitlab.models.factory import create_model
from vitlab.runtime import num_threads
from vitlab.serve import look, runs
from vitlab.serve.models import ModelSource, ModelStore, run_sources
from vitlab.serve.page import NO_GRADIO
from vitlab.speed import onednn, tune
from vitlab.speed.rules import Plan
from vitlab.weights.checkpoint import find_runs, save_checkpoint, save_weights

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with num_threads(1):  # tiny models: a second thread only adds contention on a shared machine
        yield


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """A vit_mini checkpoint with random weights and a random, non-zero head (10 classes)."""
    torch.manual_seed(0)
    model = create_model("vit_mini")
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return save_weights(tmp_path_factory.mktemp("mini") / "mini", model)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i, (size, fmt) in enumerate([((48, 40), "PNG"), ((37, 53), "JPEG")]):
        path = folder / f"photo{i}.{fmt.lower().replace('jpeg', 'jpg')}"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path, fmt)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def store(mini) -> ModelStore:
    return ModelStore(device="cpu")


def test_the_top5_has_the_numbers_of_vitlab_predict(store, mini, images, capsys):
    loaded = store.load(ModelSource(checkpoint=str(mini)))
    ours = look.predict(loaded, images)
    assert main(["predict", *map(str, images), "--checkpoint", str(mini), "--json", "--device", "cpu"]) == 0
    cli = json.loads(capsys.readouterr().out)["results"]
    for page, ref in zip(ours, cli):
        assert page["file"] == Path(ref["file"]).name
        assert [p["label"] for p in page["predictions"]] == [p["label"] for p in ref["predictions"]]
        # The command packs the Linear weights for oneDNN (~1e-6); what the page shows is identical.
        np.testing.assert_allclose(
            [p["prob"] for p in page["predictions"]], [p["prob"] for p in ref["predictions"]], atol=1e-5
        )
        assert [look.format_prob(p["prob"]) for p in page["predictions"]] == [
            f"{p['prob']:.2%}" for p in ref["predictions"]
        ]
    html = look.topk_html(ours[0])
    assert html.count('class="vl-row"') == 5 and look.format_prob(ours[0]["predictions"][0]["prob"]) in html


def test_the_top5_moves_to_a_readied_copy_after_warm_up_and_the_attention_keeps_the_model(mini, images):
    """`vitlab serve` readies a copy of each model in the background (here the plan `vitlab tune` kept for it:
    the explicit attention products, and oneDNN's where this torch has them); the top-k moves to it once it
    is ready, with the same probabilities to ~1e-6, while the model as built stays for the attention maps.
    `--fast-path off` keeps the model as built."""
    model = create_model(checkpoint=str(mini))
    tuned = Plan("explicit", "onednn" if onednn.available("fp32") else "aten", source="tuned")
    tune.remember(model, mode="inference", precision="fp32", batch_size=1, plan=tuned)
    fast = ModelStore(device="cpu", fast_path="tuned").load(ModelSource(checkpoint=str(mini)))
    off = ModelStore(device="cpu", fast_path="off").load(ModelSource(checkpoint=str(mini)))
    assert fast.ready.wait(120) and off.ready.wait(120)
    assert fast.for_topk() is not fast.model and fast.path == tuned.describe()
    assert f"top-k path: {fast.path}" in fast.describe()
    assert all(b.attn.fused for b in fast.model.blocks)  # the model as built, untouched
    assert off.path == Plan(source="--fast-path off").describe()
    for a, b in zip(look.predict(fast, images), look.predict(off, images)):
        assert [p["index"] for p in a["predictions"]] == [p["index"] for p in b["predictions"]]
        np.testing.assert_allclose(
            [p["prob"] for p in a["predictions"]], [p["prob"] for p in b["predictions"]], atol=1e-5
        )


@pytest.mark.parametrize(
    "flags",
    [
        dict(method="cls", layer=1, head="2", alpha=0.3, upsample="nearest"),
        dict(method="cls", layer="last", head="max", alpha=0.6, upsample="bilinear"),
        dict(method="rollout", layer=2, head="min", start_layer=1, discard_ratio=0.2, alpha=0.5, upsample="bilinear"),
    ],
)
def test_the_overlay_is_the_picture_vitlab_attention_writes(store, mini, images, tmp_path, flags):
    loaded = store.load(ModelSource(checkpoint=str(mini)))
    ours = look.attention_overlay(loaded, images[1], **flags)
    argv = ["attention", str(images[1]), "--checkpoint", str(mini), "--out", str(tmp_path), "--device", "cpu"]
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    assert main(argv) == 0
    cli = np.asarray(Image.open(tmp_path / f"{images[1].stem}_{flags['method']}_overlay.png"))
    assert ours.picture.dtype == np.uint8 and ours.picture.shape == cli.shape
    assert np.array_equal(ours.picture, cli)
    assert "peak at patch" in ours.caption


def test_a_different_layer_gives_a_different_overlay(store, mini, images):
    loaded = store.load(ModelSource(checkpoint=str(mini)))
    first = look.attention_overlay(loaded, images[0], layer=0).picture
    last = look.attention_overlay(loaded, images[0], layer=3).picture
    assert np.abs(first.astype(int) - last.astype(int)).mean() > 1


def test_figure7_is_the_one_vitlab_inspect_draws(store, mini, images, tmp_path, capsys):
    loaded = store.load(ModelSource(checkpoint=str(mini)))
    summary = look.figure7(loaded, sorted(images), tmp_path / "page")
    folder = images[0].parent
    assert (
        main(
            [
                "inspect",
                "--checkpoint",
                str(mini),
                "--images",
                str(folder),
                "--out",
                str(tmp_path / "cli"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for name in ("fig7a_patch_embedding_pcs.csv", "fig7c_mean_attention_distance.csv"):
        assert (tmp_path / "page" / name).read_text() == (tmp_path / "cli" / name).read_text()
    assert all(line in printed for line in summary["lines"]) and summary["n_images"] == 2


def test_the_token_norm_map_is_the_one_vitlab_inspect_draws(store, mini, images, tmp_path, capsys):
    loaded = store.load(ModelSource(checkpoint=str(mini)))
    norms = look.token_norms(loaded, sorted(images), tmp_path / "page")  # the Inside tab's call, as for Figure 7
    folder = images[0].parent
    assert (
        main(
            [
                "inspect",
                "--checkpoint",
                str(mini),
                "--images",
                str(folder),
                "--out",
                str(tmp_path / "cli"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    page, cli = (np.asarray(Image.open(tmp_path / side / "token_norms.png")) for side in ("page", "cli"))
    assert page.shape == cli.shape and np.array_equal(page, cli)
    assert (tmp_path / "page" / "token_norms.csv").read_text() == (tmp_path / "cli" / "token_norms.csv").read_text()
    assert all(line in printed for line in norms["lines"]) and norms["n_images"] == 2
    text = look.token_norm_markdown(norms)
    assert "Darcet et al. 2023" in text and f"above {look.NORM_RATIO:g} x their layer's median" in text
    assert all(f"- {line.strip()}" in text for line in norms["lines"])


def test_the_models_memory_is_bounded_and_counted_before_a_model_is_read(mini):
    """Each model counts twice its fp32 weights (the model, the copy readied for the top-k); loading one that does not
    fit with the others drops the ones used longest ago; one that never fits is refused before it is built."""
    small = ModelSource.of("model", "vit_mini_x")  # 20,898 parameters: 167 kB counted
    assert small.weights_estimate() == 20_898 * 4 and ModelSource(checkpoint=str(mini)).weights_estimate() > 0
    store = ModelStore(device="cpu", fast_path="off", memory_limit=300_000)
    a = store.load(small)
    assert store.memory_used() == 2 * 20_898 * 4
    b = store.load(ModelSource.of("model", "vit_mini_x", img_size=64))  # another 167 kB: a goes to make room
    assert store.loaded_keys() == [b.source.label] and store.memory_used() <= store.memory_limit
    with pytest.raises(VitlabError, match="--model vit_base_patch16_224 needs about 660.5 MiB"):
        store.load(ModelSource.of("model", "vit_base_patch16_224"))
    assert store.loaded_keys() == [b.source.label]  # a refusal changes nothing
    visitors = ModelStore(device="cpu", fast_path="off", loadable=())
    with pytest.raises(VitlabError, match="this page does not load models given by --checkpoint .*--page-load none"):
        visitors.request("checkpoint", str(mini))
    assert visitors.load(small).source.label == a.source.label  # what vitlab serve itself loads is not a visitor's


def test_one_copy_per_model_and_a_failed_load_changes_nothing(mini, tmp_path):
    store = ModelStore(device="cpu", capacity=2)
    a = store.load(ModelSource(checkpoint=str(mini)))
    assert store.load(ModelSource(checkpoint=str(mini))) is a and store.get(a.source.label) is a
    broken = tmp_path / "broken"
    shutil.copytree(mini, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(VitlabError, match="could not read weights file .*broken"):
        store.load(ModelSource(checkpoint=str(broken)))
    with pytest.raises(VitlabError, match="does not exist"):
        store.load(ModelSource.of("checkpoint", str(tmp_path / "missing")))
    assert store.loaded_keys() == [a.source.label]
    b = store.load(ModelSource.of("model", "vit_mini_x"))
    c = store.load(ModelSource(checkpoint=str(mini), img_size=48))  # a third model: the oldest (a) goes
    assert store.loaded_keys() == [b.source.label, c.source.label]
    assert store.get(a.source.label) is not a  # asked for again: loaded again
    assert c.source.label == f"--checkpoint {mini} --img-size 48" and c.model.cfg.img_size == (48, 48)
    with pytest.raises(VitlabError, match="--model needs a value"):
        ModelSource.of("model", "  ")


def _bomb_png(path: Path, side: int = 40000) -> None:
    """A tiny PNG whose header claims side x side pixels: PIL refuses it at open."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", side, side)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))


def test_bad_uploads_get_the_command_lines_words_naming_the_file(store, mini, images, tmp_path):
    upload = tmp_path / "3f9c0a"  # an upload sits in a folder of a random name
    upload.mkdir()
    (upload / "notes.png").write_text("this is not an image\n")
    (upload / "cut.jpg").write_bytes(images[1].read_bytes()[:200])
    (upload / "empty.jpg").write_bytes(b"")
    _bomb_png(upload / "bomb.png")
    names = ["notes.png", "cut.jpg", "empty.jpg", "bomb.png"]
    results = look.predict(store.load(ModelSource(checkpoint=str(mini))), [upload / n for n in names] + [images[0]])
    words = [
        "notes.png: not an image file PIL can read",
        "cut.jpg: corrupt or truncated image",
        "empty.jpg: the file is empty",
        "bomb.png: refused as a possible decompression bomb",
    ]
    for r, expected in zip(results, words):
        assert r["error"].startswith(expected) and str(upload) not in r["error"], r
    assert "predictions" in results[-1]  # the good image after them is still predicted
    assert 'class="vl-error"' in look.topk_html(results[0])
    with pytest.raises(VitlabError, match="^cut.jpg: corrupt or truncated image"):
        look.attention_overlay(store.get(f"--checkpoint {mini}"), upload / "cut.jpg")


def _fake_run(folder: Path, model, *, summary: bool) -> Path:
    """A run folder as `vitlab train` leaves it (checkpoint, pointers, metrics; summary if asked)."""
    save_checkpoint(folder, "epoch_0002", model, {"epoch": 2})
    (folder / "best.json").write_text(json.dumps({"checkpoint": "checkpoints/epoch_0002", "epoch": 2, "val_acc": 0.5}))
    header = "epoch,stage,lr,train_loss,train_acc,val_loss,val_acc,time_s\n"
    (folder / "metrics.csv").write_text(header + "1,1,0.001,2.3,0.1,2.2,0.2,0.5\n2,1,0.0005,2.0,0.3,1.9,0.5,0.5\n")
    if summary:
        (folder / "summary.json").write_text(
            json.dumps(
                {
                    "model": "vit_mini",
                    "data": "digits",
                    "images": {"train": 80, "val": 20},
                    "best": {"epoch": 2, "val_acc": 0.5, "val_loss": 1.9},
                    "time_s": 3.0,
                }
            )
        )
        (folder / "per_class_accuracy.csv").write_text("class,accuracy,val_images\n0,0.500000,2\n1,,0\n")
    return folder


def test_runs_and_reports_found_under_a_folder(tmp_path):
    root = tmp_path / "runs"
    model = create_model("vit_mini_x")
    _fake_run(root / "digits", model, summary=True)
    _fake_run(root / "demo" / "pos_learned", model, summary=False)
    (root / ".half_written").mkdir(parents=True)
    (root / ".half_written" / "last.json").write_text("{}")
    (root / "demo" / "loop").symlink_to(root, target_is_directory=True)  # a loop is walked once
    shutil.copytree(DOCS / "reproduce" / "synthetic", root / "reproduce")  # a committed report
    found = find_runs(root)
    assert found == [root / "demo" / "pos_learned", root / "digits"]
    assert find_runs(tmp_path / "nothing_here") == []
    assert [s.label for s in run_sources(found, cwd=tmp_path)] == [
        "--checkpoint runs/demo/pos_learned",
        "--checkpoint runs/digits",
    ]
    demo, digits = runs.list_runs(root)
    assert (demo.name, digits.name) == ("demo/pos_learned", "digits")
    text = runs.run_markdown(digits)
    assert "model **vit_mini**" in text and "val acc **50.00%**" in text and "last epoch 2" in text
    assert runs.per_class_rows(digits) == [["0", "50.0%", "2"], ["1", "", "0"]]
    curves = runs.curves_image(demo, tmp_path / "work")  # no curves.png: drawn from metrics.csv
    assert curves.parent == tmp_path / "work" and Image.open(curves).size[0] > 600
    (root / "digits" / "summary.json").write_text("{not json")
    assert "is not readable JSON" in runs.run_markdown(runs.read_run(root / "digits", root))
    assert runs.find_reports(root) == [root / "reproduce"]
    report = runs.report_markdown(root / "reproduce")
    figures = (root / "reproduce" / "report.md").read_text().count("](figures/")
    assert figures >= 5 and report.count("](data:image/png;base64,") == figures and "](figures/" not in report


def test_serve_without_gradio_says_how_to_get_it_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` now fails as if it were not installed
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {NO_GRADIO}\n" and "pip install -e '.[serve]'" in err


def test_serve_refuses_bad_options_before_it_starts(tmp_path, capsys):
    if importlib.util.find_spec("gradio") is None:
        pytest.skip(NO_GRADIO)
    assert main(["serve", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --checkpoint {tmp_path / 'missing'} does not exist")
    assert main(["serve", "--max-upload-mb", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-upload-mb must be an integer >= 1; found 0\n"
    assert main(["serve", "--img-size", "64"]) == 2
    assert "--img-size needs a model" in capsys.readouterr().err
