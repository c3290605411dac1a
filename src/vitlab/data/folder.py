"""Your own images: an ImageFolder scan, a train/val split, and a Dataset that applies transforms.

Two layouts are accepted (the torchvision/timm convention, one sub-folder per class):

    DIR/train/<class>/*.jpg   DIR/val/<class>/*.jpg     (a split you made)
    DIR/<class>/*.jpg                                   (one folder; --val-split carves a seeded,
                                                         stratified validation set out of it)

One scan opens every file once (with `vitlab.data.preprocess.open_image`, the same decoder inference
uses), so an unreadable file is found here, skipped, and listed in a warning, instead of crashing
epoch 7. Folders that cannot train a classifier -- empty, one class, a class with no readable image --
are a VitlabError naming the folder and the fix. Small folders are kept decoded in memory, so an
epoch costs transforms, not JPEG decoding.

Symbolic links are followed, but never round a loop (a folder linking back to one that encloses it),
and each real file counts once: the same file (by device and inode, so links of either kind) twice in
one class is counted once, and in two classes or in both train/ and val/ is refused -- its label would
be ambiguous, or validation would score images the model trained on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from vitlab.data.preprocess import open_image
from vitlab.data.split import stratified_split
from vitlab.errors import VitlabError
from vitlab.options import DEFAULT_VAL_SPLIT, check_seed

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm")


@dataclass
class FolderScan:
    """What one scan of an image folder found. Paths are absolute; labels index `classes`."""

    root: Path
    layout: str  # "train/val" or "single"
    classes: list[str]
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    val_split: float | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    images: dict[str, Image.Image] = field(default_factory=dict)  # decoded RGB images, when small enough
    given: str = ""  # the folder as the user named it (relative, ~), for messages

    def counts(self, part: str) -> list[int]:
        samples = self.train if part == "train" else self.val
        out = [0] * len(self.classes)
        for _, label in samples:
            out[label] += 1
        return out

    def report(self) -> str:
        """The images-per-class table the scan prints."""
        tr, va = self.counts("train"), self.counts("val")
        how = {"train/val": "train/ and val/", "in-memory": "in memory"}.get(self.layout)
        how = how or f"one folder, seeded stratified val split {self.val_split:g}"
        width = max(5, *(len(c) for c in self.classes))
        lines = [
            f"{self.given or self.root}: {len(self.classes)} classes, {len(self.train)} train / {len(self.val)} val "
            f"images ({how})",
            f"  {'class':<{width}}  {'train':>6}  {'val':>5}",
        ]
        lines += [f"  {c:<{width}}  {t:>6}  {v:>5}" for c, t, v in zip(self.classes, tr, va)]
        return "\n".join(lines)

    def warning(self) -> str | None:
        """One warning listing every skipped file and why, or None."""
        if not self.skipped:
            return None
        lines = [f"warning: skipped {len(self.skipped)} file(s) in {self.root}:"]
        lines += [f"  {path}: {why}" for path, why in self.skipped]
        return "\n".join(lines)


def scan_folder(
    root: str | Path, *, val_split: float | None = None, seed: int = 0, cache_mb: float = 512.0, progress: bool = False
) -> FolderScan:
    """Scan an image folder (either layout), check every image opens, and split it if needed.

    `val_split` is the validation fraction for the one-folder layout (default 0.2); giving it for a
    folder that already has train/ and val/ is an error. Decoded images are kept in memory while
    their total size (RGB bytes) stays under `cache_mb`.
    """
    # Absolute, but not resolved: a folder reached through a symlink keeps its name, and every file's
    # path is `root` joined with its place in the folder (the run's data fingerprint relies on it).
    check_seed(seed)
    given, root = str(root), Path(os.path.abspath(Path(root).expanduser()))
    if not root.exists():
        raise VitlabError(f"data {root}: no such folder", arg="data")
    if not root.is_dir():
        raise VitlabError(
            f"data {root}: is a file; expected a folder of class sub-folders (DIR/<class>/*.jpg)", arg="data"
        )
    skipped: list[tuple[str, str]] = []
    has_split = (root / "train").is_dir()
    if has_split:
        if val_split is not None:
            raise VitlabError(
                f"val_split {val_split:g}: {root} already has train/ and val/ folders; drop val_split, "
                "or point data at a folder with one sub-folder per class",
                arg="val_split",
            )
        if not (root / "val").is_dir():
            raise VitlabError(
                f"data {root}: found {root / 'train'} but no {root / 'val'}; add a val/ folder with the same "
                "class sub-folders, or move the class folders up to use val_split",
                arg="data",
            )
        _stray_entries(root, {"train", "val"}, skipped)
        classes = _class_dirs(root / "train", skipped)
        val_classes = _class_dirs(root / "val", skipped)
        unknown = sorted(set(val_classes) - set(classes))
        if unknown:
            raise VitlabError(
                f"data {root}: val/ has class folder(s) {', '.join(unknown)} that train/ lacks; "
                "every validation class needs training images (make the class names match)",
                arg="data",
            )
        index = {c: i for i, c in enumerate(classes)}
        train_files = _class_files(root / "train", classes, skipped)
        val_files = _class_files(root / "val", val_classes, skipped)
        layout = "train/val"
    else:
        classes = _class_dirs(root, skipped)
        index = {c: i for i, c in enumerate(classes)}
        train_files = _class_files(root, classes, skipped)
        val_files = {}
        layout = "single"
    _count_each_file_once(root, train_files, val_files, skipped)

    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "none"
        where = root / "train" if has_split else root
        raise VitlabError(
            f"data {where}: a classifier needs at least 2 class sub-folders; found {found}. "
            f"Expected {where}/<class>/<image files>, one sub-folder per class",
            arg="data",
        )

    good, images = _open_every_file(root, classes, train_files, val_files, skipped, cache_mb, progress)
    _refuse_empty_classes(root, layout, classes, val_files, good, skipped)
    train = [(p, index[c]) for c in classes for p in good["train"][c]]
    if layout == "train/val":
        val = [(p, index[c]) for c in classes for p in good["val"][c]]
        if not val:
            raise VitlabError(
                f"data {root}: val/ has no readable image; put images in {root / 'val'}/<class>/", arg="data"
            )
        return FolderScan(root, layout, classes, train, val, None, skipped, images, given)

    frac = DEFAULT_VAL_SPLIT if val_split is None else val_split
    labels = torch.tensor([label for _, label in train])
    tr_idx, va_idx = stratified_split(
        labels, frac, seed=seed, names=classes
    )  # refuses a class left with no training image
    return FolderScan(
        root,
        layout,
        classes,
        [train[i] for i in tr_idx.tolist()],
        [train[i] for i in va_idx.tolist()],
        frac,
        skipped,
        images,
        given,
    )


def _open_every_file(
    root: Path, classes: list[str], train_files: dict, val_files: dict, skipped: list, cache_mb: float, progress: bool
) -> tuple[dict[str, dict[str, list[str]]], dict[str, Image.Image]]:
    """Open every file once: ({"train"|"val": {class: readable paths}}, the decoded images kept while their RGB bytes
    stay under `cache_mb`); an unreadable file is added to `skipped` with why."""
    images: dict[str, Image.Image] = {}
    budget = cache_mb * 2**20
    all_files = [
        (p, c, part)
        for part, files in (("train", train_files), ("val", val_files))
        for c, paths in files.items()
        for p in paths
    ]
    good: dict[str, dict[str, list[str]]] = {"train": {c: [] for c in classes}, "val": {c: [] for c in classes}}
    for path, c, part in tqdm(all_files, desc=f"scan {root.name}", leave=False, disable=not progress):
        try:
            im = open_image(path)
        except VitlabError as e:
            skipped.append((path, str(e).removeprefix(f"{path}: ")))
            continue
        good[part][c].append(path)
        if budget > 0 and im.width * im.height * 3 <= budget:
            images[path] = im
            budget -= im.width * im.height * 3
        else:
            budget = 0  # past the budget: cache nothing more, and free what we have (all or nothing)
            images.clear()
    return good, images


def _refuse_empty_classes(root: Path, layout: str, classes: list[str], val_files: dict, good: dict, skipped: list):
    """A class folder with no readable image is an error that names it (and what was skipped there)."""
    for part in ("train",) if layout == "single" else ("train", "val"):
        base = root / part if layout == "train/val" else root
        dirs = classes if part == "train" else val_files.keys()
        empty = [c for c in dirs if not good[part][c]]
        if empty:
            bad = [f"{base / c}" for c in empty]
            inside = [f"{Path(p).name}: {why}" for p, why in skipped if any(Path(p).is_relative_to(b) for b in bad)]
            shown = "; ".join(inside[:3]) + (f"; and {len(inside) - 3} more" if len(inside) > 3 else "")
            raise VitlabError(
                f"class folder(s) with no readable image: {', '.join(bad)}; add images (.jpg, .png, ...) "
                "or remove the folder" + (f" (skipped there: {shown})" if inside else "")
            )


def _is_hidden(name: str) -> bool:
    return name.startswith(".") or name.startswith("__")  # .DS_Store, .ipynb_checkpoints, __MACOSX


def _stray_entries(root: Path, expected: set[str], skipped: list) -> None:
    for entry in sorted(root.iterdir()):
        if entry.name not in expected and not _is_hidden(entry.name):
            kind = "folder" if entry.is_dir() else "file"
            skipped.append((str(entry), f"stray {kind} next to train/ and val/ (ignored)"))


def _class_dirs(folder: Path, skipped: list) -> list[str]:
    """Sorted class folder names; stray files at the class level are listed, not classes."""
    classes, loose_images = [], 0
    for entry in sorted(folder.iterdir()):
        if _is_hidden(entry.name):
            continue
        if entry.is_dir():
            classes.append(entry.name)
        else:
            is_image = entry.suffix.lower() in IMAGE_EXTENSIONS
            loose_images += is_image
            what = "image file" if is_image else "file"
            skipped.append((str(entry), f"stray {what} at the class level (not inside a class folder; ignored)"))
    if not classes and loose_images:
        raise VitlabError(
            f"data {folder}: found {loose_images} image file(s) directly in the folder but no class sub-folders; "
            f"expected {folder}/<class>/<image files>, one sub-folder per class",
            arg="data",
        )
    if not classes:
        raise VitlabError(
            f"data {folder}: the folder is empty (no class sub-folders); "
            f"expected {folder}/<class>/<image files>, one sub-folder per class",
            arg="data",
        )
    return classes


def _class_files(folder: Path, classes, skipped: list) -> dict[str, list[str]]:
    """Image files under each class folder (recursively, sorted); other files are listed as skipped.
    Folder links are followed unless they lead back to a folder this walk has been through (a loop)."""
    out: dict[str, list[str]] = {}
    for c in classes:
        files = []
        walked: set[str] = set()  # real paths of the folders walked in this class
        for dirpath, dirnames, filenames in os.walk(folder / c, followlinks=True):
            here = os.path.realpath(dirpath)
            walked.add(here)
            keep = []
            for d in sorted(d for d in dirnames if not _is_hidden(d)):
                real = os.path.realpath(os.path.join(dirpath, d))
                if real in walked or here == real or here.startswith(real.rstrip(os.sep) + os.sep):
                    skipped.append(
                        (
                            os.path.join(os.path.abspath(dirpath), d),
                            f"a link back to {real}, which encloses it or was already scanned (not followed)",
                        )
                    )
                else:
                    keep.append(d)
            dirnames[:] = keep
            for name in sorted(filenames):
                if _is_hidden(name):
                    continue
                path = os.path.join(os.path.abspath(dirpath), name)
                if name.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(path)
                else:
                    skipped.append(
                        (
                            path,
                            f"not an image file (extension {Path(name).suffix or 'none'}; "
                            f"expected one of {', '.join(IMAGE_EXTENSIONS)})",
                        )
                    )
        out[c] = files
    return out


def _count_each_file_once(root: Path, train: dict[str, list[str]], val: dict[str, list[str]], skipped: list) -> None:
    """Drop the second sighting of a file in the same class and split (in place, listed as skipped);
    refuse a file in two classes, or in both train/ and val/."""
    seen: dict[tuple[int, int], tuple[str, str, str]] = {}  # (device, inode) -> (split, class, path)
    two_classes, both_splits = [], []
    for part, files in (("train", train), ("val", val)):
        for c, paths in files.items():
            kept = []
            for path in paths:
                try:
                    st = os.stat(path)
                except OSError:  # a dangling link: open_image names the problem when the scan opens it
                    kept.append(path)
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen[key] = (part, c, path)
                    kept.append(path)
                elif seen[key][:2] == (part, c):
                    skipped.append((path, f"the same file as {seen[key][2]} (counted once)"))
                elif seen[key][0] == part:
                    two_classes.append(f"{os.path.realpath(path)} (in {seen[key][1]} and {c})")
                else:
                    both_splits.append(f"{os.path.realpath(path)} (train/{seen[key][1]} and val/{c})")
            files[c] = kept

    def listing(items: list[str]) -> str:
        return "; ".join(items[:3]) + (f"; and {len(items) - 3} more" if len(items) > 3 else "")

    if two_classes:
        raise VitlabError(
            f"data {root}: {len(two_classes)} file(s) are in two class folders (one file reached "
            f"through a link): {listing(two_classes)}; a file needs one label, so keep it "
            "in one class",
            arg="data",
        )
    if both_splits:
        raise VitlabError(
            f"data {root}: {len(both_splits)} file(s) are in both train/ and val/ (one file reached through a link): "
            f"{listing(both_splits)}; validation would score images the model trained on, so keep each "
            "in one of them",
            arg="data",
        )


def image_paths(items: list[str | Path]) -> list[Path]:
    """Files as given, folders expanded to their image files (sorted, not recursive)."""
    out = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        elif path.is_file():
            out.append(path)
        else:
            raise VitlabError(f"image {item}: no such file or folder", arg="images")
    if not out:
        raise VitlabError(
            f"no image files ({', '.join(IMAGE_EXTENSIONS)}) found in {', '.join(map(str, items))}", arg="images"
        )
    return out


class ImageDataset(Dataset):
    """(image, label) pairs: opens each file (or takes its cached decoded image) and applies `transform`.

    `images` maps a path to an already decoded RGB PIL image; a sample's "path" may also be a name
    with its image only in `images` (in-memory datasets such as digits).
    """

    def __init__(self, samples: list[tuple[str, int]], transform, *, images: dict[str, Image.Image] | None = None):
        self.samples = samples
        self.transform = transform
        self.images = images or {}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        im = self.images.get(path)
        if im is None:
            im = open_image(path)
        return self.transform(im), label


__all__ = ["FolderScan", "ImageDataset", "scan_folder", "image_paths", "IMAGE_EXTENSIONS"]
