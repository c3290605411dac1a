"""Speed and memory: how fast vitlab runs on this machine, next to timm and next to the arithmetic limit.

`vitlab bench` measures, in one process and at one thread count:

1. the machine's matrix-multiply rate (a 2048^3 product in fp32 and in bf16): the ceiling a ViT,
   which is ~98% matrix products (`vitlab.analysis.flops`), can approach;
2. vitlab's inference and training-step images/s for named models;
3. timm's VisionTransformer with the same configuration, the same weights and the same precision, the
   two run alternately (the order flips every repeat) so a slow phase of a shared machine hits both.

Every number is the median of several timed repeats after warm-up. Achieved FLOP/s uses the analytic
count of `vitlab.analysis.flops.count_macs` (FLOPs = 2 x MACs; a training step counts 3x the forward:
one product forward, two backward); MFU is that rate over the measured matmul rate of the same
precision. No timing here is ever asserted in tests: machines differ, read the ratios.

Memory: `estimate_memory` predicts the bytes of a run (weights, gradients, AdamW state, activations,
with or without gradient checkpointing, fp32 or bf16); `measure_peak_memory` runs one step in a fresh
process and reads its peak resident set size, so a measurement never inherits another's peak.
"""

from __future__ import annotations

import copy
import os
import platform
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.analysis.flops import _bytes, activation_elements, count_macs
from vitlab.errors import VitlabError, check_range
from vitlab.models.factory import create_model
from vitlab.models.registry import get_config, get_variant
from vitlab.models.vit import ViTConfig, VisionTransformer
from vitlab.runtime import autocast, check_precision, process_pool, resolve_device
from vitlab.speed import cpu_inference, cpu_training
from vitlab.train.optim import build_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------------
# Timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = ("wall", "cpu")


def race(fns: dict[str, Callable[[], None]], *, warmup: int = 1, repeats: int = 5,
         device: torch.device = torch.device("cpu"), clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per call of each function, interleaved: every repeat runs each function once, and the
    order rotates between repeats. Returns {name: [seconds per repeat]} (take the median).

    `clock="wall"` times elapsed seconds; `clock="cpu"` the process's CPU seconds, which on a shared
    machine leaves out the time the process spent waiting for a core (meaningful at one thread: with
    several, threads that spin while waiting for each other count too).
    """
    if clock not in CLOCKS:
        raise VitlabError(f"clock must be one of {', '.join(CLOCKS)}; found {clock!r}", arg="clock")
    now = time.perf_counter if clock == "wall" else time.process_time
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t0 = now()
            fns[name]()
            _sync(device)
            times[name].append(now() - t0)
    return times


def paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median over repeats of theirs / ours seconds (= our speed over theirs): each pair ran back to
    back, so a slow phase of the machine cancels out of each ratio."""
    return statistics.median(t / o for o, t in zip(ours, theirs))


def matmul_rate(precision: str = "fp32", *, n: int = 2048, warmup: int = 2, repeats: int = 5,
                device: torch.device | str = "cpu", clock: str = "wall") -> float:
    """FLOP/s of an n x n x n matrix product (2 n^3 FLOPs) in `precision`: the best of `repeats`
    (the ceiling is what the machine can do; a slow repeat measures the neighbours, not the machine).
    On a CPU with oneDNN, the faster of torch.mm and oneDNN's product with a pre-packed operand (what
    vitlab's inference runs, `vitlab.speed.cpu_inference`), so that MFU stays a share of the best rate."""
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, DTYPES[precision])
    b = torch.randn(n, n, generator=g).to(device, DTYPES[precision])
    fns = {"mm": lambda: torch.mm(a, b)}
    if cpu_inference.supported(precision, device):
        packed = torch.ops.mkldnn._reorder_linear_weight(b.T.contiguous(), n)  # a @ b as a Linear of weight b^T
        fns["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    times = race(fns, warmup=warmup, repeats=repeats, device=device, clock=clock)
    return 2 * n**3 / min(min(t) for t in times.values())


# ----------------------------------------------------------------------------------------------------
# The two sides: vitlab's model and timm's twin


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
            "(learned 1-D position embedding, conv patch embedding), or compare without timm", arg="against"
        )
    twin = TimmViT(
        img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
        embed_dim=c.dim, depth=c.depth, num_heads=c.heads, mlp_ratio=c.hidden_dim / c.dim, qkv_bias=c.qkv_bias,
        class_token=c.class_token, global_pool="token" if c.pool == "cls" else "avg", fc_norm=c.use_fc_norm,
        pos_embed="learn" if c.pos_embed == "learned" else "none",
    )
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.to(next(model.parameters()).device)


def _give_head_weights(model: VisionTransformer, seed: int = 0) -> None:
    """The zero-initialised head (Section 3.2) makes every logit 0; benchmarks and precision checks
    want logits that depend on the input, so the head gets small random weights."""
    if isinstance(model.head, nn.Linear):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=g) * 0.02)


def forward_flops(cfg: ViTConfig) -> int:
    """FLOPs of one image's forward pass (analytic; see vitlab.analysis.flops)."""
    return count_macs(cfg).flops


# ----------------------------------------------------------------------------------------------------
# One benchmark row


@dataclass
class BenchRow:
    model: str
    mode: str  # "infer" or "train"
    batch_size: int
    precision: str
    library: str  # "vitlab" or "timm"
    seconds: float  # median seconds per call (one forward, or one training step)
    images_per_s: float
    flops_per_s: float
    mfu: float  # flops_per_s over the measured matmul rate of the same precision
    ratio: float | None = None  # vitlab / timm speed, median of back-to-back pairs (vitlab rows only)
    repeats: list[float] = field(default_factory=list)


def _inference_fn(model: nn.Module, x: torch.Tensor, precision: str) -> Callable[[], None]:
    device = x.device

    def fn() -> None:
        with torch.inference_mode(), autocast(device, precision):
            model(x)

    return fn


def _train_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> Callable[[], None]:
    """One training step as `vitlab.train.engine.train_one_epoch` takes it, less gradient clipping:
    forward under autocast, cross-entropy in fp32, backward, one fused AdamW step (the same optimizer
    for both libraries). Returns the step as a closure."""
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


def bench_model(
    name: str,
    *,
    batch_size: int = 32,
    precision: str = "fp32",
    train: bool = False,
    against_timm: bool = False,
    grad_checkpointing: bool = False,
    matmul_flops: dict[str, float],
    warmup: int = 1,
    repeats: int = 5,
    device: torch.device | str = "cpu",
    clock: str = "wall",
    seed: int = 0,
    pack: bool = True,
) -> list[BenchRow]:
    """Inference (and with `train`, training-step) rows for vitlab, and for timm's twin if asked.

    With `pack`, vitlab runs on a CPU with oneDNN as its commands do: inference as `vitlab predict`,
    Linear weights packed once (`vitlab.speed.cpu_inference`), training as `vitlab train`, fp32 Linear
    products by the faster library (`vitlab.speed.cpu_training`); timm's twin runs as timm ships it."""
    check_precision(precision)
    check_range("batch_size", batch_size, low=1, integer=True)
    device = resolve_device(device)
    torch.manual_seed(seed)
    ours = create_model(name).to(device)
    if not isinstance(ours, VisionTransformer):
        raise VitlabError(f"vitlab bench measures ViTs; {name!r} is a CNN baseline")
    _give_head_weights(ours, seed)
    ours.set_grad_checkpointing(grad_checkpointing)
    sides: dict[str, nn.Module] = {"vitlab": ours}
    if against_timm:
        theirs = timm_twin(ours)
        if grad_checkpointing:
            theirs.set_grad_checkpointing(True)
        sides["timm"] = theirs
    cfg = ours.cfg
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, cfg.in_chans, *cfg.img_size, generator=g).to(device)
    y = torch.randint(0, max(cfg.num_classes, 1), (batch_size,), generator=g).to(device)

    modes = ["infer"] + (["train"] if train else [])
    rows: list[BenchRow] = []
    for mode in modes:
        if mode == "infer":
            for m in sides.values():
                m.eval()
            infer_sides = dict(sides)
            if pack and cpu_inference.supported(precision, device):
                # vitlab's inference on CPU: Linear weights (cast and) reordered once, not per call
                tokens = batch_size * (cfg.num_patches + cfg.num_prefix_tokens)
                infer_sides["vitlab"] = cpu_inference.pack_for_cpu_inference(copy.deepcopy(ours), precision, tokens)
            fns = {k: _inference_fn(m, x, precision) for k, m in infer_sides.items()}
            flops = forward_flops(cfg) * batch_size
        else:
            for m in sides.values():
                m.train()
            if pack:
                cpu_training.use_onednn_linears(ours)  # as vitlab's trainers run it (fp32 products by size)
            fns = {k: _train_fn(m, x, y, precision) for k, m in sides.items()}
            flops = 3 * forward_flops(cfg) * batch_size
        times = race(fns, warmup=warmup, repeats=repeats, device=device, clock=clock)
        mode_rows = {}
        for lib, ts in times.items():
            s = statistics.median(ts)
            rate = flops / s
            mode_rows[lib] = BenchRow(name, mode, batch_size, precision, lib, s, batch_size / s, rate,
                                      rate / matmul_flops[precision], None, ts)
        if "timm" in mode_rows:
            mode_rows["vitlab"].ratio = paired_ratio(times["vitlab"], times["timm"])
        rows.extend(mode_rows.values())
    return rows


def machine_info(device: torch.device) -> dict:
    info = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
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


def check_options(models: list[str], *, batch_sizes: list[int], precisions: list[str] = ("fp32",), warmup: int = 1,
                  repeats: int = 5, matmul_size: int = 2048, clock: str = "wall") -> None:
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
    train: bool = False,
    against_timm: bool = False,
    grad_checkpointing: bool = False,
    warmup: int = 1,
    repeats: int = 5,
    matmul_size: int = 2048,
    device: str = "auto",
    clock: str = "wall",
    pack: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The whole `vitlab bench` run: machine rates, then one group of rows per (model, precision, batch).
    Returns a JSON-ready dict: {"machine": ..., "matmul_flops": {precision: FLOP/s}, "rows": [...]}."""
    check_options(models, batch_sizes=batch_sizes, precisions=precisions, warmup=warmup, repeats=repeats,
                  matmul_size=matmul_size, clock=clock)
    dev = resolve_device(device)
    say = progress or (lambda s: None)
    rates = {}
    for p in ("fp32", "bf16"):
        say(f"matmul {matmul_size}^3 {p}")
        rates[p] = matmul_rate(p, n=matmul_size, device=dev, clock=clock)
    rows = []
    for name in models:
        for p in precisions:
            for b in batch_sizes:
                say(f"{name} {p} batch {b}")
                rows += bench_model(name, batch_size=b, precision=p, train=train, against_timm=against_timm,
                                    grad_checkpointing=grad_checkpointing, matmul_flops=rates, warmup=warmup,
                                    repeats=repeats, device=dev, clock=clock, pack=pack)
    packed = pack and any(cpu_inference.supported(p, dev) for p in precisions)
    return {"machine": machine_info(dev), "clock": clock, "matmul_size": matmul_size, "matmul_flops": rates,
            "inference": "vitlab: Linear weights packed once (vitlab.speed.cpu_inference); timm: as shipped" if packed
            else "both models as they are",
            "training": "vitlab: big fp32 Linear products through oneDNN (vitlab.speed.cpu_training); timm: as shipped"
            if train and pack and dev.type == "cpu" and cpu_training.supported() else "both models as they are",
            "rows": [asdict(r) for r in rows]}


def format_table(result: dict) -> str:
    """The human-readable table of `run_bench`'s result."""
    rates = result["matmul_flops"]
    m = result["machine"]
    lines = [
        f"torch {m['torch']} on {m['device']} ({m['cpu']}), {m['threads']} threads, {result['clock']} clock "
        "(median of repeats; vitlab/timm: median of back-to-back pairs)",
        f"matmul {result['matmul_size']}^3: fp32 {rates['fp32'] / 1e9:.1f} GFLOP/s, bf16 {rates['bf16'] / 1e9:.1f} GFLOP/s",
        f"inference: {result.get('inference', 'both models as they are')}",
        *([f"training: {result.get('training', 'both models as they are')}"]
          if any(r["mode"] == "train" for r in result["rows"]) else []),
        "",
        f"{'model':<24}{'mode':<6}{'batch':>6}{'prec':>6}  {'library':<8}{'img/s':>9}{'GFLOP/s':>10}{'MFU':>7}"
        f"{'vitlab/timm':>13}",
    ]
    for r in result["rows"]:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else ""
        lines.append(f"{r['model']:<24}{r['mode']:<6}{r['batch_size']:>6}{r['precision']:>6}  {r['library']:<8}"
                     f"{r['images_per_s']:>9.2f}{r['flops_per_s'] / 1e9:>10.1f}{100 * r['mfu']:>6.1f}%{ratio:>13}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Memory: estimate and measurement


def estimate_memory(cfg: ViTConfig, batch_size: int, *, train: bool = True, precision: str = "fp32",
                    grad_checkpointing: bool = False, optimizer: str = "adamw") -> dict[str, int]:
    """Bytes a run needs, by part: weights, gradients, optimizer state, activations, and their total.

    Training keeps, per block, the tensors autograd saves (`vitlab.analysis.flops.activation_elements`:
    ~T (8D + 2M) per image). With gradient checkpointing only each block's input (T D) is kept, plus
    one block's saved tensors while it is recomputed in the backward pass. Under bf16 autocast the
    saved matrix-product inputs are bf16 (about half of them), the weights and AdamW state stay fp32.
    Inference keeps no activations: the peak is the largest few live tensors of one block
    (the residual stream, the MLP's hidden layer before and after GELU: T (D + 2M) per image).
    Not counted: the allocator's slack, the framework itself (~0.3-0.5 GB of libraries for torch).
    """
    check_range("batch_size", batch_size, low=1, integer=True)
    check_precision(precision)
    with torch.device("meta"):
        params = sum(p.numel() for p in VisionTransformer(cfg).parameters())
    f32 = 4
    act_bytes = 3.0 if precision == "bf16" else 4.0  # bf16: ~half the saved tensors are 2-byte casts
    T, D, M = cfg.num_patches + cfg.num_prefix_tokens, cfg.dim, cfg.hidden_dim
    out = {"weights": params * f32}
    if train:
        per_image = activation_elements(cfg)
        block = per_image["blocks"] // cfg.depth
        if grad_checkpointing:
            kept = cfg.depth * T * D + block + per_image["input image"] + per_image["final norm + head"]
        else:
            kept = sum(per_image.values())
        out["gradients"] = params * f32
        out["optimizer"] = params * f32 * (2 if optimizer == "adamw" else 0)  # exp_avg, exp_avg_sq
        # the backward pass holds a gradient of the widest activation while it runs
        out["activations"] = int(batch_size * (kept * act_bytes + T * 2 * M * f32))
    else:
        out["activations"] = int(batch_size * T * (D + 2 * M) * (2 if precision == "bf16" else f32))
    out["total"] = sum(out.values())
    return out


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


def _memory_probe(name: str, batch_size: int, train: bool, precision: str, grad_checkpointing: bool,
                  threads: int, overrides: dict) -> dict:
    """Runs in a fresh process: build the model, run one step (two for training, so AdamW's state
    exists), and report peak RSS above the RSS before the model was built."""
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
        cpu_training.use_onednn_linears(model)  # as vitlab's trainers run on CPU
        optimizer = build_optimizer(model, lr=1e-4)
        y = torch.zeros(batch_size, dtype=torch.long)
        for _ in range(2):
            with autocast(device, precision):
                logits = model(x)
            F.cross_entropy(logits.float(), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        model.eval()
        with torch.inference_mode(), autocast(device, precision):
            model(x)
    return {"peak_bytes": _peak_rss_bytes() - base, "model_bytes": after_build - base, "weights_bytes": weights}


def measure_peak_memory(name: str, batch_size: int, *, train: bool = True, precision: str = "fp32",
                        grad_checkpointing: bool = False, threads: int | None = None, **overrides) -> dict:
    """Peak resident memory of one run (CPU), measured in a fresh process so that no earlier peak counts.

    Returns {"peak_bytes": peak RSS above the baseline taken before the model was built,
    "model_bytes": RSS added by building the model and the input, "weights_bytes": parameter bytes}.
    """
    threads = threads or torch.get_num_threads()
    with process_pool(1, threads=threads) as pool:
        return pool.submit(_memory_probe, name, batch_size, train, precision, grad_checkpointing, threads,
                           overrides).result()


def memory_report(name: str, batch_size: int, *, precision: str = "fp32", threads: int | None = None,
                  **overrides) -> dict:
    """Training peak memory with and without gradient checkpointing, inference at batch 1, each next
    to `estimate_memory`. Returns a JSON-ready dict."""
    check_options([name], batch_sizes=[batch_size], precisions=[precision])
    cfg = get_config(name, **overrides)
    out = {"model": name, "batch_size": batch_size, "precision": precision, "runs": []}
    for train, ckpt, b in ((True, False, batch_size), (True, True, batch_size), (False, False, 1)):
        measured = measure_peak_memory(name, b, train=train, precision=precision, grad_checkpointing=ckpt,
                                       threads=threads, **overrides)
        est = estimate_memory(cfg, b, train=train, precision=precision, grad_checkpointing=ckpt)
        out["runs"].append({"mode": "train" if train else "infer", "grad_checkpointing": ckpt, "batch_size": b,
                            **measured, "estimate_bytes": est["total"], "estimate": est})
    plain, ckpt = out["runs"][0]["peak_bytes"], out["runs"][1]["peak_bytes"]
    out["checkpointing_saving"] = 1 - ckpt / plain
    infer = out["runs"][2]
    out["inference_peak_over_weights"] = infer["peak_bytes"] / infer["weights_bytes"]
    return out


def format_memory(report: dict) -> str:
    lines = [f"{report['model']}: peak resident memory above the process baseline ({report['precision']})",
             f"{'run':<36}{'peak':>12}{'estimate':>12}{'weights':>12}"]
    for r in report["runs"]:
        label = f"{r['mode']} batch {r['batch_size']}" + (" + grad checkpointing" if r["grad_checkpointing"] else "")
        lines.append(f"{label:<36}{_bytes(r['peak_bytes']):>12}{_bytes(r['estimate_bytes']):>12}"
                     f"{_bytes(r['weights_bytes']):>12}")
    lines.append(f"gradient checkpointing saves {100 * report['checkpointing_saving']:.1f}% of the training peak; "
                 f"inference at batch 1 peaks at {report['inference_peak_over_weights']:.2f}x the weights "
                 "(small models: the allocator and kernels' own ~10-30 MB dominate)")
    return "\n".join(lines)


__all__ = [
    "BenchRow",
    "race",
    "matmul_rate",
    "timm_twin",
    "forward_flops",
    "bench_model",
    "run_bench",
    "format_table",
    "estimate_memory",
    "measure_peak_memory",
    "memory_report",
    "format_memory",
]
