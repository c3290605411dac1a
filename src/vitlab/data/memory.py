"""Data that fits in memory, decoded once and trained on in batches: `ImageTensors`, `BatchTransform`,
`MemoryLoader`.

A dataset such as Fashion-MNIST (47 MB of pixels), the digits, dataset X or a small image folder is
decoded once into a uint8 tensor (N, C, H, W). An epoch then costs no decoding and no PIL: each batch
is gathered from that tensor on the training device, augmented as a batch, and normalised there.

The augmentation is per image, as in timm's pipeline (random resized crop -> flip -> colour jitter ->
RandAugment/TrivialAugment -> normalise -> random erasing), but drawn and applied
for the whole batch at once where torchvision has the batched operation:

    random resized crop   torchvision's box sampling (area scale, log-uniform aspect ratio, 10 tries,
                          then the central crop), the boxes resampled in one `torchvision.ops.roi_align`
                          call (bilinear, averaged over the box where it shrinks the image)
    horizontal flip       one `torch.where` over the batch
    random erasing        torchvision's box sampling, one mask over the batch (value 0 = the mean colour)
    colour jitter,        torchvision.transforms.v2 on each uint8 image: they have no batched form
    RandAugment, Trivial

Every random number of an epoch is drawn when it starts, for every image of the dataset, from a
generator seeded by (seed, epoch); a batch takes the rows of its images. So an image's augmentation
depends on the seed, the epoch and the image alone: not on the batch size, the number of processes, the
order of batches, or a resume. The order of the batches is that of torch's DistributedSampler (one
seeded permutation per epoch, each process its share), as for data read from disk.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data.distributed import DistributedSampler
from torchvision.ops import roi_align
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from vitlab.data.preprocess import INTERPOLATIONS
from vitlab.errors import VitlabError, check_range
from vitlab.options import AUTO_AUGMENTS


@dataclass
class ImageTensors:
    """One split, decoded: images (N, C, H, W) uint8 and labels (N,) int64."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise VitlabError(
                f"images must be a uint8 tensor (N, C, H, W); found {self.images.dtype} {tuple(self.images.shape)}"
            )
        if len(self.images) != len(self.labels):
            raise VitlabError(f"images and labels differ in length: {len(self.images)} vs {len(self.labels)}")
        self.labels = self.labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.images.shape[-2:])

    def subset(self, index: torch.Tensor) -> ImageTensors:
        return ImageTensors(self.images[index], self.labels[index])

    @classmethod
    def from_float(cls, images: torch.Tensor, labels: torch.Tensor) -> ImageTensors:
        """From float images in [0, 1] (the synthetic datasets, the digits), rounded to uint8."""
        return cls((images.clamp(0, 1) * 255 + 0.5).to(torch.uint8), labels)


def random_boxes(
    generator: torch.Generator,
    n: int,
    height: int,
    width: int,
    *,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    erasing: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` random boxes in a `height` x `width` image, each drawn as torchvision's RandomResizedCrop
    (erasing=False) or RandomErasing (erasing=True) draws one: 10 tries of an area fraction uniform in
    `scale` and an aspect ratio log-uniform in `ratio`, the first box that fits, placed uniformly.

    Returns (boxes (n, 4) int64 as top, left, h, w; found (n,) bool). Where no try fits, RandomResizedCrop
    takes the largest central crop within `ratio`, and RandomErasing erases nothing (found = False).
    """
    tries = 10
    area = height * width * torch.empty(n, tries).uniform_(scale[0], scale[1], generator=generator)
    log_r = torch.log(torch.tensor(ratio, dtype=torch.float64))
    aspect = torch.exp(
        torch.empty(n, tries, dtype=torch.float64).uniform_(float(log_r[0]), float(log_r[1]), generator=generator)
    )
    long_side, short_side = torch.sqrt(area * aspect).round().long(), torch.sqrt(area / aspect).round().long()
    if erasing:  # RandomErasing: h = sqrt(area * aspect), and the box must be strictly smaller than the image
        h, w = long_side, short_side
        fits = (h < height) & (w < width)
    else:  # RandomResizedCrop: w = sqrt(area * aspect)
        w, h = long_side, short_side
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.int().argmax(dim=1)  # the first try that fits (0 when none does)
    found = fits.any(dim=1)
    rows = torch.arange(n)
    h, w = h[rows, first], w[rows, first]
    if not erasing:  # torchvision's fallback: the central crop, clamped to the ratio range
        in_ratio = width / height
        if in_ratio < min(ratio):
            fw, fh = width, int(round(width / min(ratio)))
        elif in_ratio > max(ratio):
            fw, fh = int(round(height * max(ratio))), height
        else:
            fw, fh = width, height
        h, w = torch.where(found, h, fh), torch.where(found, w, fw)
    u = torch.rand(n, 2, generator=generator)
    top = (u[:, 0] * (height - h + 1)).floor().long().clamp(min=0)
    left = (u[:, 1] * (width - w + 1)).floor().long().clamp(min=0)
    if not erasing:
        top = torch.where(found, top, (height - h) // 2)
        left = torch.where(found, left, (width - w) // 2)
    return torch.stack([top, left, h, w], dim=1), found


class BatchTransform:
    """A uint8 batch (B, C, H, W) -> a normalised float batch (B, channels, *size), with per-image random
    augmentation when `augment` (the recipe's fields; see vitlab.data.transforms.train_transform).

    Without augmentation the images must already be at `size` (the loader preprocesses them once).
    `draw(n, generator)` draws an epoch's random numbers for `n` images; `__call__(x, params)` takes the
    rows of the batch's images.
    """

    def __init__(
        self,
        *,
        size: Sequence[int],
        mean: Sequence[float],
        std: Sequence[float],
        channels: int,
        augment: bool = False,
        source_size: Sequence[int] | None = None,
        crop_scale: float = 0.35,
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: bool = False,
        color_jitter: float = 0.0,
        auto_augment: str = "none",
        re_prob: float = 0.0,
        interpolation: str = "bicubic",
    ):
        if auto_augment not in AUTO_AUGMENTS:
            raise VitlabError(
                f"auto_augment must be one of {', '.join(AUTO_AUGMENTS)}; found {auto_augment!r}", arg="auto_augment"
            )
        check_range("crop_scale", crop_scale, low=0, high=1, low_open=True)
        check_range("color_jitter", color_jitter, low=0)
        check_range("reprob", re_prob, low=0, high=1)
        self.size = tuple(int(s) for s in size)
        self.source_size = tuple(source_size or self.size)
        self.mean, self.std = list(mean)[:channels], list(std)[:channels]
        self.channels, self.augment = channels, augment
        # a crop of the whole image at the same size is no crop: skip it (crop_scale 1 keeps flips etc. alone)
        self.crops = augment and not (crop_scale >= 1.0 and self.source_size == self.size)
        self.scale, self.ratio, self.hflip, self.re_prob = (
            (crop_scale, 1.0),
            ratio,
            hflip and augment,
            re_prob if augment else 0.0,
        )
        # torchvision's geometric ops on tensors (RandAugment's rotate, shear, translate) take nearest or bilinear
        interp = INTERPOLATIONS[interpolation if interpolation in ("nearest", "bilinear") else "bilinear"]
        on = augment and color_jitter > 0
        self.jitter = (
            v2.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter) if on else None
        )
        self.auto = None
        if augment and auto_augment == "rand":
            self.auto = v2.RandAugment(num_ops=2, magnitude=9, interpolation=interp)
        elif augment and auto_augment == "trivial":
            self.auto = v2.TrivialAugmentWide(interpolation=interp)

    @property
    def random(self) -> bool:
        return self.augment

    def describe(self) -> str:
        if not self.augment:
            return "no augmentation"
        parts = [f"random resized crop (scale {self.scale[0]:g}-1)"] if self.crops else []
        parts += ["flip"] if self.hflip else []
        parts += [type(t).__name__ for t in (self.jitter, self.auto) if t is not None]
        return ", ".join(parts + ([f"random erasing p={self.re_prob:g}"] if self.re_prob else []))

    def draw(self, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The random numbers of one epoch for `n` images (rows follow the images' indices)."""
        if not self.augment:
            return {}
        out = {}
        if self.crops:
            out["crop"], _ = random_boxes(generator, n, *self.source_size, scale=self.scale, ratio=self.ratio)
        if self.hflip:
            out["flip"] = torch.rand(n, generator=generator) < 0.5
        if self.jitter is not None:
            out["seed"] = torch.randint(0, 2**62, (n,), generator=generator)
        if self.auto is not None:
            out.update(_draw_auto_augment(self.auto, n, generator))
        if self.re_prob > 0:
            h, w = self.size
            erase, found = random_boxes(generator, n, h, w, scale=(0.02, 0.33), ratio=(0.3, 3.3), erasing=True)
            out["erase"] = erase
            out["erase_on"] = (torch.rand(n, generator=generator) < self.re_prob) & found
        return out

    def __call__(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self._channels(x)
        if not self.augment:
            if tuple(x.shape[-2:]) != self.size:
                raise VitlabError(f"images of {tuple(x.shape[-2:])} need augment or preprocessing to {self.size}")
            return TF.normalize(TF.to_dtype(x, torch.float32, scale=True), self.mean, self.std)
        if self.crops:
            top, left, h, w = params["crop"].to(x.device).unbind(1)
            boxes = torch.stack([torch.arange(len(x), device=x.device), left, top, left + w, top + h], dim=1).float()
            # (B, C, H, W) -> (B, C, *size): each box resampled to the output size, bilinear at the centres of the
            # output pixels (aligned=True), averaged over ceil(box / size) samples per pixel where it shrinks
            x = roi_align(x.float(), boxes, output_size=self.size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        elif tuple(x.shape[-2:]) != self.size:
            raise VitlabError(
                f"images of {tuple(x.shape[-2:])} need a crop_scale below 1 or preprocessing to {self.size}"
            )
        else:
            x = x.float()
        if self.hflip:
            x = torch.where(params["flip"].to(x.device)[:, None, None, None], x.flip(-1), x)
        if self.jitter is not None or self.auto is not None:  # torchvision's colour ops work on uint8
            x = x.round().clamp(0, 255).to(torch.uint8)
            if self.jitter is not None:  # random factors and order per image: one image at a time, each seeded
                out = []
                for img, seed in zip(x, params["seed"].tolist()):
                    with torch.random.fork_rng(devices=[]):
                        torch.default_generator.manual_seed(seed)
                        out.append(self.jitter(img))
                x = torch.stack(out)
            if self.auto is not None:
                x = _apply_auto_augment(self.auto, x, params["auto_op"], params["auto_bin"], params["auto_neg"])
            x = x.float()
        x = TF.normalize(x.mul_(1.0 / 255), self.mean, self.std)
        if self.re_prob > 0:
            x = _erase(x, params["erase"].to(x.device), params["erase_on"].to(x.device))
        return x

    def _channels(self, x: torch.Tensor) -> torch.Tensor:
        C = x.shape[1]
        if C == self.channels:
            return x
        if C == 1 and self.channels == 3:
            return x.expand(-1, 3, -1, -1)  # grey images for an RGB model: the same value in each channel
        if C == 3 and self.channels == 1:
            return TF.rgb_to_grayscale(x)
        raise VitlabError(f"images with {C} channels cannot feed a model with {self.channels}")


def _draw_auto_augment(aug, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Per image, what `aug` (v2.RandAugment or v2.TrivialAugmentWide) would draw: an op of its table for each
    of its slots, the magnitude bin (RandAugment's fixed one, TrivialAugment's uniform) and the sign."""
    slots = aug.num_ops if isinstance(aug, v2.RandAugment) else 1
    ops = torch.randint(len(aug._AUGMENTATION_SPACE), (n, slots), generator=generator)
    if isinstance(aug, v2.RandAugment):
        bins = torch.full((n, slots), aug.magnitude)
    else:
        bins = torch.randint(aug.num_magnitude_bins, (n, slots), generator=generator)
    return {"auto_op": ops, "auto_bin": bins, "auto_neg": torch.rand(n, slots, generator=generator) <= 0.5}


def _apply_auto_augment(aug, x: torch.Tensor, ops: torch.Tensor, bins: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """RandAugment / TrivialAugment on a uint8 batch with torchvision's own op table and op implementations
    (`aug._AUGMENTATION_SPACE`, `aug._apply_image_or_video_transform`), the images that drew the same op,
    magnitude and sign going through it together: a few dozen batched calls instead of one per image."""
    names = list(aug._AUGMENTATION_SPACE)
    H, W = x.shape[-2:]
    nb = aug.num_magnitude_bins
    x = x.clone()
    for slot in range(ops.shape[1]):
        keys = (ops[:, slot] * nb + bins[:, slot]) * 2 + neg[:, slot].long()
        for key in keys.unique().tolist():
            rows = (keys == key).nonzero().flatten().to(x.device)
            op, rest = divmod(key, 2 * nb)
            bin_, negative = divmod(rest, 2)
            magnitudes_fn, signed = aug._AUGMENTATION_SPACE[names[op]]
            magnitudes = magnitudes_fn(nb, H, W)
            magnitude = 0.0 if magnitudes is None else float(magnitudes[bin_]) * (-1 if signed and negative else 1)
            x[rows] = aug._apply_image_or_video_transform(
                x[rows], names[op], magnitude, interpolation=aug.interpolation, fill=aug._fill
            )
    return x


def _erase(x: torch.Tensor, boxes: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """Zero the box (top, left, h, w) of each image where `on`: RandomErasing's value 0, the mean colour."""
    top, left, h, w = (b[:, None] for b in boxes.unbind(1))  # (B, 1) each
    rows = torch.arange(x.shape[-2], device=x.device)[None]  # (1, H)
    cols = torch.arange(x.shape[-1], device=x.device)[None]  # (1, W)
    in_rows = (rows >= top) & (rows < top + h)  # (B, H)
    in_cols = (cols >= left) & (cols < left + w)  # (B, W)
    mask = (in_rows[:, :, None] & in_cols[:, None, :]) & on[:, None, None]  # (B, H, W)
    return x.masked_fill(mask[:, None], 0.0)


class MemoryLoader:
    """Batches (images, labels) of `data` on `device`, transformed by `transform`.

    The order is torch's DistributedSampler's (a permutation seeded by (seed, epoch) when `shuffle`, each
    of `num_replicas` processes its share), so one process with batch B x N sees exactly the batches N
    processes with batch B see together. The tensors move to a GPU once when they fit (`device_mb`).
    """

    def __init__(
        self,
        data: ImageTensors,
        transform: BatchTransform,
        *,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        device: str | torch.device = "cpu",
        device_mb: float = 2048.0,
    ):
        check_range("batch_size", batch_size, low=1, integer=True)
        self.data, self.transform = data, transform
        self.batch_size, self.drop_last, self.seed = batch_size, drop_last, seed
        self.device = torch.device(device)
        self.sampler = DistributedSampler(data, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.epoch = 0
        on_device = self.device.type != "cpu" and data.images.numel() <= device_mb * 2**20
        self.images = data.images.to(self.device) if on_device else data.images
        self.labels = data.labels

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(list(iter(self.sampler)), dtype=torch.long)
        params = {}
        if self.transform.random:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * self.epoch + 1)
            params = self.transform.draw(len(self.data), g)
        for i in range(len(self)):
            rows = order[i * self.batch_size : (i + 1) * self.batch_size]
            x = self.images[rows.to(self.images.device)].to(self.device, non_blocking=True)
            y = self.labels[rows].to(self.device, non_blocking=True)
            yield self.transform(x, {k: v[rows] for k, v in params.items()}), y


__all__ = ["ImageTensors", "BatchTransform", "MemoryLoader", "random_boxes"]
