"""Where the training runs of a grid execute (`vitlab reproduce --executor pool | ray`): in this process,
side by side in a pool of processes on this machine (the default), or as tasks of a Ray cluster (the
optional extra `pip install -e '.[cluster]'`).

    with open_executor("ray", address="10.0.0.1:6379", device="cpu", workers=None, n_items=len(items)) as ex:
        for i, value, node in ex.map(fn, items):  # each item's value as soon as it is ready, in any order
            ...

`fn(item)` must depend on its argument alone: no file of this machine, no state of this process. Then
where it runs changes no number (it is seeded by its argument and runs on one thread), and a cluster
needs no shared disk: the argument and the value travel with the task (a pipe to a pool's process, Ray's
object store between nodes), and only the caller writes files. An item can be one run or a group of runs:
the executor does not look inside.

Ray: every item is a Ray task of one CPU, or of one GPU where the device allows it and the cluster has
GPUs. `ray.init(address=...)` joins the cluster at `address` (`ray start --head` on one machine,
`ray start --address HEAD:PORT` on the others; see docs/cluster.md); without an address, a Ray cluster
of this machine alone is started for the grid (its files under vitlab's cache folder) and stopped after
it. A task whose worker process or node dies is run again, on any node left, up to RETRIES times (Ray's
`max_retries`); an exception raised by `fn` itself is not retried (the same argument would raise it
again) and stops the grid, as it does in the pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import as_completed
from pathlib import Path

import torch

from vitlab.errors import VitlabError, check_range
from vitlab.fileio import cache_root
from vitlab.options import EXECUTORS
from vitlab.runtime import process_pool, resolve_device

RETRIES = 3  # Ray's max_retries: a task lost with its worker or its node is run again up to 3 times
NO_RAY = (
    "executor ray needs Ray, which is not installed: install vitlab's cluster extra, "
    "pip install -e '.[cluster]' (or: pip install -c constraints.txt ray)"
)
SOCKET_LIMIT = 107  # bytes in an AF_UNIX path on Linux; Ray's sockets are <temp>/session_<date>_<pid>/sockets/<name>


def require_ray():
    """The ray module (imported on first use: it is an optional extra), or a VitlabError saying how to get it."""
    try:
        import ray  # optional: only --executor ray needs it
    except ImportError as e:
        raise VitlabError(NO_RAY, arg="executor") from e
    return ray


def check_executor(kind: str, address: str | None, workers: int | None, device: str | torch.device = "auto") -> None:
    """The options of `open_executor`, checked before any work."""
    if kind not in EXECUTORS:
        raise VitlabError(f"executor must be one of {', '.join(EXECUTORS)}; found {kind!r}", arg="executor")
    check_range("workers", workers, low=1, integer=True, optional=True)
    if address is not None and kind != "ray":
        raise VitlabError(
            f"address {address}: an address is a Ray cluster's; use it with executor ray, or drop it", arg="address"
        )
    if address is not None and workers is not None:
        raise VitlabError(
            f"workers {workers}: a Ray cluster runs as many runs at once as it has CPUs (or GPUs); drop "
            "workers, or drop the address to start a Ray cluster of this machine with that many CPUs",
            arg="workers",
        )
    if address is not None and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
        raise VitlabError(
            f"address must be the head node's HOST:PORT (as `ray start --head` prints it); found {address!r}",
            arg="address",
        )
    if kind == "ray" and str(device) not in ("auto", "cpu", "cuda"):
        raise VitlabError(
            f"device {device}: with executor ray a run asks the cluster for a CPU or a whole GPU; "
            "use auto, cpu or cuda",
            arg="device",
        )
    if kind == "ray":
        require_ray()


class Executor:
    """Runs items one after the other in this process: what a pool of one worker would do, without a
    process to start (a GPU runs one run at a time)."""

    kind = "inline"

    def __init__(self, device: torch.device):
        self.device = device  # where the items compute
        self.slots = 1  # items computed at once

    def describe(self) -> str:
        return "in this process"

    def map(self, fn: Callable, items: Sequence) -> Iterator[tuple[int, object, str]]:
        """(index of the item, fn(item), the node that computed it) for every item, as each finishes."""
        for i, item in enumerate(items):
            yield i, fn(item), socket.gethostname()


class PoolExecutor(Executor):
    """`workers` spawned processes on this machine, one CPU thread each (vitlab.runtime.process_pool)."""

    kind = "pool"

    def __init__(self, device: torch.device, workers: int, stack: contextlib.ExitStack):
        super().__init__(device)
        self.slots = workers
        self.pool = stack.enter_context(process_pool(workers, threads=1))

    def describe(self) -> str:
        return f"a pool of {self.slots} processes on this machine"

    def map(self, fn: Callable, items: Sequence) -> Iterator[tuple[int, object, str]]:
        futures = {self.pool.submit(fn, item): i for i, item in enumerate(items)}
        host = socket.gethostname()
        for future in as_completed(futures):
            yield futures[future], future.result(), host  # a worker's error is raised here


def _on_node(fn: Callable, item) -> tuple[object, str]:
    """A Ray task: fn(item), and the node that computed it (its IP address and the start of its id)."""
    import ray  # in a Ray worker, Ray is there

    return fn(item), f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"


class RayExecutor(Executor):
    """Every item a task of a Ray cluster: one CPU each, or one GPU each where the device allows it and the
    cluster has GPUs."""

    kind = "ray"

    def __init__(self, device: str, address: str | None, workers: int | None, stack: contextlib.ExitStack):
        ray = self.ray = require_ray()
        if not ray.is_initialized():  # a caller that has joined a cluster itself keeps it
            kwargs = {}
            if address is None:  # a cluster of this machine, for this grid alone
                kwargs = {"num_cpus": workers, "_temp_dir": str(_local_temp_dir())}
                # It reports no usage anywhere, and its processes share a token of their own (Ray would otherwise
                # write one to ~/.ray/auth_token); variables the caller has set are kept.
                _scoped_env(stack, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_TOKEN=secrets.token_hex(32))
            ray.init(
                address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **kwargs
            )
            stack.callback(ray.shutdown)
        self.address = address
        resources = ray.cluster_resources()
        self.nodes = sum(1 for n in ray.nodes() if n["Alive"])
        self.cpus, self.gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
        use_gpu = self.gpus > 0 and device in ("auto", "cuda")
        if device == "cuda" and not use_gpu:
            raise VitlabError(
                f"device cuda: the Ray cluster{f' at {address}' if address else ''} has no GPU "
                f"({self.cpus} CPUs on {self.nodes} node(s)); use cpu or auto",
                arg="device",
            )
        super().__init__(torch.device("cuda" if use_gpu else "cpu"))
        self.slots = max(1, self.gpus if use_gpu else self.cpus)
        self.task = ray.remote(_on_node).options(
            num_cpus=0 if use_gpu else 1, num_gpus=1 if use_gpu else 0, max_retries=RETRIES, retry_exceptions=False
        )

    def describe(self) -> str:
        where = f"the Ray cluster at {self.address}" if self.address else "a Ray cluster of this machine"
        per_run = "one GPU" if self.device.type == "cuda" else "one CPU"
        return f"{where}: {self.nodes} node(s), {self.cpus} CPU(s), {self.gpus} GPU(s); {per_run} per run"

    def map(self, fn: Callable, items: Sequence) -> Iterator[tuple[int, object, str]]:
        ray = self.ray
        pending = {self.task.remote(fn, item): i for i, item in enumerate(items)}
        try:
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ref)
                try:
                    value, node = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # fn raised: a user's mistake is its one line
                    raise (e.cause if isinstance(getattr(e, "cause", None), VitlabError) else e) from None
                except ray.exceptions.RayError as e:  # lost, RETRIES times over
                    raise VitlabError(
                        f"executor ray: a run was lost {RETRIES + 1} times ({type(e).__name__}: "
                        f"{str(e).splitlines()[0]}); the runs that finished are kept: run the same "
                        "command again to go on",
                        arg="executor",
                    ) from e
                yield i, value, node
        finally:
            for ref in pending:  # stopped early (an error, Ctrl-C): nothing left running for nobody
                ray.cancel(ref, force=True)


def _scoped_env(stack: contextlib.ExitStack, **values: str) -> None:
    """Set the environment variables the caller has not set, until `stack` closes."""
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    stack.callback(lambda: [os.environ.pop(k, None) for k in added])


def _local_temp_dir() -> Path:
    """Where a Ray cluster of this machine keeps its session files: under vitlab's cache folder, if Ray's
    socket paths fit there."""
    path = cache_root() / "ray"
    if len(str(path)) + len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store") > SOCKET_LIMIT:
        raise VitlabError(
            f"executor ray: the cache folder {cache_root()} is too long a path for the sockets of a "
            f"local Ray cluster (at most {SOCKET_LIMIT} bytes); set VITLAB_CACHE to a shorter folder, "
            "or start a cluster with `ray start --head` and pass its address",
            arg="executor",
        )
    return path


@contextlib.contextmanager
def open_executor(
    kind: str, *, device: str | torch.device, workers: int | None = None, address: str | None = None, n_items: int
) -> Iterator[Executor]:
    """An executor for `n_items` items: `pool` (`workers` processes, default one per core and at most 4; a
    single one, and any GPU, runs them in this process), or `ray` (the cluster at `address`, or one of this
    machine with `workers` CPUs). Closed (the pool's processes stopped, Ray left) when the block ends."""
    check_executor(kind, address, workers, device)
    with contextlib.ExitStack() as stack:
        if kind == "ray":
            yield RayExecutor(str(device), address, workers, stack)
            return
        dev = resolve_device(device)
        n = 1 if dev.type != "cpu" else min(workers or min(os.cpu_count() or 1, 4), max(n_items, 1))
        yield Executor(dev) if n == 1 else PoolExecutor(dev, n, stack)


__all__ = ["RETRIES", "Executor", "PoolExecutor", "RayExecutor", "check_executor", "open_executor", "require_ray"]
