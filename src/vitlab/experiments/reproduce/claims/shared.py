"""The Fashion-MNIST setup the claims share, fixed before any full run was seen: the data at each
training-set size, the two models, the plain recipe and the regularisation recipe, and the data-scale
grid of claim 5, whose runs claims 2, 3, 4, 6, 7, 8 and 9 reuse as their baseline arm.

    models    ViT: `vit_mini` with 6 blocks (P=4 on 28x28 -> 7x7 patches + class token, D=64, 4 heads,
              MLP 128, learned 1-D position embedding: the paper's model, narrowed); CNN: `resnet_mini`
              (3 stages of BasicBlocks, width 16); both with one grey input channel
    recipe    AdamW, lr 1e-3, weight decay 0.05, batch 128, linear warmup over the first tenth of
              training then cosine, gradient clipping at 1; the same for every arm of a comparison
    plain     random horizontal flips (a mirrored garment is the same garment)
    regularised  plain + RandAugment (2 ops, magnitude 9) + MixUp 0.8 / CutMix 1.0 + stochastic depth 0.1
              (the ViT's; the CNN baseline has no residual branches to drop): DeiT's recipe
    grid      training sets nested by seed (the first N of one permutation of the 60,000), each N trained for
              more steps than the one below it; validation on the 10,000 test images
"""

from __future__ import annotations

from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.runs import RunSpec, run_spec
from vitlab.models.registry import get_config

VIT, CNN = "vit_mini", "resnet_mini"
FASHION_VIT = {"depth": 6}  # six blocks, so that "depth" means something in Figure 7 (claim 8)
LR, WEIGHT_DECAY, BATCH = 1e-3, 0.05, 128
PLAIN = {"hflip": True}
REGULARISED = {"hflip": True, "auto_augment": "rand", "mixup": 0.8, "cutmix": 1.0}
DROP_PATH = 0.1
CHANCE = 0.1  # ten balanced classes


def points(scale: Scale) -> list[tuple[int, int]]:
    """(N training images, epochs) of the data-scale grid."""
    return scale.pick(
        quick=[(100, 2), (200, 2), (400, 1)],
        default=[(1000, 16), (4000, 6), (15_000, 3), (60_000, 2)],
        large=[(1000, 100), (4000, 50), (15_000, 20), (60_000, 10)],
    )


def n_small(scale: Scale) -> int:
    """The smallest training set (1,000): claims 3, 4 and 7."""
    return points(scale)[0][0]


def n_mid(scale: Scale) -> int:
    """Small data (4,000): claims 2, 7 and 9."""
    return points(scale)[1][0]


def n_full(scale: Scale) -> int:
    """The full training set (60,000): claims 5, 6, 8 and 9."""
    return points(scale)[-1][0]


def by_arm(runs: list[RunSpec], arms: list, k: int) -> dict:
    """A plan of `k` seeds per arm, in arm order, split into {arm: its k runs}."""
    return {arm: runs[i * k : (i + 1) * k] for i, arm in enumerate(arms)}


def fashion_data(n: int, scale: Scale) -> dict:
    return {"name": "fashion-mnist", "n_train": n, "n_val": 250 if scale.quick else 10_000, "img_size": 28,
            "channels": 1}


def fashion_run(model: str, n: int, seed: int, scale: Scale, *, lr: float = LR, regularised: bool = False,
                overrides: dict | None = None) -> RunSpec:
    """One run of the shared setup. Overrides equal to the registered model's own values are dropped, so
    that a claim's baseline arm is the data-scale run itself (the same cache entry)."""
    ov = dict(FASHION_VIT) if model == VIT else {}
    if regularised and model == VIT:
        ov["drop_path"] = DROP_PATH
    ov.update(overrides or {})
    base = get_config(model)
    ov = {k: v for k, v in ov.items() if getattr(base, k, None) != v}
    epochs = dict(points(scale))[n]
    return run_spec(fashion_data(n, scale), model, overrides=ov, aug=REGULARISED if regularised else PLAIN,
                    epochs=epochs, lr=lr, batch_size=BATCH, weight_decay=WEIGHT_DECAY, warmup_epochs=epochs / 10,
                    seed=seed)


def describe_setup(scale: Scale) -> str:
    """The shared setup in one paragraph, for the report's claims."""
    return (f"Fashion-MNIST, 28x28 grey, validation on the first {fashion_data(0, scale)['n_val']:,} test images; "
            f"ViT = `vit_mini` with 6 blocks (P=4: 7x7 patches + class token, D=64, 4 heads, MLP 128, learned 1-D "
            f"position embedding), CNN = `resnet_mini`; AdamW lr {LR:g}, weight decay {WEIGHT_DECAY:g}, batch {BATCH}, "
            "warmup over the first tenth of training then cosine; random horizontal flips.")
