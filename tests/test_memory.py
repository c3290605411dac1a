"""Data in memory: torchvision's random boxes drawn for a whole epoch at once, an image's augmentation a
function of (seed, epoch, image) alone (so batch size, process count and resume change nothing), grouped
RandAugment equal to one image at a time, and a small folder kept in memory evaluated exactly as
`eval_transform` (the disk path, and `vitlab predict`) preprocesses it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

from vitlab import create_model
from vitlab.data.datasets import RunData, load_data, make_loaders
from vitlab.data.digits import write_digits_folder
from vitlab.data.folder import FolderScan
from vitlab.data.memory import (
    BatchTransform,
    ImageTensors,
    MemoryLoader,
    _apply_auto_augment,
    _draw_auto_augment,
    random_boxes,
)
from vitlab.data.preprocess import eval_transform
from vitlab.train.distributed import DistInfo
from vitlab.train.recipe import Recipe


def test_random_boxes_are_drawn_as_torchvision_draws_them():
    n, H, W = 20_000, 28, 36
    boxes, found = random_boxes(torch.Generator().manual_seed(0), n, H, W, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3))
    top, left, h, w = boxes.T.float()
    assert found.all() and (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    torch.manual_seed(0)
    ref = [v2.RandomResizedCrop(28, scale=(0.35, 1.0)).make_params([torch.zeros(1, H, W)]) for _ in range(4000)]
    ref_area = sum(p["height"] * p["width"] for p in ref) / len(ref) / (H * W)
    ref_aspect = sum(math.log(p["width"] / p["height"]) for p in ref) / len(ref)
    assert abs(float((h * w).mean()) / (H * W) - ref_area) < 0.01  # 4,000 reference draws: se ~0.003
    assert abs(float(torch.log(w / h).mean()) - ref_aspect) < 0.02
    # no box fits: RandomResizedCrop falls back to the central crop within the ratio, RandomErasing to nothing
    boxes, found = random_boxes(torch.Generator().manual_seed(0), 8, 10, 40, scale=(1.0, 1.0), ratio=(3 / 4, 4 / 3))
    assert not found.any() and boxes.tolist() == [[0, 13, 10, 13]] * 8
    _, found = random_boxes(torch.Generator().manual_seed(0), 8, 4, 4, scale=(1.0, 1.0), ratio=(1.0, 1.0), erasing=True)
    assert not found.any()


def _augmented(loader: MemoryLoader, epoch: int) -> dict[int, torch.Tensor]:
    """Image index (its label here) -> its augmented tensor, over one epoch of `loader`."""
    loader.set_epoch(epoch)
    return {int(i): x for xb, yb in loader for x, i in zip(xb, yb)}


def test_an_images_augmentation_depends_on_the_seed_epoch_and_image_alone():
    g = torch.Generator().manual_seed(1)
    data = ImageTensors(torch.randint(0, 256, (24, 1, 20, 20), dtype=torch.uint8, generator=g), torch.arange(24))
    tf = BatchTransform(
        size=(16, 16),
        mean=[0.5],
        std=[0.5],
        channels=3,
        augment=True,
        source_size=(20, 20),
        crop_scale=0.35,
        hflip=True,
        color_jitter=0.3,
        auto_augment="rand",
        re_prob=0.5,
    )

    def loader(batch_size, replicas=1, rank=0):
        return MemoryLoader(data, tf, batch_size=batch_size, shuffle=True, seed=7, num_replicas=replicas, rank=rank)

    one = _augmented(loader(8), epoch=2)
    assert sorted(one) == list(range(24)) and next(iter(one.values())).shape == (3, 16, 16)
    other_batch = _augmented(loader(5), epoch=2)
    two_processes = {**_augmented(loader(4, 2, 0), epoch=2), **_augmented(loader(4, 2, 1), epoch=2)}
    for i in range(24):
        assert torch.equal(one[i], other_batch[i]) and torch.equal(one[i], two_processes[i]), i
    again, next_epoch = _augmented(loader(8), epoch=2), _augmented(loader(8), epoch=3)
    assert all(torch.equal(one[i], again[i]) for i in range(24))  # a resumed epoch sees the same images
    assert sum(not torch.equal(one[i], next_epoch[i]) for i in range(24)) > 20  # another epoch, other draws
    # the order of the batches is a DistributedSampler's: two processes share out one process's batches
    batches = [yb.tolist() for _, yb in loader(8)]
    shares = [[yb.tolist() for _, yb in loader(4, 2, r)] for r in (0, 1)]
    assert [sorted(a + b) for a, b in zip(*shares)] == [sorted(b) for b in batches]


def test_grouped_randaugment_equals_one_image_at_a_time():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8, generator=g)
    for aug in (
        v2.RandAugment(num_ops=2, magnitude=9, interpolation=v2.InterpolationMode.BILINEAR),
        v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR),
    ):
        p = _draw_auto_augment(aug, len(x), g)
        batched = _apply_auto_augment(aug, x, p["auto_op"], p["auto_bin"], p["auto_neg"])
        single = torch.cat(
            [
                _apply_auto_augment(
                    aug, x[i : i + 1], p["auto_op"][i : i + 1], p["auto_bin"][i : i + 1], p["auto_neg"][i : i + 1]
                )
                for i in range(len(x))
            ]
        )
        assert torch.equal(batched, single) and not torch.equal(batched, x)
        assert len(set(p["auto_op"].flatten().tolist())) == len(aug._AUGMENTATION_SPACE)  # every op drawn


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("mem") / "digits"
    write_digits_folder(root, size=20, per_class=6)  # 20x20 grey PNGs, 50 train / 10 val
    return root


def test_a_small_folder_in_memory_is_evaluated_as_eval_transform_preprocesses_it(folder):
    data = load_data(data=str(folder))
    assert len(data.scan.images) == 60  # decoded once by the scan
    model = create_model("vit_mini", num_classes=10, img_size=16, dim=32, depth=1, heads=2, mlp_dim=32)
    recipe = Recipe(batch_size=8, augment=False)
    mem_train, mem_val = make_loaders(data, model, recipe, dist=DistInfo())
    disk_train, disk_val = make_loaders(data, model, recipe, dist=DistInfo(), in_memory=False)
    assert isinstance(mem_val, MemoryLoader) and not isinstance(disk_val, MemoryLoader)
    expected = torch.stack([eval_transform(model.pretrained_cfg)(data.scan.images[p]) for p, _ in data.scan.val])
    got = torch.cat([x for x, _ in mem_val])
    assert got.shape == (10, 3, 16, 16) and torch.equal(got, expected)  # resized 20 -> 17, centre crop 16, normalised
    assert torch.equal(torch.cat([x for x, _ in disk_val]), got)
    mem_train.set_epoch(0)
    disk_train.sampler.set_epoch(0)
    for (a, ya), (b, yb) in zip(mem_train, disk_train):  # without augmentation, the same batches in the same order
        assert torch.equal(ya, yb) and torch.equal(a, b)


def test_in_memory_data_feeds_a_grey_model_and_an_rgb_model():
    g = torch.Generator().manual_seed(0)
    grey = ImageTensors(torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8, generator=g), torch.arange(6) % 2)
    scan_rows = [(f"t:{i}", int(c)) for i, c in enumerate(grey.labels)]
    data = RunData(FolderScan(Path("t"), "in-memory", ["a", "b"], scan_rows, scan_rows), grey, grey, "x")
    for chans in (1, 3):
        model = create_model(
            "vit_mini", num_classes=2, img_size=28, in_chans=chans, dim=32, depth=1, heads=2, mlp_dim=32
        )
        model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=1.0)
        _, val = make_loaders(data, model, Recipe(batch_size=4, augment=False), dist=DistInfo())
        x = torch.cat([b for b, _ in val])
        assert x.shape == (6, chans, 28, 28)
        assert torch.equal(x[:, -1], (grey.images[:, 0].float().mul(1 / 255) - 0.5) / 0.5)  # every channel the grey one


def test_a_grey_model_trains_on_an_rgb_folder_in_memory_and_from_disk(folder):
    data = load_data(data=str(folder))
    model = create_model("vit_mini", num_classes=10, img_size=16, in_chans=1, dim=32, depth=1, heads=2, mlp_dim=32)
    recipe = Recipe(batch_size=8, hflip=False)
    for in_memory in (True, False):
        train, val = make_loaders(data, model, recipe, dist=DistInfo(), in_memory=in_memory)
        (xt, _), (xv, _) = next(iter(train)), next(iter(val))
        assert xt.shape == (8, 1, 16, 16) and xv.shape[1:] == (1, 16, 16), in_memory
