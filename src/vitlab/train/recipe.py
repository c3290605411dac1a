"""`Recipe`: how a model is trained, every field of which changes the numbers a run gives, and the
named presets the commands take their defaults from (a default lives here, never in argparse alone).

    RECIPES["mini"]       the mini experiment (vit_mini_x on dataset X): AdamW, lr 3e-3,
                          batch 32, 60 epochs; `vitlab demo`
    RECIPES["scratch"]    a ViT or the CNN baseline from random weights on a small dataset; `vitlab train`
    RECIPES["finetune"]   staged fine-tuning of pretrained weights: a small lr, the head
                          alone for 2 epochs, then everything with layer-wise lr decay; `vitlab finetune`

`vitlab.train.engine.fit` applies the optimisation (AdamW, warmup + cosine, clipping, label
smoothing, accumulation), the stages (freezing, layer decay), the EMA and the batch mixing
(MixUp/CutMix); the per-image augmentation fields are read by `vitlab.data.datasets.make_loaders`,
which builds the training loader; `vitlab.train.job.run` initialises a model trained from random weights
as `init` and `head_init` say. Ranges are checked when a Recipe is made, in the fields' own names.

Three fields may be left None, "auto": chosen for each run from its length and its image size, by the
rules below, measured on Fashion-MNIST (benchmarks/recipe_ablation.py, docs/recipe.md):

    warmup_epochs   warmup_fraction (a tenth) of each stage's optimizer steps (`schedule`)
    augment         on from AUG_MIN_EPOCHS epochs; a shorter run learns faster on the images as they are
    crop_scale      the random resized crop's smallest area, by the model's input side (`auto_crop_scale`)

`recipe.resolve(img_size=...)` fills augment and crop_scale; `schedule(recipe, steps_per_epoch)` gives the
steps of each stage and its warmup; `in_force(...)` is the recipe a run prints and records in summary.json.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from vitlab.errors import VitlabError, check_range
from vitlab.options import AUTO_AUGMENTS, INITS, check_precision, check_seed


@dataclass(frozen=True)
class Recipe:
    # optimisation
    epochs: int = 30
    batch_size: int = 32  # per process: the global batch is batch_size x processes x grad_accum
    lr: float = 1e-3  # peak learning rate (of the head, with layer decay)
    weight_decay: float = 0.05  # AdamW, matrices only
    warmup_epochs: float | None = None  # linear warmup at the start of each stage, then cosine; None: warmup_fraction
    warmup_fraction: float = 0.1  # with warmup_epochs None: this fraction of each stage's optimizer steps
    min_lr_ratio: float = 0.0  # the cosine's floor, as a fraction of lr
    clip_grad: float = 1.0  # gradient norm clipping; 0 = off
    label_smoothing: float = 0.0
    grad_accum: int = 1
    precision: str = "fp32"  # or "bf16" autocast
    seed: int = 0  # the split, the shuffles, the augmentation, the initial weights
    # staged fine-tuning
    freeze_epochs: int = 0  # stage 1: only the head trains for this many epochs
    unfreeze: str = "all"  # stage 2: "all", "head" or "last:N" blocks (+ final norm and head)
    layer_decay: float = 1.0  # block i of L gets lr x layer_decay^(L+1-i); 1 = off
    # a model trained from random weights (vitlab.train.job.run; `fit` trains the model it is given as it is)
    init: str = "jax"  # VisionTransformer.init_weights: "jax" (the original release's) or "trunc_normal" (timm's)
    head_init: float = 0.02  # the head's std (truncated normal); 0 = the zero head of the paper's Section 3.2
    # augmentation and regularisation
    augment: bool | None = None  # random crops etc.; False: training images are preprocessed like validation ones;
    #                              None: on from AUG_MIN_EPOCHS epochs
    hflip: bool | None = (
        None  # None: on for folders and Fashion-MNIST, off for digits and X (a flip changes their class)
    )
    crop_scale: float | None = (
        None  # RandomResizedCrop keeps between this and all of the image area; None: by image side
    )
    color_jitter: float = 0.0
    auto_augment: str = "none"  # "rand" (RandAugment), "trivial" (TrivialAugmentWide) or "none"
    reprob: float = 0.0  # RandomErasing probability
    mixup: float = 0.0  # MixUp Beta alpha; 0 = off
    cutmix: float = 0.0  # CutMix Beta alpha; 0 = off
    mix_switch_prob: float = 0.5  # with both on, the chance a batch uses CutMix
    ema: float | None = None  # decay of an exponential moving average of the weights, e.g. 0.999

    def __post_init__(self) -> None:
        check_range("epochs", self.epochs, low=1, integer=True)
        check_range("batch_size", self.batch_size, low=1, integer=True)
        check_range("lr", self.lr, low=0, low_open=True)
        check_range("weight_decay", self.weight_decay, low=0)
        check_range("warmup_epochs", self.warmup_epochs, low=0, optional=True)
        check_range("warmup_fraction", self.warmup_fraction, low=0, high=1, high_open=True)
        check_range("min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        check_range("clip_grad", self.clip_grad, low=0)
        check_range("label_smoothing", self.label_smoothing, low=0, high=1, high_open=True)
        check_range("grad_accum", self.grad_accum, low=1, integer=True)
        check_precision(self.precision)
        check_seed(self.seed)
        check_range(
            "freeze_epochs",
            self.freeze_epochs,
            low=0,
            high=self.epochs,
            integer=True,
            hint=f" (at most epochs = {self.epochs})",
        )
        check_range("layer_decay", self.layer_decay, low=0, high=1, low_open=True)
        if not isinstance(self.unfreeze, str) or not (
            self.unfreeze in ("all", "head")
            or (self.unfreeze.startswith("last:") and self.unfreeze[5:].isdigit() and int(self.unfreeze[5:]) >= 1)
        ):
            raise VitlabError(
                f"unfreeze must be all, head or last:N (N >= 1 blocks); found {self.unfreeze!r}", arg="unfreeze"
            )
        if not isinstance(self.init, str) or self.init not in INITS:
            raise VitlabError(f"init must be one of {', '.join(INITS)}; found {self.init!r}", arg="init")
        check_range("head_init", self.head_init, low=0)
        check_range("crop_scale", self.crop_scale, low=0, high=1, low_open=True, optional=True)
        check_range("color_jitter", self.color_jitter, low=0)
        if self.augment is not None and not isinstance(self.augment, bool):
            raise VitlabError(
                f"augment must be True, False or None (by the run's length); found {self.augment!r}", arg="augment"
            )
        if self.hflip is not None and not isinstance(self.hflip, bool):
            raise VitlabError(
                f"hflip must be True, False or None (the dataset's default); found {self.hflip!r}", arg="hflip"
            )
        if not isinstance(self.auto_augment, str) or self.auto_augment not in AUTO_AUGMENTS:
            raise VitlabError(
                f"auto_augment must be one of {', '.join(AUTO_AUGMENTS)}; found {self.auto_augment!r}",
                arg="auto_augment",
            )
        check_range("reprob", self.reprob, low=0, high=1)
        check_range("mixup", self.mixup, low=0)
        check_range("cutmix", self.cutmix, low=0)
        check_range("mix_switch_prob", self.mix_switch_prob, low=0, high=1)
        check_range("ema", self.ema, low=0, high=1, low_open=True, high_open=True, optional=True)

    def replace(self, **changes) -> Recipe:
        """A copy with some fields changed (None values are ignored); an unknown field is an error."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise VitlabError(f"unknown Recipe field(s) {unknown}; valid fields: {sorted(known)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return asdict(self)

    def resolve(self, *, img_size: int, flips: bool | None = None) -> Recipe:
        """This recipe with its auto augmentation fields chosen (augment, crop_scale; see the module
        docstring) for a model input of `img_size` pixels (its shorter side), and hflip set to `flips` (whether
        a mirror image keeps its class) where it is None. Fields already set are kept; a None warmup stays
        None (it is counted in steps, by `schedule`)."""
        augment = (
            self.augment if self.augment is not None else self.epochs >= AUG_MIN_EPOCHS or bool(self.asked_augmentation)
        )
        crop = self.crop_scale if self.crop_scale is not None else auto_crop_scale(int(img_size))
        hflip = self.hflip if self.hflip is not None else flips
        return replace(self, augment=augment, crop_scale=crop, hflip=hflip)

    @property
    def asked_augmentation(self) -> list[str]:
        """The per-image augmentation options set to something other than their default (off or auto):
        with augment None (auto) they turn augmentation on whatever the run's length."""
        asked = [
            ("crop_scale", self.crop_scale is not None),
            ("hflip", self.hflip is True),
            ("color_jitter", self.color_jitter > 0),
            ("auto_augment", self.auto_augment != "none"),
            ("reprob", self.reprob > 0),
        ]
        return [name for name, on in asked if on]

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (MixUp/CutMix), which needs full batches (a partner for each image)."""
        return self.mixup > 0 or self.cutmix > 0


RECIPES: dict[str, Recipe] = {
    # The mini experiment: AdamW, lr 3e-3, batch 32, 60 epochs; a warmup of 1/12 of the run (5 epochs of 60),
    # cosine, clipping at 1. The images are tensors already (dataset X), with no augmentation; the model as
    # create_model builds it.
    "mini": Recipe(
        epochs=60, batch_size=32, lr=3e-3, warmup_fraction=1 / 12, augment=False, init="trunc_normal", head_init=0.0
    ),
    # From random weights: the original release's initialisation with a small random head, a warmup of a
    # tenth of the run, augmentation only in runs long enough for it to pay, its crops milder for small
    # images (docs/recipe.md: each choice against the others on Fashion-MNIST, 3 to 50 epochs).
    "scratch": Recipe(epochs=30, lr=1e-3),
    # Pretrained weights: a small learning rate (1e-5 to 1e-4), the head alone for the first few epochs,
    # then everything; layer decay 0.75 as BEiT/timm fine-tune ViTs. Each stage warms up for a tenth of
    # its steps; augmentation as for "scratch" (init and head_init do not apply: the weights are loaded,
    # and the new head is zero, Section 3.2).
    "finetune": Recipe(epochs=10, lr=1e-4, freeze_epochs=2, layer_decay=0.75),
}

# The rules of the auto fields (None), from the measurements of docs/recipe.md.
AUG_MIN_EPOCHS = 40  # augment None: random augmentation in runs of at least this many epochs


def auto_crop_scale(side: int) -> float:
    """crop_scale None: the smallest area a random resized crop keeps, for a model input of `side` pixels.

    0.35 (DeiT and timm use 0.08 at 224 px) is too strong for small images: a third of a 32 px image is an
    18 px crop blown up to 32. Small images get milder crops, rising to 0.35 at 224 px and above."""
    if side >= 224:
        return 0.35
    if side <= 32:
        return 0.8
    t = math.log(side / 32) / math.log(224 / 32)  # log-linear between the two ends
    return round(0.8 + t * (0.35 - 0.8), 2)


@dataclass(frozen=True)
class Stage:
    """One stage of a run's schedule: linear warmup for `warmup_steps`, then cosine decay to
    lr x min_lr_ratio over the rest."""

    epochs: int
    steps: int
    warmup_steps: int

    @property
    def decay_steps(self) -> int:
        return max(0, self.steps - self.warmup_steps)


def schedule(recipe: Recipe, steps_per_epoch: int) -> list[Stage]:
    """The stages of a run of `steps_per_epoch` optimizer steps per epoch (1 stage, or 2 with freeze_epochs)
    and each one's warmup: warmup_fraction of its steps when warmup_epochs is None (rounded down, so never
    more), else warmup_epochs x steps_per_epoch (rounded), which in a staged run is at most half a stage."""
    K = recipe.freeze_epochs
    epochs = [n for n in (K, recipe.epochs - K) if n > 0]
    stages = []
    for n in epochs:
        steps = n * steps_per_epoch
        if recipe.warmup_epochs is None:
            warm = math.floor(round(recipe.warmup_fraction * steps, 6))  # 6 decimals: 3780 / 12 is 315, not 314
        else:
            warm = round(recipe.warmup_epochs * steps_per_epoch)
            if len(epochs) > 1:
                warm = min(warm, steps // 2)
        stages.append(Stage(n, steps, warm))
    return stages


def in_force(
    recipe: Recipe,
    *,
    img_size: int,
    flips: bool,
    steps_per_epoch: int,
    world_size: int = 1,
    weights: str | None = None,
    drop_path: float = 0.0,
    own_init: str | None = None,
) -> dict:
    """The recipe a run trains with, as it prints it and records it in summary.json ("recipe"): every auto
    field chosen (for a model input of `img_size` pixels and `steps_per_epoch` optimizer steps per epoch),
    the schedule in steps, and a note for each option that the run's length makes pointless or contradicts.

    flips: whether a mirror image keeps its class (the default of hflip). weights: None for a model
    trained from random weights, else where its weights come from ("pretrained", "checkpoint"). own_init: for a
    model from random weights that the recipe's init and head_init do not apply to (the CNN baseline), how
    it initialises itself.
    """
    r = recipe.resolve(img_size=img_size, flips=flips)
    hflip = r.hflip
    stages = schedule(r, steps_per_epoch)
    steps = sum(s.steps for s in stages)
    auto = []
    if recipe.warmup_epochs is None:
        auto.append(f"warmup {recipe.warmup_fraction:.3g} of each stage's steps")
    if recipe.augment is None:
        why = (
            f"the run has {r.epochs} epochs, at least {AUG_MIN_EPOCHS}"
            if r.epochs >= AUG_MIN_EPOCHS
            else f"asked by {', '.join(recipe.asked_augmentation)}"
            if recipe.asked_augmentation
            else f"the run has {r.epochs} epochs, fewer than {AUG_MIN_EPOCHS}: it learns faster on the images as "
            "they are"
        )
        auto.append(f"augmentation {'on' if r.augment else 'off'}: {why}")
    if recipe.crop_scale is None and r.augment:
        auto.append(f"crop scale {r.crop_scale:g} for {img_size} px images")
    if r.augment:
        parts = ([f"random resized crop (scale {r.crop_scale:g}-1)"] if r.crop_scale < 1 else []) + (
            ["flip"] if hflip else []
        )
        parts += [f"colour jitter {r.color_jitter:g}"] if r.color_jitter > 0 else []
        parts += (
            [{"rand": "RandAugment", "trivial": "TrivialAugmentWide"}[r.auto_augment]]
            if r.auto_augment != "none"
            else []
        )
        parts += [f"random erasing p={r.reprob:g}"] if r.reprob > 0 else []
        augmentation = ", ".join(parts) or "none"
    else:
        augmentation = "none"
    mixing = [f"MixUp {r.mixup:g}"] * (r.mixup > 0) + [f"CutMix {r.cutmix:g}"] * (r.cutmix > 0)
    regularisation = (
        f"weight decay {r.weight_decay:g}, label smoothing {r.label_smoothing:g}, drop path {drop_path:g}, "
        + (" + ".join(mixing) if mixing else "no MixUp/CutMix")
        + ", "
        + (f"EMA {r.ema:g}" if r.ema else "no EMA")
    )
    if weights is None and own_init is not None:
        init = own_init
    elif weights is None:
        init = f"{r.init}, head " + (f"N(0, {r.head_init:g})" if r.head_init > 0 else "zero")
    else:
        init = f"{weights} weights, a new zero head"
    record = {
        "optimizer": "AdamW",
        "lr": r.lr,
        "weight_decay": r.weight_decay,
        "batch": r.batch_size * world_size * r.grad_accum,
        "clip_grad": r.clip_grad,
        "precision": r.precision,
        "epochs": r.epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps": steps,
        "stages": [
            {"epochs": s.epochs, "steps": s.steps, "warmup_steps": s.warmup_steps, "decay_steps": s.decay_steps}
            for s in stages
        ],
        "decay": "cosine to 0" if r.min_lr_ratio == 0 else f"cosine to {r.min_lr_ratio:g} x lr",
        "layer_decay": r.layer_decay,
        "init": init,
        "augmentation": augmentation,
        "regularisation": regularisation,
        "auto": auto,
        "notes": _notes(recipe, r, stages, steps),
        "fields": r.to_dict(),
    }
    return record


def describe(record: dict) -> list[str]:
    """The lines a run prints for `in_force`'s record: the first thing it says after the data and the model."""
    stages = record["stages"]
    spe = record["steps_per_epoch"]
    if len(stages) == 1:
        s = stages[0]
        plan = f"{s['warmup_steps']} warmup steps, then {record['decay']} over {s['decay_steps']}"
    else:
        plan = "; ".join(
            f"stage {i + 1}: {s['warmup_steps']} warmup steps, then {record['decay']} over {s['decay_steps']}"
            for i, s in enumerate(stages)
        )
    lines = [
        f"recipe: AdamW lr {record['lr']:g}, weight decay {record['weight_decay']:g}, batch {record['batch']}, "
        f"gradient clipping {record['clip_grad']:g}"
        + (f", layer decay {record['layer_decay']:g}" if record["layer_decay"] != 1 else "")
        + f", {record['precision']}",
        f"  schedule: {record['steps']} steps ({record['epochs']} epochs x {spe}): {plan}",
        f"  init: {record['init']}",
        f"  augmentation: {record['augmentation']}",
        f"  regularisation: {record['regularisation']}",
    ]
    if record["auto"]:
        lines.append(f"  auto: {'; '.join(record['auto'])}")
    lines += [f"note: {n}" for n in record["notes"]]
    return lines


def _notes(given: Recipe, r: Recipe, stages: list[Stage], steps: int) -> list[str]:
    """One line for each option that the run's length contradicts or that has no effect."""
    notes = []
    if given.warmup_epochs is not None:
        for i, s in enumerate(stages):
            where = f"the {s.epochs}-epoch run" if len(stages) == 1 else f"stage {i + 1} ({s.epochs} epochs)"
            asked = round(given.warmup_epochs * s.steps / s.epochs)
            if s.warmup_steps >= s.steps:
                notes.append(
                    f"--warmup-epochs {given.warmup_epochs:g} covers {where} ({s.warmup_steps} warmup steps of "
                    f"{s.steps}): the learning rate rises to the end and never decays; without the flag the "
                    f"warmup is {given.warmup_fraction:.3g} of it "
                    f"({math.floor(round(given.warmup_fraction * s.steps, 6))} steps)"
                )
            elif s.warmup_steps < asked:
                notes.append(
                    f"--warmup-epochs {given.warmup_epochs:g} is cut to half of {where}: {s.warmup_steps} "
                    f"warmup steps of {s.steps}"
                )
    if r.freeze_epochs >= r.epochs and r.unfreeze != "head":
        notes.append(
            f"--freeze-epochs {r.freeze_epochs} is the whole {r.epochs}-epoch run: only the head trains, and "
            f"--unfreeze {r.unfreeze} never starts"
        )
    if r.ema and steps < 1 / (1 - r.ema):
        notes.append(
            f"--ema {r.ema:g} averages over about {round(1 / (1 - r.ema)):,} steps, more than the run's "
            f"{steps:,}: the averaged weights stay close to the initial ones"
        )
    if not r.augment:
        unused = [name for name in given.asked_augmentation if name != "hflip" or given.hflip]
        if unused:
            notes.append(
                f"{', '.join('--' + n.replace('_', '-') for n in unused)} "
                f"{'has' if len(unused) == 1 else 'have'} no effect: augmentation is off (--no-aug)"
            )
    return notes


__all__ = ["Recipe", "RECIPES", "AUG_MIN_EPOCHS", "auto_crop_scale", "Stage", "schedule", "in_force", "describe"]
