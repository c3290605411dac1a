"""`PretrainedCfg`: where a model's weights came from and how its inputs must be prepared.

Every model `create_model` returns carries one as `model.pretrained_cfg`. Its preprocessing fields are
what `vitlab.data.preprocess.eval_transform` applies, because each weight source resized, cropped and
normalised its training images its own way and a mismatch silently costs accuracy (seed 004 section
7.2; vision_transformer#39: 83.41% vs 85.08% top-1 from the resize alone). timm keeps the same record
(`timm.models._pretrained.PretrainedCfg`); this one adds what vitlab learned while loading the weights
(the head's state, notes on dropped parts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

HEAD_STATES = ("random", "loaded", "zero", "absent", "new", "none")


@dataclass(frozen=True)
class PretrainedCfg:
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

    def __post_init__(self) -> None:
        # Lists from JSON become tuples, so a config read back from disk equals the one written.
        for name in ("input_size", "mean", "std", "label_names", "notes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def img_size(self) -> tuple[int, int]:
        return tuple(self.input_size[1:])

    @property
    def in_chans(self) -> int:
        return int(self.input_size[0])

    def replace(self, **changes) -> "PretrainedCfg":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict | None) -> "PretrainedCfg":
        """From `to_dict()` output, or the untyped dict older vitlab checkpoints stored; unknown keys
        are ignored and missing ones take the defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known and v is not None})


__all__ = ["PretrainedCfg", "HEAD_STATES"]
