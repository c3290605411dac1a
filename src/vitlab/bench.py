"""Speed and memory: how fast vitlab runs on this machine, next to the peers a user would pick.

`vitlab bench` measures, in one process and at one thread count:

1. the machine's matrix-multiply rate (a 2048^3 product in fp32 and in bf16): the ceiling a ViT,
   which is ~98% matrix products (`vitlab.analysis.flops`), can approach;
2. for each model, precision and batch size, inference (and with `train`, training-step) images/s on
   every path asked for, all with the same weights and inputs, run alternately (the order rotates
   every repeat, so a slow phase of a shared machine hits all of them):
       vitlab         as vitlab's commands run a long run: the engine and plan the fixed rules give this
                      machine (`auto`, the default: `vitlab.inference.engine`, which may be ONNX Runtime
                      on vitlab's own export, and `vitlab.speed.fastpath`), and with `tuned` also the
                      plan `vitlab tune` measured fastest here, on PyTorch (row "vitlab-tuned"); each
                      row says its engine and plan
       timm           timm's VisionTransformer of the same configuration, as shipped (eager)
       timm-compile   the same under `torch.compile`, with inductor's `freezing` for inference, as
                      torch's documentation recommends for CPU inference
       onnxruntime    timm's own model (`timm.create_model(name)`, vitlab's weights) exported to ONNX
                      with `torch.onnx.export` and run in ONNX Runtime's CPU provider with every graph
                      optimisation, as a user who picks ONNX Runtime runs it; inference in fp32 (its
                      CPU provider has no bf16 matrix products)
   The compile time of each compiled path (wall clock: the compiler's own processes count) and the
   number of images after which it pays for itself are reported beside the rows.

Every number is the median of several timed repeats after warm-up; a repeat calls a fast path several
times over, to last at least `MIN_REPEAT_S`. Achieved FLOP/s uses the analytic
count of `vitlab.analysis.flops.count_macs` (FLOPs = 2 x MACs; a training step counts 3x the forward:
one product forward, two backward); MFU is that rate over the measured matmul rate of the same
precision. No timing here is ever asserted in tests: machines differ, read the ratios.

Memory: `measure_peak_memory` runs one step in a fresh process and reads its peak resident set size, so a
measurement never inherits another's peak; `memory_report` sets each beside the estimate of
`vitlab.models.size.estimate_memory` (weights, gradients, AdamW state, activations, with or without gradient
checkpointing, fp32 or bf16), the one `check_fits` refuses runs with.
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.analysis.flops import count_macs
from vitlab.errors import VitlabError, check_range
from vitlab.fileio import import_onnxruntime
from vitlab.inference.engine import inference_engine, onnxruntime_session
from vitlab.inference.export import ONNX_TOLERANCE
from vitlab.inference.interop import timm_architecture
from vitlab.models.factory import create_model
from vitlab.models.registry import get_config, get_variant
from vitlab.models.size import estimate_memory, format_bytes
from vitlab.models.vit import VisionTransformer
from vitlab.options import BENCH_FAST_PATHS, DEFAULT_FAST_PATH, check_precision
from vitlab.runtime import autocast, process_pool, resolve_device
from vitlab.speed import onednn
from vitlab.speed.compiled import compile_model
from vitlab.speed.fastpath import check_fast_path, choose_plan
from vitlab.speed.machine import this_machine
from vitlab.speed.paths import training
from vitlab.speed.tune import race as _race
from vitlab.speed.tune import tuning_file
from vitlab.train.optim import build_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PEERS = {"timm": "timm", "compile": "timm-compile", "onnxruntime": "onnxruntime"}  # --against word -> path
PATHS = ("vitlab", "vitlab-tuned", "timm", "timm-compile", "onnxruntime")
OURS = dict(zip(BENCH_FAST_PATHS, ("vitlab", "vitlab-tuned")))  # vitlab's fast paths a bench measures -> their rows
LONG_RUN = 10**6  # images (or steps) of the run a row stands for: the rules' plan for a long run
MIN_REPEAT_S = 0.5  # a repeat of a path lasts at least this long (a batch of one is called several times)
MODES = ("inference", "train")


def parse_against(text: str | None) -> list[str]:
    """`timm,compile,onnxruntime` -> the paths raced against vitlab, in that order."""
    words = [w.strip() for w in (text or "").split(",") if w.strip()]
    bad = [w for w in words if w not in PEERS]
    if bad:
        raise VitlabError(
            f"against: unknown peer(s) {', '.join(bad)}; expected a comma list of {', '.join(PEERS)}", arg="against"
        )
    return list(dict.fromkeys(PEERS[w] for w in words))


# ----------------------------------------------------------------------------------------------------
# Timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = ("wall", "cpu")


def race(
    fns: dict[str, Callable[[], None]],
    *,
    warmup: int = 1,
    repeats: int = 5,
    device: torch.device = torch.device("cpu"),
    clock: str = "wall",
    min_repeat_s: float = 0.0,
) -> dict[str, list[float]]:
    """Seconds per call of each function, interleaved (`vitlab.speed.tune.race`). `clock="wall"` times elapsed
    seconds; `clock="cpu"` the process's CPU seconds, which on a shared machine leave out the time spent
    waiting for a core (meaningful at one thread). Returns {name: [seconds per call, one per repeat]}."""
    if clock not in CLOCKS:
        raise VitlabError(f"clock must be one of {', '.join(CLOCKS)}; found {clock!r}", arg="clock")
    synced = {name: (lambda fn=fn: (fn(), _sync(device))) for name, fn in fns.items()}
    return _race(
        synced,
        warmup=warmup,
        repeats=repeats,
        min_repeat_s=min_repeat_s,
        clock=time.perf_counter if clock == "wall" else time.process_time,
    )


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median over repeats of theirs / ours seconds (= our speed over theirs): each pair ran back to
    back, so a slow phase of the machine cancels out of each ratio."""
    return statistics.median(t / o for o, t in zip(ours, theirs))


def matmul_rate(
    precision: str = "fp32",
    *,
    n: int = 2048,
    warmup: int = 2,
    repeats: int = 5,
    device: torch.device | str = "cpu",
    clock: str = "wall",
) -> float:
    """FLOP/s of an n x n x n matrix product (2 n^3 FLOPs) in `precision`: the best of `repeats`
    (the ceiling is what the machine can do; a slow repeat measures the neighbours, not the machine).
    On a CPU with oneDNN, the faster of torch.mm and oneDNN's product with a pre-packed operand (what vitlab's
    packed inference runs, `vitlab.speed.onednn`), so that MFU stays a share of the best rate."""
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, DTYPES[precision])
    b = torch.randn(n, n, generator=g).to(device, DTYPES[precision])
    fns = {"mm": lambda: torch.mm(a, b)}
    if device.type == "cpu" and onednn.available(precision):
        linear = nn.Linear(n, n, bias=False)
        linear.weight.data = b.T.contiguous().float()  # a @ b as a Linear of weight b^T
        fns["onednn"] = partial(onednn.PackedLinear(linear, DTYPES[precision], n), a)
    times = race(fns, warmup=warmup, repeats=repeats, device=device, clock=clock)
    return 2 * n**3 / min(min(t) for t in times.values())


# ----------------------------------------------------------------------------------------------------
# The peers: timm's twin, compiled or not, and ONNX Runtime


def timm_twin(model: VisionTransformer) -> nn.Module:
    """timm's VisionTransformer with `model`'s configuration and weights (module names are the same, so
    the state dict loads with strict=True). Raises VitlabError for configurations timm does not have."""
    try:
        from timm.models.vision_transformer import VisionTransformer as TimmViT
    except ImportError as e:  # pragma: no cover - timm is a dev dependency
        raise VitlabError("against timm needs timm installed (pip install timm)", arg="against") from e
    c = model.cfg
    if c.stem != "patch" or c.patch_embed != "conv" or c.pos_embed not in ("learned", "none"):
        raise VitlabError(
            f"against timm: timm's VisionTransformer has no equivalent of stem={c.stem!r}, "
            f"patch_embed={c.patch_embed!r}, pos_embed={c.pos_embed!r}; benchmark a standard variant "
            "(learned 1-D position embedding, conv patch embedding), or compare without timm",
            arg="against",
        )
    twin = TimmViT(**timm_architecture(c)[1])  # the arguments a timm export's config.json carries
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.to(next(model.parameters()).device)


def timm_model(name: str, model: VisionTransformer) -> nn.Module:
    """timm's own `timm.create_model(name, pretrained=False)` with `model`'s weights (vitlab's module names are
    timm's), as a user of timm builds it; `timm_twin` where timm has no model of that name (or another shape)."""
    try:
        import timm
    except ImportError as e:  # pragma: no cover - timm is a dev dependency
        raise VitlabError("against timm needs timm installed (pip install timm)", arg="against") from e
    c = model.cfg
    try:
        theirs = timm.create_model(name, pretrained=False, num_classes=c.num_classes, img_size=c.img_size)
        theirs.load_state_dict(model.state_dict(), strict=True)
    except (RuntimeError, ValueError, TypeError):  # a vitlab-only name, or a configuration timm builds otherwise
        return timm_twin(model)
    return theirs.to(next(model.parameters()).device)


def timm_onnxruntime(name: str, model: VisionTransformer, x: torch.Tensor, folder: str | Path):
    """timm's model of `name` with `model`'s weights (`timm_model`), exported to ONNX as its documentation says
    (`torch.onnx.export(model, (x,), path, dynamo=True)`, at the input's shape) and loaded in ONNX Runtime's CPU
    provider with every graph optimisation, at torch's thread count (`vitlab.inference.engine.onnxruntime_session`):
    what a user who picks ONNX Runtime runs. Its logits are checked against timm's (within ONNX_TOLERANCE)."""
    try:
        ort = import_onnxruntime()
    except ImportError as e:  # pragma: no cover - onnxruntime is a dev dependency
        raise VitlabError(
            "against onnxruntime needs onnxruntime installed (pip install onnxruntime)", arg="against"
        ) from e
    theirs = timm_model(name, model).float().cpu().eval()
    x = x.float().cpu()
    path = Path(folder) / "timm.onnx"
    torch.onnx.export(
        theirs,
        (x,),
        str(path),
        dynamo=True,
        input_names=["image"],
        output_names=["logits"],
        report=False,
        verbose=False,  # no progress lines in the bench's output
    )
    session = onnxruntime_session(path, ort)
    with torch.no_grad():
        expected = theirs(x).numpy()
    (got,) = session.run(["logits"], {"image": x.numpy()})
    diff = float(abs(got - expected).max())
    if not diff <= ONNX_TOLERANCE:
        raise VitlabError(f"timm's model in ONNX Runtime differs from timm's by {diff:.2e} (max abs)")
    return session


def _give_head_weights(model: VisionTransformer, seed: int = 0) -> None:
    """The zero-initialised head (Section 3.2) makes every logit 0; benchmarks and precision checks
    want logits that depend on the input, so the head gets small random weights."""
    if isinstance(model.head, nn.Linear):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=g) * 0.02)


# ----------------------------------------------------------------------------------------------------
# One benchmark: every path on one model, precision, batch size and mode


@dataclass
class BenchRow:
    model: str
    mode: str  # "inference" or "train"
    precision: str
    batch: int
    path: str  # one of PATHS
    images_per_s: float
    seconds: float  # median seconds per call (one forward, or one training step)
    flops_per_s: float
    mfu: float  # flops_per_s over the measured matmul rate of the same precision
    how: str  # what ran on this path
    vs_best_peer: float | None = None  # vitlab rows: vitlab's speed over the fastest peer's (paired median)
    compile_s: float | None = None  # a compile measured for this path: its first call less a steady one (wall)
    pays_after_images: float | None = None  # compile_s over the seconds it saves per image (None: not faster)
    cpu: str = ""
    threads: int = 0
    clock: str = "wall"
    compiled_path: bool = False  # whether the row's images/s are those of a compiled model
    repeats: list[float] = field(default_factory=list)


def _inference_fn(model: Callable, x: torch.Tensor, precision: str) -> Callable[[], None]:
    device = x.device

    def fn() -> None:
        with torch.inference_mode(), autocast(device, precision):
            model(x)

    return fn


def _train_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> Callable[[], None]:
    """One training step as `vitlab.train.engine.train_one_epoch` takes it, less gradient clipping:
    forward under autocast, cross-entropy in fp32, backward, one fused AdamW step (the same optimizer
    for every path). Returns the step as a closure."""
    optimizer = build_optimizer(model, lr=1e-4)  # a small lr: the weights stay meaningful over repeats
    device = x.device

    def fn() -> None:
        with autocast(device, precision):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return fn


def _first_call_s(fn: Callable[[], None], device: torch.device) -> float:
    """Wall seconds of a compiled path's first call: the compile, and one call (with inductor's on-disk cache
    as it is: kernels built by an earlier run are reused)."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def bench_model(
    name: str,
    *,
    batch_size: int = 32,
    precision: str = "fp32",
    mode: str = "inference",
    against: list[str] = (),
    fast_paths: list[str] = (DEFAULT_FAST_PATH,),
    grad_checkpointing: bool = False,
    matmul_flops: dict[str, float],
    warmup: int = 1,
    repeats: int = 5,
    device: torch.device | str = "cpu",
    clock: str = "wall",
    seed: int = 0,
    notes: list[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """The rows of one model, batch size, precision and mode: vitlab's, one per fast path of `fast_paths`
    ("auto": the rules' plan for a long run; "tuned": `vitlab tune`'s, measured first if need be), then each
    path of `against` (see the module docstring). `notes` gets a line for each path left out, with the
    reason; `log` the tuning's progress."""
    _check_options(precision, batch_size, mode, fast_paths, against)
    device = resolve_device(device)
    notes = notes if notes is not None else []
    train = mode == "train"
    torch.compiler.reset()  # the graphs of the rows before: dynamo keeps a few per function, and their memory
    torch.manual_seed(seed)
    ours = create_model(name).to(device)
    if not isinstance(ours, VisionTransformer):
        raise VitlabError(f"vitlab bench measures ViTs; {name!r} is a CNN baseline")
    _give_head_weights(ours, seed)
    ours.set_grad_checkpointing(grad_checkpointing)
    cfg = ours.cfg
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, cfg.in_chans, *cfg.img_size, generator=g).to(device)
    y = torch.randint(0, max(cfg.num_classes, 1), (batch_size,), generator=g).to(device)

    def fn_of(model: nn.Module) -> Callable[[], None]:
        return _train_fn(model, x, y, precision) if train else _inference_fn(model, x, precision)

    fns: dict[str, Callable[[], None]] = {}
    how: dict[str, str] = {}
    compile_s: dict[str, float] = {}
    stack = contextlib.ExitStack()  # the training paths' contexts stay open while they are timed

    # vitlab, as its commands run a long run: the plan of each fast path, said in the row
    for fast in fast_paths:
        path = OURS[fast]
        if train:
            plan = choose_plan(
                ours,
                fast=fast,
                mode=mode,
                precision=precision,
                batch_size=batch_size,
                items=LONG_RUN,
                device=device,
                log=log,
            )
            how[path] = plan.describe()
            fns[path] = fn_of(stack.enter_context(training(copy.deepcopy(ours).train(), plan, precision=precision)))
        else:  # the default engine (ONNX Runtime where the rules say so; PyTorch for a tuned plan)
            engine = inference_engine(
                ours,
                engine="auto",
                precision=precision,
                batch_size=batch_size,
                images=LONG_RUN,
                device=device,
                fast=fast,
                log=log,
            )
            how[path] = engine.describe()
            fns[path] = fn_of(engine)
            plan = engine.fn.plan if engine.name == "torch" else None
        if plan is not None and plan.compile:
            compile_s[path] = _first_call_s(fns[path], device)

    # the peers
    twin = timm_twin(ours).train(train) if any(p.startswith("timm") for p in against) else None
    if "timm" in against:
        fns["timm"] = fn_of(twin)
        how["timm"] = "as shipped"
    if "timm-compile" in against:
        fns["timm-compile"] = fn_of(compile_model(copy.deepcopy(twin), mode, cpp_wrapper=False))
        how["timm-compile"] = "torch.compile" + ("" if train else " with freezing")
        compile_s["timm-compile"] = _first_call_s(fns["timm-compile"], device)
    tmp = None
    if "onnxruntime" in against:
        if train or precision != "fp32" or device.type != "cpu":
            notes.append(
                f"{name} {mode} {precision}: no onnxruntime row: ONNX Runtime runs inference here, and its "
                "CPU provider has no bf16 matrix products"
                if device.type == "cpu"
                else f"{name}: no onnxruntime row: its CPU provider is measured on a CPU only"
            )
        else:
            tmp = tempfile.TemporaryDirectory(prefix="vitlab-bench-")
            session = timm_onnxruntime(name, ours, x, tmp.name)
            x_np = x.cpu().numpy()
            fns["onnxruntime"] = lambda: session.run(["logits"], {"image": x_np})
            how["onnxruntime"] = "timm's model exported to ONNX, CPU provider, every graph optimisation"

    try:
        times = race(fns, warmup=warmup, repeats=repeats, device=device, clock=clock, min_repeat_s=MIN_REPEAT_S)
    finally:
        stack.close()
        if tmp is not None:
            tmp.cleanup()

    flops = count_macs(cfg).flops * batch_size * (3 if mode == "train" else 1)  # training: forward and backward
    return _rows(name, mode, precision, batch_size, times, how, compile_s, flops, matmul_flops[precision], clock)


def _check_options(precision: str, batch_size: int, mode: str, fast_paths, against) -> None:
    """`bench_model`'s options, each refused by name."""
    check_precision(precision)
    check_range("batch_size", batch_size, low=1, integer=True)
    if mode not in MODES:
        raise VitlabError(f"mode must be one of {', '.join(MODES)}; found {mode!r}", arg="mode")
    for fast in fast_paths:
        if check_fast_path(fast) not in OURS:
            raise VitlabError(
                f"fast_path: a bench row runs vitlab's {' or '.join(OURS)} path; found {fast!r}", arg="fast_path"
            )
    for path in against:
        if path not in PATHS[2:]:
            raise VitlabError(f"against: {path!r} is not a peer; expected {', '.join(PATHS[2:])}", arg="against")


def _rows(name, mode, precision, batch_size, times, how, compile_s, flops, peak, clock) -> list[BenchRow]:
    """A BenchRow per path timed: images/s, FLOP/s (`flops` per call) against the machine's `peak`, vitlab's paths
    against the fastest peer, and what compiling cost and when it pays."""
    peers = [p for p in PATHS[2:] if p in times]
    rows = []
    for path in [p for p in PATHS if p in times]:
        ts = times[path]
        s = statistics.median(ts)
        row = BenchRow(
            name,
            mode,
            precision,
            batch_size,
            path,
            batch_size / s,
            s,
            flops / s,
            flops / s / peak,
            how[path],
            cpu=this_machine().cpu,
            threads=torch.get_num_threads(),
            clock=clock,
            repeats=ts,
        )
        if path in OURS.values() and peers:
            row.vs_best_peer = min(paired_ratio(ts, times[p]) for p in peers)
        if path in compile_s:
            row.compiled_path = True
            row.compile_s = max(0.0, compile_s[path] - s)
            uncompiled = times.get("timm" if path == "timm-compile" else "", None)
            saved = (statistics.median(uncompiled) - s) / batch_size if uncompiled else None
            row.pays_after_images = row.compile_s / saved if saved and saved > 0 else None
        rows.append(row)
    return rows


def machine_info(device: torch.device) -> dict:
    info = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cpu": this_machine().describe(),
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import timm

        info["timm"] = timm.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def check_options(
    models: list[str],
    *,
    batch_sizes: list[int],
    precisions: list[str] = ("fp32",),
    warmup: int = 1,
    repeats: int = 5,
    matmul_size: int = 2048,
    clock: str = "wall",
) -> None:
    """Every option of a bench run, checked before the first measurement (the matmul probes take seconds)."""
    for name in models:
        if not get_variant(name).is_vit:
            raise VitlabError(f"model {name!r} is a CNN baseline; vitlab bench measures ViTs", arg="model")
    for b in batch_sizes:
        check_range("batch_size", b, low=1, integer=True)
    for p in precisions:
        check_precision(p)
    check_range("warmup", warmup, low=0, integer=True)
    check_range("repeats", repeats, low=1, integer=True)
    check_range("matmul_size", matmul_size, low=1, integer=True)
    if clock not in CLOCKS:
        raise VitlabError(f"clock must be one of {', '.join(CLOCKS)}; found {clock!r}", arg="clock")


def run_bench(
    models: list[str],
    *,
    batch_sizes: list[int],
    precisions: list[str],
    modes: list[str] = ("inference",),
    against: list[str] = (),
    fast_paths: list[str] = (DEFAULT_FAST_PATH,),
    grad_checkpointing: bool = False,
    warmup: int = 1,
    repeats: int = 5,
    matmul_size: int = 2048,
    device: str = "auto",
    clock: str = "wall",
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The whole `vitlab bench` run: machine rates, then one group of rows per (model, mode, precision,
    batch). Returns a JSON-ready dict: {"machine", "clock", "matmul_flops": {precision: FLOP/s}, "rows",
    "notes"}."""
    check_options(
        models,
        batch_sizes=batch_sizes,
        precisions=precisions,
        warmup=warmup,
        repeats=repeats,
        matmul_size=matmul_size,
        clock=clock,
    )
    dev = resolve_device(device)
    say = progress or (lambda s: None)
    rates = {}
    for p in ("fp32", "bf16"):
        say(f"matmul {matmul_size}^3 {p}")
        rates[p] = matmul_rate(p, n=matmul_size, device=dev, clock=clock)
    rows, notes = [], []
    for name in models:
        for mode in modes:
            for p in precisions:
                for b in batch_sizes:
                    say(f"{name} {mode} {p} batch {b}")
                    peers = [a for a in against if not (mode == "train" and a == "onnxruntime")]
                    rows += bench_model(
                        name,
                        batch_size=b,
                        precision=p,
                        mode=mode,
                        against=peers,
                        fast_paths=fast_paths,
                        grad_checkpointing=grad_checkpointing,
                        matmul_flops=rates,
                        warmup=warmup,
                        repeats=repeats,
                        device=dev,
                        clock=clock,
                        notes=notes,
                        log=say,
                    )
    if "onnxruntime" in against and "train" in modes:
        notes.append("onnxruntime: inference rows only (ONNX Runtime's training is another product)")
    return {
        "machine": machine_info(dev),
        "clock": clock,
        "matmul_size": matmul_size,
        "matmul_flops": rates,
        "warmup": warmup,
        "repeats": repeats,
        "min_repeat_s": MIN_REPEAT_S if warmup else 0.0,
        "tuning": str(tuning_file()) if "tuned" in fast_paths else None,
        "rows": [asdict(r) for r in rows],
        "notes": list(dict.fromkeys(notes)),
    }


def _home_relative(path: str) -> str:
    """`path` with the home folder written as ~ (a table pasted elsewhere names no one's home)."""
    home = str(Path.home())
    return "~" + path[len(home) :] if path.startswith(home + os.sep) else path


def format_table(result: dict) -> str:
    """The human-readable table of `run_bench`'s result."""
    rates = result["matmul_flops"]
    m = result["machine"]
    long_repeats = f" (each at least {result['min_repeat_s']:g} s of calls)" if result.get("min_repeat_s") else ""
    lines = [
        f"torch {m['torch']} on {m['device']} ({m['cpu']}), {m['threads']} thread(s), {result['clock']} clock; "
        f"median of {result['repeats']} repeats{long_repeats} after {result['warmup']} warm-up; paths run alternately",
        f"matmul {result['matmul_size']}^3: fp32 {rates['fp32'] / 1e9:.1f} GFLOP/s, "
        f"bf16 {rates['bf16'] / 1e9:.1f} GFLOP/s",
        *([f"vitlab's tuned plans: {_home_relative(result['tuning'])}"] if result.get("tuning") else []),
        "MFU (model FLOP utilisation): the row's GFLOP/s over the matmul rate above of the same precision",
        "",
        f"{'model':<24}{'mode':<11}{'prec':<6}{'batch':>5}  {'path':<14}{'img/s':>9}{'GFLOP/s':>9}{'MFU':>7}"
        f"{'vs best peer':>14}  how",
    ]
    compiles = []
    for r in result["rows"]:
        ratio = f"{r['vs_best_peer']:.3f}x" if r["vs_best_peer"] is not None else ""
        lines.append(
            f"{r['model']:<24}{r['mode']:<11}{r['precision']:<6}{r['batch']:>5}  {r['path']:<14}"
            f"{r['images_per_s']:>9.2f}{r['flops_per_s'] / 1e9:>9.1f}{100 * r['mfu']:>6.1f}%{ratio:>14}  "
            f"{r['how']}"
        )
        if r["compile_s"] is not None:
            pays = (
                f"pays for itself after {r['pays_after_images']:,.0f} images"
                if r["pays_after_images"] is not None
                else "never pays (not faster)"
            )
            compiles.append(
                f"  {r['model']} {r['mode']} {r['precision']} batch {r['batch']}, {r['path']}: "
                f"{r['compile_s']:.1f} s" + (f", {pays}" if r["path"] == "timm-compile" else "")
            )
    if compiles:
        lines += [
            "",
            "compile time (wall clock, the first call less a steady one; inductor's on-disk cache makes a "
            "second process's shorter):",
            *compiles,
        ]
    if result.get("notes"):
        lines += ["", *result["notes"]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Memory: estimate and measurement


def _peak_rss_bytes() -> int:
    """The process's peak resident set size.

    On Linux this is VmHWM of /proc/self/status: getrusage's ru_maxrss survives exec, so a process
    spawned from a large parent (a test runner at 1 GB) would report the parent's peak as its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB, macOS bytes
    return peak if platform.system() == "Darwin" else peak * 1024


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak so far is the best we have
        return _peak_rss_bytes()


def _memory_probe(
    name: str, batch_size: int, train: bool, precision: str, grad_checkpointing: bool, threads: int, overrides: dict
) -> dict:
    """Runs in a fresh process: build the model, run one step (two for training, so AdamW's state
    exists), and report peak RSS above the RSS before the model was built. Training runs on the plan
    vitlab's trainers take (`vitlab.speed.fastpath.choose_plan`)."""
    torch.set_num_threads(threads)
    x = torch.randn(batch_size, 3, 8, 8)  # touch the allocator and kernels once before the baseline
    del x
    base = _current_rss_bytes()
    model = create_model(name, **overrides)
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(batch_size, cfg.in_chans, *cfg.img_size)
    after_build = _current_rss_bytes()
    device = torch.device("cpu")
    if train:
        model.train().set_grad_checkpointing(grad_checkpointing)
        plan = choose_plan(
            model, fast="auto", mode="train", precision=precision, batch_size=batch_size, items=2, device=device
        )
        optimizer = build_optimizer(model, lr=1e-4)
        y = torch.zeros(batch_size, dtype=torch.long)
        with training(model, plan, precision=precision) as net:  # as vitlab's trainers run it
            for _ in range(2):
                with autocast(device, precision):
                    logits = net(x)
                F.cross_entropy(logits.float(), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    else:
        model.eval()
        with torch.inference_mode(), autocast(device, precision):
            model(x)
    return {"peak_bytes": _peak_rss_bytes() - base, "model_bytes": after_build - base, "weights_bytes": weights}


def measure_peak_memory(
    name: str,
    batch_size: int,
    *,
    train: bool = True,
    precision: str = "fp32",
    grad_checkpointing: bool = False,
    threads: int | None = None,
    **overrides,
) -> dict:
    """Peak resident memory of one run (CPU), measured in a fresh process so that no earlier peak counts.

    Returns {"peak_bytes": peak RSS above the baseline taken before the model was built,
    "model_bytes": RSS added by building the model and the input, "weights_bytes": parameter bytes}.
    """
    threads = threads or torch.get_num_threads()
    args = (name, batch_size, train, precision, grad_checkpointing, threads, overrides)
    with process_pool(1, threads=threads) as pool:
        return pool.submit(_memory_probe, *args).result()


def memory_report(
    name: str, batch_size: int, *, precision: str = "fp32", threads: int | None = None, **overrides
) -> dict:
    """Training peak memory with and without gradient checkpointing, inference at batch 1, each next
    to `estimate_memory`. Returns a JSON-ready dict."""
    check_options([name], batch_sizes=[batch_size], precisions=[precision])
    cfg = get_config(name, **overrides)
    out = {"model": name, "batch_size": batch_size, "precision": precision, "runs": []}
    for train, ckpt, b in ((True, False, batch_size), (True, True, batch_size), (False, False, 1)):
        measured = measure_peak_memory(
            name, b, train=train, precision=precision, grad_checkpointing=ckpt, threads=threads, **overrides
        )
        est = estimate_memory(cfg, b, train=train, precision=precision, grad_checkpointing=ckpt)
        out["runs"].append(
            {
                "mode": "train" if train else "infer",
                "grad_checkpointing": ckpt,
                "batch_size": b,
                **measured,
                "estimate_bytes": est["total"],
                "estimate": est,
            }
        )
    plain, ckpt = out["runs"][0]["peak_bytes"], out["runs"][1]["peak_bytes"]
    out["checkpointing_saving"] = 1 - ckpt / plain
    infer = out["runs"][2]
    out["inference_peak_over_weights"] = infer["peak_bytes"] / infer["weights_bytes"]
    return out


def format_memory(report: dict) -> str:
    lines = [
        f"{report['model']}: peak resident memory above the process baseline ({report['precision']})",
        f"{'run':<36}{'peak':>12}{'estimate':>12}{'weights':>12}",
    ]
    for r in report["runs"]:
        label = f"{r['mode']} batch {r['batch_size']}" + (" + grad checkpointing" if r["grad_checkpointing"] else "")
        lines.append(
            f"{label:<36}{format_bytes(r['peak_bytes']):>12}{format_bytes(r['estimate_bytes']):>12}"
            f"{format_bytes(r['weights_bytes']):>12}"
        )
    lines.append(
        f"gradient checkpointing saves {100 * report['checkpointing_saving']:.1f}% of the training peak; "
        f"inference at batch 1 peaks at {report['inference_peak_over_weights']:.2f}x the weights "
        "(small models: the allocator and kernels' own ~10-30 MB dominate)"
    )
    return "\n".join(lines)


__all__ = [
    "BenchRow",
    "PATHS",
    "PEERS",
    "parse_against",
    "paired_ratio",
    "race",
    "matmul_rate",
    "timm_twin",
    "timm_model",
    "timm_onnxruntime",
    "bench_model",
    "run_bench",
    "format_table",
    "measure_peak_memory",
    "memory_report",
    "format_memory",
]
