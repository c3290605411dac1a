"""Hostile input and faults, over every command: each refusal is one line `error: ...` (exit 2) that says
what was expected, no traceback, no file of the user's changed (checksums before and after), and
nothing left behind (not even an empty folder). A table of cases run in-process, then the faults a
table cannot hold: a disk that fills up mid-run (a real tmpfs) and kill -9 during checkpoint writes
(a real process), each followed by a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import vitlab
from vitlab import bench, create_model
from vitlab.cli import main
from vitlab.data.digits import write_digits_folder
from vitlab.runtime import available_cpus
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
    sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"] = sd["patch_embed.proj.weight"][:7], sd["patch_embed.proj.bias"][:7]
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
    assert main(["attention", str(lab / "photo.png"), "--checkpoint", str(lab / "run"), "--out", str(tmp / "attn")]) == 0


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


RUN, PHOTO = "{lab}/run", "{lab}/photo.png"
CASES = {
    # predict: options, hub ids, run metadata, images
    "predict_img_size_0": Case(f"predict {PHOTO} --checkpoint {RUN} --img-size 0", 2, "--img-size must be an integer >= 1; found 0"),
    "predict_img_size_negative": Case(f"predict {PHOTO} --checkpoint {RUN} --img-size -3", 2, "--img-size must be an integer >= 1; found -3"),
    "predict_topk_0": Case(f"predict {PHOTO} --checkpoint {RUN} --topk 0", 2, "--topk must be an integer >= 1; found 0"),
    "predict_batch_size_0": Case(f"predict {PHOTO} --checkpoint {RUN} --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"),
    "predict_device_unknown": Case(f"predict {PHOTO} --checkpoint {RUN} --device banana", 2, "--device 'banana' is not a device; expected auto, cpu"),
    "predict_hub_id_path": Case(f"predict {PHOTO} --pretrained hf-hub:../../etc/passwd", 2, "hub id '../../etc/passwd' is not a Hugging Face repository name"),
    "predict_hub_id_empty": Case(f"predict {PHOTO} --pretrained hf-hub:", 2, "hub id '' is not a Hugging Face repository name"),
    "predict_no_weights": Case(f"predict {PHOTO} --model vit_mini", 2, "give the weights with --pretrained"),
    "predict_missing_checkpoint": Case(f"predict {PHOTO} --checkpoint {{tmp}}/nothing", 2, "nothing does not exist: expected a checkpoint folder"),
    "predict_pointer_not_json": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "last.json is not readable JSON", pointer("{oops")),
    "predict_pointer_a_list": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "should be a JSON object whose \"checkpoint\" names a folder inside the run", pointer("[1, 2]")),
    "predict_pointer_escapes": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "names a folder inside the run", pointer('{"checkpoint": "../../etc", "epoch": 1}')),
    "predict_pointer_epoch_text": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run/last.json", 2, "should give \"epoch\" as a whole number >= 0; found 'one'", pointer('{"checkpoint": "checkpoints/epoch_0001", "epoch": "one"}')),
    "predict_config_unknown_kind": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "has model kind 'alien'; expected one of vit, resnet_mini", meta_kind),
    "predict_config_unknown_kind_as_pretrained": Case(f"predict {PHOTO} --pretrained {{tmp}}/run/checkpoints/epoch_0001", 2, "has model kind 'alien'", meta_kind),
    "predict_export_json_unknown_kind": Case(f"predict {PHOTO} --checkpoint {{tmp}}/m.safetensors", 2, "m.json has model kind 'alien'", export_kind),
    "predict_config_not_json": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "config.json is not readable JSON", meta_not_json),
    "predict_weights_truncated": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "could not read weights file {tmp}/run/checkpoints/epoch_0001/model.safetensors", weights_truncated),
    "predict_patch_embedding_7_rows": Case(f"predict {PHOTO} --checkpoint {{tmp}}/run", 2, "does not fit vit_mini: shape differences (2): patch_embed.proj.bias model (64,) vs checkpoint (7,); patch_embed.proj.weight model (64, 3, 4, 4) vs checkpoint (7, 3, 4, 4)", patch_embed_rows),
    "predict_malicious_pth": Case(f"predict {PHOTO} --pretrained {{tmp}}/weights.pth", 2, "refused to load", evil_pth),
    "predict_symlink_loop": Case(f"predict {{tmp}}/loop.png --checkpoint {RUN}", 2, "loop.png: a loop of symbolic links", image_links),
    "predict_dangling_link": Case(f"predict {{tmp}}/gone.png --checkpoint {RUN}", 2, "gone.png: a symbolic link to nowhere.png, which does not exist", image_links),
    "predict_not_an_image": Case(f"predict {{tmp}}/junk.png --checkpoint {RUN}", 2, "junk.png: not an image file PIL can read", image_links),
    "predict_unreadable": Case(f"predict {PHOTO} --checkpoint {RUN}", 2, "photo.png: cannot be read (permission denied)", patch=unreadable),
    "predict_works": Case(f"predict {PHOTO} --checkpoint {RUN} --topk 2", 0, "photo.png"),
    # train and finetune: options, the run folder, image folders, resume from damaged state
    "train_lr_negative": Case("train --data {lab}/digits --model vit_mini --lr -0.1 --out {tmp}/r", 2, "--lr must be a number > 0; found -0.1"),
    "train_epochs_0": Case("train --data {lab}/digits --model vit_mini --epochs 0 --out {tmp}/r", 2, "--epochs must be an integer >= 1; found 0"),
    "train_batch_size_0": Case("train --data {lab}/digits --model vit_mini --batch-size 0 --out {tmp}/r", 2, "--batch-size must be an integer >= 1; found 0"),
    "train_img_size_0": Case("train --data {lab}/digits --model vit_mini --img-size 0 --out {tmp}/r", 2, "--img-size must be an integer >= 1; found 0"),
    "train_val_split_1_5": Case("train --data {tmp}/few --model vit_mini --val-split 1.5 --out {tmp}/r", 2, "--val-split must be a number in (0, 1); found 1.5", tiny_classes),
    "train_ema_1_5": Case("train --data {lab}/digits --model vit_mini --ema 1.5 --out {tmp}/r", 2, "--ema must be a number in (0, 1); found 1.5"),
    "train_threads_0": Case("train --data {lab}/digits --model vit_mini --threads 0 --out {tmp}/r", 2, f"--threads must be an integer in [1, {CPUS}]; found 0 (this machine lets vitlab use {CPUS} CPU"),
    "train_workers_negative": Case("train --data {lab}/digits --model vit_mini --workers -1 --out {tmp}/r", 2, "--workers must be an integer >= 0; found -1"),
    "train_out_is_a_file": Case("train --data {lab}/digits --model vit_mini --out {lab}/notes.txt", 2, "notes.txt is a file; expected a folder"),
    "train_out_under_proc": Case("train --data {lab}/digits --model vit_mini --out /proc/vitlab/run", 2, "--out /proc/vitlab/run cannot be created: cannot write in /proc"),
    "train_out_under_a_file": Case("train --data {lab}/digits --model vit_mini --out {lab}/notes.txt/run", 2, "notes.txt is a file, not a folder"),
    "train_out_users_folder": Case("train --data {lab}/digits --model vit_mini --out {lab}/mine", 2, "already holds files vitlab did not write (metrics.csv, summary.json); choose a new folder, or pass --force"),
    "train_relative_paths_into_users_folder_forced": Case("train --data digits " + " ".join(SMALL) + " --out mine --force", 0,
                                                          "wrote mine/", user_folder,
                                                          after=lambda lab, tmp: (tmp / "mine/last.json").is_file()),
    "train_out_holds_a_run": Case("train --data {lab}/digits --model vit_mini --out {lab}/run", 2, "already holds a run (last.json); resume it (--resume), or choose a new folder"),
    "train_resume_nothing": Case("train --data {lab}/digits --model vit_mini --resume --out {tmp}/new", 2, "--resume: no checkpoint to resume from"),
    "train_resume_pointer_not_json": Case("train --data {lab}/digits " + " ".join(SMALL) + " --resume --out {tmp}/run", 2, "last.json is not readable JSON", pointer("not json")),
    "train_resume_state_truncated": Case("train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run", 2, "state.pt is truncated or not a training state", state_truncated),
    "train_resume_state_pickle": Case("train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run", 2, "refused", state_evil),
    "train_resume_state_incomplete": Case("train --data {lab}/digits " + " ".join(SMALL) + " --no-hflip --resume --out {tmp}/run", 2, "is not a complete training state (it lacks optimizer, scheduler, rng_cpu, history, recipe)", state_incomplete),
    "train_data_missing": Case("train --data {tmp}/nothing --model vit_mini --out {tmp}/r", 2, "--data {tmp}/nothing: no such folder"),
    "train_data_is_a_file": Case("train --data {lab}/notes.txt --model vit_mini --out {tmp}/r", 2, "is a file; expected a folder of class sub-folders"),
    "train_file_in_two_classes": Case("train --data {tmp}/loop --model vit_mini --out {tmp}/r", 2, "1 file(s) are in two class folders", same_file_two_classes),
    "train_file_in_train_and_val": Case("train --data {tmp}/leak --model vit_mini --out {tmp}/r", 2, "1 file(s) are in both train/ and val/", train_val_leak),
    "train_val_split_starves_a_class": Case("train --data {tmp}/few --model vit_mini --val-split 0.9 --out {tmp}/r", 2, "--val-split 0.9 would send every image of class(es) a (2 images), b (2 images) to validation", tiny_classes),
    "finetune_unknown_kind": Case("finetune --data {lab}/digits --checkpoint {tmp}/run --out {tmp}/ft", 2, "has model kind 'alien'", meta_kind),
    "finetune_freeze_past_epochs": Case("finetune --data {lab}/digits --model vit_mini --epochs 1 --out {tmp}/ft", 2, "--freeze-epochs must be an integer in [0, 1]; found 2"),
    "finetune_unfreeze_bogus": Case("finetune --data {lab}/digits --model vit_mini --unfreeze some --out {tmp}/ft", 2, "--unfreeze must be all, head or last:N"),
    # demo
    "demo_epochs_0": Case("demo --epochs 0 --out {tmp}/demo", 2, "--epochs must be an integer in [1, 10000]; found 0"),
    "demo_seed_negative": Case("demo --seed -1 --out {tmp}/demo", 2, "--seed must be an integer in [0, 4294967295]; found -1"),
    "demo_threads_negative": Case("demo --threads -1 --out {tmp}/demo", 2, f"--threads must be an integer in [0, {CPUS}]; found -1"),
    "demo_out_is_a_file": Case("demo --out {lab}/notes.txt", 2, "notes.txt is a file; expected a folder"),
    "demo_out_under_proc": Case("demo --out /proc/vitlab", 2, "cannot be created: cannot write in /proc"),
    "demo_out_users_folder": Case("demo --epochs 1 --out {lab}/mine", 2, "already holds files vitlab did not write (metrics.csv, summary.json)"),
    # reproduce
    "reproduce_seeds_0": Case("reproduce --quick --seeds 0 --out {tmp}/rep", 2, "--seeds must be an integer >= 1; found 0"),
    "reproduce_workers_0": Case("reproduce --quick --workers 0 --out {tmp}/rep", 2, "--workers must be an integer >= 1; found 0"),
    "reproduce_only_unknown": Case("reproduce --quick --only bogus --out {tmp}/rep", 2, "--only: unknown experiment 'bogus'"),
    "reproduce_out_is_a_file": Case("reproduce --quick --out {lab}/notes.txt", 2, "notes.txt is a file"),
    "reproduce_out_users_folder": Case("reproduce --quick --out {lab}/mine", 2, "already holds files vitlab did not write"),
    "reproduce_out_under_proc": Case("reproduce --quick --out /proc/vitlab", 2, "cannot write in /proc"),
    # attention and inspect
    "attention_cnn_model": Case(f"attention {PHOTO} --model resnet_mini --out {{tmp}}/a", 2, "resnet_mini is a CNN baseline, which has no attention layers"),
    "attention_cnn_checkpoint": Case(f"attention {PHOTO} --checkpoint {{lab}}/cnn --out {{tmp}}/a", 2, "resnet_mini is a CNN baseline, which has no attention layers"),
    "attention_alpha_2": Case(f"attention {PHOTO} --checkpoint {RUN} --alpha 2 --out {{tmp}}/a", 2, "--alpha must be a number in [0, 1]; found 2.0"),
    "attention_discard_ratio_1": Case(f"attention {PHOTO} --checkpoint {RUN} --method rollout --discard-ratio 1 --out {{tmp}}/a", 2, "--discard-ratio must be a number in [0, 1); found 1.0"),
    "attention_layer_99": Case(f"attention {PHOTO} --checkpoint {RUN} --layer 99 --out {{tmp}}/a", 2, "--layer 99 does not exist: this model has layers 0..3"),
    "attention_head_99": Case(f"attention {PHOTO} --checkpoint {RUN} --head 99 --out {{tmp}}/a", 2, "--head 99 does not exist: this model has heads 0..3"),
    "attention_img_size_0": Case(f"attention {PHOTO} --checkpoint {RUN} --img-size 0 --out {{tmp}}/a", 2, "--img-size must be an integer >= 1; found 0"),
    "attention_out_is_a_file": Case(f"attention {PHOTO} --checkpoint {RUN} --out {{lab}}/notes.txt", 2, "notes.txt is a file"),
    "attention_out_users_folder": Case(f"attention {PHOTO} --checkpoint {RUN} --out {{lab}}/mine", 2, "already holds files vitlab did not write"),
    "attention_again_into_its_folder": Case(f"attention {PHOTO} --checkpoint {RUN} --out {{tmp}}/attn", 0, "wrote", attention_folder),
    "inspect_into_attention_folder": Case(f"inspect --checkpoint {RUN} --out {{tmp}}/attn", 2, "already holds the output of another vitlab command (attention)", attention_folder),
    "inspect_cnn_model": Case("inspect --model resnet_mini --out {tmp}/i", 2, "resnet_mini is a CNN baseline"),
    "inspect_max_images_0": Case(f"inspect --checkpoint {RUN} --max-images 0 --out {{tmp}}/i", 2, "--max-images must be an integer >= 1; found 0"),
    "inspect_batch_size_0": Case(f"inspect --checkpoint {RUN} --batch-size 0 --out {{tmp}}/i", 2, "--batch-size must be an integer >= 1; found 0"),
    "inspect_out_under_proc": Case(f"inspect --checkpoint {RUN} --out /proc/vitlab", 2, "cannot write in /proc"),
    # export
    "export_existing_file": Case(f"export --checkpoint {RUN} --out {{tmp}}/m.safetensors", 2, "m.safetensors and {tmp}/m.json already exist; choose another name, or pass --force to replace", existing_export),
    "export_existing_file_forced": Case(f"export --checkpoint {RUN} --out {{tmp}}/m.safetensors --force", 0, "wrote", existing_export,
                                        after=lambda lab, tmp: len(load_file(tmp / "m.safetensors")) > 10),
    "export_unknown_suffix": Case(f"export --checkpoint {RUN} --out {{tmp}}/m.txt", 2, "unknown export format '.txt'"),
    "export_out_is_a_folder": Case(f"export --checkpoint {RUN} --out {{tmp}}/m.onnx", 2, "m.onnx is a folder; expected a file name",
                                   lambda lab, tmp: (tmp / "m.onnx").mkdir()),
    "export_out_under_proc": Case(f"export --checkpoint {RUN} --out /proc/m.safetensors", 2, "--out /proc/m.safetensors cannot be written: cannot write in /proc"),
    "export_out_under_a_file": Case(f"export --checkpoint {RUN} --out {{lab}}/notes.txt/m.onnx", 2, "notes.txt is a file, not a folder"),
    "export_opset_0": Case(f"export --checkpoint {RUN} --opset 0 --out {{tmp}}/m.onnx", 2, "--opset must be an integer >= 17; found 0"),
    # data
    "data_digits_into_users_folder": Case("data digits --out {lab}/mine", 2, "already exists and is not empty"),
    "data_digits_out_under_proc": Case("data digits --out /proc/digits", 2, "cannot write in /proc"),
    "data_digits_size_0": Case("data digits --size 0 --out {tmp}/d", 2, "--size must be an integer >= 8; found 0"),
    "data_digits_val_split_2": Case("data digits --val-split 2 --out {tmp}/d", 2, "--val-split must be a number in (0, 1); found 2.0"),
    "data_digits_per_class_1": Case("data digits --per-class 1 --out {tmp}/d", 2, "--per-class must be an integer >= 2; found 1"),
    "data_scan_missing": Case("data scan {tmp}/nothing", 2, "no such folder"),
    "data_scan_symlink_loop": Case("data scan {tmp}/loop", 0, "2 classes, 8 train / 2 val images", folder_loop),
    # bench: refused before the matmul probes (they fail the test if they run)
    "bench_batch_size_0": Case("bench --quick --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"),
    "bench_repeats_0": Case("bench --quick --repeats 0", 2, "--repeats must be an integer >= 1; found 0"),
    "bench_warmup_negative": Case("bench --quick --warmup -1", 2, "--warmup must be an integer >= 0; found -1"),
    "bench_matmul_size_0": Case("bench --quick --matmul-size 0", 2, "--matmul-size must be an integer >= 1; found 0"),
    "bench_cnn": Case("bench --quick --model resnet_mini", 2, "--model 'resnet_mini' is a CNN baseline"),
    "bench_unknown_model": Case("bench --quick --model vit_gigantic", 2, "unknown model 'vit_gigantic'"),
    "bench_memory_batch_size_0": Case("bench --quick --memory --batch-size 0", 2, "--batch-size must be an integer >= 1; found 0"),
    # info
    "info_img_size_0": Case("info vit_mini --img-size 0", 2, "--img-size must be an integer >= 1; found 0"),
    "info_heads_5": Case("info vit_mini --heads 5", 2, "dim 64 is not divisible by heads 5"),
}


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
    if case.setup:
        case.setup(lab, tmp_path)
    if case.patch:
        case.patch(monkeypatch, lab, tmp_path)
    monkeypatch.chdir(tmp_path)  # anything written to the working directory is found too
    capsys.readouterr()
    before = _tree(lab, tmp_path)
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
    else:
        assert "error" not in err
        assert expect in out
        changed = [p for p in before if p.startswith(str(lab)) and after.get(p) != before[p]]
        assert not changed and not any(p.startswith(str(lab)) for p in set(after) - set(before))
        if case.after:
            assert case.after(lab, tmp_path)
    assert not (tmp_path / "pwned").exists()  # no pickle ran


def test_the_table_covers_every_command():
    commands = {c.argv.split()[0] for c in CASES.values()}
    assert commands == {"predict", "train", "finetune", "demo", "reproduce", "attention", "inspect", "export",
                        "data", "bench", "info"}
    assert len(CASES) >= 60


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
    for argv in (["export", "--checkpoint", str(lab / "run"), "--out", str(small_disk / "m.safetensors")],
                 ["data", "digits", "--size", "16", "--per-class", "4", "--out", str(small_disk / "digits")]):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: could not write") and "no space left on the disk" in lines[0]
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
    forker = subprocess.Popen([sys.executable, "-c", TINY_FIT + FORKER, str(epochs)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
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
