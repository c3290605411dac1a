"""`vitlab serve` in a real browser: a server on a free port of 127.0.0.1 in a subprocess, driven by
headless Chromium (Debian's chromium and chromium-driver) through Selenium, with the functions of
benchmarks/serve_page.py. Without the browser these tests skip, saying how to get it; under CI=true
a missing browser is a failure. One server and one browser for the module; the model is vit_mini
trained one epoch on a small digits folder, so each forward pass takes milliseconds."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("serve_page", ROOT / "benchmarks" / "serve_page.py")
serve_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_page)


def _missing() -> str | None:
    if importlib.util.find_spec("gradio") is None:
        return "gradio is not installed: pip install -e '.[dev,serve]'"
    return serve_page.chromium_missing()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    why = _missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests must run in CI: {why}")
        pytest.skip(f"no browser to test the page in: {why}")
    tmp = tmp_path_factory.mktemp("serve")
    mini = serve_page.random_vit(tmp / "mini", "vit_mini")
    # The server starts (seconds: Gradio's import) while a run is trained here; the Runs tab finds it.
    server = serve_page.Server(
        ["--checkpoint", str(mini), "--runs", str(tmp / "runs"), "--max-upload-mb", "1"], cwd=tmp
    )
    driver = None
    try:
        (run,) = serve_page.digits_runs(tmp, epochs=1, per_class=8)
        shutil.copytree(ROOT / "docs" / "reproduce", tmp / "runs" / "reproduce")
        driver = serve_page.chromium(tmp / "profile")
        yield SimpleNamespace(
            server=server, driver=driver, mini=mini, run=run, tmp=tmp, page=serve_page.Page(driver, server.url)
        )
    finally:
        if driver is not None:
            driver.quit()
        server.stop()


def _pixels(url: str) -> np.ndarray:
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=30) as r:
        return np.asarray(Image.open(r).convert("RGB"))


def test_upload_shows_the_top5_of_vitlab_predict(served, capsys):
    page = served.page
    image = serve_page.digit_image(served.tmp, 3)
    page.upload(image)
    shown = page.topk(image.name)
    assert main(["predict", str(image), "--checkpoint", str(served.mini), "--json", "--device", "cpu"]) == 0
    (cli,) = json.loads(capsys.readouterr().out)["results"]
    assert shown == [
        (f"{p['rank']}. {p['label']} (class {p['index']})", f"{p['prob']:.2%}") for p in cli["predictions"]
    ]


def test_the_layer_slider_redraws_the_overlay_as_vitlab_attention_does(served, tmp_path):
    page = served.page
    image = serve_page.digit_image(served.tmp, 7)
    before = page.overlay_src("cls")
    page.upload(image)  # joins the images already there, and is shown
    page.topk(image.name)
    last = page.wait_overlay_change(before)
    page.set_slider("layer", 0)
    first = page.wait_overlay_change(last)
    assert "layer 0" in page.settled("#caption-cls")
    for layer, src in (("last", last), ("0", first)):
        out = tmp_path / layer
        assert (
            main(
                [
                    "attention",
                    str(image),
                    "--checkpoint",
                    str(served.mini),
                    "--layer",
                    layer,
                    "--out",
                    str(out),
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
        cli = np.asarray(Image.open(out / f"{image.stem}_cls_overlay.png").convert("RGB"))
        assert np.array_equal(_pixels(src), cli), f"layer {layer}: the page's overlay is not vitlab attention's"
    assert not np.array_equal(_pixels(last), _pixels(first))


def test_broken_files_get_a_message_and_the_server_goes_on(served, tmp_path):
    good = serve_page.digit_image(served.tmp, 1)
    (tmp_path / "notes.png").write_text("this is not an image\n")
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:100])
    (tmp_path / "huge.png").write_bytes(os.urandom(1_300_000))  # over --max-upload-mb 1
    page = served.page
    for name, words in (
        ("cut.png", "cut.png: corrupt or truncated image"),
        ("notes.png", "notes.png: not an image file PIL can read"),
    ):
        page.upload(tmp_path / name)
        assert page.error(words).startswith(f"error: {words}")
    page.upload(tmp_path / "huge.png")
    toast = page.until(lambda: page.text("[data-testid=toast-text]"), "the upload limit's message")
    assert 'exceed the maximum allowed size of 1.0 Mb: "huge.png"' in toast
    page.upload(good)  # the same page, the next request: served
    assert len(page.topk(good.name)) == 5


def test_a_checkpoint_that_fails_to_load_is_reported_and_the_model_stays(served, tmp_path):
    page = served.page
    broken = tmp_path / "broken"
    shutil.copytree(served.mini, broken)
    (broken / "config.json").write_text('{"kind": "transformer"}')
    page.load_model("checkpoint", str(broken))
    error = page.settled("#model-error", "the load error")
    assert error.startswith(f"error: checkpoint config {broken / 'config.json'} has model kind 'transformer'")
    assert page.find("#model input").get_attribute("value") == f"--checkpoint {served.mini}"
    image = serve_page.digit_image(served.tmp, 8)
    page.upload(image)  # still predicted, by the model that was loaded
    assert len(page.topk(image.name)) == 5


def test_the_runs_tab_shows_the_run_made_here(served):
    page = served.page
    page.tab("Runs")
    page.until(lambda: "digits_vit_mini" in page.text("#run-a-summary"), "the run's summary")
    summary = page.text("#run-a-summary")
    assert "model vit_mini" in summary and "best epoch 1: val acc" in summary
    page.until(
        lambda: page.find_all("#run-a-curves img") and page.find_all("#run-a-confusion img"),
        "the run's curves and confusion matrix",
    )
    grid = page.until(lambda: page.find_all("#run-a-per-class [role=grid]"), "the per-class accuracy")[0]
    assert grid.get_attribute("aria-rowcount") == "11"  # a header and ten classes
    assert "%" in page.text("#run-a-per-class")


def test_every_tab_draws_and_nothing_is_fetched_from_elsewhere(served, tmp_path):
    page = serve_page.Page(served.driver, served.server.url)  # a new session
    shots = serve_page.screenshot_tabs(page, tmp_path, serve_page.digit_image(served.tmp, 5))
    for shot in shots:
        picture = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
        assert picture.shape[1] >= 1200 and picture.shape[0] >= 600 and picture.std() > 10, shot
    urls = serve_page.requested_urls(served.driver)  # every request of the module's pages so far
    assert any(u.startswith(served.server.url) for u in urls)
    assert serve_page.outside(urls) == []


def test_eight_simultaneous_predictions_on_vit_s16_are_all_answered(served):
    weights = serve_page.random_vit(served.tmp / "vit_s")
    image = serve_page.sample_image(served.tmp, "chelsea")
    result = serve_page.load_test(
        served.server.url, image, model=("checkpoint", str(weights)), clients=8, rounds=2, server=served.server
    )
    assert result["errors"] == [] and result["answered"] == result["requests"] == 16
    first, second = result["rss_mb"]
    assert second < first + 64, f"the server grew from {first:.0f} to {second:.0f} MiB in a round of the same requests"
