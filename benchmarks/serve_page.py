"""Drive a real `vitlab serve`: load it with simultaneous predictions, and take a screenshot of each tab.

    python benchmarks/serve_page.py load                     # 8 clients x 5 rounds on ViT-S/16 (random weights)
    python benchmarks/serve_page.py load --clients 8 --rounds 20 --json load.json
    python benchmarks/serve_page.py screenshots --out docs/serve

`load` starts `vitlab serve` on a free port of 127.0.0.1 with a ViT-S/16 of random weights and a random
(non-zero) head, saved as a vitlab checkpoint in a temporary folder. Each round, `--clients` clients
(each its own browser session, through gradio_client) send one image at the same moment; every answer
must carry a top-5. It prints the median and the worst latency (submit to answer, over every request)
and the server's resident memory after each round: it must stop growing after the first round, since
the server holds one copy of the model and answers one forward pass at a time. Timings need a quiet
machine; on a shared one they say more about the neighbours than about the server.

`screenshots` trains vit_mini and resnet_mini on 600 digits (`vitlab train`, 30 epochs, a minute or
two), serves the ViT with both runs and a copy of the `vitlab reproduce` report of docs/reproduce under
--runs, and saves a PNG of each tab, driven by headless Chromium (Debian: apt-get install chromium
chromium-driver) through Selenium.

The tests (tests/test_serve_browser.py) use these same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import torch
from PIL import Image

import vitlab
from vitlab.cli import main as vitlab_main
from vitlab.data.photos import BUNDLED_PHOTOS, sample_photos
from vitlab.weights.checkpoint import save_weights

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
HOW_TO_GET_CHROMIUM = "apt-get install chromium chromium-driver (Debian; .ci/run installs them)"
TABS = ("Predict and look", "Inside (Figure 7)", "Runs", "Reproduce report")


# ----------------------------------------------------------------------------------------------------
# The server

# Gradio's progress line in a pending output ("processing | 0.8s", "queue: 1/2 | 0.3s", or the timer alone, "0.1s",
# before the event is queued: seen on a loaded machine)
STATUS = re.compile(r"^((processing|queue: \S+) \| )?[\d.]+s$")


def offline_env() -> dict:
    """The environment of a server that reaches nothing outside this machine."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        GRADIO_ANALYTICS_ENABLED="False",
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


class Server:
    """`vitlab serve ARGS` in a subprocess; `url` once it has printed where it listens and answers."""

    def __init__(
        self, args: list[str], *, cwd: str | Path | None = None, timeout: float = 120.0, threads: int | None = None
    ):
        """Start the server; `url` waits until it answers (so other work can go on meanwhile)."""
        cmd = [sys.executable, "-m", "vitlab", "serve", *args] + (["--threads", str(threads)] if threads else [])
        self.log = tempfile.NamedTemporaryFile(prefix="vitlab-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=offline_env(), stdout=self.log, stderr=subprocess.STDOUT)
        self.timeout = timeout
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = self._wait(self.timeout)
        return self._url

    def _wait(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        url = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vitlab serve exited with {self.proc.returncode}:\n{self.output()}")
            if url is None:
                for line in self.output().splitlines():
                    if line.startswith("vitlab serve: http://"):
                        url = line.split()[2]
            if url is not None:
                host, port = urlparse(url).hostname, urlparse(url).port
                with socket.socket() as s:
                    if s.connect_ex((host, port)) == 0:
                        return url
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"vitlab serve did not start within {timeout:.0f} s:\n{self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def rss_mb(self) -> float:
        """The server's resident memory now, in MiB (Linux)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS in /proc: memory is measured on Linux only")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        Path(self.log.name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------
# Load: simultaneous predictions


def random_vit(folder: str | Path, name: str = "vit_small_patch16_224", seed: int = 0) -> Path:
    """A vitlab checkpoint of `name` with random weights and a random, non-zero head (a zero head, the
    paper's init, would be refused: it predicts nothing)."""
    torch.manual_seed(seed)
    model = vitlab.create_model(name)
    torch.nn.init.normal_(model.head.weight, std=0.02)
    return save_weights(Path(folder), model)


def sample_image(folder: str | Path, name: str = "chelsea") -> Path:
    """A bundled photo saved as PNG: the image every client sends."""
    path = Path(folder) / f"{name}.png"
    dict(sample_photos(BUNDLED_PHOTOS.index(name) + 1))[name].save(path)  # up to `name` only: they load slowly
    return path


def load_test(
    url: str,
    image: str | Path,
    *,
    model: tuple[str, str] | None = None,
    clients: int = 8,
    rounds: int = 5,
    server: Server | None = None,
    timeout: float = 300.0,
) -> dict:
    """`clients` sessions send `image` at the same moment, `rounds` times. `model` = (kind, value) is
    loaded in each session first (the server keeps one copy), and the rounds start once the server has
    readied its top-k copy (steady state). Returns the latencies, the answers
    counted, and the server's memory after each round."""
    from gradio_client import Client, handle_file  # noqa: PLC0415  the optional extra

    sessions = [Client(url, verbose=False, download_files=False) for _ in range(clients)]
    if model is not None:
        for c in sessions:
            info = c.predict(model[0], model[1], api_name="/load_model")[2]
        deadline = time.monotonic() + timeout
        while "being readied" in str(info) and time.monotonic() < deadline:  # the server's warm-up, in the background
            time.sleep(0.5)
            info = sessions[0].predict(model[0], model[1], api_name="/load_model")[2]
    latencies: list[float] = []
    answers, errors, rss = 0, [], []
    lock = threading.Lock()
    for _ in range(rounds):
        barrier = threading.Barrier(clients)

        def one(client, barrier=barrier):
            nonlocal answers
            barrier.wait()
            t0 = time.perf_counter()
            try:
                out = client.predict([handle_file(str(image))], api_name="/predict")
            except Exception as e:  # noqa: BLE001  a lost request is counted, not raised
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                return
            dt = time.perf_counter() - t0
            topk_html = out[1]
            with lock:
                latencies.append(dt)
                if topk_html.count('class="vl-row"') == 5:
                    answers += 1
                else:
                    errors.append(f"an answer without a top-5: {topk_html[:200]}")

        threads = [threading.Thread(target=one, args=(c,)) for c in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if server is not None:
            rss.append(server.rss_mb())
    for c in sessions:
        c.close()
    return {
        "clients": clients,
        "rounds": rounds,
        "requests": clients * rounds,
        "answered": answers,
        "errors": errors,
        "latency_s": sorted(latencies),
        "median_s": statistics.median(latencies) if latencies else None,
        "worst_s": max(latencies) if latencies else None,
        "rss_mb": rss,
    }


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main_load(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        weights = random_vit(Path(tmp) / "vit_s")
        image = sample_image(tmp)
        server = Server(["--checkpoint", str(weights), "--runs", str(Path(tmp) / "runs")], threads=args.threads)
        try:
            url = server.url  # started and answering
            rss0 = server.rss_mb()
            result = load_test(url, image, clients=args.clients, rounds=args.rounds, server=server)
        finally:
            server.stop()
    result["rss_start_mb"] = rss0
    threads = (
        f"{args.threads} torch threads" if args.threads else f"torch's default threads ({torch.get_num_threads()})"
    )
    print(
        f"vitlab serve, ViT-S/16 (random weights, fp32), {args.clients} clients sending the same photo (451x300 PNG, "
        f"preprocessed to 224x224) at the same moment, {args.rounds} rounds; {cpu_name()}, {os.cpu_count()} cores, "
        f"{threads}, torch {torch.__version__}"
    )
    print(f"  answered {result['answered']} of {result['requests']} requests ({len(result['errors'])} errors)")
    if result["latency_s"]:
        print(
            f"  latency: median {result['median_s']:.2f} s, worst {result['worst_s']:.2f} s (submit to answer, "
            "queueing included: the server runs one forward pass at a time)"
        )
    print(
        f"  server memory (RSS): {rss0:.0f} MiB once started, after each round: "
        + ", ".join(f"{m:.0f}" for m in result["rss_mb"])
        + " MiB"
    )
    for e in result["errors"][:5]:
        print(f"  error: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["answered"] == result["requests"] else 1


# ----------------------------------------------------------------------------------------------------
# The browser


def chromium_missing() -> str | None:
    """Why headless Chromium cannot be driven here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: {HOW_TO_GET_CHROMIUM}"
    try:
        import selenium  # noqa: F401, PLC0415
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev,serve]'"
    return None


def chromium(profile: str | Path, *, width: int = 1400, height: int = 1000):
    """Headless Chromium through Selenium, with a fresh profile, recording every request it makes;
    names that are not this machine resolve to nothing (a request that escapes fails at once)."""
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def requested_urls(driver) -> list[str]:
    """Every URL the page has asked for since the last call (Chromium's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def outside(urls: list[str]) -> list[str]:
    """The URLs that would leave this machine: over the network (http, https, ws, wss) to a host that is
    not this one. (data:, blob: and the browser's own chrome:// pages stay inside the browser.)"""
    return [
        u
        for u in urls
        if urlparse(u).scheme in ("http", "https", "ws", "wss")
        and urlparse(u).hostname not in ("127.0.0.1", "localhost", "::1")
    ]


class Page:
    """The served page in a browser, by the elem_ids vitlab.serve.page gives its parts."""

    def __init__(self, driver, url: str, timeout: float = 60.0):
        from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

        self.driver, self.url, self.timeout = driver, url, timeout
        self.wait = WebDriverWait(driver, timeout, poll_frequency=0.1)
        driver.get(url)
        self.until(lambda: self.find_all("#images input[type=file]"), "the page to be drawn")

    def find(self, css: str):
        from selenium.webdriver.common.by import By  # noqa: PLC0415

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str):
        from selenium.webdriver.common.by import By  # noqa: PLC0415

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        found = self.find_all(css)
        return found[0].text if found else ""

    def settled(self, css: str, message: str = "") -> str:
        """The element's text once it is non-empty and Gradio shows no progress in it (its status line,
        "processing | 0.8s" or "queue: 1/2 | 0.3s", while an event is still running)."""

        def done() -> str | None:
            t = self.text(css)
            return t if t and not any(STATUS.match(line) for line in t.splitlines()) else None

        return self.until(done, message or f"{css} to settle")

    def until(self, condition, message: str = ""):
        from selenium.common.exceptions import TimeoutException  # noqa: PLC0415

        try:
            return self.wait.until(lambda d: condition())
        except TimeoutException:
            raise AssertionError(f"timed out after {self.timeout:.0f} s waiting for {message}") from None

    def upload(self, *paths: str | Path) -> None:
        self.find("#images input[type=file]").send_keys("\n".join(str(p) for p in paths))

    def topk(self, file: str | None = None) -> list[tuple[str, str]]:
        """Wait for the top-5 of `file` (by name), then [(label text, probability text)]."""

        def ready():
            box = self.find_all("#topk .vl-topk")
            if not box or (file is not None and box[0].get_attribute("data-file") != file):
                return None
            rows = self.find_all("#topk .vl-row")
            return rows if len(rows) == 5 else None

        rows = self.until(ready, f"the top-5 of {file}")
        return [
            (r.find_element("css selector", ".vl-label").text, r.find_element("css selector", ".vl-prob").text)
            for r in rows
        ]

    def error(self, containing: str) -> str:
        """Wait for an error message under the top-5 that contains `containing`; returns it."""
        return self.until(
            lambda: containing in (t := self.text("#topk .vl-error")) and t,
            f"an error message with {containing!r} under the top-5",
        )

    def overlay_src(self, which: str = "cls") -> str | None:
        imgs = self.find_all(f"#overlay-{which} img")
        return imgs[0].get_attribute("src") if imgs else None

    def wait_overlay_change(self, before: str | None, which: str = "cls") -> str:
        return self.until(lambda: (s := self.overlay_src(which)) and s != before and s, f"a new {which} overlay")

    def set_slider(self, elem_id: str, value: int | float) -> None:
        """Type a value into the slider's number box and leave it, as a user would."""
        from selenium.webdriver.common.keys import Keys  # noqa: PLC0415

        box = self.find(f"#{elem_id} input[type=number]")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(value), Keys.TAB)

    def tab(self, name: str) -> None:
        button = next(b for b in self.find_all("button[role=tab]") if b.text.strip() == name)
        button.click()

    def choose(self, elem_id: str, option: str) -> None:
        """Pick `option` in the dropdown `elem_id`."""
        self.find(f"#{elem_id} input").click()
        item = self.until(
            lambda: next(
                (li for li in self.find_all("li[role=option]") if li.get_attribute("aria-label") == option), None
            ),
            f"{option!r} in the list {elem_id}",
        )
        item.click()

    def load_model(self, kind: str, value: str) -> None:
        """Open "Load another model", choose `kind` (checkpoint, pretrained, model), type `value`, press Load."""
        from selenium.webdriver.common.keys import Keys  # noqa: PLC0415

        if not self.find_all("#load-value textarea, #load-value input"):
            next(b for b in self.find_all("button") if b.text.strip().startswith("Load another model")).click()
        self.until(lambda: self.find_all("#load-value textarea, #load-value input"), "the load box")
        next(label for label in self.find_all("#load-kind label") if label.text.strip() == kind).click()
        box = self.find("#load-value textarea, #load-value input")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(value)
        self.find("#load").click()

    def screenshot(self, path: str | Path, max_height: int = 1800) -> Path:
        """The page from its top, as tall as the page (at most `max_height` pixels)."""
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        width = self.driver.get_window_size()["width"]
        self.driver.set_window_size(width, min(max(height + 40, 600), max_height))
        self.driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(0.3)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return Path(path)


def digits_runs(folder: str | Path, *, models=("vit_mini",), epochs: int = 2, per_class: int = 12) -> list[Path]:
    """Small models trained on a digits folder with `vitlab train`, into folder/runs/digits_<model>: runs
    with every file a run has (summary, metrics, curves, confusion matrix, per-class accuracy)."""
    folder = Path(folder)
    data = folder / "digits"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: one thread is fastest on a shared machine
    try:
        if not data.exists():
            assert (
                vitlab_main(["data", "digits", "--out", str(data), "--size", "32", "--per-class", str(per_class)]) == 0
            )
        runs = []
        for model in models:
            run = folder / "runs" / f"digits_{model}"
            assert (
                vitlab_main(
                    [
                        "train",
                        "--data",
                        str(data),
                        "--model",
                        model,
                        "--epochs",
                        str(epochs),
                        "--batch-size",
                        "32",
                        "--device",
                        "cpu",
                        "--out",
                        str(run),
                    ]
                )
                == 0
            )
            runs.append(run)
    finally:
        torch.set_num_threads(threads)
    return runs


def digit_image(folder: str | Path, label: int = 3) -> Path:
    """A validation image of `digits_runs`' data."""
    return sorted((Path(folder) / "digits" / "val" / str(label)).iterdir())[0]


def screenshot_tabs(page: Page, out: str | Path, image: str | Path) -> list[Path]:
    """A PNG of each tab: the first with `image` predicted, the runs with the first run shown."""
    out = Path(out)
    shots = []
    page.upload(image)
    page.topk(Path(image).name)
    page.until(lambda: page.overlay_src("rollout"), "the rollout overlay")
    shots.append(page.screenshot(out / "serve_predict.png"))
    page.tab(TABS[1])
    page.until(lambda: page.find_all("#fig7c img") and page.find_all("#token-norms img"), "Figure 7, token norms")
    shots.append(page.screenshot(out / "serve_inside.png"))
    page.tab(TABS[2])
    page.until(lambda: page.find_all("#run-a-curves img"), "a run's curves")
    shots.append(page.screenshot(out / "serve_runs.png"))
    page.tab(TABS[3])
    page.until(lambda: page.find_all("#report-text img"), "the report's figures")
    shots.append(page.screenshot(out / "serve_report.png"))
    return shots


def main_screenshots(args) -> int:
    why = chromium_missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        runs = digits_runs(tmp, models=("vit_mini", "resnet_mini"), epochs=args.epochs, per_class=60)
        shutil.copytree(ROOT / "docs" / "reproduce", Path(tmp) / "runs" / "reproduce")
        # From the folder, with relative paths, as a user types them.
        server = Server(["--checkpoint", str(runs[0].relative_to(tmp)), "--runs", "runs"], cwd=tmp)
        driver = chromium(Path(tmp) / "profile", width=1280)
        try:
            page = Page(driver, server.url)
            for shot in screenshot_tabs(page, args.out, digit_image(tmp)):
                small = Image.open(shot).convert("RGB").quantize(256)  # a palette: a third of the bytes
                small.save(shot, optimize=True)
                print(f"wrote {shot} ({small.width}x{small.height}, {shot.stat().st_size // 1024} KiB)")
            leaks = outside(requested_urls(driver))
            print("requests outside 127.0.0.1: " + (", ".join(leaks) if leaks else "none"))
        finally:
            driver.quit()
            server.stop()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    load = sub.add_parser("load", help="simultaneous predictions on ViT-S/16: latency and server memory")
    load.add_argument("--clients", type=int, default=8, help="simultaneous requests per round")
    load.add_argument("--rounds", type=int, default=5, help="rounds of simultaneous requests")
    load.add_argument("--threads", type=int, default=None, help="the server's torch threads (default: torch's)")
    load.add_argument("--json", default=None, metavar="PATH", help="also write the numbers as JSON")
    shots = sub.add_parser("screenshots", help="a PNG of each tab, through headless Chromium")
    shots.add_argument("--out", default=str(ROOT / "docs" / "serve"), help="folder for the PNGs")
    shots.add_argument("--epochs", type=int, default=30, help="epochs of the two digits runs shown")
    args = p.parse_args(argv)
    return main_load(args) if args.what == "load" else main_screenshots(args)


if __name__ == "__main__":
    sys.exit(main())
