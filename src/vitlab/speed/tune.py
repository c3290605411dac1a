"""Measured tuning, an explicit step: `vitlab tune`, or `--fast-path tuned` before a run starts.

The rules (`vitlab.speed.rules`) are written per kind of CPU; a machine can still differ from its kind
(caches, memory bandwidth, a noisy neighbour), and a model or batch can sit between the rows. `tune`
times the candidate plans of one model, mode, precision, batch and thread count on this machine, and
keeps the fastest in a file under vitlab's cache root:

    <cache root>/tuning/<cpu>-<flags>-torch-<version>.json      (`vitlab.fileio.cache_root()`)

The candidates: each attention kernel (with, for inference, each library of products), eager; then the
fastest of those compiled; for compiled inference at a batch above 4, pieces of the batch halved while a half is faster.
They run interleaved, the order rotating every repeat (a slow phase of a shared machine hits them all),
each scored by its median seconds per image; a candidate replaces the rules' plan only when it is at
least `MARGIN` faster. Nothing here runs during a run: a command with `--fast-path tuned` reads the
file, and measures first (before its first step) only when the file has no entry for it. A run records
the plan it used (summary.json, its checkpoints), and resuming it reuses that plan.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    import fcntl
except ImportError:  # Windows: no lock between processes
    fcntl = None

from vitlab.fileio import cache_root, write_json
from vitlab.runtime import autocast
from vitlab.speed import onednn
from vitlab.speed.machine import this_machine
from vitlab.speed.paths import inference_fn, training
from vitlab.speed.rules import Plan

MARGIN = 0.03  # a candidate must beat the rules' plan by 3% (the noise of a few interleaved repeats)
VERSION = 1
_LOCK = threading.Lock()  # the file's readers and writers in this process (a server's threads)


def race(
    fns: dict[str, Callable[[], None]],
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_repeat_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each function, interleaved: every repeat runs each once, the order rotating between
    repeats. With `min_repeat_s`, a repeat calls a function as many times as its last warm-up call says it
    takes to last that long. Returns {name: [seconds per call, one per repeat]}."""
    names = list(fns)
    calls = dict.fromkeys(names, 1)
    for _ in range(warmup):
        for name in names:
            t0 = clock()
            fns[name]()
            calls[name] = max(1, round(min_repeat_s / max(clock() - t0, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = clock()
            for _ in range(calls[name]):
                fns[name]()
            times[name].append((clock() - t0) / calls[name])
    return times


def signature(model: nn.Module) -> str:
    """A short name for the model's architecture (its class and configuration, with defaults resolved as the model
    resolved them), weights aside."""
    cfg = getattr(model, "cfg", None)
    d = cfg.to_dict() if cfg is not None else {"repr": repr(model)}
    if hasattr(cfg, "use_fc_norm"):
        d["fc_norm"] = cfg.use_fc_norm  # None means "as the pooling implies": the same model as its resolved value
    text = json.dumps(d, sort_keys=True, default=str)
    return f"{type(model).__name__}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def key(model: nn.Module, *, mode: str, precision: str, batch_size: int) -> str:
    return f"{mode}/{signature(model)}/{precision}/b{batch_size}/t{torch.get_num_threads()}"


def tuning_file() -> Path:
    return cache_root() / "tuning" / f"{this_machine().slug}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """This process's lock, and an exclusive lock on `<file>.lock` between processes (POSIX)."""
    with _LOCK:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            yield


MAX_FILE_BYTES = 4 << 20  # a tuning file is a few KiB per tuned model; one larger than this is not read


def read_entries(path: Path | None = None) -> dict:
    """The tuning file's entries ({} when there is none, it is not a regular file or over MAX_FILE_BYTES, or it is
    torn, foreign or of another layout)."""
    path = path or tuning_file()
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:  # a link to a device, a runaway file
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("cpu") != this_machine().cpu:
        return {}
    return data["entries"] if isinstance(data.get("entries"), dict) else {}


def known(model: nn.Module, *, mode: str, precision: str, batch_size: int) -> Plan | None:
    """The plan tuned here for this model, mode, precision, batch and thread count, or None."""
    entry = read_entries().get(key(model, mode=mode, precision=precision, batch_size=batch_size))
    try:
        return Plan.from_dict(entry["plan"]) if entry else None
    except (KeyError, TypeError, ValueError):
        return None  # a damaged entry: tune again


def remember(model: nn.Module, *, mode: str, precision: str, batch_size: int, plan: Plan, **details) -> None:
    """Keep `plan` as this machine's tuned plan for the model, mode, precision, batch and thread count (merged into
    the file as it is on disk now: another process may have added entries since this one read it)."""
    path = tuning_file()
    entry = {"plan": plan.to_dict(), "when": datetime.date.today().isoformat(), **details}
    with _locked(path):
        entries = {**read_entries(path), key(model, mode=mode, precision=precision, batch_size=batch_size): entry}
        write_json(path, {"version": VERSION, "cpu": this_machine().cpu, "entries": entries}, indent=1)


def _step(
    model: nn.Module, plan: Plan, mode: str, precision: str, x: torch.Tensor, y: torch.Tensor
) -> tuple[Callable[[], None], contextlib.ExitStack]:
    """One call of `plan`'s path on a copy of `model`: a forward pass, or a training step's forward and
    backward; and the context that must stay open while it runs."""
    device, stack = x.device, contextlib.ExitStack()
    if mode == "inference":
        fn = inference_fn(model, plan, precision=precision, batch_size=len(x))

        def infer() -> None:
            with torch.inference_mode(), autocast(device, precision):
                fn(x)

        return infer, stack
    twin = copy.deepcopy(model).train()
    net = stack.enter_context(training(twin, plan, precision=precision))

    def train_step() -> None:
        with autocast(device, precision):
            logits = net(x)
        F.cross_entropy(logits.float(), y).backward()
        twin.zero_grad(set_to_none=True)

    return train_step, stack


def tune(
    model: nn.Module,
    *,
    mode: str,
    precision: str,
    batch_size: int,
    default: Plan,
    repeats: int = 5,
    log: Callable[[str], None] | None = None,
) -> Plan:
    """Time the candidate plans of `model` here (see the module docstring), keep the fastest in the tuning
    file, and return it. `default` is the rules' plan, which a candidate must beat by `MARGIN`."""
    say = log or (lambda line: None)
    c = model.cfg
    g = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    x = torch.randn(batch_size, c.in_chans, *c.img_size, generator=g).to(device)
    y = torch.randint(0, max(c.num_classes, 1), (batch_size,), generator=g).to(device)
    products = ("aten", "onednn") if mode == "inference" and onednn.available(precision) else ("aten",)
    eager = [Plan(a, p, source="tuned") for a in ("fused", "explicit") for p in products]
    seconds: dict[str, float] = {}

    def measure(plans: list[Plan]) -> None:
        with contextlib.ExitStack() as stack, torch.random.fork_rng(devices=[]):  # dropout draws: not the run's
            fns = {}
            for plan in plans:
                fn, ctx = _step(model, plan, mode, precision, x, y)
                stack.enter_context(ctx)
                fns[plan.describe()] = fn
            times = race(fns, warmup=2, repeats=repeats, min_repeat_s=0.3)  # a compile, then a steady call
        for name, ts in times.items():
            seconds[name] = statistics.median(ts) / batch_size

    say(f"tuning {signature(model)} {mode} {precision} batch {batch_size}: {len(eager)} eager paths")
    measure(eager)
    best = min(eager, key=lambda p: seconds[p.describe()])
    compiled = [replace(best, compile=True)]
    say("tuning: the fastest compiled (a compile per candidate: tens of seconds each)")
    measure(compiled)
    if mode == "inference":  # halve the batch while a half is faster (each piece size is a graph of its own)
        size = batch_size // 2
        while size >= 4:
            candidate = replace(compiled[-1], pieces=size)
            measure([candidate])
            if seconds[candidate.describe()] >= seconds[compiled[-1].describe()]:
                break
            compiled.append(candidate)
            size //= 2
    fastest = min(eager + compiled, key=lambda p: seconds[p.describe()])
    base = replace(default, source="tuned")
    if base.describe() not in seconds:
        measure([base])
    chosen = fastest if seconds[fastest.describe()] < (1 - MARGIN) * seconds[base.describe()] else base
    remember(
        model,
        mode=mode,
        precision=precision,
        batch_size=batch_size,
        plan=chosen,
        seconds_per_image=seconds,
        rules=default.to_dict(),
    )
    say(
        f"tuning: {chosen.describe()} ({1 / seconds[chosen.describe()]:.2f} images/s; the rules' plan "
        f"{1 / seconds[base.describe()]:.2f})"
    )
    return chosen


__all__ = ["tune", "known", "remember", "race", "signature", "key", "tuning_file", "read_entries", "MARGIN"]
