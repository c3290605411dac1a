"""Multi-process training: the same command under torchrun (2 CPU processes, gloo) matches one process
with the same global batch, and only rank 0 writes and prints; across two nodes (two torchrun agents on
loopback, each with a `--out` of its own) too, and a run whose second node is killed resumes to the very
weights of an uninterrupted one (the two-node tests are slow)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
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


def test_processes_that_read_other_data_are_refused(tmp_path, monkeypatch, capsys):
    """Each machine reads its own copy of the data: a process whose copy differs from rank 0's (here, as
    the gathered fingerprints would show it) stops the run in one line before anything trains."""
    write_digits_folder(tmp_path / "data", size=16, per_class=4)
    monkeypatch.setattr(distributed, "all_gather_object", lambda obj, info: [obj, obj, "another copy"])
    args = [
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
        str(tmp_path / "run"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: --data {tmp_path / 'data'}: process(es) [2] read other images or classes than rank 0"
    )
    assert not (tmp_path / "run" / "last.json").exists()


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    write_digits_folder(tmp_path / "data", size=16, per_class=20)  # 160 train images: 10 steps of 16
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=4, img_size=16, dim=32, depth=2, heads=2, mlp_dim=64)
    save_checkpoint(tmp_path / "init", "init", model, {"epoch": 0})
    # No random augmentation, dropout or mixing: the two runs then see the same batches and the same arithmetic.
    args = [
        "finetune",
        "--data",
        str(tmp_path / "data"),
        "--checkpoint",
        str(tmp_path / "init"),
        "--epochs",
        "2",
        "--freeze-epochs",
        "1",
        "--unfreeze",
        "all",
        "--lr",
        "1e-3",
        "--no-aug",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "vitlab",
            *args,
            "--batch-size",
            "8",
            "--out",
            str(tmp_path / "ddp"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


# ----------------------------------------------------------------------------------------------------
# Two nodes: two torchrun agents on this machine, a c10d rendezvous on loopback (slow)

EPOCHS = 6
FINETUNE = [
    "finetune",
    "--epochs",
    str(EPOCHS),
    "--freeze-epochs",
    "1",
    "--unfreeze",
    "all",
    "--lr",
    "1e-3",
    "--no-aug",
    "--device",
    "cpu",
]


@pytest.fixture(scope="module")
def nodes_setup(tmp_path_factory) -> Path:
    """The data and the initial checkpoint, and one process trained with the global batch (16) in one/."""
    root = tmp_path_factory.mktemp("nodes")
    write_digits_folder(root / "data", size=16, per_class=20)  # 160 train images: 10 steps of 16
    torch.manual_seed(0)
    model = create_model("vit_mini", num_classes=4, img_size=16, dim=32, depth=2, heads=2, mlp_dim=64)
    save_checkpoint(root / "init", "init", model, {"epoch": 0})
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*FINETUNE, *_data(root), "--batch-size", "16", "--out", str(root / "one")]) == 0
    finally:
        torch.set_num_threads(n)
    return root


def _data(root: Path) -> list[str]:
    return ["--data", str(root / "data"), "--checkpoint", str(root / "init")]


def _two_nodes(root: Path, outs: tuple[Path, Path], *extra: str) -> list[subprocess.Popen]:
    """`torchrun --nnodes 2 --node-rank R --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT -m vitlab finetune`
    for R = 0, 1, 8 images per process (a global batch of 16), each agent in a process group of its own
    (so that a node can be killed whole) and with a --out of its own: no folder is shared. c10d orders the
    nodes by their address, not by --node-rank: --local-addr makes node 0 (127.0.0.1) rank 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(r),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--local-addr",
                f"127.0.0.{r + 1}",
                "-m",
                "vitlab",
                *FINETUNE,
                *_data(root),
                "--batch-size",
                "8",
                "--out",
                str(outs[r]),
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in (0, 1)
    ]


def _finish(nodes: list[subprocess.Popen]) -> list[str]:
    logs = [p.communicate(timeout=600)[0] for p in nodes]
    for p, log in zip(nodes, logs):
        assert p.returncode == 0, log[-3000:]
    return logs


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / f"checkpoints/epoch_{EPOCHS:04d}/model.safetensors")


@pytest.fixture(scope="module")
def two_nodes_run(nodes_setup) -> tuple[Path, list[str]]:
    outs = (nodes_setup / "n0", nodes_setup / "n1")
    return outs[0], _finish(_two_nodes(nodes_setup, outs))


@pytest.mark.slow
def test_two_nodes_match_one_with_the_same_global_batch(nodes_setup, two_nodes_run):
    out, (log0, log1) = two_nodes_run
    a, b = _weights(out), _weights(nodes_setup / "one")
    init = load_file(nodes_setup / "init/checkpoints/init/model.safetensors")
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - init[k]).abs().max().item() for k in a if not k.startswith("head."))
    assert diff < 1e-5, f"max |two nodes - one| = {diff:.3g}"
    assert moved > 100 * 1e-5  # the comparison means something: stage 2 really moved the weights
    assert "global batch 16 = 8 x 2 process(es)" in log0 and log0.count(f"epoch   {EPOCHS}/{EPOCHS} [stage 2]") == 1
    assert "epoch " not in log1  # rank 1 prints no epoch, and writes nothing: its --out was never made
    assert not (nodes_setup / "n1").exists()


def _kill_node(agent: subprocess.Popen) -> None:
    """Node 1 dies at once, as a machine that loses power: its torchrun agent and the worker process the agent
    started (in a session of its own), SIGKILL."""
    workers = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _parent(stat) == agent.pid]
    os.killpg(agent.pid, signal.SIGKILL)
    for pid in workers:
        os.killpg(pid, signal.SIGKILL)
    agent.wait()


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])  # pid (comm) state ppid ...
    except (OSError, IndexError, ValueError):  # a process that ended meanwhile
        return None


@pytest.mark.slow
def test_a_killed_node_resumes_to_the_uninterrupted_weights(nodes_setup, two_nodes_run):
    """Node 1 dies (its agent and worker killed) after node 0 has written a checkpoint; node 0's process fails
    with it. Both started again with --resume (node 1's --out still empty: rank 0 reads the checkpoint and
    hands it over), the run ends bitwise where the uninterrupted one ended."""
    outs = (nodes_setup / "k0", nodes_setup / "k1")
    nodes = _two_nodes(nodes_setup, outs)
    end = time.monotonic() + 600
    last = outs[0] / "last.json"
    while not last.exists() and nodes[0].poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    _kill_node(nodes[1])
    log0 = nodes[0].communicate(timeout=600)[0]
    assert nodes[0].returncode != 0, "node 0 finished although node 1 was killed: " + log0[-3000:]
    stopped = json.loads(last.read_text())["epoch"]
    assert 1 <= stopped < EPOCHS, log0[-3000:]
    assert not outs[1].exists()
    log0, _ = _finish(_two_nodes(nodes_setup, outs, "--resume"))
    assert f"resumed from {outs[0]}/last.json at epoch" in log0
    a, b = _weights(outs[0]), _weights(two_nodes_run[0])
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ended elsewhere than the uninterrupted one"
