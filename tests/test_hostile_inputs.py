"""Hostile input and faults, over every command: each refusal is one line `error: ...` (exit 2) that says
what was expected, no traceback, no file of the user's changed (checksums before and after), and
nothing left behind (not even an empty folder). A table of cases run in-process, then the faults a
table cannot hold: a disk that fills up mid-run (a real tmpfs) and kill -9 during checkpoint writes
(a real process), each followed by a resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import vitlab
from vitlab import bench, create_model
from vitlab.analysis import flops
from vitlab.cli import main
from vitlab.data.digits import write_digits_folder
from vitlab.data.fashion_mnist import cache_dir
from vitlab.errors import VitlabError
from vitlab.fileio import TMP_TAG, umask
from vitlab.models import size
from vitlab.models.pretrained_cfg import PretrainedCfg
from vitlab.runtime import available_cpus
from vitlab.serve.models import ModelStore
from vitlab.train import RECIPES, Recipe
from vitlab.train.engine import TensorLoader, fit
from vitlab.weights import checkpoint as ckpt

CPUS = available_cpus()
SMALL = ["--model", "vit_mini", "--img-size", "16", "--epochs", "1", "--batch-size", "16", "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """What a user has: an image folder, a photo, a trained run, a CNN checkpoint, a folder of their own
    files and a plain file. Shared by every case and never written to (the checksums say so)."""
    lab = tmp_path_factory.mktemp("lab")
    write_digits_folder(lab / "digits", size=16, per_class=6)  # 50 train / 10 val, 10 classes
    shutil.copy(next((lab / "digits/val/3").iterdir()), lab / "photo.png")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", "--data", str(lab / "digits"), *SMALL, "--no-hflip", "--out", str(lab / "run")]) == 0
        ckpt.save_weights(lab / "cnn", create_model("resnet_mini", num_classes=10))
    finally:
        torch.set_num_threads(n)
    (lab / "mine").mkdir()
    (lab / "mine" / "metrics.csv").write_text("the user's own numbers\n")
    (lab / "mine" / "summary.json").write_text('{"mine": true}\n')
    (lab / "notes.txt").write_text("a file, not a folder\n")
    fake_fashion(lab / "fashion")
    return lab


# ----------------------------------------------------------------------------------------------------
# Damaged and hostile things a case can set up in its own folder


def _run_copy(lab: Path, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(lab / "run", run)
    return run


def _last_folder(run: Path) -> Path:
    return run / ckpt.read_pointer(run / "last.json")["checkpoint"]


def pointer(text: str):
    def setup(lab, tmp):
        (_run_copy(lab, tmp) / "last.json").write_text(text)

    return setup


def meta_kind(lab, tmp):
    folder = _last_folder(_run_copy(lab, tmp))
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "kind": "alien"}))


def meta_not_json(lab, tmp):
    (_last_folder(_run_copy(lab, tmp)) / "config.json").write_text("{not json")


def export_kind(lab, tmp):
    assert main(["export", "--checkpoint", str(lab / "run"), "--out", str(tmp / "m.safetensors")]) == 0
    meta = json.loads((tmp / "m.json").read_text())
    (tmp / "m.json").write_text(json.dumps({**meta, "kind": "alien"}))


def weights_truncated(lab, tmp):
    f = _last_folder(_run_copy(lab, tmp)) / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])


def patch_embed_rows(lab, tmp):
    f = _last_folder(_run_copy(lab, tmp)) / "model.safetensors"
    sd = load_file(f)
    sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"] = (
        sd["patch_embed.proj.weight"][:7],
        sd["patch_embed.proj.bias"][:7],
    )
    save_file({k: v.contiguous() for k, v in sd.items()}, f)


def state_truncated(lab, tmp):
    f = _last_folder(_run_copy(lab, tmp)) / "state.pt"
    f.write_bytes(f.read_bytes()[:200])


class Evil:
    def __reduce__(self):
        return (os.system, ("echo the pickle ran > pwned",))


def state_evil(lab, tmp):
    torch.save({"version": 2, "payload": Evil()}, _last_folder(_run_copy(lab, tmp)) / "state.pt")


def state_incomplete(lab, tmp):
    torch.save({"version": 2, "epoch": 1}, _last_folder(_run_copy(lab, tmp)) / "state.pt")


def evil_pth(lab, tmp):
    torch.save({"patch_embed.proj.weight": torch.zeros(8, 3, 4, 4), "x": Evil()}, tmp / "weights.pth")


def image_links(lab, tmp):
    (tmp / "loop.png").symlink_to("loop.png")
    (tmp / "gone.png").symlink_to("nowhere.png")
    (tmp / "junk.png").write_bytes(b"these bytes are not a PNG")


def unreadable(monkeypatch, lab, tmp):
    """Root reads any file, so the test makes PIL meet the PermissionError a user would."""
    real = Image.open

    def guarded(fp, *a, **k):
        if str(fp).endswith("photo.png"):
            raise PermissionError(13, "Permission denied", str(fp))
        return real(fp, *a, **k)

    monkeypatch.setattr(Image, "open", guarded)


def folder_loop(lab, tmp):
    """a/up -> .. : followed, it would put the whole folder inside class a, forty levels deep."""
    for c, digit in (("a", "3"), ("b", "7")):
        (tmp / "loop" / c).mkdir(parents=True)
        for f in sorted((lab / "digits/train" / digit).iterdir()):
            shutil.copy(f, tmp / "loop" / c)
    (tmp / "loop/a/up").symlink_to("..", target_is_directory=True)


def same_file_two_classes(lab, tmp):
    folder_loop(lab, tmp)
    (tmp / "loop/a/up").unlink()
    first = sorted((tmp / "loop/a").iterdir())[0]
    (tmp / "loop/b/also_in_a.png").symlink_to(first)


def train_val_leak(lab, tmp):
    shutil.copytree(lab / "digits", tmp / "leak")
    first = sorted((tmp / "leak/train/4").iterdir())[0]
    os.link(first, tmp / "leak/val/4/copy.png")  # a hard link: the same file, not a copy


def tiny_classes(lab, tmp):
    for c, digit in (("a", "1"), ("b", "2")):
        (tmp / "few" / c).mkdir(parents=True)
        for f in sorted((lab / "digits/train" / digit).iterdir())[:2]:
            shutil.copy(f, tmp / "few" / c)


def user_folder(lab, tmp):
    shutil.copytree(lab / "mine", tmp / "mine")
    shutil.copytree(lab / "digits", tmp / "digits")  # trained on with a relative --data


def attention_folder(lab, tmp):
    assert (
        main(["attention", str(lab / "photo.png"), "--checkpoint", str(lab / "run"), "--out", str(tmp / "attn")]) == 0
    )


def existing_export(lab, tmp):
    (tmp / "m.safetensors").write_bytes(b"an older export the user keeps")
    (tmp / "m.json").write_text("{}")


# ----------------------------------------------------------------------------------------------------
# The table


@dataclass
class Case:
    argv: str  # {lab}: the shared materials; {tmp}: this case's own folder
    rc: int
    expect: str  # a part of the one stderr line (rc 2), or of stdout (rc 0)
    setup: Callable | None = None
    patch: Callable | None = None  # (monkeypatch, lab, tmp) -> None, for what the OS will not do as root
    after: Callable | None = field(default=None)  # (lab, tmp) -> None: more checks on a success
    stderr: str | None = None  # on a success: stderr exactly


RUN, PHOTO = "{lab}/run", "{lab}/photo.png"
CASES = {
    # predict: options, hub ids, run metadata, images
    "predict_img_size_0": Case(
        f"predict {PHOTO} --checkpoint {RUN} --img-size 0", 2, "--img-size must be an integer >= 1; found 0"
    ),
    "predict_img_size_negative": Case(
        f"predict {PHOTO} --checkpoint {RUN} --img-size -3", 2, "--img-size must be an integer >= 1; found -3"
    ),
    "predict_topk_0": Case(
        f"predict {PHOTO} --checkpoint {RUN} --topk 0", 2, "--topk must be an integer >= 1; found 0"
    ),
    "predict_batch_size_0": Case(
        f"predict {PHOTO} --checkpoint {RUN} --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"
    ),
    "predict_device_unknown": Case(
        f"predict {PHOTO} --checkpoint {RUN} --device banana",
        2,
        "--device 'banana' is not a device; expected auto, cpu",
    ),
    "predict_hub_id_path": Case(
        f"predict {PHOTO} --pretrained hf-hub:../../etc/passwd",
        2,
        "hub id '../../etc/passwd' is not a Hugging Face repository name",
    ),
    "predict_hub_id_empty": Case(
        f"predict {PHOTO} --pretrained hf-hub:", 2, "hub id '' is not a Hugging Face repository name"
    ),
    "predict_no_weights": Case(f"predict {PHOTO} --model vit_mini", 2, "give the weights with --pretrained"),
    "predict_missing_checkpoint": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/nothing", 2, "nothing does not exist: expected a checkpoint folder"
    ),
    "predict_pointer_not_json": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "last.json is not readable JSON", pointer("{oops")
    ),
    "predict_pointer_a_list": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run",
        2,
        'should be a JSON object whose "checkpoint" names a folder inside the run',
        pointer("[1, 2]"),
    ),
    "predict_pointer_escapes": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run",
        2,
        "names a folder inside the run",
        pointer('{"checkpoint": "../../etc", "epoch": 1}'),
    ),
    "predict_pointer_epoch_text": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run/last.json",
        2,
        "should give \"epoch\" as a whole number >= 0; found 'one'",
        pointer('{"checkpoint": "checkpoints/epoch_0001", "epoch": "one"}'),
    ),
    "predict_config_unknown_kind": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run",
        2,
        "has model kind 'alien'; expected one of vit, resnet_mini",
        meta_kind,
    ),
    "predict_config_unknown_kind_as_pretrained": Case(
        f"predict {PHOTO} --pretrained {{tmp}}/run/checkpoints/epoch_0001", 2, "has model kind 'alien'", meta_kind
    ),
    "predict_export_json_unknown_kind": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/m.safetensors", 2, "m.json has model kind 'alien'", export_kind
    ),
    "predict_config_not_json": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "config.json is not readable JSON", meta_not_json
    ),
    "predict_weights_truncated": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run",
        2,
        "could not read weights file {tmp}/run/checkpoints/epoch_0001/model.safetensors",
        weights_truncated,
    ),
    "predict_patch_embedding_7_rows": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/run",
        2,
        "its tensors do not match its own config (dim: config 64 vs tensors 7: shape differences (2): "
        "patch_embed.proj.bias model (64,) vs checkpoint (7,); "
        "patch_embed.proj.weight model (64, 3, 4, 4) vs checkpoint (7, 3, 4, 4))",
        patch_embed_rows,
    ),
    "predict_malicious_pth": Case(f"predict {PHOTO} --pretrained {{tmp}}/weights.pth", 2, "refused to load", evil_pth),
    "predict_symlink_loop": Case(
        f"predict {{tmp}}/loop.png --checkpoint {RUN}", 2, "loop.png: a loop of symbolic links", image_links
    ),
    "predict_dangling_link": Case(
        f"predict {{tmp}}/gone.png --checkpoint {RUN}",
        2,
        "gone.png: a symbolic link to nowhere.png, which does not exist",
        image_links,
    ),
    "predict_not_an_image": Case(
        f"predict {{tmp}}/junk.png --checkpoint {RUN}", 2, "junk.png: not an image file PIL can read", image_links
    ),
    "predict_unreadable": Case(
        f"predict {PHOTO} --checkpoint {RUN}", 2, "photo.png: cannot be read (permission denied)", patch=unreadable
    ),
    "predict_works": Case(f"predict {PHOTO} --checkpoint {RUN} --topk 2", 0, "photo.png"),
    # train and finetune: options, the run folder, image folders, resume from damaged state
    "train_lr_negative": Case(
        "train --data {lab}/digits --model vit_mini --lr -0.1 --out {tmp}/r", 2, "--lr must be a number > 0; found -0.1"
    ),
    "train_epochs_0": Case(
        "train --data {lab}/digits --model vit_mini --epochs 0 --out {tmp}/r",
        2,
        "--epochs must be an integer >= 1; found 0",
    ),
    "train_batch_size_0": Case(
        "train --data {lab}/digits --model vit_mini --batch-size 0 --out {tmp}/r",
        2,
        "--batch-size must be an integer >= 1; found 0",
    ),
    "train_img_size_0": Case(
        "train --data {lab}/digits --model vit_mini --img-size 0 --out {tmp}/r",
        2,
        "--img-size must be an integer >= 1; found 0",
    ),
    "train_val_split_1_5": Case(
        "train --data {tmp}/few --model vit_mini --val-split 1.5 --out {tmp}/r",
        2,
        "--val-split must be a number in (0, 1); found 1.5",
        tiny_classes,
    ),
    "train_ema_1_5": Case(
        "train --data {lab}/digits --model vit_mini --ema 1.5 --out {tmp}/r",
        2,
        "--ema must be a number in (0, 1); found 1.5",
    ),
    "train_threads_0": Case(
        "train --data {lab}/digits --model vit_mini --threads 0 --out {tmp}/r",
        2,
        f"--threads must be an integer in [1, {CPUS}]; found 0 (this machine lets vitlab use {CPUS} CPU",
    ),
    "train_workers_negative": Case(
        "train --data {lab}/digits --model vit_mini --workers -1 --out {tmp}/r",
        2,
        "--workers must be an integer >= 0; found -1",
    ),
    "train_out_is_a_file": Case(
        "train --data {lab}/digits --model vit_mini --out {lab}/notes.txt", 2, "notes.txt is a file; expected a folder"
    ),
    "train_out_under_proc": Case(
        "train --data {lab}/digits --model vit_mini --out /proc/vitlab/run",
        2,
        "--out /proc/vitlab/run cannot be created: cannot write in /proc",
    ),
    "train_out_under_a_file": Case(
        "train --data {lab}/digits --model vit_mini --out {lab}/notes.txt/run", 2, "notes.txt is a file, not a folder"
    ),
    "train_out_users_folder": Case(
        "train --data {lab}/digits --model vit_mini --out {lab}/mine",
        2,
        "already holds files vitlab did not write (metrics.csv, summary.json); choose a new folder, or pass --force",
    ),
    "train_relative_paths_into_users_folder_forced": Case(
        "train --data digits " + " ".join(SMALL) + " --out mine --force",
        0,
        "wrote mine/",
        user_folder,
        after=lambda lab, tmp: (tmp / "mine/last.json").is_file(),
    ),
    "train_out_holds_a_run": Case(
        "train --data {lab}/digits --model vit_mini --out {lab}/run",
        2,
        "already holds a run (last.json); resume it (--resume), or choose a new folder",
    ),
    "train_resume_nothing": Case(
        "train --data {lab}/digits --model vit_mini --resume --out {tmp}/new",
        2,
        "--resume: no checkpoint to resume from",
    ),
    "train_resume_pointer_not_json": Case(
        "train --data {lab}/digits " + " ".join(SMALL) + " --resume --out {tmp}/run",
        2,
        "last.json is not readable JSON",
        pointer("not json"),
    ),
    "train_resume_state_truncated": Case(
        "train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run",
        2,
        "state.pt is truncated or not a training state",
        state_truncated,
    ),
    "train_resume_state_pickle": Case(
        "train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run",
        2,
        "refused",
        state_evil,
    ),
    "train_resume_state_incomplete": Case(
        "train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run",
        2,
        "is not a complete training state (it lacks optimizer, scheduler, rng_cpu, history, recipe)",
        state_incomplete,
    ),
    "train_data_missing": Case(
        "train --data {tmp}/nothing --model vit_mini --out {tmp}/r", 2, "--data {tmp}/nothing: no such folder"
    ),
    "train_data_is_a_file": Case(
        "train --data {lab}/notes.txt --model vit_mini --out {tmp}/r",
        2,
        "is a file; expected a folder of class sub-folders",
    ),
    "train_file_in_two_classes": Case(
        "train --data {tmp}/loop --model vit_mini --out {tmp}/r",
        2,
        "1 file(s) are in two class folders",
        same_file_two_classes,
    ),
    "train_file_in_train_and_val": Case(
        "train --data {tmp}/leak --model vit_mini --out {tmp}/r",
        2,
        "1 file(s) are in both train/ and val/",
        train_val_leak,
    ),
    "train_val_split_starves_a_class": Case(
        "train --data {tmp}/few --model vit_mini --val-split 0.9 --out {tmp}/r",
        2,
        "--val-split 0.9 would send every image of class(es) a (2 images), b (2 images) to validation",
        tiny_classes,
    ),
    "finetune_unknown_kind": Case(
        "finetune --data {lab}/digits --checkpoint {tmp}/run --out {tmp}/ft", 2, "has model kind 'alien'", meta_kind
    ),
    "finetune_freeze_past_epochs": Case(
        "finetune --data {lab}/digits --model vit_mini --epochs 1 --out {tmp}/ft",
        2,
        "--freeze-epochs must be an integer in [0, 1]; found 2",
    ),
    "finetune_unfreeze_bogus": Case(
        "finetune --data {lab}/digits --model vit_mini --unfreeze some --out {tmp}/ft",
        2,
        "--unfreeze must be all, head or last:N",
    ),
    # demo
    "demo_epochs_0": Case("demo --epochs 0 --out {tmp}/demo", 2, "--epochs must be an integer in [1, 10000]; found 0"),
    "demo_seed_negative": Case(
        "demo --seed -1 --out {tmp}/demo", 2, "--seed must be an integer in [0, 4294967295]; found -1"
    ),
    "demo_threads_negative": Case(
        "demo --threads -1 --out {tmp}/demo", 2, f"--threads must be an integer in [0, {CPUS}]; found -1"
    ),
    "demo_out_is_a_file": Case("demo --out {lab}/notes.txt", 2, "notes.txt is a file; expected a folder"),
    "demo_out_under_proc": Case("demo --out /proc/vitlab", 2, "cannot be created: cannot write in /proc"),
    "demo_out_users_folder": Case(
        "demo --epochs 1 --out {lab}/mine", 2, "already holds files vitlab did not write (metrics.csv, summary.json)"
    ),
    # reproduce
    "reproduce_seeds_0": Case(
        "reproduce --quick --seeds 0 --out {tmp}/rep", 2, "--seeds must be an integer >= 1; found 0"
    ),
    "reproduce_workers_0": Case(
        "reproduce --quick --workers 0 --out {tmp}/rep", 2, "--workers must be an integer >= 1; found 0"
    ),
    "reproduce_only_unknown": Case(
        "reproduce --quick --only bogus --out {tmp}/rep", 2, "--only: unknown experiment 'bogus'"
    ),
    "reproduce_out_is_a_file": Case("reproduce --quick --out {lab}/notes.txt", 2, "notes.txt is a file"),
    "reproduce_out_users_folder": Case(
        "reproduce --quick --out {lab}/mine", 2, "already holds files vitlab did not write"
    ),
    "reproduce_out_under_proc": Case("reproduce --quick --out /proc/vitlab", 2, "cannot write in /proc"),
    # attention and inspect
    "attention_cnn_model": Case(
        f"attention {PHOTO} --model resnet_mini --out {{tmp}}/a",
        2,
        "resnet_mini is a CNN baseline, which has no attention layers",
    ),
    "attention_cnn_checkpoint": Case(
        f"attention {PHOTO} --checkpoint {{lab}}/cnn --out {{tmp}}/a",
        2,
        "resnet_mini is a CNN baseline, which has no attention layers",
    ),
    "attention_alpha_2": Case(
        f"attention {PHOTO} --checkpoint {RUN} --alpha 2 --out {{tmp}}/a",
        2,
        "--alpha must be a number in [0, 1]; found 2.0",
    ),
    "attention_discard_ratio_1": Case(
        f"attention {PHOTO} --checkpoint {RUN} --method rollout --discard-ratio 1 --out {{tmp}}/a",
        2,
        "--discard-ratio must be a number in [0, 1); found 1.0",
    ),
    "attention_layer_99": Case(
        f"attention {PHOTO} --checkpoint {RUN} --layer 99 --out {{tmp}}/a",
        2,
        "--layer 99 does not exist: this model has layers 0..3",
    ),
    "attention_head_99": Case(
        f"attention {PHOTO} --checkpoint {RUN} --head 99 --out {{tmp}}/a",
        2,
        "--head 99 does not exist: this model has heads 0..3",
    ),
    "attention_img_size_0": Case(
        f"attention {PHOTO} --checkpoint {RUN} --img-size 0 --out {{tmp}}/a",
        2,
        "--img-size must be an integer >= 1; found 0",
    ),
    "attention_out_is_a_file": Case(
        f"attention {PHOTO} --checkpoint {RUN} --out {{lab}}/notes.txt", 2, "notes.txt is a file"
    ),
    "attention_out_users_folder": Case(
        f"attention {PHOTO} --checkpoint {RUN} --out {{lab}}/mine", 2, "already holds files vitlab did not write"
    ),
    "attention_again_into_its_folder": Case(
        f"attention {PHOTO} --checkpoint {RUN} --out {{tmp}}/attn", 0, "wrote", attention_folder
    ),
    "inspect_into_attention_folder": Case(
        f"inspect --checkpoint {RUN} --out {{tmp}}/attn",
        2,
        "already holds the output of another vitlab command (attention)",
        attention_folder,
    ),
    "inspect_cnn_model": Case("inspect --model resnet_mini --out {tmp}/i", 2, "resnet_mini is a CNN baseline"),
    "inspect_max_images_0": Case(
        f"inspect --checkpoint {RUN} --max-images 0 --out {{tmp}}/i", 2, "--max-images must be an integer >= 1; found 0"
    ),
    "inspect_batch_size_0": Case(
        f"inspect --checkpoint {RUN} --batch-size 0 --out {{tmp}}/i", 2, "--batch-size must be an integer >= 1; found 0"
    ),
    "inspect_out_under_proc": Case(f"inspect --checkpoint {RUN} --out /proc/vitlab", 2, "cannot write in /proc"),
    # export
    "export_existing_file": Case(
        f"export --checkpoint {RUN} --out {{tmp}}/m.safetensors",
        2,
        "m.safetensors and {tmp}/m.json already exist; choose another name, or pass --force to replace",
        existing_export,
    ),
    "export_existing_file_forced": Case(
        f"export --checkpoint {RUN} --out {{tmp}}/m.safetensors --force",
        0,
        "wrote",
        existing_export,
        after=lambda lab, tmp: len(load_file(tmp / "m.safetensors")) > 10,
    ),
    "export_unknown_suffix": Case(f"export --checkpoint {RUN} --out {{tmp}}/m.txt", 2, "unknown export format '.txt'"),
    "export_out_is_a_folder": Case(
        f"export --checkpoint {RUN} --out {{tmp}}/m.onnx",
        2,
        "m.onnx is a folder; expected a file name",
        lambda lab, tmp: (tmp / "m.onnx").mkdir(),
    ),
    "export_out_under_proc": Case(
        f"export --checkpoint {RUN} --out /proc/m.safetensors",
        2,
        "--out /proc/m.safetensors cannot be written: cannot write in /proc",
    ),
    "export_out_under_a_file": Case(
        f"export --checkpoint {RUN} --out {{lab}}/notes.txt/m.onnx", 2, "notes.txt is a file, not a folder"
    ),
    "export_opset_0": Case(
        f"export --checkpoint {RUN} --opset 0 --out {{tmp}}/m.onnx", 2, "--opset must be an integer >= 17; found 0"
    ),
    # data
    "data_digits_into_users_folder": Case("data digits --out {lab}/mine", 2, "already exists and is not empty"),
    "data_digits_out_under_proc": Case("data digits --out /proc/digits", 2, "cannot write in /proc"),
    "data_digits_size_0": Case("data digits --size 0 --out {tmp}/d", 2, "--size must be an integer >= 8; found 0"),
    "data_digits_val_split_2": Case(
        "data digits --val-split 2 --out {tmp}/d", 2, "--val-split must be a number in (0, 1); found 2.0"
    ),
    "data_digits_per_class_1": Case(
        "data digits --per-class 1 --out {tmp}/d", 2, "--per-class must be an integer >= 2; found 1"
    ),
    "data_scan_missing": Case("data scan {tmp}/nothing", 2, "no such folder"),
    "data_scan_symlink_loop": Case("data scan {tmp}/loop", 0, "2 classes, 8 train / 2 val images", folder_loop),
    # bench: refused before the matmul probes (they fail the test if they run)
    "bench_batch_size_0": Case("bench --quick --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"),
    "bench_repeats_0": Case("bench --quick --repeats 0", 2, "--repeats must be an integer >= 1; found 0"),
    "bench_warmup_negative": Case("bench --quick --warmup -1", 2, "--warmup must be an integer >= 0; found -1"),
    "bench_matmul_size_0": Case("bench --quick --matmul-size 0", 2, "--matmul-size must be an integer >= 1; found 0"),
    "bench_cnn": Case("bench --quick --model resnet_mini", 2, "--model 'resnet_mini' is a CNN baseline"),
    "bench_unknown_model": Case("bench --quick --model vit_gigantic", 2, "unknown model 'vit_gigantic'"),
    "bench_memory_batch_size_0": Case(
        "bench --quick --memory --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"
    ),
    # info
    "info_img_size_0": Case("info vit_mini --img-size 0", 2, "--img-size must be an integer >= 1; found 0"),
    "info_heads_5": Case("info vit_mini --heads 5", 2, "dim 64 is not divisible by heads 5"),
}


# ----------------------------------------------------------------------------------------------------
# Round 2: silent wrong data, NaN called success, a run folder's every field, sizes that cannot
# fit, the library's arguments, messages that pointed the wrong way. Helpers first, then the cases.


def _idx_gz(path: Path, data, magic: int) -> None:
    import gzip
    import struct

    path.write_bytes(
        gzip.compress(struct.pack(f">{1 + data.ndim}I", magic, *data.shape) + data.tobytes(), compresslevel=1)
    )


def fake_fashion(folder: Path) -> Path:
    """Four well-formed Fashion-MNIST .gz files of made-up images (stripes) and labels: what a --root holds."""
    import numpy as np

    folder.mkdir(parents=True)
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        images = ((np.arange(n)[:, None, None] + np.arange(28)[None, :, None] * 9) % 256).astype(np.uint8)
        _idx_gz(folder / f"{split}-images-idx3-ubyte.gz", np.broadcast_to(images, (n, 28, 28)).copy(), 2051)
        _idx_gz(folder / f"{split}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8), 2049)
    return folder


def fashion_root(replace: str, kind: str):
    """A --root of `lab/fashion`'s files with one replaced: all-black images, or labels outside 0..9."""
    import numpy as np

    def setup(lab, tmp):
        root = tmp / "root"
        root.mkdir()
        for f in (lab / "fashion").iterdir():
            if not f.name.startswith(replace):
                (root / f.name).symlink_to(f)
        n = 60_000 if replace.startswith("train") else 10_000
        if kind == "black":
            _idx_gz(root / f"{replace}.gz", np.zeros((n, 28, 28), np.uint8), 2051)
        else:
            _idx_gz(root / f"{replace}.gz", np.full(n, 12, np.uint8), 2049)

    return setup


def legacy_fashion_root(lab, tmp):
    """A --root of uncompressed idx files beside torchvision's legacy processed/*.pt files (which torchvision
    reads instead), holding 20 training images and 15 labels."""
    import gzip

    root = tmp / "root"
    root.mkdir()
    for f in (lab / "fashion").iterdir():
        (root / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    processed = root / "_Reader" / "processed"  # torchvision's <root>/<class name>/processed
    processed.mkdir(parents=True)
    images = torch.randint(0, 256, (20, 28, 28), dtype=torch.uint8)
    torch.save((images, torch.arange(15) % 10), processed / "training.pt")
    torch.save((images, torch.arange(20) % 10), processed / "test.pt")


def state_with(**fields):
    """The run's state.pt with some fields replaced (a callable gets the state and returns the new value)."""

    def setup(lab, tmp):
        f = _last_folder(_run_copy(lab, tmp)) / "state.pt"
        state = torch.load(f, weights_only=True)
        for k, v in fields.items():
            state[k] = v(state) if callable(v) else v
        torch.save(state, f)

    return setup


def weights_with(change: Callable[[dict], None], *, cnn: bool = False):
    """The run's (or the CNN checkpoint's) model.safetensors, changed in place."""

    def setup(lab, tmp):
        folder = tmp / "cnn" if cnn else _last_folder(_run_copy(lab, tmp))
        if cnn:
            shutil.copytree(lab / "cnn", folder)
        sd = load_file(folder / "model.safetensors")
        change(sd)
        save_file({k: v.contiguous() for k, v in sd.items()}, folder / "model.safetensors")

    return setup


def config_with(change: Callable[[dict], None], *, cnn: bool = False):
    """The run's (or the CNN checkpoint's) config.json, changed in place."""

    def setup(lab, tmp):
        folder = tmp / "cnn" if cnn else _last_folder(_run_copy(lab, tmp))
        if cnn:
            shutil.copytree(lab / "cnn", folder)
        meta = json.loads((folder / "config.json").read_text())
        change(meta)
        (folder / "config.json").write_text(json.dumps(meta))

    return setup


def _set(d: dict, path: str, value) -> None:
    *keys, last = path.split(".")
    for k in keys:
        d = d[k]
    d[last] = value


def _poison(key: str, value: float):
    def change(sd):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[0] = value

    return change


def bare_timm_file(change: Callable[[dict], None] | None = None):
    """A bare .safetensors in timm's layout (vit_mini's tensors, no config next to it)."""

    def setup(lab, tmp):
        sd = dict(load_file(_last_folder(lab / "run") / "model.safetensors"))
        if change:
            change(sd)
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp / "bare.safetensors")

    return setup


def bare_384_file(lab, tmp):
    """A bare timm-layout file of a ViT at 384 px (random weights, a trained-looking head), no config next to it."""
    torch.manual_seed(0)
    model = create_model("vit_mini", img_size=384, patch_size=32)  # 12 x 12 patches: quick
    with torch.no_grad():
        model.head.weight.normal_()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp / "bare384.safetensors")


def cnn_export(lab, tmp):
    assert main(["export", "--checkpoint", str(lab / "cnn"), "--out", str(tmp / "cnn.safetensors")]) == 0


def overflowing_head(sd):
    """Finite weights whose every logit overflows: the final norm gives 1 everywhere, the head multiplies by 3e38."""
    sd["norm.weight"], sd["norm.bias"] = torch.zeros_like(sd["norm.weight"]), torch.ones_like(sd["norm.bias"])
    sd["head.weight"] = torch.full_like(sd["head.weight"], 3e38)


def leftovers(lab, tmp):
    """What a killed `data digits --out digits` left next to its folder (its process, 999999999, is gone), what
    another process is writing now (this one's id: left alone), and a half file of another name."""
    (tmp / f".digits{TMP_TAG}999999999-abc123" / "train").mkdir(parents=True)
    (tmp / f".digits{TMP_TAG}{os.getpid()}-busy").mkdir()
    (tmp / f".notes.txt{TMP_TAG}999999999-xyz").write_text("half a file")


def ordinary_modes(*paths: str):
    """Everything under `paths` has the permissions the user's umask gives (0644 files, 0755 folders here)."""

    def check(lab, tmp):
        mask = umask()
        for root in paths:
            for p in [tmp / root, *(tmp / root).rglob("*")]:
                want = (0o777 if p.is_dir() else 0o666) & ~mask
                assert p.stat().st_mode & 0o777 == want, (p, oct(p.stat().st_mode & 0o777), oct(want))
        return True

    return check


def warns(monkeypatch, lab, tmp):
    """A library warning while a command runs (as torch's, PIL's, onnxscript's come)."""
    real = flops.info_report

    def report(*a, **k):
        warnings.warn("a library says something", UserWarning, stacklevel=2)
        return real(*a, **k)

    monkeypatch.setattr(flops, "info_report", report)  # `vitlab info` imports it when it runs


def memory_of(gib: int):
    """This machine as one of `gib` GiB (the checks read vitlab.runtime.machine_memory)."""

    def patch(monkeypatch, lab, tmp):
        monkeypatch.setattr(size, "machine_memory", lambda: gib * 2**30)

    return patch


PHOTO_RUN = f"predict {PHOTO} --checkpoint {{tmp}}/run"
RESUME = "train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --fast-path off --resume --out {tmp}/run"
NOT_STATE = "is not a training state vitlab can continue: its"
CASES.update(
    {
        # 1. silent wrong data: a --root is checked before it is read or copied, and never stands in for the dataset
        "data_fashion_root_black_images": Case(
            "data fashion-mnist --root {tmp}/root --train-size 20 --out {tmp}/fm",
            2,
            "{tmp}/root/train-images-idx3-ubyte.gz: every pixel of every image is 0",
            fashion_root("train-images-idx3-ubyte", "black"),
        ),
        "data_fashion_root_labels_12": Case(
            "data fashion-mnist --root {tmp}/root --train-size 20 --out {tmp}/fm",
            2,
            "{tmp}/root/t10k-labels-idx1-ubyte.gz: label 12 at item 0 (10,000 labels outside 0..9)",
            fashion_root("t10k-labels-idx1-ubyte", "labels"),
        ),
        "data_fashion_root_fewer_labels_than_images": Case(
            "data fashion-mnist --root {tmp}/root --train-size 20 --out {tmp}/fm",
            2,
            "the train split has 20 images and 15 labels; Fashion-MNIST's has 60,000 of each",
            legacy_fashion_root,
        ),
        "train_fashion_root_black_test_images": Case(
            "train --dataset fashion-mnist --root {tmp}/root --model vit_mini --out {tmp}/r",
            2,
            "t10k-images-idx3-ubyte.gz: every pixel of every image is 0, so these are not photos",
            fashion_root("t10k-images-idx3-ubyte", "black"),
        ),
        # 2. NaN is not a result: weights refused on load, naming the tensor; a non-finite score is an error
        "predict_nan_weight": Case(
            PHOTO_RUN,
            2,
            "epoch_0001: tensor blocks.0.attn.qkv.weight holds 1 NaN value(s) of 12,288",
            weights_with(_poison("blocks.0.attn.qkv.weight", float("nan"))),
        ),
        "predict_inf_weight": Case(
            PHOTO_RUN,
            2,
            "tensor norm.weight holds 1 infinite value(s) of 64",
            weights_with(_poison("norm.weight", float("inf"))),
        ),
        "predict_bool_weight": Case(
            PHOTO_RUN,
            2,
            "tensor head.bias holds bool values; weights are floating-point numbers",
            weights_with(lambda sd: sd.update({"head.bias": sd["head.bias"] > 0})),
        ),
        "predict_int64_weight": Case(
            PHOTO_RUN,
            2,
            "tensor pos_embed holds int64 values",
            weights_with(lambda sd: sd.update({"pos_embed": sd["pos_embed"].long()})),
        ),
        "predict_bare_file_nan": Case(
            f"predict {PHOTO} --pretrained {{tmp}}/bare.safetensors",
            2,
            "bare.safetensors: tensor cls_token holds 1 NaN value(s)",
            bare_timm_file(_poison("cls_token", float("nan"))),
        ),
        "predict_cnn_nan_weight": Case(
            f"predict {PHOTO} --checkpoint {{tmp}}/cnn",
            2,
            "tensor head.weight holds 1 NaN value(s)",
            weights_with(_poison("head.weight", float("nan")), cnn=True),
        ),
        "predict_json_overflowing_scores": Case(
            f"{PHOTO_RUN} --json",
            2,
            "photo.png: the model's scores for this image are not finite (NaN or infinity)",
            weights_with(overflowing_head),
        ),
        "predict_config_negative_norm_eps": Case(
            PHOTO_RUN,
            2,
            "config.json: norm_eps must be a number > 0; found -1e-06",
            config_with(lambda m: _set(m, "config.norm_eps", -1e-6)),
        ),
        "export_onnx_nan_weight": Case(
            "export --checkpoint {tmp}/run --out {tmp}/m.onnx",
            2,
            "holds 1 NaN value(s)",
            weights_with(_poison("blocks.1.mlp.fc2.bias", float("nan"))),
        ),
        "attention_nan_weight": Case(
            f"attention {PHOTO} --checkpoint {{tmp}}/run --out {{tmp}}/a",
            2,
            "holds 1 NaN value(s)",
            weights_with(_poison("pos_embed", float("nan"))),
        ),
        "finetune_from_nan_weight": Case(
            "finetune --data {lab}/digits --checkpoint {tmp}/run --epochs 1 --freeze-epochs 0 --out {tmp}/ft",
            2,
            "holds 1 infinite value(s)",
            weights_with(_poison("patch_embed.proj.bias", float("-inf"))),
        ),
        # 3. --resume: every field of state.pt checked before anything is restored or written
        "train_resume_epoch_negative": Case(
            RESUME,
            2,
            f"{NOT_STATE} epoch should be a whole number of epochs done, 1 .. 1 (the run's epochs); found -4",
            state_with(epoch=-4),
        ),
        "train_resume_epoch_99_of_1": Case(
            RESUME, 2, f"{NOT_STATE} epoch should be a whole number of epochs done, 1 .. 1", state_with(epoch=99)
        ),
        "train_resume_epoch_text": Case(RESUME, 2, "found 'one'", state_with(epoch="one")),
        "train_resume_epoch_not_last_json": Case(
            RESUME,
            2,
            f"{NOT_STATE} epoch should be 0, the epoch last.json says",
            pointer('{"checkpoint": "checkpoints/epoch_0001", "epoch": 0}'),
        ),
        "train_resume_plan_pieces_1e9": Case(
            RESUME,
            2,
            f"{NOT_STATE} plan should be the fast path the run trained on",
            state_with(plan=lambda s: {**s["plan"], "pieces": 10**9}),
        ),
        "train_resume_plan_compiled_behind_the_summary": Case(
            RESUME,
            2,
            "says the run trained on fused attention, torch's products, compiled [",
            state_with(plan=lambda s: {**s["plan"], "compile": True}),
        ),
        "train_resume_rng_an_int": Case(
            RESUME, 2, f"{NOT_STATE} rng_cpu should be a list; found 5", state_with(rng_cpu=5)
        ),
        "train_resume_rng_wrong_size": Case(
            RESUME,
            2,
            "rng_cpu should be one CPU random-generator state per process",
            state_with(rng_cpu=[torch.zeros(7, dtype=torch.uint8)]),
        ),
        "train_resume_history_without_val_acc": Case(
            RESUME,
            2,
            "history row 1 should be a number for val_acc; found 'nothing'",
            state_with(history=lambda s: [{k: v for k, v in r.items() if k != "val_acc"} for r in s["history"]]),
        ),
        "train_resume_history_short": Case(
            RESUME, 2, "history should be 1 rows of metrics, one per epoch done; found '0 rows'", state_with(history=[])
        ),
        "train_resume_history_nan": Case(
            RESUME,
            2,
            "history row 1 should be a number for train_loss; found nan",
            state_with(history=lambda s: [{**r, "train_loss": float("nan")} for r in s["history"]]),
        ),
        "train_resume_optimizer_a_list": Case(
            RESUME, 2, f"{NOT_STATE} optimizer should be a dict; found a list", state_with(optimizer=[1, 2])
        ),
        "train_resume_optimizer_lr_text": Case(
            RESUME,
            2,
            "optimizer should be AdamW's state_dict",
            state_with(
                optimizer=lambda s: {
                    **s["optimizer"],
                    "param_groups": [{**g, "lr": "fast"} for g in s["optimizer"]["param_groups"]],
                }
            ),
        ),
        "train_resume_scheduler_negative": Case(
            RESUME,
            2,
            "scheduler should be the schedule's state_dict (last_epoch: the optimizer steps taken); found -5",
            state_with(scheduler=lambda s: {**s["scheduler"], "last_epoch": -5}),
        ),
        "train_resume_world_size_lies": Case(
            RESUME,
            2,
            "world_size should be the number of processes that saved it (1 random states); found 4",
            state_with(world_size=4),
        ),
        # 4. sizes and counts: (the sizes that would allocate run in a process of their own: SIZE_CASES below)
        "train_threads_1000": Case(
            "train --data {lab}/digits --model vit_mini --threads 1000 --out {tmp}/r",
            2,
            f"--threads must be an integer in [1, {CPUS}]; found 1000",
        ),
        "bench_threads_1000": Case(
            "bench --quick --threads 1000", 2, f"--threads must be an integer in [1, {CPUS}]; found 1000"
        ),
        "demo_threads_1000": Case(
            "demo --threads 1000 --out {tmp}/demo", 2, f"--threads must be an integer in [0, {CPUS}]"
        ),
        "train_seed_too_large": Case(
            "train --data {lab}/digits --model vit_mini --seed 100000000000000000000 --out {tmp}/r",
            2,
            "--seed must be an integer in [0, 4294967295]; found 100000000000000000000",
        ),
        "demo_seed_too_large": Case(
            "demo --seed 4294967296 --out {tmp}/demo", 2, "--seed must be an integer in [0, 4294967295]"
        ),
        "data_digits_seed_too_large": Case(
            "data digits --seed 99999999999 --out {tmp}/d", 2, "--seed must be an integer in [0, "
        ),
        "data_scan_seed_negative": Case(
            "data scan {lab}/digits --seed -1", 2, "--seed must be an integer in [0, 4294967295]; found -1"
        ),
        "train_batch_larger_than_the_data": Case(
            "train --data {lab}/digits " + " ".join(SMALL[:-4]) + " --batch-size 2048 "
            "--device cpu --fast-path off --no-hflip --out {tmp}/r",
            0,
            "note: batch size 2,048 is more than the 50 training images; training with batch 50, one step per epoch",
            after=lambda lab, tmp: (
                json.loads((tmp / "r/summary.json").read_text())["settings"]["recipe"]["batch_size"] == 50
            ),
        ),
        "train_activations_cannot_fit": Case(
            "train --data {lab}/digits --model vit_mini --img-size 2048 --batch-size 64 --out {tmp}/r",
            2,
            "training vit_mini (dim 64, depth 4, MLP 128, 262,144 patches of "
            "2048x2048 images: 16,915,146 parameters) at batch 50 would need about 173.0 GiB of "
            "memory; this machine has 8.0 GiB",
            patch=memory_of(8),
        ),
        # 5. a run folder's config.json: one schema, checked where it is read, named as the file's field
        "predict_config_mean_a_string": Case(
            PHOTO_RUN,
            2,
            "config.json: pretrained_cfg mean must be a list of 1 to 4 numbers",
            config_with(lambda m: _set(m, "pretrained_cfg.mean", "0.5")),
        ),
        "predict_config_crop_negative": Case(
            PHOTO_RUN,
            2,
            "pretrained_cfg crop_pct must be a number in (0, 1]",
            config_with(lambda m: _set(m, "pretrained_cfg.crop_pct", -0.9)),
        ),
        "predict_config_pretrained_cfg_a_list": Case(
            PHOTO_RUN,
            2,
            "pretrained_cfg must be an object of preprocessing fields; found list",
            config_with(lambda m: _set(m, "pretrained_cfg", [0.5])),
        ),
        "predict_config_config_a_list": Case(
            PHOTO_RUN,
            2,
            '"config" should be an object of vit fields; found list',
            config_with(lambda m: _set(m, "config", [64, 4])),
        ),
        "predict_config_patch_size_text": Case(
            PHOTO_RUN,
            2,
            "config.json: patch_size must be an integer >= 1; found '4'",
            config_with(lambda m: _set(m, "config.patch_size", "4")),
        ),
        "predict_config_interpolation_unknown": Case(
            PHOTO_RUN,
            2,
            "pretrained_cfg interpolation must be one of nearest, bilinear, bicubic, lanczos",
            config_with(lambda m: _set(m, "pretrained_cfg.interpolation", "magic")),
        ),
        "predict_config_future_version": Case(
            PHOTO_RUN,
            2,
            "has version 99; this vitlab reads versions 1..2",
            config_with(lambda m: _set(m, "version", 99)),
        ),
        "predict_head_rows_not_its_config": Case(
            PHOTO_RUN,
            2,
            "its tensors do not match its own config (num_classes: config 10 "
            "vs tensors 7: shape differences (2): head.bias model (10,) vs checkpoint (7,)",
            weights_with(
                lambda sd: sd.update({"head.weight": sd["head.weight"][:7], "head.bias": sd["head.bias"][:7]})
            ),
        ),
        "predict_cnn_config_width_text": Case(
            f"predict {PHOTO} --checkpoint {{tmp}}/cnn",
            2,
            "cnn/config.json: width must be an integer >= 1; found 'wide'",
            config_with(lambda m: _set(m, "config.width", "wide"), cnn=True),
        ),
        "predict_cnn_head_rows_not_its_config": Case(
            f"predict {PHOTO} --checkpoint {{tmp}}/cnn",
            2,
            "its weights do not fit the "
            "resnet_mini model its config describes (16 channels, 1 block(s) per stage, 10 "
            "classes): shape differences (2): head.bias model (10,) vs checkpoint (7,)",
            weights_with(
                lambda sd: sd.update({"head.weight": sd["head.weight"][:7], "head.bias": sd["head.bias"][:7]}), cnn=True
            ),
        ),
        "finetune_config_mean_a_string": Case(
            "finetune --data {lab}/digits --checkpoint {tmp}/run --out {tmp}/ft",
            2,
            "pretrained_cfg std must be a list of 1 to 4 numbers > 0",
            config_with(lambda m: _set(m, "pretrained_cfg.std", [0.5, 0, 0.5])),
        ),
        "export_config_head_state_unknown": Case(
            "export --checkpoint {tmp}/run --out {tmp}/m.safetensors",
            2,
            "pretrained_cfg head must be one of random, loaded",
            config_with(lambda m: _set(m, "pretrained_cfg.head", "maybe")),
        ),
        # 6. every writer through vitlab.fileio's output checks
        "data_fashion_out_under_proc": Case(
            "data fashion-mnist --root {lab}/fashion --out /proc/vitlab/fm",
            2,
            "--out /proc/vitlab/fm cannot be created: cannot write in /proc",
        ),
        "data_fashion_out_is_a_file": Case(
            "data fashion-mnist --root {lab}/fashion --out {lab}/notes.txt", 2, "notes.txt is a file; expected a folder"
        ),
        "data_fashion_out_users_folder": Case(
            "data fashion-mnist --root {lab}/fashion --out {lab}/mine", 2, "already exists and is not empty"
        ),
        "data_fashion_out_under_a_file": Case(
            "data fashion-mnist --root {lab}/fashion --out {lab}/notes.txt/fm", 2, "notes.txt is a file, not a folder"
        ),
        # 7. vitlab serve: the host, what the page may load, the models' memory (all before Gradio starts)
        "serve_host_unresolvable": Case(
            "serve --host no-such-host.invalid --runs {tmp}/runs",
            2,
            "--host 'no-such-host.invalid' is not a host name or address this machine can resolve",
        ),
        "serve_host_not_this_machine": Case(
            "serve --host 192.0.2.1 --runs {tmp}/runs",
            2,
            "--host 192.0.2.1 is not an address of this machine, so nothing can listen on it",
        ),
        "serve_page_load_unknown": Case(
            "serve --page-load everything --runs {tmp}/runs",
            2,
            "--page-load must be a comma list of checkpoint, pretrained, model, or none; found 'everything'",
        ),
        "serve_max_model_memory_1e30": Case(
            "serve --max-model-memory 1e30 --runs {tmp}/runs", 2, "--max-model-memory must be a number in (0, "
        ),
        "serve_max_model_memory_0": Case(
            "serve --max-model-memory 0 --runs {tmp}/runs", 2, "--max-model-memory must be a number in (0, "
        ),
        "serve_model_over_its_memory": Case(
            "serve --model vit_huge_patch14_224 --max-model-memory 1 --runs {tmp}/runs",
            2,
            "--model vit_huge_patch14_224 needs about 4.7 GiB (its weights, and the copy readied "
            "for the top-k), more than the 1.0 GiB this page keeps for models",
        ),
        # 9. messages that pointed the wrong way
        "predict_stray_key_is_one_unexpected_key": Case(
            PHOTO_RUN,
            2,
            "does not load into model 'vit_mini': unexpected keys (1): blocks.71.extra",
            weights_with(lambda sd: sd.update({"blocks.71.extra": torch.zeros(3)})),
        ),
        "predict_damaged_mlp_is_named_not_swiglu": Case(
            PHOTO_RUN,
            2,
            "shape differences (1): blocks.0.mlp.fc1.weight model (128, 64) vs checkpoint (100, 64)",
            weights_with(lambda sd: sd.update({"blocks.0.mlp.fc1.weight": sd["blocks.0.mlp.fc1.weight"][:100]})),
        ),
        "predict_bare_file_stray_key_names_no_model_none": Case(
            f"predict {PHOTO} --pretrained {{tmp}}/bare.safetensors",
            2,
            "does not load into the model its tensors and config describe: unexpected keys (1): pos_embed_extra",
            bare_timm_file(lambda sd: sd.update({"pos_embed_extra": torch.zeros(2)})),
        ),
        "train_smoothing_named_as_its_flag": Case(
            "train --data {lab}/digits --model vit_mini --smoothing 1.5 --out {tmp}/r",
            2,
            "--smoothing must be a number in [0, 1); found 1.5",
        ),
        "attention_start_layer_named_as_its_flag": Case(
            f"attention {PHOTO} --checkpoint {RUN} --method rollout --start-layer 99 --out {{tmp}}/a",
            2,
            "--start-layer 99 does not exist: this model has layers 0..3",
        ),
        "train_class_of_unreadable_files_lists_them": Case(
            "train --data {tmp}/few --model vit_mini --out {tmp}/r",
            2,
            "class folder(s) with no readable image: {tmp}/few/b; add images (.jpg, "
            ".png, ...) or remove the folder (skipped there: junk.png: not an image file",
            lambda lab, tmp: (
                tiny_classes(lab, tmp),
                [p.unlink() for p in (tmp / "few/b").iterdir()],
                (tmp / "few/b/junk.png").write_bytes(b"not a png"),
            ),
        ),
        # 10. a bare weights file: the preprocessing of the models it looks like, said to be inferred
        "predict_bare_384_file_crops_nothing": Case(
            f"predict {PHOTO} --pretrained {{tmp}}/bare384.safetensors",
            0,
            "preprocessing: resize short side to 384 (bicubic), centre-crop 384x384",
            bare_384_file,
        ),
        "predict_cnn_export_reads_back": Case(
            f"predict {PHOTO} --checkpoint {{tmp}}/cnn.safetensors", 0, "photo.png", cnn_export
        ),
        "data_digits_ordinary_permissions_and_no_leftovers": Case(
            "data digits --size 8 --per-class 2 --out {tmp}/digits",
            0,
            "wrote",
            leftovers,
            after=lambda lab, tmp: (
                ordinary_modes("digits")(lab, tmp)
                and [p.name for p in tmp.glob(f".digits{TMP_TAG}*")] == [f".digits{TMP_TAG}{os.getpid()}-busy"]
                and (tmp / f".notes.txt{TMP_TAG}999999999-xyz").exists()
            ),
        ),
        "train_run_folder_ordinary_permissions": Case(
            "train --data {lab}/digits " + " ".join(SMALL) + " --fast-path off --no-hflip --out {tmp}/r",
            0,
            "wrote",
            after=ordinary_modes("r"),
        ),
        "export_ordinary_permissions": Case(
            f"export --checkpoint {RUN} --out {{tmp}}/e/m.safetensors", 0, "wrote", after=ordinary_modes("e")
        ),
        "info_library_warning_is_one_line": Case(
            "info vit_mini", 0, "vit_mini: D=64", patch=warns, stderr="warning: a library says something\n"
        ),
        "info_patch_size_0_named_as_its_flag": Case(
            "info vit_mini --patch-size 0", 2, "--patch-size must be an integer >= 1; found 0"
        ),
    }
)


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """(size, modification time) of every file under `root`: cheap enough for a cache of large files."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")} if root.exists() else {}


def _tree(*roots: Path) -> dict[str, str]:
    """Every file (its checksum), link and folder under `roots`."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                out[os.path.join(dirpath, d)] = "folder"
            for f in filenames:
                p = os.path.join(dirpath, f)
                out[p] = "link" if os.path.islink(p) else hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture(autouse=True)
def no_matmul_probe(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("bench measured before checking its options")

    monkeypatch.setattr(bench, "matmul_rate", refuse)


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name, lab, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    if "/proc/" in case.argv and not Path("/proc/self").exists():
        pytest.skip("the case writes under Linux's /proc, which refuses new files even to root")
    if name == "serve_model_over_its_memory":
        pytest.importorskip("gradio", reason="vitlab serve needs its extra: pip install -e '.[serve]'")
    if case.setup:
        case.setup(lab, tmp_path)
    if case.patch:
        case.patch(monkeypatch, lab, tmp_path)
    monkeypatch.chdir(tmp_path)  # anything written to the working directory is found too
    capsys.readouterr()
    before, cache = _tree(lab, tmp_path), _listing(cache_dir())
    argv = [a.format(lab=lab, tmp=tmp_path) for a in case.argv.split()]
    rc = main(argv)  # a traceback would escape here and fail the test
    out, err = capsys.readouterr()
    after = _tree(lab, tmp_path)
    expect = case.expect.format(lab=lab, tmp=tmp_path)
    assert rc == case.rc, err
    assert "Traceback" not in err
    if case.rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert expect in lines[0]
        assert after == before  # nothing of the user's changed, nothing left behind
        assert _listing(cache_dir()) == cache  # nor a copy of refused data in the shared cache
    else:
        assert "error" not in err
        assert expect in out
        if case.stderr is not None:
            assert err == case.stderr
        changed = [p for p in before if p.startswith(str(lab)) and after.get(p) != before[p]]
        assert not changed and not any(p.startswith(str(lab)) for p in set(after) - set(before))
        if case.after:
            assert case.after(lab, tmp_path)
    assert not (tmp_path / "pwned").exists()  # no pickle ran


def test_the_table_covers_every_command():
    commands = {c.argv.split()[0] for c in CASES.values()}
    assert commands == {
        "predict",
        "train",
        "finetune",
        "demo",
        "reproduce",
        "attention",
        "inspect",
        "export",
        "data",
        "bench",
        "info",
        "serve",
    }
    assert (
        len(CASES) >= 160 and len(SIZE_CASES) >= 10 and len(LIBRARY_CASES) >= 15
    )  # 102 + 60 in the table before round 2


# ----------------------------------------------------------------------------------------------------
# Sizes that cannot fit, and work that could hang: each case runs in a process of its own, forked from one
# that has imported vitlab (a fresh interpreter per case would cost seconds of imports each), so that its
# peak memory is its own (under 1 GB: nothing was allocated for the size refused) and its time is bounded
# by this test's own limit (SIZE_LIMIT_S: a case still running then was hanging, and is killed).

SIZE_LIMIT_S = 120
PEAK_LIMIT = 2**30

SIZE_CASES = {  # the sizes are beyond any machine's memory (terabytes), so every machine refuses them
    "train_img_size_1000000": Case(
        "train --data {lab}/digits --model vit_mini --img-size 1000000 --out {tmp}/r",
        2,
        "model vit_mini (dim 64, depth 4, MLP 128, 62,500,000,000 patches of 1000000x1000000 "
        "images: 4,000,000,137,930 parameters): its weights alone would need about 14.6 TiB",
    ),
    "predict_img_size_1000000": Case(
        f"predict {PHOTO} --checkpoint {RUN} --img-size 1000000",
        2,
        "epoch_0001 (dim 64, depth 4, MLP 128, 62,500,000,000 patches",
    ),
    "attention_img_size_1000000": Case(
        f"attention {PHOTO} --checkpoint {RUN} --img-size 1000000 --out {{tmp}}/a",
        2,
        "its weights alone would need about 14.6 TiB of memory; this machine has",
    ),
    "data_digits_size_100000": Case(
        "data digits --size 100000 --out {tmp}/d",
        2,
        "--size 100000: the 1,797 digits at "
        "100000x100000 pixels would need about 147.1 TiB of memory; this machine has",
    ),
    "bench_matmul_size_1000000": Case(
        "bench --quick --matmul-size 1000000",
        2,
        "--matmul-size 1000000: the 1000000^3 "
        "matrix-product probe (three 1000000 x 1000000 matrices in fp32 and bf16) would need "
        "about 16.4 TiB",
    ),
    "bench_batch_size_1e9": Case(
        "bench --quick --batch-size 1000000000",
        2,
        "running vit_mini_x (dim 32, depth 2, MLP 64, 64 "
        "patches of 32x32 images: 20,898 parameters) on 1,000,000,000 image(s) would need about 49.0 TiB",
    ),
    "info_dim_1e9": Case(
        "info vit_mini --dim 1000000000",
        2,
        "vit_mini (dim 1000000000, depth 4, MLP 128, 64 patches of 32x32 "
        "images: 16,000,001,187,000,000,522 parameters): its weights alone would need about 56843.4 PiB",
    ),
    "info_img_size_1000000": Case("info vit_mini --img-size 1000000", 2, "its weights alone would need about 14.6 TiB"),
    "info_depth_100000_answers": Case("info vit_mini --depth 100000", 0, "vit_mini: D=64 L=100000 h=4"),
    "predict_cnn_config_width_1e7": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/cnn",
        2,
        "the model of checkpoint {tmp}/cnn (width 10000000, 1 block(s) per stage",
        config_with(lambda m: _set(m, "config.width", 10**7), cnn=True),
    ),
    "predict_cnn_config_depth_1e8": Case(
        f"predict {PHOTO} --checkpoint {{tmp}}/cnn",
        2,
        "(width 16, 100000000 block(s) per "
        "stage, 32x32 images: 9,721,599,980,826 parameters): its weights alone would need about 35.4 TiB",
        config_with(lambda m: _set(m, "config.blocks", 10**8), cnn=True),
    ),
    "library_create_model_dim_1e9": Case(
        "py:vitlab.create_model('vit_mini', dim=10**9)", 2, "model vit_mini (dim 1000000000, depth 4, MLP 128"
    ),
    "library_vit_config_depth_1e9": Case(
        "py:vitlab.create_model('vit_base_patch16_224', depth=10**9)", 2, "its weights alone would need about"
    ),
}

SIZE_FORKER = """
import io, json, os, sys, time, traceback
import torch
import vitlab
from vitlab.cli.commands import main
from vitlab.errors import VitlabError
torch.set_num_threads(1)

def run_case(argv):
    if argv[0].startswith("py:"):  # a library call: a VitlabError is printed as the command line prints it
        try:
            exec(" ".join(argv)[3:], {"vitlab": vitlab})
            return 0
        except VitlabError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return main(argv)

for line in sys.stdin:  # one case a line: fork a process that runs it, wait (bounded), report how it ended
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(req["cwd"])
        sys.stdout, sys.stderr = open(req["out"], "w"), open(req["err"], "w")
        try:
            rc = run_case(req["argv"])
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(rc)
    deadline, status, usage = time.monotonic() + float(sys.argv[1]), None, None
    while time.monotonic() < deadline:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        _, status, usage = os.wait4(pid, 0)
        status = None
    rc = None if status is None else os.waitstatus_to_exitcode(status)
    print(json.dumps({"rc": rc, "peak": usage.ru_maxrss * 1024}), flush=True)
"""


@pytest.fixture(scope="module")
def forker():
    """A process that has imported vitlab and forks one child per case; yields run(argv, cwd, out, err)."""
    if not hasattr(os, "fork"):
        pytest.skip("the cases are forked from one process (POSIX only)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(vitlab.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", SIZE_FORKER, str(SIZE_LIMIT_S)],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    def run(argv: list[str], cwd: Path, out: Path, err: Path) -> dict:
        proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "out": str(out), "err": str(err)}) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        yield run
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("name", list(SIZE_CASES))
def test_sizes_that_cannot_fit_are_refused_before_anything_is_allocated(name, lab, forker, tmp_path, tmp_path_factory):
    case = SIZE_CASES[name]
    work = tmp_path / "case"
    work.mkdir()
    if case.setup:
        case.setup(lab, work)
    logs = tmp_path_factory.mktemp("logs")
    before = _tree(lab, work)
    argv = [case.argv] if case.argv.startswith("py:") else [a.format(lab=lab, tmp=work) for a in case.argv.split()]
    result = forker(argv, work, logs / "out", logs / "err")
    out, err = (logs / "out").read_text(), (logs / "err").read_text()
    assert result["rc"] is not None, f"still running after {SIZE_LIMIT_S} s: killed (a hang)"
    assert result["rc"] == case.rc, err
    assert "Traceback" not in err
    assert result["peak"] < PEAK_LIMIT, f"peak memory {result['peak'] / 2**30:.2f} GiB"  # no allocation was attempted
    expect = case.expect.format(lab=lab, tmp=work)
    if case.rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], err
        assert _tree(lab, work) == before  # nothing written, nothing changed
    else:
        assert expect in out and not err.strip(), err


# ----------------------------------------------------------------------------------------------------
# The library checks its arguments like the command line: a VitlabError naming the argument, never a deep
# torch error, and nothing written


def _store(**kwargs):
    return ModelStore(device="cpu", fast_path="off", **kwargs)


def _fit(train, val, recipe=None):
    model = create_model("vit_mini", img_size=16)
    return fit(model, train, val, recipe or RECIPES["mini"].replace(epochs=1), device="cpu", fast_path="off")


def _loader(n: int, **kwargs):
    return TensorLoader(torch.zeros(n, 3, 16, 16), torch.zeros(n, dtype=torch.long), batch_size=4, **kwargs)


LIBRARY_CASES = {  # name: (a call that must refuse, the message's part)
    "create_model_patch_size_0": (
        lambda lab: create_model("vit_mini", patch_size=0),
        "patch_size must be an integer >= 1; found 0",
    ),
    "create_model_patch_size_text": (
        lambda lab: create_model("vit_mini", patch_size="4"),
        "patch_size must be an integer >= 1; found '4'",
    ),
    "create_model_mlp_dim_negative": (
        lambda lab: create_model("vit_mini", mlp_dim=-5),
        "mlp_dim must be an integer >= 1; found -5",
    ),
    "create_model_norm_eps_negative": (
        lambda lab: create_model("vit_mini", norm_eps=-1.0),
        "norm_eps must be a number > 0; found -1.0",
    ),
    "create_model_dim_a_bool": (
        lambda lab: create_model("vit_mini", dim=True),
        "dim must be an integer >= 1; found True",
    ),
    "create_model_pool_a_list": (
        lambda lab: create_model("vit_mini", pool=["cls"]),
        "pool must be one of cls, mean, cls+mean; found ['cls']",
    ),
    "create_model_dropout_text": (
        lambda lab: create_model("vit_mini", dropout="a lot"),
        "dropout must be a number in [0, 1); found 'a lot'",
    ),
    "create_model_nan_checkpoint": (
        lambda lab: create_model(checkpoint=_nan_run(lab)),
        "tensor blocks.2.norm1.weight holds 1 NaN value(s) of 64",
    ),
    "model_on_an_unbatched_image": (
        lambda lab: create_model("vit_mini")(torch.zeros(3, 32, 32)),
        "the model takes a batch of images, a tensor (B, 3, H, W); found a tensor of shape (3, 32, 32) "
        "(one image: add the batch axis, x[None])",
    ),
    "model_on_a_grey_image": (
        lambda lab: create_model("vit_mini")(torch.zeros(2, 1, 32, 32)),
        "found a tensor of shape (2, 1, 32, 32)",
    ),
    "cnn_on_a_grey_image": (
        lambda lab: create_model("resnet_mini")(torch.zeros(2, 1, 32, 32)),
        "(B, 3, H, W); found a tensor of shape (2, 1, 32, 32)",
    ),
    "model_on_uint8_pixels": (
        lambda lab: create_model("vit_mini")(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)),
        "the model takes float images",
    ),
    "recipe_unfreeze_an_int": (
        lambda lab: Recipe(unfreeze=5),
        "unfreeze must be all, head or last:N (N >= 1 blocks); found 5",
    ),
    "recipe_augment_text": (
        lambda lab: Recipe(augment="yes"),
        "augment must be True, False or None (by the run's length); found 'yes'",
    ),
    "recipe_seed_beyond_torch": (
        lambda lab: Recipe(seed=2**64),
        "seed must be an integer in [0, 4294967295]; found 18446744073709551616",
    ),
    "fit_empty_train_loader": (
        lambda lab: _fit(_loader(0), _loader(4)),
        "train_loader has no batches: no images to train on",
    ),
    "fit_empty_val_loader": (lambda lab: _fit(_loader(4), []), "val_loader has no batches: nothing to validate on"),
    "fit_a_loader_without_length": (
        lambda lab: _fit(iter(_loader(4)), _loader(4)),
        "train_loader must be an iterable of (images, labels) batches with a length",
    ),
    "fit_recipe_a_dict": (
        lambda lab: _fit(_loader(4), _loader(4), {"epochs": 1}),
        "recipe must be a vitlab.train.Recipe",
    ),
    "pretrained_cfg_mean_text": (
        lambda lab: PretrainedCfg(mean="0.5"),
        "pretrained_cfg mean must be a list of 1 to 4 numbers",
    ),
    "serve_store_refuses_a_kind": (
        lambda lab: _store(loadable=("checkpoint",)).request("model", "vit_huge_patch14_224"),
        "this page does not load models given by --model (it was started with --page-load checkpoint: --checkpoint)",
    ),
    "serve_store_refuses_a_model_over_its_memory": (
        lambda lab: _store(memory_limit=100 * 2**20).request("model", "vit_base_patch16_224"),
        "--model vit_base_patch16_224 needs about 660.5 MiB (its weights, and the "
        "copy readied for the top-k), more than the 100.0 MiB",
    ),
}


def _nan_run(lab: Path) -> Path:
    folder = lab.parent / "nan_run"  # outside lab: lab is checked unchanged
    if not folder.exists():
        shutil.copytree(_last_folder(lab / "run"), folder)
        sd = load_file(folder / "model.safetensors")
        _poison("blocks.2.norm1.weight", float("nan"))(sd)
        save_file(sd, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("name", list(LIBRARY_CASES))
def test_the_library_refuses_bad_arguments_in_one_message(name, lab, tmp_path, monkeypatch):
    call, expect = LIBRARY_CASES[name]
    monkeypatch.chdir(tmp_path)
    before = _tree(lab, tmp_path)
    with pytest.raises(VitlabError) as refused:  # a VitlabError, not a TypeError from deep inside torch
        call(lab)
    assert expect in str(refused.value) and "\n" not in str(refused.value)
    assert _tree(lab, tmp_path) == before


def test_ctrl_c_while_vitlab_starts_is_one_line():
    """SIGINT while `python -m vitlab` imports torch (a fixed delay was not enough on a loaded machine: the
    signal could land before Python had started): one line, exit 130. The child starts with SIGINT's default
    disposition, as from a terminal: a process that ignores SIGINT (an earlier test in this pytest worker can
    leave it so) passes that on, and Python then never raises KeyboardInterrupt. On a loaded machine the signal
    can still land after the command has done its work (exit 0, its output complete): that try tested nothing,
    and the test tries again, up to five times."""
    env = {**os.environ, "PYTHONPATH": str(Path(vitlab.__file__).parents[1])}
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "vitlab", "info", "vit_base_patch16_224"],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 120
        if maps.exists():  # wait until torch's library is loaded: Python's handler is in place, imports under way
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):  # the process may end between the poll and the read
                    if "libtorch" in maps.read_text():
                        break
                time.sleep(0.01)
        else:
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0 and "vit_base_patch16_224" in out:
            continue  # the command had finished before the signal came: nothing was interrupted
        assert proc.returncode == 130, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: interrupted"), err
        return
    pytest.fail("in five tries the signal never landed while vitlab was starting (the machine is too loaded)")


# ----------------------------------------------------------------------------------------------------
# A disk that fills up mid-run


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for one checkpoint of the run below, not two."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command to make a small tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root outside a locked-down container): {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write until the disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_full_disk_mid_run_stops_in_one_line_and_the_run_resumes(lab, small_disk, capsys):
    run = small_disk / "run"
    args = ["train", "--data", str(lab / "digits"), *SMALL, "--epochs", "3", "--no-hflip", "--out", str(run)]
    capsys.readouterr()
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training stopped at epoch 2: could not write"), lines
    assert "no space left on the disk" in lines[0]
    assert f"{run / 'last.json'} still points at checkpoints/epoch_0001, the last complete checkpoint" in lines[0]
    folder = ckpt.resolve_checkpoint(run)
    assert folder.name == "epoch_0001" and ckpt.read_state(folder)["epoch"] == 1 and ckpt.read_weights(folder)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch_0001"]  # no half-written folder

    # a full disk in the other commands that write: one line, nothing half-written
    _fill(small_disk / "filler")
    before = _tree(small_disk)
    for argv in (
        ["export", "--checkpoint", str(lab / "run"), "--out", str(small_disk / "m.safetensors")],
        ["data", "digits", "--size", "16", "--per-class", "4", "--out", str(small_disk / "digits")],
        [
            "data",
            "fashion-mnist",
            "--root",
            str(lab / "fashion"),
            "--train-size",
            "20",
            "--out",
            str(small_disk / "fm"),
        ],
    ):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert (
            len(lines) == 1
            and lines[0].startswith("error: could not write")
            and "no space left on the disk" in lines[0]
        )
        assert _tree(small_disk) == before
    (small_disk / "filler").unlink()

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # the user makes room
    assert main([*args, "--resume"]) == 0
    assert ckpt.read_pointer(run / "last.json")["epoch"] == 3 and (run / "summary.json").is_file()


# ----------------------------------------------------------------------------------------------------
# kill -9 during checkpoint writes

TINY_FIT = """
import sys, torch
from vitlab import bench, create_model
from vitlab.train import RECIPES
from vitlab.train.engine import TensorLoader, fit

def tiny_fit(out, epochs, resume=False):
    torch.set_num_threads(1)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(16) % 2
    torch.manual_seed(0)
    model = create_model("vit_mini", img_size=8, num_classes=2, dim=16, depth=1, heads=2, mlp_dim=32)
    recipe = RECIPES["mini"].replace(epochs=epochs, batch_size=8, seed=0)
    fit(model, TensorLoader(x, y, batch_size=8, shuffle=True), TensorLoader(x, y, batch_size=16), recipe,
        device="cpu", out=out, resume=resume)
    return model
"""  # run here and, killed, in a child process: one source


def _tiny_fit(out, epochs: int, *, resume: bool = False):
    namespace: dict = {}
    exec(TINY_FIT, namespace)
    return namespace["tiny_fit"](out, epochs, resume)


FORKER = """
import os
torch.set_num_threads(1)
for line in sys.stdin:  # one run folder per try: fork a process that trains into it, report its pid
    pid = os.fork()
    if pid == 0:
        tiny_fit(line.strip(), int(sys.argv[1]))
        os._exit(0)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def _wait_for_a_write(folder: Path, *, skip: int, timeout: float = 5.0) -> None:
    """Return as a checkpoint write starts (its temporary folder appears), after letting `skip` go by."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        writing = [n for n in os.listdir(folder) if n.startswith(".")]
        if writing and writing[0] != seen:
            seen = writing[0]
            if skip == 0:
                return
            skip -= 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the tries are forked from one process (POSIX only)")
def test_kill_9_during_checkpoint_writes_then_resume(tmp_path):
    """Each try kills the run a random few milliseconds after one of its checkpoint writes starts.
    Whatever the kill cuts, last.json names a complete checkpoint, and resuming ends bitwise where an
    uninterrupted run ends. One process imports torch once and forks each try (a fresh interpreter per
    try would cost seconds of imports each); the kill is a real SIGKILL of a real process."""
    epochs = 40
    reference = _tiny_fit(None, epochs).state_dict()  # uninterrupted (and unsaved: saving changes no number)
    rng = random.Random(16)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(vitlab.__file__).parents[1])}
    forker = subprocess.Popen(
        [sys.executable, "-c", TINY_FIT + FORKER, str(epochs)],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        for attempt in range(3):
            run = tmp_path / f"killed{attempt}"
            forker.stdin.write(f"{run}\n")
            forker.stdin.flush()
            pid = int(forker.stdout.readline())
            deadline = time.monotonic() + 120
            while not (run / "last.json").exists():
                assert forker.poll() is None and time.monotonic() < deadline, "no checkpoint within 2 minutes"
                time.sleep(0.005)
            _wait_for_a_write(run / "checkpoints", skip=rng.randrange(4))
            time.sleep(rng.uniform(0.0, 0.004))  # somewhere in the write: weights, config, state, rename, pointer
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it finished first
                pass
            assert forker.stdout.readline().strip() == "reaped"
            folder = ckpt.resolve_checkpoint(run)  # complete, whatever moment the kill came
            state = ckpt.read_state(folder)
            assert ckpt.read_weights(folder) and ckpt.read_meta(folder)["kind"] == "vit"
            assert state["epoch"] == ckpt.read_pointer(run / "last.json")["epoch"]
            if state["epoch"] < epochs:
                resumed = _tiny_fit(run, epochs, resume=True)
                assert all(torch.equal(resumed.state_dict()[k], v) for k, v in reference.items())
            assert ckpt.read_pointer(run / "last.json")["epoch"] == epochs
            assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no torn folder left
    finally:
        forker.stdin.close()
        forker.kill()
        forker.wait()
