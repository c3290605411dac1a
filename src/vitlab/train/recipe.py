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
which builds the training loader. Ranges are checked when a Recipe is made, in the fields' own names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from vitlab.data.transforms import AUTO_AUGMENTS
from vitlab.errors import VitlabError, check_range
from vitlab.runtime import check_precision, check_seed


@dataclass(frozen=True)
class Recipe:
    # optimisation
    epochs: int = 30
    batch_size: int = 32  # per process: the global batch is batch_size x processes x grad_accum
    lr: float = 1e-3  # peak learning rate (of the head, with layer decay)
    weight_decay: float = 0.05  # AdamW, matrices only
    warmup_epochs: float = 3.0  # linear warmup at the start of each stage, then cosine
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
    # augmentation and regularisation
    augment: bool = True  # random crops etc.; False: training images are preprocessed like validation ones
    hflip: bool | None = None  # None: on for folders and Fashion-MNIST, off for digits and X (a flip changes their class)
    crop_scale: float = 0.35  # RandomResizedCrop keeps between this and all of the image area
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
        check_range("warmup_epochs", self.warmup_epochs, low=0)
        check_range("min_lr_ratio", self.min_lr_ratio, low=0, high=1)
        check_range("clip_grad", self.clip_grad, low=0)
        check_range("label_smoothing", self.label_smoothing, low=0, high=1, high_open=True)
        check_range("grad_accum", self.grad_accum, low=1, integer=True)
        check_precision(self.precision)
        check_seed(self.seed)
        check_range("freeze_epochs", self.freeze_epochs, low=0, high=self.epochs, integer=True,
                    hint=f" (at most epochs = {self.epochs})")
        check_range("layer_decay", self.layer_decay, low=0, high=1, low_open=True)
        if not isinstance(self.unfreeze, str) or not (self.unfreeze in ("all", "head") or (self.unfreeze.startswith("last:") and self.unfreeze[5:].isdigit()
                                                      and int(self.unfreeze[5:]) >= 1)):
            raise VitlabError(f"unfreeze must be all, head or last:N (N >= 1 blocks); found {self.unfreeze!r}",
                              arg="unfreeze")
        check_range("crop_scale", self.crop_scale, low=0, high=1, low_open=True)
        check_range("color_jitter", self.color_jitter, low=0)
        for name in ("augment",):
            if not isinstance(getattr(self, name), bool):
                raise VitlabError(f"{name} must be True or False; found {getattr(self, name)!r}", arg=name)
        if self.hflip is not None and not isinstance(self.hflip, bool):
            raise VitlabError(f"hflip must be True, False or None (the dataset's default); found {self.hflip!r}", arg="hflip")
        if not isinstance(self.auto_augment, str) or self.auto_augment not in AUTO_AUGMENTS:
            raise VitlabError(f"auto_augment must be one of {', '.join(AUTO_AUGMENTS)}; found {self.auto_augment!r}",
                              arg="auto_augment")
        check_range("reprob", self.reprob, low=0, high=1)
        check_range("mixup", self.mixup, low=0)
        check_range("cutmix", self.cutmix, low=0)
        check_range("mix_switch_prob", self.mix_switch_prob, low=0, high=1)
        check_range("ema", self.ema, low=0, high=1, low_open=True, high_open=True, optional=True)

    def replace(self, **changes) -> "Recipe":
        """A copy with some fields changed (None values are ignored); an unknown field is an error."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise VitlabError(f"unknown Recipe field(s) {unknown}; valid fields: {sorted(known)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (MixUp/CutMix), which needs full batches (a partner for each image)."""
        return self.mixup > 0 or self.cutmix > 0


RECIPES: dict[str, Recipe] = {
    # The mini experiment: AdamW, lr 3e-3, batch 32, 60 epochs; a 5-epoch warmup, cosine, clipping at 1.
    # The images are tensors already (dataset X), with no augmentation.
    "mini": Recipe(epochs=60, batch_size=32, lr=3e-3, warmup_epochs=5.0, augment=False),
    # From random weights: a larger lr than fine-tuning, a longer warmup, every layer trains.
    "scratch": Recipe(epochs=30, lr=1e-3, warmup_epochs=3.0),
    # Pretrained weights: a small learning rate (1e-5 to 1e-4), the head alone for the first few epochs,
    # then everything; layer decay 0.75 as BEiT/timm fine-tune ViTs.
    "finetune": Recipe(epochs=10, lr=1e-4, warmup_epochs=1.0, freeze_epochs=2, layer_decay=0.75),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise VitlabError(f"unknown recipe {name!r}; expected one of {', '.join(RECIPES)}", arg="recipe")
    return RECIPES[name]


__all__ = ["Recipe", "RECIPES", "get_recipe", "AUTO_AUGMENTS"]
