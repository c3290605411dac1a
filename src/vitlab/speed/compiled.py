"""torch.compile for vitlab's models, and whether it pays for a given run.

How a model is compiled (`compile_model`):
- inference: `torch.compile(model, dynamic=False)`, called with inductor's `freezing` on
  (`torch._inductor.config.patch(freezing=True)` around every call, so that a recompile freezes too).
  Freezing, what inductor's documentation recommends for CPU inference, turns the weights into
  constants, so inductor packs each Linear weight once (MKL's packed GEMM in fp32, oneDNN's in bf16),
  as `vitlab.speed.cpu_inference` does by hand, and fuses the element-wise work around the products
  (bias, GELU, residual adds, LayerNorm) into a few C++ loops; with `cpp_wrapper`, the code that calls
  those kernels and the products is C++ too, not Python (inductor's "C++ wrapper": ViT-S/16 at batch 1
  ran 1.02-1.06x with it on an Intel Xeon, a gain near the noise; `benchmarks/compiled_variants.py`).
  It must be the config, not
  `torch.compile(..., options={"freezing": True})`: dynamo reads the flag when it traces, to hand the
  weights to inductor as constants, and the options reach only inductor. With the options alone (this
  module's way until it was measured) the graph keeps the weights as inputs and nothing is packed;
- training: `torch.compile(model, dynamic=False)`: forward and backward graphs (AOTAutograd), the
  weights left as inputs since they change every step.
`dynamic=False` keeps one graph per batch shape; `CompiledModel` sends a call of another shape (the
last, smaller batch of a run) to the uncompiled model instead of compiling a second graph for it.

A second process compiles faster: inductor keeps what it built on disk (in torchinductor_<user> under
the system's temporary folder unless TORCHINDUCTOR_CACHE_DIR says otherwise). A training graph goes
whole into its FX graph cache (and AOTAutograd's), so the next run of the same model, precision and
batch shape loads it. A frozen inference graph cannot: its packed oneDNN weights do not pickle, and
inductor bypasses the FX graph cache for it ("mkldnn tensors unpickleable"), so the next process
traces and freezes the graph again, but finds its C++ kernels already built (ViT-S/16, fp32, batch
32, on an Intel Xeon: a first call of 29.7 s in the first process, 19.2 s in the second;
`benchmarks/compile_cache.py`).

When to compile is measured, not guessed from the model's size: compiling costs tens of seconds to
minutes and gains a few to tens of percent per image, depending on the CPU, the model and the
precision. Every compile a command or `vitlab bench` does is timed, with the seconds per image
compiled and uncompiled, and kept in the machine's calibration file (`vitlab.speed.calibration`).
`decide` then compiles when the run's images (or training steps) repay the measured compile time.
For a model, precision and batch never compiled on this machine, it compiles only when the run is
long: at least `FIRST_COMPILE_SHARE`^-1 times the longest compile measured here (or `FIRST_COMPILE_S`
when there is none), so that a compile that gains nothing costs at most that share of the run, and
measures it for the next run.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import types
from dataclasses import dataclass, field

import torch
from torch import nn

from vitlab.speed.calibration import Calibration, threads_tag

FIRST_COMPILE_SHARE = 0.1  # a first compile may cost at most this share of the run it speeds up
FIRST_COMPILE_S = 120.0  # the compile time assumed before any compile was measured on this machine
MODES = ("inference", "train")


class _Frozen:
    """A compiled inference function, called with inductor's freezing on (and its C++ wrapper, unless
    `cpp_wrapper` is False); see the module docstring."""

    def __init__(self, fn, cpp_wrapper: bool = True):
        self.fn, self.cpp_wrapper = fn, cpp_wrapper

    def __call__(self, *args, **kwargs):
        with torch._inductor.config.patch(freezing=True, cpp_wrapper=self.cpp_wrapper):
            return self.fn(*args, **kwargs)


def _own_code(method):
    """`method` (a bound method) running a copy of its function's code object.

    Dynamo keeps the graphs it compiles on the code object it traced, so every compile of one model
    class (every `VisionTransformer.forward`) shares that code's cache, and after `cache_size_limit` of
    them (8) it stops compiling that code and runs it uncompiled, without an error: the ninth ViT
    compiled in one process (a `vitlab bench` table of more than eight rows, the runs of `vitlab
    reproduce`) ran as it was built (measured, torch 2.14: a "compile" of 0.1 s). A code object of its
    own gives each compiled model a cache of its own (the cache on the code: pytorch/pytorch#104095).
    Not for torch.nn's own classes (an `nn.Sequential`): dynamo calls those through a function of its
    own, whose cache they all share still."""
    f = method.__func__
    own = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    own.__kwdefaults__, own.__qualname__ = f.__kwdefaults__, f.__qualname__
    return types.MethodType(own, method.__self__)


class _CompiledModule(nn.Module):
    """`module` whose forward runs its compiled graph: its parameters, `train()` and `eval()` are the
    module's, as with `torch.compile(module)`, so an optimizer can be built on it."""

    def __init__(self, module: nn.Module, compiled):
        super().__init__()
        self.module, self.compiled = module, compiled  # the compiled function is not a module: not registered

    def forward(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)


def compile_model(fn, mode: str, *, cpp_wrapper: bool = True):
    """`fn` (a module or a method) compiled for `mode` ("inference", with freezing, or "train"); see the
    module docstring. A module is compiled through its `forward`, on a code object of its own
    (`_own_code`), and comes back as a module with its parameters; its hooks are not run.
    `cpp_wrapper=False` compiles an inference graph as plain `torch.compile` with freezing does (`vitlab
    bench`'s compiled-timm peer). Run an inference one under torch.no_grad or torch.inference_mode:
    freezing applies to graphs without gradients."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; found {mode!r}")
    compiled = torch.compile(_own_code(fn.forward if isinstance(fn, nn.Module) else fn), dynamic=False)
    compiled = _Frozen(compiled, cpp_wrapper) if mode == "inference" else compiled
    return _CompiledModule(fn, compiled) if isinstance(fn, nn.Module) else compiled


def signature(model: nn.Module) -> str:
    """A short name for the model's architecture (its class and configuration), weights aside."""
    cfg = getattr(model, "cfg", None)
    text = json.dumps(cfg.to_dict() if cfg is not None else repr(model), sort_keys=True, default=str)
    return f"{type(model).__name__}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def record_key(model: nn.Module, *, mode: str, precision: str, batch_size: int, device: torch.device | str = "cpu",
               extra: str = "", pieces: int | None = None) -> str:
    """The calibration key of a compile measurement: what was compiled, how, and on what (`pieces`: the
    images per forward pass of a batch run in pieces, `vitlab.speed.pieces`; another graph)."""
    if pieces is not None and pieces < batch_size:
        extra += f"-pieces{pieces}"
    where = threads_tag() if torch.device(device).type == "cpu" else str(device)
    frozen = "-frozen-cpp" if mode == "inference" else ""  # records of the compiles of before are not read
    return f"compile/{mode}{frozen}/{signature(model)}{extra}/{precision}/b{batch_size}/{where}"


class CompiledModel(nn.Module):
    """`model` (or its `method`, e.g. "forward_features") and its compiled graph: a call with the batch
    shape of the first call goes to the graph, any other to the uncompiled model."""

    def __init__(self, model: nn.Module, *, mode: str, method: str = "forward"):
        super().__init__()
        self.model, self.method = model, method
        self.compiled = compile_model(getattr(model, method), mode)  # a function: `model` is registered once
        self.shape: torch.Size | None = None

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if self.shape is None:
            self.shape = x.shape
        if x.shape == self.shape:
            return self.compiled(x, *args, **kwargs)
        return (self.model if self.method == "forward" else getattr(self.model, self.method))(x, *args, **kwargs)


@dataclass
class Decision:
    """Whether a run compiles, and why, in words a command prints."""

    compile: bool
    reason: str
    measured: bool = False  # decided by a compile measured on this machine (or by the user)


@dataclass
class Measurement:
    """Seconds per item (image or training step) of a run, uncompiled and compiled, and the compile
    time; `save` keeps them in the calibration for the next `decide`."""

    key: str
    uncompiled: list[float] = field(default_factory=list)  # seconds per item, one entry per timed call
    compiled: list[float] = field(default_factory=list)
    compile_s: float | None = None

    def save(self, cal: Calibration) -> dict | None:
        """Kept when there is a compile time and compiled timings (merged with what was known)."""
        if self.compile_s is None or not self.compiled:
            return None
        old = cal.get(self.key) or {}
        uncompiled = statistics.median(self.uncompiled) if self.uncompiled else old.get("uncompiled_s")
        if uncompiled is None:
            return None
        record = {"compile_s": self.compile_s, "compiled_s": statistics.median(self.compiled),
                  "uncompiled_s": uncompiled}
        cal.put(self.key, record)
        return record


def longest_compile(cal: Calibration) -> float | None:
    """The longest compile measured on this machine, any model: the estimate for an unmeasured one."""
    times = [e["compile_s"] for k, e in cal.entries.items() if k.startswith("compile/") and "compile_s" in e]
    return max(times) if times else None


def decide(cal: Calibration, key: str, *, items: int, uncompiled_s: float | None, unit: str = "images",
           choice: bool | None = None) -> Decision:
    """Whether compiling pays for a run of `items` more images (or steps) at `uncompiled_s` seconds each
    uncompiled. `choice` True/False is the user's (a flag), None lets the measurements decide."""
    if choice is not None:
        return Decision(choice, "asked for" if choice else "turned off", measured=True)
    record = cal.get(key)
    if record is not None:
        gain = record["uncompiled_s"] - record["compiled_s"]
        if gain <= 0:
            return Decision(False, f"measured here: the compiled model is not faster ({record['compiled_s']:.3g} vs "
                                   f"{record['uncompiled_s']:.3g} s per {unit[:-1]})", measured=True)
        after = record["compile_s"] / gain
        share = gain / record["uncompiled_s"]
        text = (f"measured here: compiling takes {record['compile_s']:.0f} s and saves {share:.0%} per {unit[:-1]}, "
                f"so it pays after {after:,.0f} {unit}; this run has {items:,}")
        return Decision(items > after, text, measured=True)
    if uncompiled_s is None:
        return Decision(False, "not measured on this machine yet")
    expected = longest_compile(cal) or FIRST_COMPILE_S
    run_s = items * uncompiled_s
    pays = FIRST_COMPILE_SHARE * run_s >= expected
    return Decision(pays, f"compile time not measured for this model here: expected ~{expected:.0f} s, "
                          f"{'at most' if pays else 'more than'} {FIRST_COMPILE_SHARE:.0%} of the run's ~{run_s:,.0f} s")


__all__ = ["CompiledModel", "Decision", "Measurement", "decide", "compile_model", "record_key", "signature",
           "longest_compile", "FIRST_COMPILE_SHARE", "FIRST_COMPILE_S"]
