"""The path a model runs on, chosen by fixed rules from what the machine is: one table, no stopwatch.

A `Plan` holds every choice that changes how fast a model runs and changes its numbers at most by float
rounding: the attention kernel, the library of the matrix products, torch.compile, and how many images of
a batch go through the model at a time. `plan_by_rules` reads the choices off `RULES` below, from the CPU
kind and vendor (`vitlab.speed.machine`), the mode (inference or training), the precision, the batch, and
the run's length in FLOPs; nothing is timed. So a command, a seed, the data and the machine kind decide
a run's weights and metrics, bitwise, whatever ran before on the machine. What still pays for measuring
is measured only when asked (`vitlab tune`, `--fast-path tuned`: `vitlab.speed.tune`).

Each row of the table is the fastest path measured on that kind of machine, with `vitlab bench` and
`vitlab tune` (the figures, and the CPUs, are in `docs/speed.md`):

- AMD processors run torch's fp32 products (Intel's MKL) far below their rate; oneDNN runs them at it:
  ViT-S/16's inference ran 2.5x as fast with its weights packed once for oneDNN on an AMD EPYC (Zen 5)
  (`vitlab.speed.onednn`). torch.compile's own freezing packs fp32 weights for MKL, so AMD compiles
  over the weights packed for oneDNN instead: in bf16 (with the explicit attention products) that ran
  1.4x the eager packed model; in fp32 it gained 6-18% at batch 32 and lost up to 11% at batch 1 (where
  there is little element-wise work left to fuse), so fp32 compiles from batch 2 only. Training
  reorders the weights at every step, which ate the gain (2-4%), so training takes torch's products
  everywhere.
- On an Intel Xeon with AMX, compiled inference with freezing (which packs every weight once) is the
  fastest path for a long run, and bf16 training runs the explicit attention products (the fused
  kernel's backward is slower there).
- A small ViT (under `SMALL_FLOPS` per image: the mini experiment's) runs as built on every CPU: its
  steps are dispatch, not arithmetic, and a product reordered for oneDNN at every call costs more than it
  saves.
- Compiling costs tens of seconds; it is chosen only for a run of at least `COMPILE_FLOPS` (about
  5,000 ViT-S/16 images, 1,400 ViT-B/16 images), by the FLOPs the model will compute, never by the clock.
  A ViT's training does not compile by these rules (a few percent for a minute of compile, measured);
  `--fast-path compile` or a tuned plan does.
- A CNN's training does, where measured (AMD with AVX-512 and bf16), for a run of at least
  `CNN_COMPILE_STEPS` steps: eager autograd runs each convolution, batch norm and ReLU as kernels of their
  own, which inductor fuses, and a small network's compile (seconds) is repaid in a few hundred steps.

The engine of an inference run, the other table here (`ENGINE_RULES`): PyTorch on the plan above, or ONNX
Runtime running the model exported to ONNX (`vitlab.inference.engine`), where it was measured faster. ONNX
Runtime's CPU provider has no bf16 matrix products, and it leads only where a batch is too small for the
packed products to fill the cores: fp32, a few images at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from vitlab.speed.machine import Machine

ATTENTION = ("fused", "explicit")
PRODUCTS = ("aten", "onednn")
MODES = ("inference", "train")
SMALL_FLOPS = 1e9  # per image, forward: below it a model runs as built (ViT-Ti/16 is 2.5e9, the mini models 1e7-1e8)
COMPILE_FLOPS = 5e13  # a run's forward FLOPs from which compiling pays (ViT-S/16: 9.2e9 per image)
CNN_COMPILE_STEPS = 1000  # a CNN's training steps from which compiling pays (its compile is repaid in 300-500)
FAMILIES = ("vit", "cnn")  # the kinds of model the rows tell apart: a VisionTransformer (hybrids too), a CNN


MAX_PIECES = 4096  # the most images per piece a plan read back from a file may ask for (the rules ask for 4 or 16)
MAX_SOURCE = 200  # characters of a plan's `source` read from a file: one printable line


@dataclass(frozen=True)
class Plan:
    """How a model runs. Each field but `source` changes speed, and a result only by float rounding; `source`
    says where the plan came from and is left out of equality (two plans that run the same are equal)."""

    attention: str = "fused"  # fused: torch's scaled_dot_product_attention; explicit: softmax(q k^T / sqrt(d)) v
    products: str = "aten"  # aten: nn.Linear as built (MKL on x86); onednn: `vitlab.speed.onednn`
    compile: bool = False  # torch.compile (inference: with freezing)
    pieces: int = 0  # images per forward pass of a batch; 0: the whole batch
    source: str = field(default="as built", compare=False)  # where it came from: "rules (<kind>)", "tuned", ...

    def describe(self) -> str:
        """The plan in a few words, as a command prints it."""
        parts = [f"{self.attention} attention", "oneDNN products" if self.products == "onednn" else "torch's products"]
        if self.pieces:
            parts.append(f"{self.pieces} images at a time")
        parts.append("compiled" if self.compile else "not compiled")
        return f"{', '.join(parts)} [{self.source}]"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """A plan read back from a run's files (checked: a damaged one is refused by the caller)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or set(d) - names:
            raise ValueError(f"not a plan: {d!r}")
        plan = cls(**d)
        if (
            plan.attention not in ATTENTION
            or plan.products not in PRODUCTS
            or not isinstance(plan.compile, bool)
            or not isinstance(plan.pieces, int)
            or isinstance(plan.pieces, bool)
            or not 0 <= plan.pieces <= MAX_PIECES
            or not isinstance(plan.source, str)
            or len(plan.source) > MAX_SOURCE
            or not plan.source.isprintable()
        ):
            raise ValueError(f"not a plan: {d!r}")
        return plan


AS_BUILT = Plan()


@dataclass(frozen=True)
class Rule:
    """A row of RULES: where it applies ("*" = any) and what it chooses."""

    vendor: str
    kind: str
    mode: str
    precision: str
    family: str = "vit"  # the kind of model (FAMILIES)
    attention: str = "fused"
    products: str = "aten"
    compile: bool = False  # for runs of at least COMPILE_FLOPS
    compile_batch: int = 1  # ... at batches of at least this many images
    pieces: int = 0  # with compile, at batches above it

    def matches(self, machine: Machine, mode: str, precision: str, family: str = "vit") -> bool:
        return all(
            want in ("*", have)
            for want, have in (
                (self.vendor, machine.vendor),
                (self.kind, machine.kind),
                (self.mode, mode),
                (self.precision, precision),
                (self.family, family),
            )
        )


# The first row that matches decides. Figures behind each row: docs/speed.md.
RULES = (
    # AMD: inference on weights packed for oneDNN; compiled bf16 for a long run (fp32: freezing packs for MKL)
    Rule("amd", "avx512-bf16", "inference", "fp32", products="onednn", compile=True, compile_batch=2),
    Rule("amd", "*", "inference", "fp32", products="onednn"),
    Rule("amd", "avx512-bf16", "inference", "bf16", attention="explicit", products="onednn", compile=True),
    Rule("amd", "avx512-bf16", "train", "bf16", attention="explicit"),
    # Intel with AMX: compiled inference (freezing packs the weights, then pieces keep a batch in the cache)
    Rule("intel", "amx", "inference", "fp32", compile=True, pieces=4),
    Rule("intel", "amx", "inference", "bf16", products="onednn", compile=True, pieces=16),
    Rule("intel", "amx", "train", "bf16", attention="explicit"),
    # A CNN's training, compiled for a run of CNN_COMPILE_STEPS or more: `resnet_mini`, one thread, batch 64, 28x28
    # grey, on an AMD EPYC (Zen 4, family 25), CPU time a step eager / compiled: 1.48x at width 16 (88.4 -> 59.6 ms),
    # 1.28x at width 24, 1.29x and 1.33x in a second run on a busier machine; whole 1,000-step runs 1.29-1.53x
    # (benchmarks/bench_compile_train.py, docs/speed.md); the first step 1-16 s of wall clock (the compile). Bitwise
    # the same weights in two processes, inductor's cache empty then full (a slow test). The hybrid (a conv stem before
    # a ViT, family "vit") gained 1.07-1.21x: too uncertain for a row yet; it stays as built with the ViTs
    # (0.90-1.07x). Measured on Zen 4 alone (Zen 5 is the same kind here); no Intel row.
    Rule("amd", "avx512-bf16", "train", "fp32", family="cnn", compile=True),
    # anything else: the model as built
    Rule("*", "*", "*", "*", family="*"),
)


@dataclass(frozen=True)
class EngineRule:
    """A row of ENGINE_RULES: where ONNX Runtime computes an inference run's logits ("*" = any)."""

    vendor: str
    kind: str
    precision: str
    max_batch: int  # batches of at most this many images
    short_runs: bool = False  # only where RULES would not compile the PyTorch plan (a run too short to pay for it)

    def matches(self, machine: Machine, precision: str, batch_size: int, compiled: bool) -> bool:
        return (
            self.vendor in ("*", machine.vendor)
            and self.kind in ("*", machine.kind)
            and self.precision in ("*", precision)
            and batch_size <= self.max_batch
            and not (self.short_runs and compiled)
        )


# Where ONNX Runtime runs an inference run; everything else runs on PyTorch. Figures behind each row: docs/speed.md.
ENGINE_RULES = (
    # AMD EPYC (Zen 4, family 25), one thread, ViT-S/16 fp32 (`vitlab bench --threads 1 --clock cpu`): at batch 1
    # ONNX Runtime ran 9.44 img/s to the oneDNN-packed model's 7.96 (1.19x; 9.33 to 8.58 in a second run); from
    # batch 2 the packed model (compiled, for a long run) led ONNX Runtime: 1.12x, 1.08x, 1.21x, 1.18x at 2, 4,
    # 8, 32 images. On an AMD EPYC (Zen 5, family 26), the same kind, ONNX Runtime led at batch 1 too: ViT-S/16
    # 22.70 img/s to 21.58, ViT-B/16 6.08 to 5.89, and trailed at batch 32 (docs/speed.md).
    EngineRule("amd", "avx512-bf16", "fp32", max_batch=1),
    # Intel Xeon with AMX (family 6 model 167), one thread, fp32 at batch 1, on the CPU clock beside a training run:
    # vitlab's export in ONNX Runtime against the PyTorch plan of a short run (not compiled), ViT-S/16 17.78 img/s
    # to 15.01 (1.18x), ViT-B/16 5.04 to 4.61 and 4.80 to 4.43 (1.09x, 1.08x); but the plan of a long run, compiled,
    # led timm's model in ONNX Runtime: ViT-S/16 19.10 to 16.31, ViT-B/16 5.93 to 4.84 (`vitlab bench`,
    # docs/speed.md). So ONNX Runtime there only where the rules would not compile.
    EngineRule("intel", "amx", "fp32", max_batch=1, short_runs=True),
)


def engine_by_rules(
    machine: Machine,
    *,
    precision: str,
    batch_size: int,
    flops_per_item: float,
    images: int | None = 1,
    device_type: str = "cpu",
) -> tuple[str, str]:
    """The engine (one of `vitlab.options.ENGINES`) ENGINE_RULES give an inference run of `images` images in batches of
    `batch_size`, of a model of `flops_per_item` forward FLOPs per image, and where the choice came from, in words.
    `images` None: a run of no known length (a server), which a row for short runs does not take. A small model
    runs on PyTorch (the rows were measured on ViT-S/16 and ViT-B/16), as does anything off the CPU."""
    source = f"rules ({machine.kind}, {machine.vendor})" if device_type == "cpu" else f"rules ({device_type})"
    if device_type != "cpu":
        return "torch", source
    if flops_per_item < SMALL_FLOPS:
        return "torch", f"{source}: a small model"
    compiled = (
        images is None
        or plan_by_rules(
            machine,
            mode="inference",
            precision=precision,
            batch_size=batch_size,
            flops_per_item=flops_per_item,
            items=images,
        ).compile
    )
    rule = next((r for r in ENGINE_RULES if r.matches(machine, precision, batch_size, compiled)), None)
    return ("onnxruntime" if rule else "torch"), source


def plan_by_rules(
    machine: Machine,
    *,
    mode: str,
    precision: str,
    batch_size: int,
    flops_per_item: float,
    items: int,
    device_type: str = "cpu",
    family: str = "vit",
) -> Plan:
    """The plan RULES give for a run of `items` images (inference) or training steps of `batch_size`
    images, of a model of `flops_per_item` forward FLOPs per image and of kind `family` (FAMILIES), on `machine`.
    A CNN's rows count a run's steps (CNN_COMPILE_STEPS), a ViT's its FLOPs."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; found {mode!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; found {family!r}")
    if device_type != "cpu":
        return replace(AS_BUILT, source=f"rules ({device_type})")
    source = f"rules ({machine.kind}, {machine.vendor})"
    if family == "cnn":
        rule = next(r for r in RULES if r.matches(machine, mode, precision, family))
        return Plan(compile=rule.compile and items >= CNN_COMPILE_STEPS, source=f"{source}: a CNN")
    if flops_per_item < SMALL_FLOPS:
        return replace(AS_BUILT, source=f"{source}: a small model")
    rule = next(r for r in RULES if r.matches(machine, mode, precision))
    images = items * (batch_size if mode == "train" else 1)
    compile_ = rule.compile and batch_size >= rule.compile_batch and images * flops_per_item >= COMPILE_FLOPS
    pieces = rule.pieces if compile_ and 0 < rule.pieces < batch_size else 0
    return Plan(attention=rule.attention, products=rule.products, compile=compile_, pieces=pieces, source=source)


__all__ = [
    "Plan",
    "AS_BUILT",
    "Rule",
    "RULES",
    "plan_by_rules",
    "EngineRule",
    "ENGINE_RULES",
    "engine_by_rules",
    "ATTENTION",
    "PRODUCTS",
    "MODES",
    "SMALL_FLOPS",
    "COMPILE_FLOPS",
    "CNN_COMPILE_STEPS",
    "FAMILIES",
]
