"""What runs fastest on this machine, measured here once and remembered.

A fast path that wins on one CPU can lose on another. On an AMD EPYC core oneDNN's fp32 products beat
MKL's by 10-18% at ViT-B/16's training shapes; on an Intel Xeon with AMX the same products ran
0.3-1.3x. Which attention kernel is faster in bf16, and whether a packed Linear weight pays, differ
the same way. So vitlab never decides such a choice by a size threshold or a CPU name: the first time
it meets a choice (a product of a given shape, precision and thread count), it times the candidates
on the real kernels, in a fraction of a second to a few seconds, and keeps the answer in one JSON
file per CPU and torch version:

    $XDG_CACHE_HOME/vitlab/speed/<cpu model>-<cpu flags hash>-torch-<version>.json
    (~/.cache/vitlab/speed/... when XDG_CACHE_HOME is not set)

A file written on another CPU (another model name or instruction set) or by another torch is never
read: its name differs, and its header is checked when it is read. `vitlab bench --recalibrate`
measures everything again. Timings of compiled models (`vitlab.speed.compiled`) are kept in the same
file, so that a command can tell whether compiling will pay before it compiles.

The candidates run interleaved (a slow phase of a shared machine hits all of them) and each is
scored by its fastest repeat: the kernel's own speed, without the neighbours' interference. A
candidate replaces the default (the first one) only when it is at least `MARGIN` faster; below that
the difference is within the noise of a few repeats, and staying with the default keeps results
the same from machine to machine where the choice does not matter. A choice that departs from the
default is confirmed by a second round of repeats before it is kept: each candidate's score is then
its fastest repeat of both rounds. (A noisy phase can slow every repeat of one candidate in a round:
on an Intel Xeon, ViT-B/16's bf16 attention once scored 0.144 s fused against 0.094 explicit, and
0.077 fused when measured again.)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from vitlab.fileio import write_json

MARGIN = 0.03  # a candidate must beat the default by 3% to be chosen (the noise of a few repeats)
VERSION = 1  # of the file's layout


@functools.cache  # read once per process: a lookup on every training product must not read /proc (~0.2 ms)
def cpu_model() -> str:
    """The CPU's model name as the OS reports it (`lscpu`'s "Model name"), else the platform's word."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


@functools.cache
def _cpu_flags() -> str:
    """The instruction-set flags (Linux), which tell apart CPUs that a VM names alike."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


def machine_key() -> dict:
    """What a calibration is valid for: the CPU (model name and instruction set) and the torch build."""
    return {"cpu": cpu_model(), "flags": hashlib.sha1(_cpu_flags().encode()).hexdigest()[:10],
            "torch": torch.__version__}


def cache_root() -> Path:
    """$XDG_CACHE_HOME/vitlab, or ~/.cache/vitlab."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vitlab"


def cache_file(root: str | Path | None = None) -> Path:
    """The calibration file of this CPU and torch version."""
    key = machine_key()
    slug = re.sub(r"[^a-z0-9]+", "-", key["cpu"].lower()).strip("-")
    torch_slug = re.sub(r"[^A-Za-z0-9.+]+", "-", key["torch"])
    return Path(root or cache_root()) / "speed" / f"{slug}-{key['flags']}-torch-{torch_slug}.json"


def _fastest_repeat(fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1) -> dict[str, float]:
    """The fastest of `repeats` interleaved runs of each function, in seconds (wall clock: a choice is
    about elapsed time, and threads other than this one do part of the work)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    best = {name: float("inf") for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def pick(seconds: dict[str, float], margin: float = MARGIN) -> str:
    """The candidate to use: the first (the default) unless another is at least `margin` faster."""
    default = next(iter(seconds))
    best = min(seconds, key=seconds.get)
    return best if seconds[best] < (1 - margin) * seconds[default] else default


def measure(candidates: dict[str, Callable[[], object]], *, repeats: int = 3,
            items: dict[str, int] | None = None, margin: float = MARGIN) -> dict:
    """The candidates timed (`_fastest_repeat`, per item when `items` says how many each call does) and the
    one to use (`pick`), confirmed by a second round when it is not the first, the default (see the module
    docstring): {"choice": name, "seconds": {name: s}, "rounds": 1 or 2}."""
    per = items or {}

    def once() -> dict[str, float]:
        return {name: s / per.get(name, 1) for name, s in _fastest_repeat(candidates, repeats=repeats).items()}

    with torch.no_grad():
        seconds, rounds = once(), 1
        if pick(seconds, margin) != next(iter(candidates)):  # departing from the default: measure once more
            again = once()
            seconds, rounds = {name: min(s, again[name]) for name, s in seconds.items()}, 2
    return {"choice": pick(seconds, margin), "seconds": seconds, "rounds": rounds}


class Calibration:
    """The measured choices of one machine, backed by a JSON file (see the module docstring).

    `choose(key, candidates)` returns the remembered choice for `key`, or measures the candidates,
    remembers the result and returns it. Keys name what was measured (the operation, its shape, the
    precision, the thread count); values are {"choice": name, "seconds": {name: s}, "rounds": 1 or 2}.
    Other records (compile times, images/s of a compiled model) go through `get` / `put`.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: dict[str, dict] = self._read()
        self._locks = 0

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # no file yet, or a torn or foreign one: measure again
        if not isinstance(data, dict) or data.get("version") != VERSION or data.get("machine") != machine_key():
            return {}  # written for another CPU or torch: not valid here
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, value: dict) -> None:
        """Remember `value` under `key`, merged into the file as it is on disk now (another process
        may have added entries since this one read it)."""
        self.entries = {**self._read(), **self.entries, key: value}
        try:
            write_json(self.path, {"version": VERSION, "machine": machine_key(), "entries": self.entries}, indent=1)
        except OSError:
            pass  # a read-only home: the choice is still used for this process

    def known(self, key: str, names) -> str | None:
        """The remembered choice for `key` among the candidates `names`, or None when there is none or it
        was measured among other candidates (a kernel added since: measure again)."""
        entry = self.entries.get(key)
        if entry is None or entry.get("choice") not in names:
            return None
        measured = entry.get("seconds") or {}
        return entry["choice"] if not measured or set(measured) == set(names) else None

    def choose(self, key: str, candidates: dict[str, Callable[[], object]], *, repeats: int = 3,
               items: dict[str, int] | None = None) -> str:
        """The fastest candidate for `key` (the first one is the default; see `pick`), measured once (and
        confirmed by a second round when it is not the default; see the module docstring). `items`: how
        many items (images) each candidate's call does, when they differ; it is then scored per item.

        Measuring holds a lock on the file: processes started together (a pool of training runs) take
        turns, and those after the first read its answer, so every process of a machine makes the same
        choice (and none is timed while another measures)."""
        if (known := self.known(key, candidates)) is not None:
            return known
        with self._locked():
            entry = self._read().get(key)  # another process may have measured it meanwhile
            if entry is not None:
                self.entries[key] = entry
                if (known := self.known(key, candidates)) is not None:
                    return known
            entry = measure(candidates, repeats=repeats, items=items)
            self.put(key, entry)
        return entry["choice"]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on `<file>.lock` (POSIX; elsewhere, and on a read-only home, no lock). Held
        once per object: a measurement that needs another (a block's attention timed through its Linear
        layers) takes the lock it holds already."""
        if self._locks:
            self._locks += 1
            try:
                yield
            finally:
                self._locks -= 1
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open(self.path.with_suffix(".lock"), "a")
        except OSError:
            yield
            return
        with f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            self._locks = 1
            try:
                yield
            finally:
                self._locks = 0

    def __deepcopy__(self, memo) -> "Calibration":
        return self  # a handle on the machine's file: a copied model shares it

    def clear(self) -> None:
        """Forget every measurement of this machine (`vitlab bench --recalibrate`)."""
        self.entries = {}
        self.path.unlink(missing_ok=True)


_OPEN: dict[Path, Calibration] = {}


def calibration(root: str | Path | None = None) -> Calibration:
    """This machine's calibration (one object per file and process, so a lookup costs a dict access)."""
    path = cache_file(root)
    if path not in _OPEN:
        _OPEN[path] = Calibration(path)
    return _OPEN[path]


def threads_tag() -> str:
    """The part of a key that says how many threads the measurement ran on."""
    return f"t{torch.get_num_threads()}"


__all__ = ["Calibration", "calibration", "measure", "cache_file", "cache_root", "cpu_model", "machine_key", "pick",
           "MARGIN"]
