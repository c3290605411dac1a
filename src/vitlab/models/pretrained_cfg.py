"""`PretrainedCfg`: where a model's weights came from and how its inputs must be prepared.

Every model `create_model` returns carries one as `model.pretrained_cfg`. Its preprocessing fields are
what `vitlab.data.preprocess.eval_transform` applies, because each weight source resized, cropped and
normalised its training images its own way and a mismatch silently costs accuracy
(vision_transformer#39: 83.41% vs 85.08% top-1 from the resize alone). timm keeps the same record
(`timm.models._pretrained.PretrainedCfg`); this one adds what vitlab learned while loading the weights
(the head's state, notes on dropped parts).

It is also a read-only mapping with timm's keys (`input_size`, `mean`, `std`, `crop_pct`, `crop_mode`,
`interpolation`, `num_classes`, `classifier`, `first_conv`, `hf_hub_id`, ...), so that code written for
timm reads it as it reads timm's: `timm.data.resolve_data_config(model=model)`, `cfg["classifier"]`,
`cfg.get("mean")`, `dict(cfg)`. vitlab itself reads the typed fields (`cfg.crop_pct`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace

from vitlab.errors import VitlabError

HEAD_STATES = ("random", "loaded", "zero", "absent", "new", "none")
CROP_MODES = ("center", "squash")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
RESIZE_BACKENDS = ("pil", "tensor")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)

# Eval preprocessing per weight source (each source trained with its own mean/std, resize and crop),
# as each source's own library does it. crop_mode "squash" resizes both sides to input_size / crop_pct;
# "center" resizes the short side, then crops. The registry's named models and the weight formats use these.
PREPROCESSING = {
    # timm augreg ViTs (the default of timm's vit_* configs): mean = std = 0.5, crop 0.9, bicubic.
    "timm": dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=0.9, crop_mode="center", interpolation="bicubic"),
    # Original JAX release and HF google/vit-*: resize straight to the input size, bilinear, no crop.
    "jax": dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=1.0, crop_mode="squash", interpolation="bilinear"),
    # HF's ViTImageProcessor (transformers >= 5) resizes the uint8 tensor with torchvision (antialiased), not PIL.
    "hf": dict(
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        crop_pct=1.0,
        crop_mode="squash",
        interpolation="bilinear",
        resize_backend="tensor",
    ),
    # torchvision vit_b_16 IMAGENET1K_V1: resize 256 bilinear, centre crop 224 (224/256 = 0.875), ImageNet stats.
    "torchvision": dict(
        mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.875, crop_mode="center", interpolation="bilinear"
    ),
    # DeiT and DeiT III in timm (deit_*.fb_in1k, deit3_*.fb_in1k): ImageNet stats, bicubic, centre crop 0.9.
    "deit": dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.9, crop_mode="center", interpolation="bicubic"),
    # HF's DeiTImageProcessor as facebook/deit-* configure it: both sides to 256 (bicubic, on the tensor), centre
    # crop 224, ImageNet stats (the processor class's own default, 0.5, is not what DeiT was trained with).
    "hf_deit": dict(
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        crop_pct=0.875,
        crop_mode="squash",
        interpolation="bicubic",
        resize_backend="tensor",
    ),
    # DINO in timm (vit_*.dino): ImageNet stats, bicubic, centre crop 0.9.
    "dino": dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.9, crop_mode="center", interpolation="bicubic"),
    # DINOv2 in timm (vit_*_dinov2.lvd142m): ImageNet stats, bicubic, no crop (the models run at 518).
    "dinov2": dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0, crop_mode="center", interpolation="bicubic"),
    # facebookresearch/dinov2's own eval transform (dinov2/data/transforms.py): short side 256 bicubic, crop 224.
    "dinov2_repo": dict(
        mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.875, crop_mode="center", interpolation="bicubic"
    ),
    # HF facebook/dinov2-*'s BitImageProcessor: short side 256 bicubic, centre crop 224, ImageNet stats (tensor).
    "hf_dinov2": dict(
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        crop_pct=0.875,
        crop_mode="center",
        interpolation="bicubic",
        resize_backend="tensor",
    ),
    # OpenAI CLIP's preprocess (clip.load): short side 224 bicubic, centre crop 224, CLIP's own mean/std.
    "clip": dict(mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0, crop_mode="center", interpolation="bicubic"),
    # Alibaba-MIIL's ImageNet-21K ViT in timm (vit_base_patch16_224_miil): no normalisation, bilinear, crop 0.875.
    "miil": dict(
        mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_pct=0.875, crop_mode="center", interpolation="bilinear"
    ),
}


def _count(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value, low: float | None) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (low is None or value > low)


# timm's keys that have no field of their own: the module names of the classifier and of the first
# convolution (what timm's layer-decay grouping and input-channel adaptation look for); the CNN
# baseline's first convolution is "stem.0".
TIMM_CLASSIFIER, TIMM_FIRST_CONV = "head", "patch_embed.proj"


@dataclass(frozen=True)
class PretrainedCfg(Mapping):
    source: str = "random init"  # a weights file, folder, hub id, vitlab checkpoint, or "random init"
    format: str | None = None  # timm | hf | torchvision | jax | vitlab: the layout the weights were read from
    architecture: str | None = None  # the registered model name, when there is one
    input_size: tuple[int, int, int] = (3, 224, 224)  # (C, H, W) the model takes
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # the original JAX release's (x - 0.5) / 0.5
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 0.9  # resize to input_size / crop_pct, then crop input_size (timm's convention)
    crop_mode: str = "center"  # "center": short side, then a centre crop; "squash": both sides, no aspect kept
    interpolation: str = "bicubic"
    resize_backend: str = "pil"  # "tensor": resize the uint8 tensor (Hugging Face's ViTImageProcessor)
    num_classes: int = 1000
    label_names: tuple[str, ...] | None = None
    # The classifier's state: "random" (a new model), "loaded" (trained, from the weights), "zero" (all
    # zeros: an ImageNet-21k pre-training checkpoint), "absent" (the weights had none), "new" (a new
    # zero-initialised head for other classes), "none" (num_classes=0: the model returns features).
    head: str = "random"
    notes: tuple[str, ...] = ()  # what loading changed: resampled position tables, dropped parts
    hf_hub_id: str | None = None  # the hub repository of the variant's default weights (timm's), for pretrained=True
    first_conv: str = TIMM_FIRST_CONV  # the module the input channels go into (timm's key of the same name)
    fixed_input_size: bool = True  # the model takes input_size only; False with dynamic_img_size (any size)

    def __post_init__(self) -> None:
        # Lists from JSON become tuples, so a config read back from disk equals the one written.
        for name in ("input_size", "mean", "std", "label_names", "notes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self._check()

    def _check(self) -> None:
        """Every field of the right type and range (a config.json is user input): one message naming it."""

        def fail(name: str, expected: str):
            raise VitlabError(f"pretrained_cfg {name} must be {expected}; found {getattr(self, name)!r}", arg=name)

        for name in ("source", "crop_mode", "interpolation", "resize_backend", "head", "first_conv"):
            if not isinstance(getattr(self, name), str):
                fail(name, "a string")
        for name in ("format", "architecture", "hf_hub_id"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                fail(name, "a string or null")
        size = self.input_size
        if not (isinstance(size, tuple) and len(size) == 3 and all(_count(v, 1) for v in size)):
            fail("input_size", "(channels, height, width), three integers >= 1")
        for name, low in (("mean", None), ("std", 0.0)):
            v = getattr(self, name)
            if not (isinstance(v, tuple) and 1 <= len(v) <= 4 and all(_number(x, low) for x in v)):
                fail(name, "a list of 1 to 4 numbers" + (" > 0" if low is not None else "") + ", one per channel")
        if not _number(self.crop_pct, 0.0) or self.crop_pct > 1:
            fail("crop_pct", "a number in (0, 1]: the share of the resized image the centre crop keeps")
        for name, choices in (
            ("crop_mode", CROP_MODES),
            ("interpolation", INTERPOLATIONS),
            ("resize_backend", RESIZE_BACKENDS),
            ("head", HEAD_STATES),
        ):
            if getattr(self, name) not in choices:
                fail(name, f"one of {', '.join(choices)}")
        if not _count(self.num_classes, 0):
            fail("num_classes", "an integer >= 0")
        if self.label_names is not None and not (
            isinstance(self.label_names, tuple) and all(isinstance(n, str) for n in self.label_names)
        ):
            fail("label_names", "a list of strings or null")
        if not (isinstance(self.notes, tuple) and all(isinstance(n, str) for n in self.notes)):
            fail("notes", "a list of strings")
        if not isinstance(self.fixed_input_size, bool):
            fail("fixed_input_size", "true or false")

    @property
    def img_size(self) -> tuple[int, int]:
        return tuple(self.input_size[1:])

    @property
    def in_chans(self) -> int:
        return int(self.input_size[0])

    def replace(self, **changes) -> PretrainedCfg:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def to_timm(self) -> dict:
        """The dict timm keeps as `model.pretrained_cfg` (timm.models.PretrainedCfg.to_dict's keys): what
        timm's data helpers, optimisers and hub writers read (tuples, as timm keeps them)."""
        out = {
            "architecture": self.architecture,
            "hf_hub_id": self.hf_hub_id,
            "input_size": self.input_size,
            "fixed_input_size": self.fixed_input_size,  # timm's tests feed other sizes where False
            "interpolation": self.interpolation,
            "crop_pct": self.crop_pct,
            "crop_mode": self.crop_mode,
            "mean": self.mean,
            "std": self.std,
            "num_classes": self.num_classes,
            "first_conv": self.first_conv,
            "classifier": TIMM_CLASSIFIER,
        }
        if self.label_names is not None:
            out["label_names"] = self.label_names
        return out

    # The read-only mapping of timm's keys (the module docstring): three methods, from to_timm.
    def __getitem__(self, key: str):
        return self.to_timm()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_timm())

    def __len__(self) -> int:
        return len(self.to_timm())

    @classmethod
    def from_dict(cls, data: dict | None) -> PretrainedCfg:
        """From `to_dict()` output, or the untyped dict older vitlab checkpoints stored; unknown keys
        are ignored and missing ones take the defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known and v is not None})


__all__ = [
    "PretrainedCfg",
    "TIMM_CLASSIFIER",
    "TIMM_FIRST_CONV",
    "HEAD_STATES",
    "CROP_MODES",
    "INTERPOLATIONS",
    "RESIZE_BACKENDS",
    "PREPROCESSING",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CLIP_MEAN",
    "CLIP_STD",
]
