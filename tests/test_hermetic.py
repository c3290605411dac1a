"""Nothing outside `--out` and the cache root: the files of the libraries vitlab's commands use (matplotlib's
config and font cache, torch.compile's kernels, ONNX Runtime's telemetry) go under VITLAB_CACHE too. Each command
runs as a user runs it, in its own process, with a home folder and a temporary folder of its own to look into."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("serve_page", ROOT / "benchmarks" / "serve_page.py")
serve_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_page)


def _everything(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.slow  # a compile and a server start: about a minute and a half on 2 cores
def test_train_compiled_predict_export_and_serve_write_nothing_outside_out_and_the_cache(tmp_path, monkeypatch):
    home, tmp, cache, work = (tmp_path / name for name in ("home", "tmp", "cache", "work"))
    for folder in (home, tmp, work):
        folder.mkdir()
    env = {"HOME": str(home), "TMPDIR": str(tmp), "VITLAB_CACHE": str(cache)}
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def vitlab(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "vitlab", *args],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        assert done.returncode == 0, f"vitlab {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    vitlab("data", "digits", "--out", "digits")
    vitlab("train", "--data", "digits", "--model", "vit_mini", "--epochs", "1", "--threads", "1", "--out", "run")
    image = next(iter(sorted((work / "digits" / "val").rglob("*.png"))))
    vitlab("predict", str(image), "--checkpoint", "run", "--fast-path", "compile")
    vitlab("export", "--checkpoint", "run", "--out", "model.onnx")
    server = serve_page.Server(["--checkpoint", "run", "--runs", "."], cwd=work, threads=1)
    try:
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        server.stop()

    assert _everything(home) == set(), "written under the home folder"
    assert _everything(tmp) == set(), "left in the temporary folder"
    kept = {p.name for p in cache.iterdir()}
    assert {"matplotlib", "inductor", "onnxruntime"} <= kept, kept
