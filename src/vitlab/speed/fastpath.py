"""The fast path a command takes, chosen by what this machine measured, and said out loud.

`--fast-path` (every command that runs a model over many images or trains one):

    auto      (default) the kernels measured fastest here (`vitlab.speed.calibration`): packed Linear
              weights for inference where they pay, the faster library per training product, the faster
              attention kernel (for training, kept only where a whole step is faster with them:
              `check_whole_step`), a batch run a few images at a time where that is faster
              (`vitlab.speed.pieces`); and torch.compile where the run repays the compile
              (`vitlab.speed.compiled.decide`)
    compile   always compile (but a run of a single batch)
    eager     the measured kernels, never compile
    off       the model exactly as built: no packing, no kernel choice, no compile

`InferenceRunner` runs the batches of an inference run (`vitlab predict`, `attention`, `inspect`)
through that path; `serving_model` readies a copy for a server that answers one image at a time
(`vitlab serve`, in the background after a model loads); `prepare_training` readies a model for
`fit`, which compiles by the same rule between epochs. Each describes the path it took in one line
that the command prints.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import VitlabError
from vitlab.models.vit import VisionTransformer
from vitlab.runtime import autocast
from vitlab.speed import compiled as C
from vitlab.speed import cpu_inference, cpu_training
from vitlab.speed.attention import choose_attention
from vitlab.speed.calibration import Calibration, calibration, threads_tag
from vitlab.speed.pieces import choose_pieces, in_pieces, known_compiled_pieces

FAST_PATHS = ("auto", "compile", "eager", "off")


def check_fast_path(fast: str) -> str:
    if fast not in FAST_PATHS:
        raise VitlabError(f"fast_path must be one of {', '.join(FAST_PATHS)}; found {fast!r}", arg="fast_path")
    return fast


def _tokens(model: nn.Module) -> int:
    cfg = getattr(model, "cfg", None)
    return cfg.num_patches + cfg.num_prefix_tokens if hasattr(cfg, "num_patches") else 1


class InferenceRunner:
    """Batches of images through `model` on the fast path for a run of `images` images in batches of
    `batch_size` (call it like the model, under the caller's autocast; then `finish()`).

    - one batch in all: the model as it is (preparing anything would cost more than it saves);
    - on a CPU, how many images of a batch to run at a time (`vitlab.speed.pieces`), the attention
      kernel and, per Linear layer, packed or not, as measured here;
    - compiled when `decide` says the run repays it: at once if a compile of this model was measured
      here before, else after the first batch, timed uncompiled, shows how long the run will be. The
      compiled graph takes inputs of the first compiled shape (a batch, or a piece of one); a smaller
      last batch or piece runs uncompiled.
    """

    def __init__(self, model: nn.Module, *, precision: str, batch_size: int, images: int,
                 device: torch.device, fast: str = "auto", cal: Calibration | None = None, method: str = "forward"):
        self.model, self.precision, self.images, self.device = model.eval(), precision, images, device
        self.method = method  # what a call runs: the model's forward, or e.g. its forward_features
        self.fast = check_fast_path(fast)
        self.cal = cal or calibration()
        self.batch_size = min(batch_size, max(images, 1))
        self.pieces = self.batch_size  # images per forward pass (`vitlab.speed.pieces`): the batch unless measured
        self.done = 0
        self.eager: nn.Module = self.model
        self.compiled: C.CompiledModel | None = None
        self.decision: C.Decision | None = None
        self.measure = C.Measurement(C.record_key(model, mode="inference", precision=precision,
                                                  batch_size=self.batch_size, device=device))
        self.notes: list[str] = []
        self.first_compiled_s: float | None = None
        self.waiting = False  # for the first batch's timing, to decide when nothing was measured before
        if fast == "off" or images <= self.batch_size:
            self.notes.append("the model as built" + ("" if fast == "off" else
                              " (one batch: preparing a faster path would cost more than it saves)"))
            return
        choice = True if fast == "compile" else (False if fast == "eager" else None)
        if device.type == "cpu":
            self._set_pieces(choose_pieces(self.model, precision=precision, batch_size=self.batch_size, cal=self.cal,
                                           images=images))
            attention = choose_attention(self.model, precision=precision, batch_size=self.pieces, cal=self.cal)
            if attention:
                self.notes.append(f"{attention} attention")
        self.decision = C.decide(self.cal, self.measure.key, items=images, uncompiled_s=None, choice=choice)
        # the piece size measured on the compiled graph (by `vitlab bench`), when compiling in it pays
        on_graph = (known_compiled_pieces(self.model, precision=precision, batch_size=self.batch_size, cal=self.cal)
                    if device.type == "cpu" and fast != "eager" else None)
        if on_graph not in (None, self.pieces):
            key = C.record_key(model, mode="inference", precision=precision, batch_size=self.batch_size,
                               device=device, pieces=on_graph)
            decision = C.decide(self.cal, key, items=images, uncompiled_s=None, choice=choice)
            if decision.compile:
                self.decision = decision
                self._set_pieces(on_graph)
        if self.pieces < self.batch_size:
            self.notes.insert(0, f"{self.pieces} images at a time")
        self.waiting = fast == "auto" and not self.decision.measured
        if self.decision.compile:
            self.compiled = C.CompiledModel(self.model, mode="inference", method=self.method)
        elif cpu_inference.supported(precision, device):
            # packed in a copy: the caller's model stays as it is (and unpacked, in case compiling is chosen
            # after the first batch)
            self.eager = copy.deepcopy(self.model)
            n = cpu_inference.pack_for_cpu_inference(self.eager, precision, self.pieces * _tokens(model),
                                                     cal=self.cal)
            self.notes.append(f"{n} of {cpu_inference.linear_count(self.eager)} Linear weights packed")

    def _set_pieces(self, pieces: int) -> None:
        self.pieces = pieces
        self.measure.key = C.record_key(self.model, mode="inference", precision=self.precision,  # its own graph
                                        batch_size=self.batch_size, device=self.device, pieces=pieces)

    def __call__(self, x: torch.Tensor, **kwargs):
        full = x.shape[0] == self.batch_size
        on_graph = self.compiled is not None and full
        t0 = time.perf_counter()
        out = in_pieces(self.compiled if on_graph else getattr(self.eager, self.method), x, self.pieces, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        if full and not on_graph:
            self.measure.uncompiled.append(seconds / len(x))
        elif full and self.first_compiled_s is None:
            self.first_compiled_s = seconds  # the compile, and one batch
        elif full:
            self.measure.compiled.append(seconds / len(x))
        self.done += len(x)
        if self.fast == "auto" and self.compiled is None and self.measure.uncompiled and self.waiting:
            self.waiting = False  # the first batch, timed uncompiled, says how long the rest will take
            self.decision = C.decide(self.cal, self.measure.key, items=self.images - self.done,
                                     uncompiled_s=self.measure.uncompiled[0])
            if self.decision.compile:
                self.compiled = C.CompiledModel(self.model, mode="inference", method=self.method)
        return out

    def finish(self) -> None:
        """Keep the compile's measurements for the next run's decision (when there are enough)."""
        if self.first_compiled_s is not None and self.measure.compiled:
            per_batch = statistics.median(self.measure.compiled) * self.batch_size
            self.measure.compile_s = max(0.0, self.first_compiled_s - per_batch)
            self.measure.save(self.cal)

    def describe(self) -> str:
        """The path taken, in one line."""
        if self.decision is None:
            return "; ".join(self.notes)
        compiled = "compiled (torch.compile, freezing, C++ wrapper)" if self.compiled is not None else "not compiled"
        return "; ".join([f"{compiled}: {self.decision.reason}"] + self.notes)


class _Served(nn.Module):
    """A server's model: batches of the compiled shape through the compiled graph, others through the
    prepared (packed) copy."""

    def __init__(self, eager: nn.Module, compiled: C.CompiledModel | None):
        super().__init__()
        self.eager, self.compiled = eager, compiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compiled is not None and x.shape == self.compiled.shape:
            return self.compiled(x)
        return self.eager(x)


def serving_model(model: nn.Module, *, precision: str, device: torch.device, fast: str = "auto",
                  cal: Calibration | None = None) -> tuple[nn.Module, str]:
    """A copy of `model` readied for answering one image at a time, and the path taken in words; `model`
    itself is left as it is (the attention maps need it so). How long a server runs is not known, so
    `auto` and `eager` take the kernels measured fastest here for a batch of one and do not compile;
    `compile` also compiles the copy for a batch of one (with freezing), here and now, before it is
    used; `off` returns `model`."""
    check_fast_path(fast)
    if fast == "off":
        return model, "the model as built (--fast-path off)"
    model = model.eval()
    eager, notes = copy.deepcopy(model), []
    if device.type == "cpu":
        attention = choose_attention(eager, precision=precision, batch_size=1, cal=cal)
        if attention:
            notes.append(f"{attention} attention")
        if cpu_inference.supported(precision, device):
            n = cpu_inference.pack_for_cpu_inference(eager, precision, _tokens(model), cal=cal or calibration())
            notes.append(f"{n} of {cpu_inference.linear_count(eager)} Linear weights packed")
    if fast != "compile":
        head = "not compiled (how long a server runs is not known; --fast-path compile compiles it)"
        return _Served(eager, None), "; ".join([head] + notes)
    compiled = C.CompiledModel(copy.deepcopy(model), mode="inference")
    cfg = model.cfg
    with torch.inference_mode(), autocast(device, precision):
        compiled(torch.zeros(1, cfg.in_chans, *cfg.img_size, device=device))  # compiles for a batch of one
    head = "compiled for one image at a time (torch.compile, freezing, C++ wrapper)"
    return _Served(eager, compiled), head + (f"; other batches: {', '.join(notes)}" if notes else "")


def prepare_training(model: nn.Module, *, precision: str, batch_size: int, fast: str = "auto",
                     cal: Calibration | None = None) -> list[str]:
    """Ready `model` (in place) for training on the fast path: on a CPU the faster library per fp32
    product and the faster attention kernel, each measured here alone, then kept only if the whole
    training step is faster with them (`check_whole_step`). Compiling is `TrainingCompiler`'s.
    Returns what was done, in words."""
    check_fast_path(fast)
    if fast == "off":
        return ["the model as built"]
    cal = cal or calibration()
    notes = []
    swapped = cpu_training.use_onednn_linears(model, cal)
    if swapped:
        notes.append("fp32 products by the library measured faster here")
    attention = choose_attention(model, precision=precision, batch_size=batch_size, train=True, cal=cal)
    if attention:
        notes.append(f"{attention} attention")
    if (swapped or attention == "explicit") and isinstance(model, VisionTransformer):
        seconds = check_whole_step(model, precision=precision, batch_size=batch_size, attention=attention, cal=cal)
        said = f"a step {_duration(seconds[SIDES[1]])} with them, {_duration(seconds[SIDES[0]])} as built"
        if seconds["choice"] == SIDES[0]:
            return [f"the model as built ({', '.join(notes)}: measured here and not kept, {said})"]
        notes.append(said)
    return notes


SIDES = ("as built", "measured kernels")  # the default first: the measured kernels must beat it (`pick`)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _take(model: VisionTransformer, side: str, attention: str | None) -> None:
    """Train `model` as built, or with the kernels `prepare_training` chose (`attention` among them)."""
    measured = side == SIDES[1]
    cpu_training.take_measured_products(model, measured)
    model.set_fused_attention(attention != "explicit" or not measured)


def check_whole_step(model: VisionTransformer, *, precision: str, batch_size: int, attention: str | None,
                     cal: Calibration) -> dict:
    """A training step (forward and backward, on a random batch of the run's size) of `model` with the
    kernels chosen one operation at a time against the model as built, timed in turn, once per model,
    precision, batch and CPU (kept in `cal`); the measured kernels must win by `MARGIN`, twice. Returns
    {"choice": side, side: seconds, ...}.

    Each operation is measured alone, and alone a kernel can win while the step gets slower: on
    `vit_mini_x` (the demo's model) at batch 32 the explicit attention products measured faster for one
    block and made the whole step slower: 14.0 ms against 11.7 ms as built (steps interleaved, one thread,
    Intel Xeon with AMX)."""
    key = f"train-kernels/{C.signature(model)}/{precision}/{threads_tag()}/b{batch_size}"
    twin = copy.deepcopy(model).train()  # timed on a copy: the model's gradients and state stay as they are
    c = model.cfg
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, c.in_chans, *c.img_size, generator=g)
    y = torch.randint(0, max(c.num_classes, 1), (batch_size,), generator=g)

    def step(side: str):
        def fn() -> None:
            _take(twin, side, attention)
            with torch.enable_grad():
                with autocast(x.device, precision):
                    logits = twin(x)
                F.cross_entropy(logits.float(), y).backward()
            twin.zero_grad(set_to_none=True)

        return fn

    with torch.random.fork_rng(devices=[]):  # dropout's draws here leave the run's random stream as it was
        choice = cal.choose(key, {side: step(side) for side in SIDES}, repeats=2)
    _take(model, choice, attention)
    return {"choice": choice, **(cal.get(key) or {}).get("seconds", {})}


class TrainingCompiler:
    """`fit`'s compile decisions, made between epochs: compile when the steps left in the stage repay it
    (`decide`, by a compile of this model measured here before, or else by the first epoch's step times),
    and measure the compile (the first compiled step, less a compiled step) and the compiled steps for
    the next run. A stage change (other parameters frozen) starts a new graph and a new decision. A
    compiled model that turns out slower than the uncompiled one is dropped.

        compiler = TrainingCompiler(model, precision=..., batch_size=..., fast=...)
        each epoch: net = compiler.model_for(steps_left); times = []; train_one_epoch(net, ..., timings=times);
                    compiler.observe(times)
    """

    def __init__(self, model: nn.Module, *, precision: str, batch_size: int, fast: str = "auto",
                 cal: Calibration | None = None, log=None):
        self.model, self.precision, self.batch_size = model, precision, batch_size
        self.fast = check_fast_path(fast)
        self.cal = cal or calibration()
        self.say = log or (lambda line: None)
        self.stage_key: str | None = None
        self._new_stage()

    def _frozen(self) -> bool:
        return any(not p.requires_grad for p in self.model.parameters())

    def _new_stage(self) -> None:
        self.frozen = self._frozen()
        self.measure = C.Measurement(C.record_key(self.model, mode="train", precision=self.precision,
                                                  batch_size=self.batch_size, device=self._device(),
                                                  extra="-partly-frozen" if self.frozen else ""))
        self.compiled: C.CompiledModel | None = None
        self.decided = self.fast in ("eager", "off")
        self.compiled_epochs = 0

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def model_for(self, steps_left: int) -> nn.Module:
        """The module to train the next epoch with: the compiled one, or `model`."""
        if self._frozen() != self.frozen:
            self._new_stage()
        if not self.decided:
            uncompiled = statistics.median(self.measure.uncompiled) if self.measure.uncompiled else None
            decision = C.decide(self.cal, self.measure.key, items=steps_left, uncompiled_s=uncompiled, unit="steps",
                                choice=True if self.fast == "compile" else None)
            self.decided = decision.measured or uncompiled is not None
            if decision.compile:
                self.compiled = C.CompiledModel(self.model, mode="train")
            if self.decided:
                self.say(f"fast path: {'compiled (torch.compile)' if decision.compile else 'not compiled'}: "
                         f"{decision.reason}")
        return self.compiled if self.compiled is not None else self.model

    def observe(self, step_s: list[float]) -> None:
        """The step times of the epoch just trained (full batches only count)."""
        if not step_s:
            return
        if self.compiled is None:
            self.measure.uncompiled += step_s
            return
        self.compiled_epochs += 1
        if self.compiled_epochs == 1:
            if len(step_s) < 2:
                return  # no step after the compile to tell it apart
            steady = statistics.median(step_s[1:])
            self.measure.compile_s = max(0.0, step_s[0] - steady)
            self.measure.compiled += step_s[1:]
        else:
            self.measure.compiled += step_s
        record = self.measure.save(self.cal)
        if record is not None and self.measure.uncompiled and record["compiled_s"] >= record["uncompiled_s"]:
            self.say(f"fast path: the compiled model is not faster here ({record['compiled_s']:.3g} s per step vs "
                     f"{record['uncompiled_s']:.3g} uncompiled); training on uncompiled")
            self.compiled = None


__all__ = ["FAST_PATHS", "check_fast_path", "InferenceRunner", "serving_model", "prepare_training",
           "check_whole_step", "TrainingCompiler"]
