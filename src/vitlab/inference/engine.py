"""The engine that computes an inference run's logits: PyTorch on the fast path's plan, or ONNX Runtime on the
model exported to ONNX.

    auto         (the default, `DEFAULT_ENGINE`) the engine `vitlab.speed.rules.ENGINE_RULES` give this kind of
                 CPU, precision, batch and run length: fixed rules, nothing timed (ONNX Runtime for fp32 at batch 1
                 on an AMD with AVX-512 and bf16, and on an Intel with AMX where the run is too short to compile
                 (not a server, whose length is unknown), where it was measured faster; PyTorch everywhere else)
    torch        PyTorch, on the plan of the fast path (`vitlab.speed.fastpath`)
    onnxruntime  ONNX Runtime's CPU provider, every graph optimisation on, fp32

A model's ONNX file is written once per weights: under the cache root, `cache_root()/onnx/<key>.onnx`, the key a
hash of the weights, the configuration and the export settings (`onnx_key`), by
`vitlab.inference.export.export_onnx`, which checks ONNX Runtime's logits against PyTorch's on random images
(within `ONNX_TOLERANCE`) before the file is moved into place; a file found under its key is used as it is.
ONNX Runtime runs at torch's thread count with one inter-op thread, so the same images give the same numbers
run to run. Where ONNX Runtime is missing, the export fails, or the run is not one it takes (bf16, a GPU),
PyTorch runs and the engine's line says why.

    engine = inference_engine(model, precision="fp32", batch_size=1, images=10, device=torch.device("cpu"))
    engine.lines()   # ["engine: onnxruntime (...) [rules (avx512-bf16, amd)]"], or the engine and the fast path
    logits = engine(images)  # (B, 3, H, W) -> (B, K), called like the model
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from vitlab.errors import VitlabError
from vitlab.fileio import cache_root, import_onnxruntime
from vitlab.inference.export import ONNX_TOLERANCE, export_onnx
from vitlab.options import DEFAULT_ENGINE, DEFAULT_FAST_PATH, ENGINE_CHOICES
from vitlab.speed.fastpath import FastPath, InferenceRunner, flops_per_image, serving_model
from vitlab.speed.machine import this_machine
from vitlab.speed.rules import engine_by_rules

# What the ONNX file is besides the weights: a change here (or in torch, which writes it) makes new files.
EXPORT_SETTINGS = {"version": 1, "input": "image (B, C, H, W), B dynamic", "output": "logits (B, K)", "opset": None}
_EXPORTING = threading.Lock()  # one export at a time: the exporter's tracing is not made for several threads


def check_engine(engine: str) -> str:
    if engine not in ENGINE_CHOICES:
        raise VitlabError(f"engine must be one of {', '.join(ENGINE_CHOICES)}; found {engine!r}", arg="engine")
    return engine


# ----------------------------------------------------------------------------------------------------
# The ONNX file, built once per weights


def onnx_key(model: nn.Module) -> str:
    """A hash of what the ONNX file of `model` depends on: every tensor of its state dict (name, dtype, shape,
    bytes), its class and configuration, torch's version and `EXPORT_SETTINGS`."""
    h = hashlib.sha256()
    about = {"settings": EXPORT_SETTINGS, "torch": torch.__version__, "class": type(model).__qualname__}
    h.update(json.dumps({**about, "config": repr(getattr(model, "cfg", None))}, sort_keys=True).encode())
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"\n{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()[:32]


def onnx_path(model: nn.Module) -> Path:
    """Where the ONNX file of `model`'s weights lives (or will): cache_root()/onnx/<onnx_key>.onnx."""
    return cache_root() / "onnx" / f"{onnx_key(model)}.onnx"


def onnx_file(model: nn.Module, *, log: Callable[[str], None] | None = None) -> Path:
    """The ONNX file of `model`: the one under its key, or exported now (on an fp32 CPU copy: `model` is left as
    it is) and checked against PyTorch before it is moved into place. Raises VitlabError if the export or the
    check fails; nothing is left under the key then."""
    path = onnx_path(model)
    with _EXPORTING:
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        report = export_onnx(copy.deepcopy(model).float().cpu().eval(), path, check=True)
    if log is not None:
        log(
            f"exported the model to ONNX once for these weights ({path}); ONNX Runtime's logits are PyTorch's "
            f"to {report['max_abs_diff']:.1e} (max abs; tolerance {ONNX_TOLERANCE:.0e})"
        )
    return path


def onnxruntime_session(path: str | Path, ort=None):
    """An ONNX Runtime session of the file at `path` in its CPU provider, every graph optimisation on, at torch's
    intra-op thread count and one inter-op thread (so a run gives the same numbers every time)."""
    ort = ort or import_onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: its optimiser's notes are not the user's business
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxRuntimeModel:
    """Called like the model: (B, C, H, W) images -> (B, K) fp32 logits, computed by ONNX Runtime."""

    def __init__(self, session, path: Path):
        self.session = session
        self.path = path

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        (logits,) = self.session.run(["logits"], {"image": x.detach().float().cpu().numpy()})
        return torch.from_numpy(logits)  # (B, K)


# ----------------------------------------------------------------------------------------------------
# The engine of a run


def choose_engine(
    model: nn.Module,
    *,
    engine: str,
    precision: str,
    batch_size: int,
    device: torch.device,
    fast: FastPath = DEFAULT_FAST_PATH,
    images: int | None = 1,
) -> tuple[str, str]:
    """(the engine, where the choice came from) for a run of `images` images in batches of `batch_size`: `engine`
    itself when it names one, else the rules' (`vitlab.speed.rules.engine_by_rules`). A fast path other than the
    default asks for a PyTorch path, so "auto" is PyTorch then."""
    check_engine(engine)
    if engine != "auto":
        return engine, f"--engine {engine}"
    if not (isinstance(fast, str) and fast == DEFAULT_FAST_PATH):
        return "torch", f"--fast-path {fast if isinstance(fast, str) else 'a plan'}"
    return engine_by_rules(
        this_machine(),
        precision=precision,
        batch_size=batch_size,
        flops_per_item=flops_per_image(model),
        images=images,
        device_type=device.type,
    )


def onnxruntime_model(
    model: nn.Module, *, precision: str, device: torch.device, log: Callable[[str], None] | None = None
) -> OnnxRuntimeModel:
    """`model` in ONNX Runtime (its ONNX file built first if need be). Raises VitlabError, in one line, where it
    cannot run there: a run ONNX Runtime does not take, ONNX Runtime missing, the export failing."""
    if precision != "fp32":
        raise VitlabError(f"ONNX Runtime's CPU provider has no {precision} matrix products")
    if device.type != "cpu":
        raise VitlabError(f"vitlab runs ONNX Runtime on the CPU; the run is on {device.type}")
    try:
        ort = import_onnxruntime()
    except ImportError as e:
        raise VitlabError(f"onnxruntime is not installed ({e}; pip install onnxruntime)") from e
    try:
        path = onnx_file(model, log=log)
        return OnnxRuntimeModel(onnxruntime_session(path, ort), path)
    except VitlabError:
        raise
    except Exception as e:  # the exporter's and ONNX Runtime's errors are many and unrelated
        raise VitlabError(f"ONNX Runtime could not run the model: {type(e).__name__}: {str(e).splitlines()[0]}") from e


class Engine:
    """What computes the logits of an inference run, called like the model, and what it is in words: `name`
    (one of `vitlab.options.ENGINES`), `lines()` (what a command prints: the engine, and PyTorch's fast path)."""

    def __init__(self, name: str, fn: Callable, said: str, plan: str | None = None):
        self.name, self.fn, self.said, self.plan = name, fn, said, plan

    def __call__(self, x: torch.Tensor, *args, **kwargs):
        return self.fn(x, *args, **kwargs)

    def describe(self) -> str:
        return self.said if self.plan is None else f"{self.said}; {self.plan}"

    def lines(self) -> list[str]:
        return [f"engine: {self.said}"] + ([f"fast path: {self.plan}"] if self.plan is not None else [])


def _onnxruntime_or_why(model, *, precision, device, source, log) -> tuple[Engine | None, str]:
    """(ONNX Runtime's engine, "") where it runs, else (None, why not, in a few words)."""
    try:
        ready = onnxruntime_model(model, precision=precision, device=device, log=log)
    except VitlabError as e:
        return None, str(e)
    threads = torch.get_num_threads()
    said = f"onnxruntime (CPU provider, {threads} thread{'s' * (threads != 1)}, {ready.path.name}) [{source}]"
    return Engine("onnxruntime", ready, said), ""


def inference_engine(
    model: nn.Module,
    *,
    engine: str = DEFAULT_ENGINE,
    precision: str,
    batch_size: int,
    images: int,
    device: torch.device,
    fast: FastPath = DEFAULT_FAST_PATH,
    log: Callable[[str], None] | None = None,
) -> Engine:
    """The engine of an inference run of `images` images in batches of `batch_size` (`engine`: a word of
    ENGINE_CHOICES; "auto" with a fast path but the default is PyTorch): ONNX Runtime where it is chosen and can
    run, else PyTorch on `fast`'s plan (`vitlab.speed.fastpath.InferenceRunner`). `model` is left as it is."""
    batch_size = max(1, min(batch_size, images))
    name, source = choose_engine(
        model, engine=engine, precision=precision, batch_size=batch_size, device=device, fast=fast, images=images
    )
    said = f"torch [{source}]"
    if name == "onnxruntime":
        ready, why = _onnxruntime_or_why(model, precision=precision, device=device, source=source, log=log)
        if ready is not None:
            return ready
        said = f"torch, not ONNX Runtime: {why} [{source}]"
    runner = InferenceRunner(
        model, precision=precision, batch_size=batch_size, images=images, device=device, fast=fast, log=log
    )
    return Engine("torch", runner, said, runner.describe())


def serving_engine(
    model: nn.Module,
    *,
    engine: str = DEFAULT_ENGINE,
    precision: str,
    device: torch.device,
    fast: FastPath = DEFAULT_FAST_PATH,
) -> tuple[Callable, str]:
    """What answers a server's top-k requests, one image at a time, and its path in words: ONNX Runtime where
    `engine` gives it (as `inference_engine` for a batch of one), else `vitlab.speed.fastpath.serving_model`'s
    (its plan in words, and why not ONNX Runtime where it was asked for and cannot run). `model` is left as it
    is (the attention maps need it so)."""
    name, source = choose_engine(  # a server's run has no known length
        model, engine=engine, precision=precision, batch_size=1, device=device, fast=fast, images=None
    )
    why = ""
    if name == "onnxruntime":
        ready, why = _onnxruntime_or_why(model, precision=precision, device=device, source=source, log=None)
        if ready is not None:
            return ready, ready.describe()
    fn, plan = serving_model(model, precision=precision, device=device, fast=fast)
    return fn, f"{plan} (not ONNX Runtime: {why} [{source}])" if why else plan


__all__ = [
    "EXPORT_SETTINGS",
    "check_engine",
    "onnx_key",
    "onnx_path",
    "onnx_file",
    "onnxruntime_session",
    "OnnxRuntimeModel",
    "choose_engine",
    "onnxruntime_model",
    "Engine",
    "inference_engine",
    "serving_engine",
]
