"""Training on several processes or machines: the same command under torchrun.

    # one machine, 4 processes
    torchrun --nproc-per-node 4 -m vitlab finetune --data runs/digits --checkpoint runs/digits_vit \\
        --batch-size 16 --out runs/digits_ft_4p
    # two machines, 8 processes each: the same line on both (HOST: the first machine's address)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m vitlab finetune --data runs/digits --checkpoint runs/digits_vit --batch-size 16 --out runs/digits_ft_16p

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `setup` reads them (the
standard env:// rendezvous) and joins the process group: NCCL when the processes train on GPUs, gloo
on CPU. Each process sees 1/N of every epoch through a DistributedSampler (its shard, read from its own
machine's copy of the data, which every process checks is the same) and computes the mean loss of its own
per-process batch; DistributedDataParallel averages the gradients, so a step is the step of one process
with the global batch = per-process batch x N. Only rank 0 writes files and prints. Without torchrun's
variables everything runs as one process (world size 1).

`--out` belongs to rank 0: it alone checks it, writes the checkpoints there, and on `--resume` reads the
last one and hands it to the other processes (`on_main`). So `--out` may be a folder of rank 0's machine
alone, or a shared one. Which machine holds rank 0: with `--rdzv-backend c10d` the one whose address
(`--local-addr`, by default its host name) sorts first, whatever `--node-rank` says; with the static
rendezvous (`--node-rank R --master-addr HOST --master-port P`) node 0. A run resumes where its
checkpoints are: on the same machines, or with a shared `--out` (docs/cluster.md).

Every process evaluates the whole validation set (simple, and the same numbers on every rank; the
cost is small next to training at this scale).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from vitlab.errors import VitlabError
from vitlab.runtime import resolve_device

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def single_process(device: str | torch.device = "auto") -> DistInfo:
    """One process (world size 1) on `device`: what `fit` uses outside torchrun."""
    return DistInfo(device=resolve_device(device))


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup(device: str = "auto") -> DistInfo:
    """Join torchrun's process group if launched by it; pick this process's device. Idempotent."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return single_process(device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = resolve_device(device)
    if dev.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise VitlabError(
                f"torchrun started {os.environ.get('LOCAL_WORLD_SIZE', '?')} processes on this machine but only "
                f"{torch.cuda.device_count()} GPU(s) are visible; use --nproc_per_node={torch.cuda.device_count()}"
            )
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    elif dev.type == "mps":
        raise VitlabError(
            "device mps: multi-process training on MPS is not supported by torch.distributed; use cpu", arg="device"
        )
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def wrap(model: nn.Module, info: DistInfo) -> nn.Module:
    """DistributedDataParallel over the parameters that train now (call again when that set changes:
    DDP fixes the set of synchronised parameters when it is built)."""
    if not info.enabled:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def all_mean(values: dict[str, float], info: DistInfo) -> dict[str, float]:
    """The mean of each value over all processes (for train loss/accuracy of the epoch)."""
    if not info.enabled:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return {k: v / info.world_size for k, v in zip(keys, t.tolist())}


def all_gather_object(obj, info: DistInfo) -> list:
    """`obj` of every process, in rank order (with one process, a list of one)."""
    if not info.enabled:
        return [obj]
    objects = [None] * info.world_size
    dist.all_gather_object(objects, obj)
    return objects


def on_main(fn: Callable[[], T], info: DistInfo) -> T:
    """fn() on rank 0 alone, and its value, or the VitlabError it raised, on every process: what only rank 0
    reads (its `--out`, which need not be shared) reaches the others, and a mistake found there stops every
    process with the same one-line error instead of leaving them waiting for rank 0."""
    value, error = None, None
    if info.is_main:
        try:
            value = fn()
        except VitlabError as e:
            error = (str(e), e.arg, e.also)
    if info.enabled:
        box = [(value, error)]
        dist.broadcast_object_list(box, src=0)
        value, error = box[0]
    if error is not None:
        raise VitlabError(error[0], arg=error[1], also=error[2])
    return value


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


__all__ = [
    "DistInfo",
    "setup",
    "single_process",
    "wrap",
    "all_mean",
    "all_gather_object",
    "on_main",
    "barrier",
    "cleanup",
    "launched_by_torchrun",
]
