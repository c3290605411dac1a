"""Image folders: the digits writer, the scan (counts, split, skipped files), bad folders through the
CLI (one line, exit 2), and the augmentation/mixing transforms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.cli import main
from vitlab.data.digits import write_digits_folder
from vitlab.data.folder import scan_folder
from vitlab.data.transforms import mix_transform, train_transform
from vitlab.errors import VitlabError


def _png(path, value=128, size=8):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size), value, np.uint8), "L").save(path)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "digits"
    assert main(["data", "digits", "--out", str(out), "--size", "8", "--per-class", "10"]) == 0
    return out


def test_digits_folder_is_a_stratified_train_val_split(digits_dir):
    scan = scan_folder(digits_dir)
    assert scan.layout == "train/val" and scan.classes == [str(i) for i in range(10)]
    assert scan.counts("train") == [8] * 10 and scan.counts("val") == [2] * 10
    train_files = {p.split("/")[-1] for p, _ in scan.train}
    assert not train_files & {p.split("/")[-1] for p, _ in scan.val}  # no image in both
    im = Image.open(scan.train[0][0])
    assert im.size == (8, 8) and im.mode == "L"


def test_digits_folder_written_again_is_replaced_whole_and_a_users_folder_is_refused(tmp_path):
    out = tmp_path / "digits"
    assert main(["data", "digits", "--out", str(out), "--size", "8", "--per-class", "10"]) == 0
    assert main(["data", "digits", "--out", str(out), "--size", "8", "--per-class", "5", "--seed", "1"]) == 0  # again
    scan = scan_folder(out)
    assert scan.counts("train") == [4] * 10 and scan.counts("val") == [1] * 10  # nothing of the first run left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits"]  # no temporary folder left beside it
    mine = tmp_path / "mine"
    (mine / "train" / "0").mkdir(parents=True)
    (mine / "notes.txt").write_text("my own files")
    with pytest.raises(VitlabError, match="not empty"):
        write_digits_folder(mine, size=8, per_class=4)
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == ["notes.txt", "train", "train/0"]


def test_one_folder_gets_a_seeded_stratified_val_split(tmp_path):
    for c in ("cat", "dog", "fox"):
        for i in range(10):
            _png(tmp_path / c / f"{i}.png", value=i)
    a = scan_folder(tmp_path, val_split=0.3, seed=1)
    b = scan_folder(tmp_path, val_split=0.3, seed=1)
    c = scan_folder(tmp_path, val_split=0.3, seed=2)
    assert a.layout == "single" and a.counts("val") == [3, 3, 3] and a.counts("train") == [7, 7, 7]
    assert a.val == b.val and a.val != c.val
    assert "one folder, seeded stratified val split 0.3" in a.report()


def test_unreadable_and_stray_files_are_skipped_and_listed(tmp_path):
    for c in ("a", "b"):
        for i in range(3):
            _png(tmp_path / c / f"{i}.png")
    (tmp_path / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (tmp_path / "b" / "notes.txt").write_text("labels by hand")
    (tmp_path / "README.md").write_text("my dataset")
    (tmp_path / ".DS_Store").write_bytes(b"\0")  # hidden files are not worth a warning
    scan = scan_folder(tmp_path, val_split=0.34)
    assert len(scan.train) + len(scan.val) == 6
    skipped = {p.split("/")[-1]: why for p, why in scan.skipped}
    assert set(skipped) == {"broken.jpg", "notes.txt", "README.md"}
    assert "corrupt" in skipped["broken.jpg"] or "not an image" in skipped["broken.jpg"]
    assert "not an image file" in skipped["notes.txt"] and "stray" in skipped["README.md"]
    assert all(name in scan.warning() for name in skipped)


def _error_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("error: ")
    return err[-1]


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty", "the folder is empty"),
        ("one_class", "at least 2 class sub-folders; found only 'cats'"),
        ("class_all_corrupt", "no readable image"),
        ("loose_images", "image file(s) directly in the folder but no class sub-folders"),
        ("train_without_val", "but no"),
        ("missing", "no such folder"),
    ],
)
def test_bad_folders_give_one_clear_line_and_exit_2(tmp_path, capsys, case, expected):
    root = tmp_path / "data"
    root.mkdir()
    if case == "one_class":
        _png(root / "cats" / "1.png")
    elif case == "class_all_corrupt":
        _png(root / "cats" / "1.png")
        _png(root / "cats" / "2.png")
        (root / "dogs").mkdir()
        (root / "dogs" / "1.png").write_bytes(b"garbage")
        (root / "dogs" / "2.webp").write_bytes(b"")
    elif case == "loose_images":
        _png(root / "1.png")
        _png(root / "2.png")
    elif case == "train_without_val":
        _png(root / "train" / "a" / "1.png")
        _png(root / "train" / "b" / "1.png")
    elif case == "missing":
        root = tmp_path / "nope"
    line = _error_line(capsys, ["data", "scan", str(root)])
    assert expected in line and str(root) in line
    # the same message from the training commands (before any model is built)
    line = _error_line(capsys, ["finetune", "--data", str(root), "--model", "vit_mini", "--out", str(tmp_path / "run")])
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_scan_command_prints_counts_and_lists_skipped_files(tmp_path, capsys):
    for c in ("a", "b"):
        for i in range(2):
            _png(tmp_path / "train" / c / f"{i}.png")
            _png(tmp_path / "val" / c / f"{i}.png")
    (tmp_path / "val" / "b" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    assert main(["data", "scan", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "2 classes, 4 train / 4 val images" in out
    assert "skipped 1 file(s)" in err and "x.png" in err


def test_mixup_cutmix_targets_are_distributions():
    x = torch.randn(16, 3, 8, 8)
    y = torch.arange(16) % 5
    for kw in (dict(mixup=0.8), dict(cutmix=1.0), dict(mixup=0.8, cutmix=1.0, switch_prob=0.5)):
        mix = mix_transform(num_classes=5, **kw)
        for _ in range(5):
            xm, t = mix(x, y)
            assert xm.shape == x.shape and t.shape == (16, 5)
            torch.testing.assert_close(t.sum(1), torch.ones(16))
            assert (t >= 0).all()
            partner = y.roll(1)  # v2.MixUp/CutMix pair each image with the previous one in the batch
            support = (
                (t > 0) & ~torch.nn.functional.one_hot(y, 5).bool() & ~torch.nn.functional.one_hot(partner, 5).bool()
            )
            assert not support.any()
    mixed = mix_transform(num_classes=5, mixup=0.8)(x, y)[1]
    assert (mixed.max(1).values < 1).any()  # really mixed, not one-hot
    assert mix_transform(num_classes=5) is None


def test_horizontal_flip_can_be_switched_off():
    arr = np.zeros((8, 8, 3), np.uint8)
    arr[:, :2] = 255  # bright left edge: a flip moves it right
    im = Image.fromarray(arr)
    torch.manual_seed(0)

    def left_bright(tf):
        return [bool(out[:, :, 0].mean() > out[:, :, -1].mean()) for out in (tf(im) for _ in range(20))]

    full = dict(size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the crop keeps the whole image
    assert all(left_bright(train_transform(hflip=False, **full)))
    assert not all(left_bright(train_transform(hflip=True, **full)))
    out = train_transform(auto_augment="rand", color_jitter=0.4, re_prob=1.0, **full)(im)
    assert out.shape == (3, 8, 8) and out.dtype == torch.float32


def test_a_class_missing_from_val_is_reported_as_no_accuracy(tmp_path):
    import json

    for c in ("a", "b", "c"):
        for i in range(4):
            _png(tmp_path / "data" / "train" / c / f"{i}.png", value=60 * i)
    for c in ("a", "b"):
        _png(tmp_path / "data" / "val" / c / "0.png")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(tmp_path / "data"),
                "--model",
                "vit_mini",
                "--img-size",
                "16",
                "--epochs",
                "1",
                "--device",
                "cpu",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["per_class_accuracy"]["c"] is None and summary["per_class_accuracy"]["a"] is not None
    assert (run / "per_class_accuracy.csv").read_text().splitlines()[3] == "c,,0"
