"""Where a training run's images come from, and the loaders it trains on.

    load_scan(data="DIR")          your image folder (vitlab.data.folder.scan_folder)
    load_scan(dataset="digits")    a bundled dataset: scikit-learn's digits (real, 10 classes) or
    load_scan(dataset="x")         dataset X of the mini experiment (synthetic, 2 classes)
    make_loaders(scan, model, recipe, dist=...)   (train, val) loaders with the model's preprocessing

Every source ends up as the same `FolderScan` (classes, train and val samples, decoded images), so a
run treats a folder and a bundled dataset alike.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from vitlab.data import digits, synthetic
from vitlab.data.folder import FolderScan, ImageDataset, in_memory_scan, scan_folder
from vitlab.data.split import DEFAULT_VAL_SPLIT, stratified_split
from vitlab.data.transforms import model_transforms
from vitlab.errors import VitlabError

# name -> class names; the bundled datasets need no download
DATASETS = {"digits": digits.CLASS_NAMES, "x": synthetic.CLASS_NAMES}


def dataset_classes(dataset: str) -> list[str]:
    if dataset not in DATASETS:
        raise VitlabError(f"dataset must be one of {', '.join(DATASETS)}; found {dataset!r}", arg="dataset")
    return list(DATASETS[dataset])


def load_scan(*, data: str | None = None, dataset: str | None = None, val_split: float | None = None, seed: int = 0,
              img_size: tuple[int, int] = (32, 32), progress: bool = False) -> FolderScan:
    """A FolderScan of an image folder (`data`) or a bundled dataset (`dataset`), split with `seed`.

    A bundled dataset is rendered at `img_size` (at least 32 px): the model's input size."""
    if (data is None) == (dataset is None):
        raise VitlabError(f"give exactly one of data (an image folder) or dataset ({' | '.join(DATASETS)})", arg="data")
    if data is not None:
        return scan_folder(data, val_split=val_split, seed=seed, progress=progress)
    names = dataset_classes(dataset)
    if dataset == "digits":
        x, y = digits.load_digits(max(32, img_size[0]), channels=3, normalize=False)
        tr, va = stratified_split(y, DEFAULT_VAL_SPLIT if val_split is None else val_split, seed=seed)
        return in_memory_scan("digits", names, (x[tr], y[tr]), (x[va], y[va]))
    (xt, yt), (xv, yv) = synthetic.dataset_x_splits(seed=seed, normalize=False)
    return in_memory_scan("dataset X", names, (xt, yt), (xv, yv))


def make_loaders(scan: FolderScan, model, recipe, *, dist, bundled: bool = False,
                 workers: int | None = None) -> tuple[DataLoader, DataLoader]:
    """(train loader, val loader) for `scan`, with `model`'s eval preprocessing and `recipe`'s augmentation.

    A DistributedSampler in every case (with one process it is a seeded shuffle), so one process with
    batch B x N sees exactly the batches N processes with batch B see together. Flips default to on
    for image folders and off for the bundled datasets (a mirrored digit or dataset X image is
    another class). MixUp/CutMix need full batches (a partner for each image), so they drop the last.
    """
    hflip = recipe.hflip if recipe.hflip is not None else not bundled
    train_tf, eval_tf = model_transforms(model, augment=recipe.augment, scale=(recipe.crop_scale, 1.0), hflip=hflip,
                                         color_jitter=recipe.color_jitter, auto_augment=recipe.auto_augment,
                                         re_prob=recipe.reprob)
    train_ds = ImageDataset(scan.train, train_tf, images=scan.images)
    val_ds = ImageDataset(scan.val, eval_tf, images=scan.images)
    sampler = DistributedSampler(train_ds, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=recipe.seed)
    cuda = dist.device.type == "cuda"
    if workers is not None and workers < 0:
        raise VitlabError(f"workers must be 0 or more; found {workers}", arg="workers")
    workers = workers if workers is not None else (min(8, torch.get_num_threads()) if cuda else 0)
    train_loader = DataLoader(train_ds, batch_size=recipe.batch_size, sampler=sampler, drop_last=recipe.mixes,
                              num_workers=workers, pin_memory=cuda)
    val_loader = DataLoader(val_ds, batch_size=2 * recipe.batch_size, shuffle=False, num_workers=workers, pin_memory=cuda)
    if len(train_loader) == 0:
        raise VitlabError(f"batch_size {recipe.batch_size} x {dist.world_size} process(es) is larger than the "
                          f"{len(scan.train)} training images, and MixUp/CutMix drop incomplete batches; "
                          "use a smaller batch size", arg="batch_size")
    return train_loader, val_loader


__all__ = ["DATASETS", "dataset_classes", "load_scan", "make_loaders"]
