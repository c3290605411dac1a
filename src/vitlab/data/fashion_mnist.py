"""Fashion-MNIST (Xiao, Rasul and Vollgraf 2017): 70,000 grey 28x28 photos of clothing in 10 classes,
the standard 60,000 training / 10,000 test split, read through `torchvision.datasets.FashionMNIST`.

Where the four idx files come from (the first place that has them is used):

    1. root=                  (--root) a folder holding them, .gz or not: directly, in DIR/fashion-mnist/,
                              or in torchvision's layout DIR/FashionMNIST/raw/. Only there: a run with
                              root= reads root's files and no other run ever does.
    2. $VITLAB_DATA           the same, in your data folder
    3. DEBIAN_DIR             /usr/share/datasets/fashion-mnist: `apt-get install dataset-fashion-mnist`
    4. a download             through torchvision, into vitlab's cache folder (`vitlab.fileio.cache_root()`/
                              datasets/fashion-mnist/download), when there is a network; kept for later runs

The system's files come before a copy of them. A .gz file is decompressed into the cache folder, in a
sub-folder named after the folder it came from (`<cache>/datasets/fashion-mnist/<hash of the source>`), so a
copy made for one source never stands in for another: a one-off `--root` of other files leaves every
default run reading Debian's (or $VITLAB_DATA's) files. Every file is checked before it is read or
copied: its magic number, its dimensions, its size, labels in 0..9, and images that are not all one
value; a file that fails is one error naming it, and nothing is copied.

    load_fashion_mnist(train=True)    -> images (60000, 1, 28, 28) uint8, labels (60000,) int64
    nested_subset(60000, n, seed=s)   -> the first n of one seeded permutation: subsets that nest
    write_fashion_mnist_folder(out)   -> the dataset as an image folder (`vitlab data fashion-mnist`)
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import zlib
from pathlib import Path
from urllib.error import URLError

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import FashionMNIST

from vitlab.errors import VitlabError, check_range
from vitlab.fileio import cache_root, whole_folder, write_bytes
from vitlab.options import check_seed

CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Class folders of `write_fashion_mnist_folder`: the label first, so that sorting them (as ImageFolder does)
# keeps the dataset's label order, and no "/" in a name.
FOLDER_NAMES = tuple(
    f"{i}_{n.lower().replace('/', '_').replace(' ', '_').replace('-', '')}" for i, n in enumerate(CLASS_NAMES)
)
N_TRAIN, N_TEST, SIDE = 60_000, 10_000, 28

# idx file -> (magic number, dimensions): 0x0803 = unsigned bytes in 3 dimensions, 0x0801 in 1 (LeCun's format)
IDX_FILES = {
    "train-images-idx3-ubyte": (2051, (N_TRAIN, SIDE, SIDE)),
    "train-labels-idx1-ubyte": (2049, (N_TRAIN,)),
    "t10k-images-idx3-ubyte": (2051, (N_TEST, SIDE, SIDE)),
    "t10k-labels-idx1-ubyte": (2049, (N_TEST,)),
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_PACKAGE = "dataset-fashion-mnist"


def cache_dir() -> Path:
    """vitlab's cache folder for datasets: `vitlab.fileio.cache_root()`/datasets."""
    return cache_root() / "datasets"


def _cache_folder(source: Path | None = None) -> Path:
    """Where the uncompressed copies of `source`'s .gz files go (None: the download)."""
    if source is None:
        return cache_dir() / "fashion-mnist" / "download"
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "fashion-mnist" / key


class _Reader(FashionMNIST):
    """torchvision's FashionMNIST reading (and downloading into) one folder of idx files, whatever its
    layout, instead of ROOT/FashionMNIST/raw."""

    def __init__(self, folder: Path, *, train: bool, download: bool = False):
        self._folder = str(folder)
        super().__init__(str(folder), train=train, download=download)

    @property
    def raw_folder(self) -> str:
        return self._folder


def _idx_files(folder: Path) -> dict[str, Path] | None:
    """The four idx files under `folder` (uncompressed preferred, else .gz), in the first of its layouts
    that has any of them; None if none has any. Some but not all of them is an error."""
    for where in (folder, folder / "fashion-mnist", folder / "FashionMNIST" / "raw"):
        found = {}
        for name in IDX_FILES:
            for candidate in (where / name, where / f"{name}.gz"):
                if candidate.is_file():
                    found[name] = candidate
                    break
        if len(found) == len(IDX_FILES):
            return found
        if found:
            missing = ", ".join(n + "[.gz]" for n in IDX_FILES if n not in found)
            raise VitlabError(
                f"Fashion-MNIST in {where} is incomplete: {missing} missing; put all four idx files "
                f"there, or remove the folder"
            )
    return None


def _expected_size(name: str) -> int:
    magic, dims = IDX_FILES[name]
    header = 4 + 4 * len(dims)
    return header + math.prod(dims)


def _check_header(path: Path, name: str, head: bytes, size: int) -> None:
    """The magic number, the dimensions and the size of an (uncompressed) idx file, against Fashion-MNIST's."""
    magic, dims = IDX_FILES[name]
    n = len(dims)
    fix = "delete it and get a fresh copy"
    if len(head) < 4 + 4 * n:
        raise VitlabError(
            f"{path}: truncated idx file ({size} bytes; a Fashion-MNIST {name} has {_expected_size(name):,}); {fix}"
        )
    found_magic, *found_dims = struct.unpack(f">{1 + n}I", head[: 4 + 4 * n])
    if found_magic != magic:
        raise VitlabError(
            f"{path}: not a Fashion-MNIST {name} idx file (magic number {found_magic:#06x}, expected "
            f"{magic:#06x}); {fix}"
        )
    if tuple(found_dims) != dims:
        raise VitlabError(f"{path}: dimensions {tuple(found_dims)}, expected {dims} for Fashion-MNIST's {name}; {fix}")
    if size != _expected_size(name):
        what = "truncated" if size < _expected_size(name) else "too long"
        raise VitlabError(f"{path}: {what} idx file ({size:,} bytes of data, expected {_expected_size(name):,}); {fix}")


def _check_values(path: Path, name: str, data: bytes) -> None:
    """What a well-formed file can still get wrong: labels outside 0..9, images that are all one value."""
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(IDX_FILES[name][1]))
    fix = "these are not Fashion-MNIST's files; get a fresh copy"
    if "labels" in name:
        bad = np.flatnonzero(body >= len(CLASS_NAMES))
        if len(bad):
            raise VitlabError(
                f"{path}: label {body[bad[0]]} at item {bad[0]:,} ({len(bad):,} labels outside "
                f"0..{len(CLASS_NAMES) - 1}); {fix}"
            )
    elif body.min() == body.max():
        raise VitlabError(f"{path}: every pixel of every image is {body[0]}, so these are not photos; {fix}")


def _check_raw(path: Path, name: str) -> None:
    data = path.read_bytes()
    _check_header(path, name, data[:16], len(data))
    _check_values(path, name, data)


def _decompress(path: Path, name: str) -> bytes:
    """The checked contents of a .gz idx file."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise VitlabError(
            f"{path}: corrupt or truncated gzip file ({type(e).__name__}: {e}); delete it and get a fresh copy"
        ) from e
    _check_header(path, name, data[:16], len(data))
    _check_values(path, name, data)
    return data


def _usable(files: dict[str, Path], *, cache: Path) -> Path:
    """A folder of checked, uncompressed idx files for `files`: their own folder if they are all
    uncompressed there, else `cache` (the folder kept for their source), where the .gz ones are
    decompressed (once). Every file is checked before anything is written, so a broken one is refused
    and leaves the cache as it was."""
    contents = {n: _decompress(p, n) for n, p in files.items() if p.suffix == ".gz"}
    for n, p in files.items():
        if n not in contents:
            _check_raw(p, n)
    folders = {p.parent for p in files.values()}
    if not contents and len(folders) == 1:
        return folders.pop()
    target = cache
    for n, p in files.items():
        dest = target / n
        if dest.exists() and dest.resolve() == p.resolve():
            continue
        data = contents[n] if n in contents else p.read_bytes()
        if not (dest.is_file() and dest.stat().st_size == len(data) and dest.read_bytes() == data):
            write_bytes(dest, data)
    return target


def _download(folder: Path) -> None:
    """torchvision's download (and md5 check) of the four .gz files into `folder`, decompressed there."""
    for train in (True, False):
        _Reader(folder, train=train, download=True)


def locate(root: str | Path | None = None, *, download: bool = True) -> Path:
    """The folder of checked, uncompressed Fashion-MNIST idx files, found in the order of the module
    docstring (decompressing or downloading into the cache folder when needed)."""
    if root is not None:
        root_path = Path(root).expanduser()
        if not root_path.is_dir():
            raise VitlabError(
                f"root {root_path}: no such folder (expected a folder with Fashion-MNIST's four idx files)", arg="root"
            )
        files = _idx_files(root_path)
        if files is None:
            raise VitlabError(
                f"root {root_path}: no Fashion-MNIST files there (expected train-images-idx3-ubyte[.gz], "
                "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz], "
                "directly or in FashionMNIST/raw/)",
                arg="root",
            )
        return _usable(files, cache=_cache_folder(root_path))
    places = [Path(os.environ["VITLAB_DATA"]).expanduser()] if os.environ.get("VITLAB_DATA") else []
    places += [DEBIAN_DIR, _cache_folder()]
    for place in places:
        if place.is_dir():
            files = _idx_files(place)
            if files is not None:
                return _usable(files, cache=_cache_folder(place))
    where = ", ".join(str(p) for p in places)
    ways = (
        f"install Debian's package (apt-get install {DEBIAN_PACKAGE}), or run once with network access (it is "
        f"downloaded through torchvision into {_cache_folder()}), or pass root (--root DIR) with the four idx files"
    )
    if not download:
        raise VitlabError(f"Fashion-MNIST not found (looked in {where}); {ways}")
    target = _cache_folder()
    print(f"Fashion-MNIST not found in {where}; downloading it (30 MB) through torchvision into {target}", flush=True)
    try:
        _download(target)
    except (RuntimeError, URLError, OSError) as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise VitlabError(
            f"Fashion-MNIST not found (looked in {where}) and the download failed ({reason}); {ways}"
        ) from e
    return _usable(_idx_files(target) or {}, cache=target)


def load_fashion_mnist(root: str | Path | None = None, *, train: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The training (60,000) or test (10,000) split: images (N, 1, 28, 28) uint8 and labels (N,) int64."""
    reader = _Reader(locate(root), train=train)
    images, labels = reader.data.unsqueeze(1).contiguous(), reader.targets  # (N, 28, 28) -> (N, 1, 28, 28)
    split, expected = ("train", N_TRAIN) if train else ("t10k", N_TEST)
    if len(images) != expected or len(labels) != expected:  # e.g. torchvision's legacy processed/*.pt files
        raise VitlabError(
            f"{reader.raw_folder}: the {split} split has {len(images):,} images and {len(labels):,} labels; "
            f"Fashion-MNIST's has {expected:,} of each; delete the folder's files and get a fresh copy"
        )
    if int(labels.max()) >= len(CLASS_NAMES) or int(labels.min()) < 0:
        raise VitlabError(
            f"{reader.raw_folder}: labels outside 0..9 in the {'train' if train else 't10k'} labels "
            "file; delete it and get a fresh copy"
        )
    return images, labels


def nested_subset(
    n_total: int, n: int | None, *, seed: int, arg: str = "train_size", what: str = "training images"
) -> torch.Tensor:
    """Sorted indices of the first `n` of one permutation seeded by `seed`: for one seed, a smaller subset
    is always inside a larger one (the data-scale experiments compare nested training sets). None: all."""
    if n is None:
        return torch.arange(n_total)
    check_range(arg, n, low=1, high=n_total, integer=True, hint=f" (there are {n_total:,} {what})")
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(seed))[:n].sort().values


def write_fashion_mnist_folder(
    out, *, root: str | Path | None = None, train_size: int | None = None, seed: int = 0
) -> dict:
    """Write Fashion-MNIST as an image folder, `out/train/<class>/<index>.png` (the training split, or its
    nested subset of `train_size` images) and `out/val/<class>/<index>.png` (the 10,000 test images).

    `out` is checked first (vitlab.fileio.whole_folder: new, empty, or this function's earlier output, which is
    replaced whole; a place that can be written); the folder is built under a temporary name and moved into
    place, so `out` is either complete or as it was, and a write that fails (a full disk) is one VitlabError
    naming it."""
    check_seed(seed)
    keep = nested_subset(N_TRAIN, train_size, seed=seed)  # checked before anything is read or written
    with whole_folder(out, kind="fashion-mnist") as tmp:  # new, empty, or its own earlier output: replaced whole
        splits = {"train": load_fashion_mnist(root, train=True), "val": load_fashion_mnist(root, train=False)}
        counts = {}
        for part, (x, y) in splits.items():
            idx = keep if part == "train" else torch.arange(len(y))
            for name in FOLDER_NAMES:
                (tmp / part / name).mkdir(parents=True)
            pixels = x[:, 0].numpy()
            for i in idx.tolist():
                Image.fromarray(pixels[i], "L").save(tmp / part / FOLDER_NAMES[int(y[i])] / f"{i:05d}.png")
            counts[part] = len(idx)
    return counts


__all__ = [
    "CLASS_NAMES",
    "FOLDER_NAMES",
    "N_TRAIN",
    "N_TEST",
    "DEBIAN_DIR",
    "cache_dir",
    "locate",
    "load_fashion_mnist",
    "nested_subset",
    "write_fashion_mnist_folder",
]
