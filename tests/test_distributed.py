"""Multi-process training: the same command under torchrun (2 CPU processes, gloo) matches one process
with the same global batch, and only rank 0 writes and prints."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from vitlab import create_model
from vitlab.cli import main
from vitlab.data.digits import write_digits_folder
from vitlab.train import distributed
from vitlab.weights.checkpoint import save_checkpoint


def test_without_torchrun_it_is_one_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    info = distributed.setup("cpu")
    assert (info.rank, info.world_size, info.is_main, info.enabled) == (0, 1, True, False)
    assert distributed.all_mean({"a": 2.0}, info) == {"a": 2.0}


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    write_digits_folder(tmp_path / "data", size=16, per_class=20)  # 160 train images: 10 steps of 16
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=4, img_size=16, dim=32, depth=2, heads=2, mlp_dim=64)
    save_checkpoint(tmp_path / "init", "init", model, {"epoch": 0})
    # No random augmentation, dropout or mixing: the two runs then see the same batches and the same arithmetic.
    args = ["finetune", "--data", str(tmp_path / "data"), "--checkpoint", str(tmp_path / "init"), "--epochs", "2",
            "--freeze-epochs", "1", "--unfreeze", "all", "--lr", "1e-3", "--no-aug", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            "-m", "vitlab", *args, "--batch-size", "8", "--out", str(tmp_path / "ddp")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the single process meanwhile, here
        assert main(args + ["--batch-size", "16", "--out", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(n)
    stdout, stderr = ddp.communicate(timeout=300)
    assert ddp.returncode == 0, stderr[-3000:]
    a = load_file(tmp_path / "ddp/checkpoints/epoch_0002/model.safetensors")
    b = load_file(tmp_path / "one/checkpoints/epoch_0002/model.safetensors")
    init = load_file(tmp_path / "init/checkpoints/init/model.safetensors")
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - init[k]).abs().max().item() for k in a if not k.startswith("head."))
    assert diff < 1e-5, f"max |DDP - single| = {diff:.3g}"
    assert moved > 100 * 1e-5  # the comparison means something: stage 2 really moved the weights
    # rank 0 alone prints and writes: each epoch line once, one TensorBoard file
    assert stdout.count("epoch   2/2 [stage 2]") == 1
    assert "global batch 16 = 8 x 2 process(es)" in stdout
    assert len(list((tmp_path / "ddp/tensorboard").glob("events.out.tfevents.*"))) == 1
