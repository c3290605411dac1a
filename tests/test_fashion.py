"""Fashion-MNIST: read through torchvision from wherever the files are (in the documented order), checked
before they are read, nested training subsets, the image-folder writer, `vitlab train` on it reaching an
accuracy, and every kind of bad input as one line and exit 2."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.cli import main
from vitlab.data import fashion_mnist
from vitlab.data.fashion_mnist import CLASS_NAMES, FOLDER_NAMES, IDX_FILES, load_fashion_mnist, locate, nested_subset
from vitlab.errors import VitlabError


def _linked(folder: Path, source: Path, names=IDX_FILES) -> Path:
    """`folder` holding symbolic links to the idx files in `source`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(source / name)
    return folder


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No Fashion-MNIST anywhere: no $VITLAB_DATA, an empty cache, no Debian package, and no network."""
    monkeypatch.delenv("VITLAB_DATA", raising=False)
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "no-package")

    def offline(folder):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(fashion_mnist, "_download", offline)
    return tmp_path


def test_the_standard_split_is_read_with_its_labels(fashion):
    x, y = load_fashion_mnist(train=True)
    xt, yt = load_fashion_mnist(train=False)
    assert x.shape == (60_000, 1, 28, 28) and x.dtype == torch.uint8 and xt.shape == (10_000, 1, 28, 28)
    assert torch.bincount(y).tolist() == [6000] * 10 and torch.bincount(yt).tolist() == [1000] * 10
    assert y[:5].tolist() == [9, 0, 0, 3, 0]  # the first training images: ankle boot, T-shirt, T-shirt, dress, T-shirt
    assert CLASS_NAMES[9] == "Ankle boot" and int(x.float().mean()) == 72  # mean pixel 72.9 of 255


def test_the_files_are_found_in_order_root_vitlab_data_debian_download(fashion, nowhere, monkeypatch):
    download = _linked(fashion_mnist.cache_dir() / "fashion-mnist" / "download", fashion)  # an earlier download
    assert locate() == download
    debian = _linked(nowhere / "debian", fashion)
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", debian)
    assert locate() == debian  # the system's files before a copy
    data = _linked(nowhere / "data" / "FashionMNIST" / "raw", fashion)  # torchvision's layout under $VITLAB_DATA
    monkeypatch.setenv("VITLAB_DATA", str(nowhere / "data"))
    assert locate() == data
    root = _linked(nowhere / "root", fashion)
    assert locate(root) == root


def test_gz_files_are_checked_and_decompressed_into_a_cache_folder_of_their_own(fashion, nowhere):
    root = nowhere / "gz"
    root.mkdir()
    for name in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"):  # small files, compressed here
        (root / f"{name}.gz").write_bytes(gzip.compress((fashion / name).read_bytes()))
    _linked(root, fashion, ["train-images-idx3-ubyte", "t10k-images-idx3-ubyte"])
    copy = locate(root)
    assert copy.parent == fashion_mnist.cache_dir() / "fashion-mnist" and copy.name not in ("download", "gz")
    _, y = load_fashion_mnist(root, train=False)
    assert torch.bincount(y).tolist() == [1000] * 10
    with pytest.raises(VitlabError, match="Fashion-MNIST not found"):  # a copy made for root= serves root= alone
        locate(download=False)


def _idx(data: np.ndarray, magic: int) -> bytes:
    return struct.pack(f">{1 + data.ndim}I", magic, *data.shape) + data.astype(np.uint8).tobytes()


def _png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_a_one_off_root_of_other_files_never_stands_in_for_fashion_mnist(fashion, tmp_path, capsys):
    """`vitlab data fashion-mnist --root` with bad files (.gz, as downloads come), then the default command:
    the bad files are refused, naming the user's file; well-formed files of other images are read for
    that root alone; the default command writes the real images."""
    x, y = load_fashion_mnist(train=True)
    xt, yt = load_fashion_mnist(train=False)

    def root(name: str, **replaced: np.ndarray) -> Path:
        folder = _linked(tmp_path / name, fashion, [n for n in IDX_FILES if n not in replaced])
        for file, data in replaced.items():
            magic = 2051 if "images" in file else 2049
            (folder / f"{file}.gz").write_bytes(gzip.compress(_idx(data, magic), compresslevel=1))
        return folder

    black = root("black", **{"train-images-idx3-ubyte": np.zeros((60_000, 28, 28), np.uint8)})
    labels = root("labels", **{"t10k-labels-idx1-ubyte": np.where(yt.numpy() == 9, 12, yt.numpy())})
    for folder, expected in (
        (black, f"{black}/train-images-idx3-ubyte.gz: every pixel of every image is 0, so these are not photos"),
        (labels, f"{labels}/t10k-labels-idx1-ubyte.gz: label 12 at item 0 (1,000 labels outside 0..9)"),
    ):
        assert (
            main(["data", "fashion-mnist", "--root", str(folder), "--train-size", "20", "--out", str(tmp_path / "no")])
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
        assert not (tmp_path / "no").exists()
    inverted = root("inverted", **{"t10k-images-idx3-ubyte": 255 - xt[:, 0].numpy()})  # well-formed, not Fashion-MNIST
    assert torch.equal(load_fashion_mnist(inverted, train=False)[0], 255 - xt)  # read for that root, as asked

    out = tmp_path / "fm"
    assert main(["data", "fashion-mnist", "--out", str(out), "--train-size", "30", "--seed", "1"]) == 0
    assert "wrote 30 train and 10,000 val images" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "train").iterdir()) == list(FOLDER_NAMES)
    assert (
        sum(1 for _ in (out / "train").rglob("*.png")) == 30 and sum(1 for _ in (out / "val").rglob("*.png")) == 10_000
    )
    i = nested_subset(60_000, 30, seed=1)[0].item()
    assert np.array_equal(_png(out / "train" / FOLDER_NAMES[int(y[i])] / f"{i:05d}.png"), x[i, 0].numpy())  # lossless
    for j in (0, 9_999):  # the real test images, not the inverted ones of the run before
        assert np.array_equal(_png(out / "val" / FOLDER_NAMES[int(yt[j])] / f"{j:05d}.png"), xt[j, 0].numpy())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    assert main(["data", "fashion-mnist", "--out", str(tmp_path / "mine")]) == 2  # not over someone else's folder
    assert "already exists and is not empty" in capsys.readouterr().err


def _broken_root(tmp_path: Path, fashion: Path, name: str, data: bytes, gz: bool) -> Path:
    root = _linked(tmp_path / "broken", fashion, [n for n in IDX_FILES if n != name])
    (root / (name + ".gz" if gz else name)).write_bytes(gzip.compress(data)[: len(data) // 3] if gz else data)
    return root


@pytest.mark.parametrize(
    "name,kind,expected",
    [
        ("t10k-labels-idx1-ubyte", "truncated gz", "corrupt or truncated gzip file"),
        ("t10k-images-idx3-ubyte", "truncated", "truncated idx file (7,000,000 bytes of data, expected 7,840,016)"),
        (
            "train-labels-idx1-ubyte",
            "wrong magic",
            "not a Fashion-MNIST train-labels-idx1-ubyte idx file (magic number 0x0803",
        ),
    ],
)
def test_corrupt_or_truncated_files_are_one_line_and_exit_2(fashion, tmp_path, capsys, name, kind, expected):
    if kind == "truncated gz":
        data = (fashion / name).read_bytes()
    elif kind == "truncated":
        data = (fashion / name).read_bytes()[:7_000_000]
    else:  # an images file where the labels should be
        data = (fashion / "t10k-images-idx3-ubyte").read_bytes()[:60_008]
    root = _broken_root(tmp_path, fashion, name, data, gz=kind.endswith("gz"))
    cache = fashion_mnist.cache_dir() / "fashion-mnist"
    before = sorted(cache.rglob("*")) if cache.exists() else []
    assert (
        main(
            [
                "train",
                "--dataset",
                "fashion-mnist",
                "--root",
                str(root),
                "--model",
                "resnet_mini",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"error: {root / name}") and expected in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()  # nothing half-written
    assert (sorted(cache.rglob("*")) if cache.exists() else []) == before  # nor a partial copy in the cache


def test_no_files_and_no_network_names_both_ways_to_get_them(nowhere, capsys):
    assert main(["train", "--dataset", "fashion-mnist", "--model", "vit_mini", "--out", str(nowhere / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the download failed (" in err and "name resolution" in err, err
    assert "apt-get install dataset-fashion-mnist" in err and "run once with network access" in err
    assert (
        main(
            [
                "train",
                "--dataset",
                "fashion-mnist",
                "--root",
                str(nowhere),
                "--model",
                "vit_mini",
                "--out",
                str(nowhere / "run"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith(f"error: --root {nowhere}: no Fashion-MNIST files there")


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--dataset", "fashion"], "argument --dataset: invalid choice: 'fashion'"),
        (["--dataset", "fashion-mnist", "--train-size", "0"], "--train-size must be an integer in [1, 60000]; found 0"),
        (
            ["--dataset", "fashion-mnist", "--train-size", "60001"],
            "--train-size must be an integer in [1, 60000]; found 60001",
        ),
        (
            ["--dataset", "digits", "--root", "somewhere"],
            "--root somewhere: only the fashion-mnist dataset is read from files",
        ),
        (
            ["--dataset", "fashion-mnist", "--val-split", "0.1"],
            "the fashion-mnist dataset has its own validation split",
        ),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    assert main(["train", *argv, "--model", "vit_mini", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and expected in err and err.count("\n") == 1, err


def test_training_subsets_nest_and_depend_on_the_seed():
    small, large = nested_subset(60_000, 1000, seed=3), nested_subset(60_000, 4000, seed=3)
    assert len(small) == 1000 and len(set(small.tolist()) - set(large.tolist())) == 0
    assert not torch.equal(small, nested_subset(60_000, 1000, seed=4))
    assert torch.equal(nested_subset(60_000, None, seed=0), torch.arange(60_000))
    with pytest.raises(VitlabError, match=r"train_size must be an integer in \[1, 60000\]; found 0"):
        nested_subset(60_000, 0, seed=0)


def test_train_on_fashion_mnist_reaches_an_accuracy(fashion, tmp_path, capsys):
    """The CNN baseline from scratch on 2,000 images for 2 epochs (126 steps), in memory: chance is 10%."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert (
            main(
                [
                    "train",
                    "--dataset",
                    "fashion-mnist",
                    "--model",
                    "resnet_mini",
                    "--train-size",
                    "2000",
                    "--epochs",
                    "2",
                    "--batch-size",
                    "32",
                    "--lr",
                    "3e-3",
                    "--warmup-epochs",
                    "0.2",
                    "--crop-scale",
                    "1",
                    "--device",
                    "cpu",
                    "--out",
                    str(tmp_path / "run"),
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "fashion-mnist: 10 classes, 2000 train / 10000 val images (in memory)" in out
    assert "data in memory as uint8 tensors; augmentation per batch on cpu: flip\n" in out  # whole images: no crop
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["images"] == {"train": 2000, "val": 10_000, "skipped": 0}
    assert summary["best"]["val_acc"] > 0.65, summary["best"]  # 0.745 on the development machine
