"""What every command needs the same way, in one place: the device, the precision, seeding, CPU
threads, the machine's memory, and pools of worker processes."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

from vitlab.errors import VitlabError, check_range
from vitlab.options import check_precision


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device that is not there is an error."""
    if device is None or str(device) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise VitlabError(
            f"device {device!r} is not a device; expected auto, cpu, cuda, cuda:N or mps", arg="device"
        ) from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise VitlabError(f"device {device} asks for CUDA but no CUDA GPU is visible; use cpu or auto", arg="device")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise VitlabError(f"device {device} asks for MPS but it is not available; use cpu or auto", arg="device")
    return dev


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CPU or GPU for `bf16`; nothing for `fp32`."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all of the machine's where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(n, *, arg: str = "threads", zero: bool = False, optional: bool = True) -> int | None:
    """A number of CPU threads: 1 .. the CPUs available (0 too where `zero` means "choose"). More threads
    than CPUs only wait for each other, and a run with hundreds of them may not finish."""
    cpus = available_cpus()
    check_range(
        arg,
        n,
        low=0 if zero else 1,
        high=cpus,
        integer=True,
        optional=optional,
        hint=f" (this machine lets vitlab use {cpus} CPU{'s' if cpus != 1 else ''})",
    )
    return n


def machine_memory() -> int:
    """Bytes of memory this process can have: the machine's RAM, or a smaller cgroup limit (a container)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = 2**40
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch, so the same seed and config give the same numbers on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op CPU threads set to `n` inside the block (None: left as it is), then restored.

    Small models (the mini experiment's 65 tokens x 32 channels) gain nothing from a second thread,
    and on a machine shared with other processes extra threads wait for each other."""
    check_threads(n)
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def busy_note(threads: int | None = None) -> str | None:
    """A one-line note where this machine's load (the last minute's average) leaves fewer free cores than the
    intra-op threads a run will use (`threads`, None: torch's now), saying what `--threads 1` would do; None on
    a quiet machine, or where the load cannot be read. Only a note: the thread count can change a run's last
    digits, so it is never changed behind the user's back."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    except OSError:
        return None
    threads = threads or torch.get_num_threads()
    free = cores - load
    if threads <= 1 or load < 1 or threads <= free + 0.5:
        return None
    return (
        f"note: this machine is busy (load {load:.1f} on {cores} cores), so {threads} threads will wait for each "
        "other; --threads 1 is often faster then for small models (the thread count can change a result's last "
        "digits, so vitlab never changes it itself)"
    )


PARENT_CHECK_S = 1.0  # how often a pool worker looks for its parent


def _start_worker(threads: int, parent: int) -> None:
    """A pool worker's start: its intra-op threads, and a watch on its parent. A parent killed with no chance
    to stop its pool (`kill -9`, the machine's OOM killer) leaves its workers to init; each one ends itself
    within PARENT_CHECK_S of seeing that, rather than compute for nobody."""
    torch.set_num_threads(threads)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="vitlab-parent-watch", daemon=True).start()


@contextlib.contextmanager
def process_pool(workers: int, *, threads: int = 1) -> Iterator[ProcessPoolExecutor]:
    """A pool of `workers` fresh processes (spawned: a clean torch in each), `threads` intra-op threads
    each. If the block fails (a task's error re-raised, Ctrl-C), the workers are stopped at once
    rather than left to finish their tasks; if this process dies without a word (`kill -9`), each worker
    ends itself within about a second.

    Runs that keep one core busy and no more (the small models of the demo and the experiments) go
    faster side by side in processes than one after the other with more threads each. A result that
    depends only on its arguments is the same in any process, so side by side changes no number."""
    check_range("workers", workers, low=1, integer=True)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(threads, os.getpid()),
    )
    try:
        yield pool
    except BaseException:
        for process in list((pool._processes or {}).values()):  # Python < 3.14 has no public terminate
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


__all__ = [
    "resolve_device",
    "autocast",
    "available_cpus",
    "check_threads",
    "machine_memory",
    "seed_everything",
    "num_threads",
    "process_pool",
]
