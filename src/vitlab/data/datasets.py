"""Where a training run's images come from, and the loaders it trains on.

    load_data(data="DIR")                    your image folder (vitlab.data.folder.scan_folder)
    load_data(dataset="fashion-mnist")       a bundled dataset (BUNDLED): Fashion-MNIST (real photos, 10 classes,
    load_data(dataset="digits" | "x")        60,000 / 10,000), scikit-learn's digits, dataset X of the mini experiment
    make_loaders(data, model, recipe, dist=...)   (train, val) loaders with the model's preprocessing

Every source ends up as the same `RunData`: a `FolderScan` (the classes, which image is in which split:
what the report counts and the resume fingerprint hashes) and, for data that fits in memory, the images
decoded once into uint8 tensors (vitlab.data.memory). The bundled datasets are always in memory; an
image folder is when its decoded images fit the scan's cache. In memory, an epoch is batches gathered
from the tensors and augmented as batches on the training device; a larger folder is read from disk
every epoch, each image decoded and augmented on its own (PIL, DataLoader worker processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.transforms.v2 import functional as TF

from vitlab.data import digits, fashion_mnist, synthetic
from vitlab.data.folder import FolderScan, ImageDataset, scan_folder
from vitlab.data.memory import BatchTransform, ImageTensors, MemoryLoader
from vitlab.data.preprocess import eval_geometry, eval_resize_crop
from vitlab.data.split import stratified_split
from vitlab.data.transforms import model_transforms
from vitlab.errors import VitlabError, check_range
from vitlab.options import DEFAULT_VAL_SPLIT


@dataclass(frozen=True)
class Bundled:
    """A dataset that comes with vitlab (or with the system): what a run needs to know before loading it."""

    classes: tuple[str, ...]
    channels: int  # 1: grey photos; a model trained from scratch on them gets one input channel
    img_size: int | None  # the images' own side; None: rendered at the model's size
    n_train: int | None  # training images when fixed; None when it depends on val_split
    own_val: bool  # a validation (test) split of its own: val_split does not apply
    flips: bool  # a mirror image is the same class: random flips on by default
    about: str


BUNDLED: dict[str, Bundled] = {
    "fashion-mnist": Bundled(
        fashion_mnist.CLASS_NAMES,
        1,
        28,
        fashion_mnist.N_TRAIN,
        True,
        True,
        "Fashion-MNIST: 70,000 grey 28x28 photos of clothing, 10 classes, the standard 60,000 / "
        "10,000 split (validation = the 10,000 test images)",
    ),
    "digits": Bundled(
        digits.CLASS_NAMES,
        3,
        None,
        None,
        False,
        False,
        "scikit-learn's 1,797 handwritten 8x8 digits, upsampled; 10 classes",
    ),
    "x": Bundled(
        synthetic.CLASS_NAMES,
        3,
        32,
        2000,
        True,
        False,
        "dataset X of the mini experiment: 2,000 / 500 synthetic 32x32 images, 2 classes",
    ),
}


def bundled(dataset: str) -> Bundled:
    if dataset not in BUNDLED:
        raise VitlabError(f"dataset must be one of {', '.join(BUNDLED)}; found {dataset!r}", arg="dataset")
    return BUNDLED[dataset]


@dataclass
class RunData:
    """A run's data: the scan (classes, which sample is in which split) and, when decoded in memory, the
    images of each split as uint8 tensors (for an image folder: built by `make_loaders` from the scan's
    decoded images, at the model's size)."""

    scan: FolderScan
    train: ImageTensors | None = None
    val: ImageTensors | None = None
    dataset: str | None = None  # the bundled dataset's name

    @property
    def bundled(self) -> bool:
        return self.dataset is not None

    @property
    def flips(self) -> bool:
        """Whether a mirror image keeps its class (the default of the random flips)."""
        return BUNDLED[self.dataset].flips if self.bundled else True


def load_data(
    *,
    data: str | None = None,
    dataset: str | None = None,
    root: str | None = None,
    train_size: int | None = None,
    val_split: float | None = None,
    seed: int = 0,
    img_size: tuple[int, int] = (32, 32),
    progress: bool = False,
) -> RunData:
    """An image folder (`data`) or a bundled dataset (`dataset`), split with `seed`.

    root: where Fashion-MNIST's files are (vitlab.data.fashion_mnist.locate searches otherwise).
    train_size: train on the first `train_size` images of one permutation of the training split seeded by
        `seed` (so for one seed a smaller training set is inside a larger one); None: all of them.
    img_size: the model's input size, at which the digits are rendered (at least 32 px).
    """
    if (data is None) == (dataset is None):
        raise VitlabError(f"give exactly one of data (an image folder) or dataset ({' | '.join(BUNDLED)})", arg="data")
    if root is not None and dataset != "fashion-mnist":
        raise VitlabError(f"root {root}: only the fashion-mnist dataset is read from files; drop root", arg="root")
    if data is not None:
        scan = scan_folder(data, val_split=val_split, seed=seed, progress=progress)
        if train_size is not None:
            keep = fashion_mnist.nested_subset(
                len(scan.train), train_size, seed=seed, what=f"training images in {scan.root}"
            )
            scan.train = [scan.train[i] for i in keep.tolist()]
        return RunData(scan)
    info = bundled(dataset)
    if val_split is not None and info.own_val:
        raise VitlabError(
            f"val_split {val_split:g}: the {dataset} dataset has its own validation split; drop val_split",
            arg="val_split",
        )
    if train_size is not None and info.n_train is not None:  # checked before anything is read
        check_range(
            "train_size",
            train_size,
            low=1,
            high=info.n_train,
            integer=True,
            hint=f" (there are {info.n_train:,} training images in {dataset})",
        )
    if dataset == "fashion-mnist":
        train = ImageTensors(*fashion_mnist.load_fashion_mnist(root, train=True))
        val = ImageTensors(*fashion_mnist.load_fashion_mnist(root, train=False))
    elif dataset == "digits":
        x, y = digits.load_digits(max(32, img_size[0]), channels=3, normalize=False)
        tr, va = stratified_split(y, DEFAULT_VAL_SPLIT if val_split is None else val_split, seed=seed)
        train, val = ImageTensors.from_float(x[tr], y[tr]), ImageTensors.from_float(x[va], y[va])
    else:
        (xt, yt), (xv, yv) = synthetic.dataset_x_splits(seed=seed, normalize=False)
        train, val = ImageTensors.from_float(xt, yt), ImageTensors.from_float(xv, yv)
    keep = fashion_mnist.nested_subset(len(train), train_size, seed=seed, what=f"training images in {dataset}")
    train = train.subset(keep)
    scan = FolderScan(
        Path(dataset),
        "in-memory",
        list(info.classes),
        [(f"{dataset}:train/{i}", label) for i, label in zip(keep.tolist(), train.labels.tolist())],
        [(f"{dataset}:val/{i}", label) for i, label in enumerate(val.labels.tolist())],
    )
    return RunData(scan, train, val, dataset)


def make_loaders(
    data: RunData, model, recipe, *, dist, workers: int | None = None, in_memory: bool | None = None
) -> tuple:
    """(train loader, val loader) for `data`, with `model`'s eval preprocessing and `recipe`'s augmentation.

    In memory (the bundled datasets; a folder whose decoded images the scan kept; `in_memory=False` reads
    a folder from disk every epoch instead): `MemoryLoader`s. From disk: DataLoaders over the files, with
    `workers` processes (default 0 on CPU, up to 8 on GPU). Either way the order is a DistributedSampler's,
    so one process with batch B x N sees exactly the batches N processes with batch B see together.
    Flips default to on, except for the bundled datasets where a mirror image is another class (a digit,
    dataset X). MixUp/CutMix need full batches (a partner for each image), so they drop the last.
    """
    check_range("workers", workers, low=0, integer=True, optional=True)
    recipe = recipe.resolve(img_size=min(model.cfg.img_size), flips=data.flips)  # the auto fields (vitlab.train.recipe)
    hflip = recipe.hflip
    scan = data.scan
    memory = data.train is not None or (in_memory is not False and _decoded(scan))
    if in_memory and not memory:
        raise VitlabError(
            f"data {scan.root}: its decoded images do not fit the scan's memory budget; read it from disk", arg="data"
        )
    if memory:
        train_loader, val_loader = _memory_loaders(data, model, recipe, dist=dist, hflip=hflip)
    else:
        train_loader, val_loader = _disk_loaders(scan, model, recipe, dist=dist, hflip=hflip, workers=workers)
    if len(train_loader) == 0:
        raise VitlabError(
            f"batch_size {recipe.batch_size} x {dist.world_size} process(es) is larger than the "
            f"{len(scan.train)} training images, and MixUp/CutMix drop incomplete batches; "
            "use a smaller batch size",
            arg="batch_size",
        )
    return train_loader, val_loader


def _decoded(scan: FolderScan) -> bool:
    return bool(scan.images) and all(p in scan.images for p, _ in scan.train + scan.val)


def _memory_loaders(data: RunData, model, recipe, *, dist, hflip: bool) -> tuple[MemoryLoader, MemoryLoader]:
    pcfg = model.pretrained_cfg
    size = tuple(model.cfg.img_size)
    C = model.cfg.in_chans
    if data.train is not None:  # the eval resize and crop, once, on the tensors (nothing if at the model's size)
        val = _resized(data.val, pcfg, size)
        train = data.train if recipe.augment else _resized(data.train, pcfg, size)
    else:
        train, val = _folder_tensors(data.scan, pcfg, size, recipe.augment)
    norm = dict(size=size, mean=pcfg.mean, std=pcfg.std, channels=C)
    train_tf = BatchTransform(
        **norm,
        augment=recipe.augment,
        source_size=train.size,
        crop_scale=recipe.crop_scale,
        hflip=hflip,
        color_jitter=recipe.color_jitter,
        auto_augment=recipe.auto_augment,
        re_prob=recipe.reprob,
        interpolation=pcfg.interpolation,
    )
    train_loader = MemoryLoader(
        train,
        train_tf,
        batch_size=recipe.batch_size,
        shuffle=True,
        drop_last=recipe.mixes,
        seed=recipe.seed,
        num_replicas=dist.world_size,
        rank=dist.rank,
        device=dist.device,
    )
    val_loader = MemoryLoader(val, BatchTransform(**norm), batch_size=2 * recipe.batch_size, device=dist.device)
    return train_loader, val_loader


def _resized(t: ImageTensors, pcfg, size: tuple[int, int]) -> ImageTensors:
    """The model's eval resize and centre crop applied once to a whole split (uint8 in, uint8 out)."""
    out = eval_resize_crop(pcfg, size)(t.images)
    return t if out.shape == t.images.shape and torch.equal(out, t.images) else ImageTensors(out, t.labels)


def _folder_tensors(scan: FolderScan, pcfg, size: tuple[int, int], augment: bool) -> tuple[ImageTensors, ImageTensors]:
    """A scanned folder's decoded images as uint8 tensors: validation images (and training images without
    augmentation) through the model's eval preprocessing up to the normalisation, exactly as `vitlab predict`
    sees them; training images with augmentation as they are, when they all have one size, else resized
    once (short side size / crop_pct, centre square) for the random crops to start from."""
    geometry = eval_geometry(pcfg, size)

    def stack(samples, fn) -> ImageTensors:
        return ImageTensors(
            torch.stack([fn(scan.images[p]) for p, _ in samples]),
            torch.tensor([label for _, label in samples], dtype=torch.long),
        )

    val = stack(scan.val, lambda im: geometry(im).as_subclass(torch.Tensor))
    if not augment:
        return stack(scan.train, lambda im: geometry(im).as_subclass(torch.Tensor)), val
    sizes = {scan.images[p].size for p, _ in scan.train}
    if len(sizes) == 1:
        return stack(scan.train, _rgb_tensor), val
    side = max(int(s / (pcfg.crop_pct or 0.875)) for s in size)
    square = eval_resize_crop(pcfg.replace(crop_pct=1.0, crop_mode="center"), (side, side))
    return stack(scan.train, lambda im: square(_rgb_tensor(im))), val


def _rgb_tensor(im: Image.Image) -> torch.Tensor:
    return TF.pil_to_tensor(im)  # (3, H, W) uint8


def _disk_loaders(
    scan: FolderScan, model, recipe, *, dist, hflip: bool, workers: int | None
) -> tuple[DataLoader, DataLoader]:
    """Images decoded and augmented one by one every epoch (PIL, vitlab.data.transforms), in `workers` processes."""
    train_tf, eval_tf = model_transforms(
        model,
        augment=recipe.augment,
        scale=(recipe.crop_scale, 1.0),
        hflip=hflip,
        color_jitter=recipe.color_jitter,
        auto_augment=recipe.auto_augment,
        re_prob=recipe.reprob,
    )
    train_ds = ImageDataset(scan.train, train_tf, images=scan.images)
    val_ds = ImageDataset(scan.val, eval_tf, images=scan.images)
    sampler = DistributedSampler(train_ds, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=recipe.seed)
    cuda = dist.device.type == "cuda"
    workers = workers if workers is not None else (min(8, torch.get_num_threads()) if cuda else 0)
    train_loader = DataLoader(
        train_ds,
        batch_size=recipe.batch_size,
        sampler=sampler,
        drop_last=recipe.mixes,
        num_workers=workers,
        pin_memory=cuda,
    )
    val_loader = DataLoader(
        val_ds, batch_size=2 * recipe.batch_size, shuffle=False, num_workers=workers, pin_memory=cuda
    )
    return train_loader, val_loader


__all__ = ["BUNDLED", "Bundled", "RunData", "bundled", "load_data", "make_loaders"]
