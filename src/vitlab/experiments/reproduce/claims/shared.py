"""The Fashion-MNIST setup the claims share: the data at each training-set size, the two models, their
recipe, the step budgets, and the data-scale grid of claim 5, whose runs claims 2, 3, 4, 6, 7, 8 and 9
reuse as their baseline arm.

The recipe was chosen by the recipe search (search.py: `vitlab reproduce --tune`, here run in part by
benchmarks/reproduce_search_small.py) on 10,000 training images held out from the other 50,000, never on
the 10,000 test images that decide the verdicts, and then fixed here; the search's record (`search.json`
beside search.py, shown in the report) says what it tried and what it found, and
tests/test_reproduce_search.py checks that these constants are its choice. The budgets are the search's
budget stage's at 1,000, 4,000 and 50,000 images (the last standing for the claims' 60,000): at each, twice
the budget moved neither model's held-out accuracy by a point.

    models    ViT: `vit_mini` at the search's patch size and depth (D=64, 4 heads, MLP 128, learned 1-D
              position embedding, class token; the paper's model, narrowed), initialised as the search chose
              (RECIPES' init); CNN: `resnet_mini` (3 stages of BasicBlocks, width 16); both with one grey input
              channel
    recipe    AdamW with each model's own learning rate, weight decay and batch size, linear warmup over a
              fraction of training then cosine to 0, gradient clipping at 1 (RECIPES: a `Recipe` per model)
    plain     random horizontal flips (PLAIN; not searched)
    regularised  claim 9's: plain + the search's choice of REGULARISATIONS (DeiT's: RandAugment, 2 ops,
              magnitude 9, + MixUp 0.8 / CutMix 1.0 + stochastic depth 0.1; lighter ones), stochastic depth
              at the same rate for both models (the ViT's blocks and the CNN's BasicBlocks, each on its
              residual branches)
    budgets   optimizer steps at each training-set size (STEPS), the same for every arm of a comparison (to
              the whole epoch the engine trains): the search's budget stage doubles a budget until doubling
              it again moves no model's held-out accuracy by a point; claim 9 has its own at 4,000 images,
              per model (REGULARISED_STEPS), found the same way with its regularisation
    grid      training sets nested by seed (the first N of one permutation of the 60,000), validation on
              the 10,000 test images
    seeds     the scale's seeds, but five at 1,000 images (SEEDS_AT: the arms of claims 2, 3, 4, 5 and 7 there,
              whose verdicts hinge on an equivalence or whose spread between seeds exceeds a point)
"""

from __future__ import annotations

import math

from vitlab.data.subsets import DIGITS_HELD_OUT, HELD_OUT, ExperimentData
from vitlab.experiments.reproduce.claims.base import Results, Scale, convergence_row
from vitlab.experiments.reproduce.probes import deciding_shots, probe_acc, probe_table
from vitlab.experiments.reproduce.runs import BASE_RECIPE, Run
from vitlab.models.registry import get_config

VIT, CNN = "vit_mini", "resnet_mini"
# ---- the search's choice (search.json; `vitlab reproduce --tune`) ------------------------------------
FASHION_VIT = {"depth": 6, "patch_size": 7}  # the ViT's shape
PLAIN = {"augment": True, "hflip": True}  # random horizontal flips (not searched)
# Per model, its recipe but for the length: a run sets its epochs, its seed and its warmup, the warmup_fraction of
# its epochs (placed in epochs, as warmup_epochs: the schedule rounds it to whole steps per epoch).
RECIPES = {
    VIT: BASE_RECIPE.replace(
        lr=2e-3, weight_decay=0.05, batch_size=64, warmup_fraction=0.02, init="trunc_normal", **PLAIN
    ),
    CNN: BASE_RECIPE.replace(lr=4e-3, weight_decay=0.15, batch_size=64, warmup_fraction=0.1, **PLAIN),
}
STEPS = {  # optimizer steps per training-set size, every arm of a comparison alike
    "quick": {100: 4, 200: 4, 400: 4},
    "default": {1000: 5000, 4000: 2500, 60_000: 10_000},
}
# Claim 9's own budgets at its smaller training set, per model, where the shared one is too short for its
# regularisation (the search's regularisation stage doubles each model's budget with it until doubling moves it by less
# than a point: a regulariser needs longer than plain training to pay off); each model's plain arm there trains as long
# as its regularised one. The CNN's converged at the shared budget.
REGULARISED_STEPS = {"quick": {}, "default": {4000: {VIT: 10_000}}}
# ------------------------------------------------------------------------------------------------------
# Claim 9's regularisation, the search's choice among these candidates (augmentation; both models' stochastic depth):
REGULARISATIONS = {
    "DeiT's": ({**PLAIN, "auto_augment": "rand", "mixup": 0.8, "cutmix": 1.0}, 0.1),  # RandAugment 2/9, MixUp/CutMix
    "mixing only": ({**PLAIN, "mixup": 0.8, "cutmix": 1.0}, 0.1),
    "light": ({**PLAIN, "auto_augment": "rand", "mixup": 0.2}, 0.05),
}
REGULARISATION = "mixing only"
REGULARISED, DROP_PATH = REGULARISATIONS[REGULARISATION]
CHANCE = 0.1  # ten balanced classes
# Seeds per training-set size where a claim needs more than the scale's (fixed before any run with them): at 1,000
# images claim 3's and claim 2's verdicts hinge on an equivalence, and claims 4's, 5's and 7's arms spread by more than
# a point between seeds. The quick scale keeps its own seeds (its verdicts mean nothing); --seeds raises, never lowers.
SEEDS_AT = {1000: 5}


def steps_table(scale: Scale) -> dict[int, int]:
    """Optimizer steps at each training-set size of the scale: the large scale trains twice as long as the
    default (so that it is itself the check that the default's budgets have converged)."""
    if scale.name == "large":
        return {n: 2 * s for n, s in STEPS["default"].items()}
    return dict(STEPS[scale.name])


def regularised_steps(model: str, n: int, scale: Scale) -> int:
    """Claim 9's optimizer steps for `model` at `n` images: its own (REGULARISED_STEPS) where it has one, else
    STEPS'."""
    own = REGULARISED_STEPS["default" if scale.name == "large" else scale.name].get(n, {})
    return (2 if scale.name == "large" else 1) * own[model] if model in own else steps_table(scale)[n]


def seeds_at(n: int, scale: Scale) -> tuple[int, ...]:
    """The seeds of the arms at `n` training images: the scale's, extended to SEEDS_AT[n] where it names more (not at
    the quick scale, nor where the scale asks for its own seeds alone), less the scale's dropped seeds."""
    # the scale's seeds with those dropped among them (a dropped seed past them is one of the extension's)
    seeds = tuple(sorted({*scale.seeds, *(d for d in scale.dropped if d <= max(scale.seeds))}))
    more = 0 if scale.quick or not scale.more_seeds else SEEDS_AT.get(n, 0) - len(seeds)
    last = max(seeds)
    seeds += tuple(range(last + 1, last + 1 + max(more, 0)))
    return tuple(s for s in seeds if s not in scale.dropped)


def points(scale: Scale) -> list[tuple[int, int]]:
    """(N training images, optimizer steps) of the data-scale grid."""
    return sorted(steps_table(scale).items())


def n_small(scale: Scale) -> int:
    """The smallest training set (1,000): claims 2, 3, 4 and 7."""
    return points(scale)[0][0]


def n_mid(scale: Scale) -> int:
    """Small data (4,000): claims 7 and 9."""
    return points(scale)[1][0]


def n_full(scale: Scale) -> int:
    """The full training set (60,000): claims 5, 6, 8 and 9."""
    return points(scale)[-1][0]


def by_arm(runs: list[Run], arms: list, k: int) -> dict:
    """A plan of `k` seeds per arm, in arm order, split into {arm: its k runs}."""
    return {arm: runs[i * k : (i + 1) * k] for i, arm in enumerate(arms)}


def fashion_data(n: int, scale: Scale) -> ExperimentData:
    return ExperimentData("fashion-mnist", n_train=n, n_val=250 if scale.quick else 10_000, img_size=28, channels=1)


def digits_data(scale: Scale, held_out: bool = False) -> ExperimentData:
    """scikit-learn's digits at the Fashion-MNIST models' input (28x28, one grey channel): claim 6 fine-tunes on
    them, and claims 2, 3 and 6 probe frozen Fashion-MNIST features on them (the transfer probe). Of the 1,797
    digits, 500 (100 at the quick scale, stratified) to train on or draw the shots from; of the rest, DIGITS_HELD_OUT
    (drawn per seed) to choose on (`held_out`: split "held_out"), the others for the verdict."""
    n_train = 100 if scale.quick else 500
    n_val = DIGITS_HELD_OUT if held_out else 1797 - n_train - DIGITS_HELD_OUT
    split = "held_out" if held_out else "test"
    return ExperimentData("digits", n_train=n_train, n_val=n_val, img_size=28, channels=1, split=split)


def transfer_probes(
    res: Results, arms: dict[str, list[Run]], scale: Scale
) -> tuple[dict[str, list[float]] | None, list[tuple[str, list[str], list[list[str]]]], str]:
    """Claims 2 and 3's transfer probe, not part of their rules: each arm's trained Fashion-MNIST models, frozen,
    probed on the digits (`digits_data`: the shots from its training digits, the ridge strength chosen on its held-out
    digits, accuracy on the others), as Table 8 and Figure 9 probe ImageNet-trained features on other datasets.
    Returns ({arm: per-seed accuracy at the deciding shot count}, the report's table, a sentence for the notes);
    (None, [], why) where the report keeps these runs without weights and no replicate probed them."""
    digits = digits_data(scale)
    specs = [r for runs in arms.values() for r in runs]
    probes, cpu = res.transfer_probes(specs, digits, scale)
    if probes is None:
        why = (
            "No transfer probe: this report keeps these runs without their weights, and no replicate beside it has "
            "probed them."
        )
        return None, [], why
    by, i = {}, 0
    for arm, runs in arms.items():
        by[arm], i = probes[i : i + len(runs)], i + len(runs)
    k = deciding_shots(scale.quick)
    source = (
        f"the same runs trained again on {cpu} (this report keeps its own without weights)"
        if cpu
        else "this report's runs"
    )
    title = (
        "Transfer probe (not part of the rule): each model's frozen features probed on scikit-learn's digits, "
        f"{digits.n_train} training digits to draw the shots from, the ridge strength chosen on {DIGITS_HELD_OUT} "
        f"held-out digits, accuracy on the other {digits.n_val:,}; the models: {source}"
    )
    table = [(title, *probe_table(by))]
    note = (
        "What decides: the rule's two parts, the test accuracy and the same-dataset probe (fixed before the transfer "
        f"probe existed); the {k}-shot transfer probe is reported beside them, from {source}."
    )
    return {arm: probe_acc(p, k) for arm, p in by.items()}, table, note


def steps_per_epoch(n: int, batch: int, drop_last: bool = False) -> int:
    return n // batch if drop_last else math.ceil(n / batch)


def epochs_for(steps: int, n: int, batch: int, drop_last: bool = False) -> int:
    """Whole epochs of `n` images closest to `steps` optimizer steps (at least one): a run's budget is
    its steps, and the engine trains whole epochs."""
    return max(1, round(steps / steps_per_epoch(n, batch, drop_last)))


def own_overrides(model: str, overrides: dict) -> dict:
    """The overrides that change the registered model: one equal to its own value is dropped, so that a run is
    described (and cached) once however its arms spell it."""
    base = get_config(model)
    return {k: v for k, v in overrides.items() if getattr(base, k, None) != v}


def fashion_run(
    model: str,
    n: int,
    seed: int,
    scale: Scale,
    *,
    lr: float | None = None,
    regularised: bool = False,
    overrides: dict | None = None,
    steps: int | None = None,
) -> Run:
    """One run of the shared setup: `model` on the first `n` training images of seed `seed`'s permutation, for
    the scale's step budget at `n` (or `steps`), with the model's recipe (or the learning rate `lr`).
    Overrides equal to the registered model's own values are dropped, so that a claim's baseline arm is
    the data-scale run itself (the same cache entry)."""
    ov = dict(FASHION_VIT) if model == VIT else {}
    if regularised:  # both models: stochastic depth on their residual branches, at one rate
        ov["drop_path"] = DROP_PATH
    ov = own_overrides(model, {**ov, **(overrides or {})})
    rec = RECIPES[model].replace(**(REGULARISED if regularised else {}))
    epochs = epochs_for(steps or steps_table(scale)[n], n, rec.batch_size, drop_last=regularised)
    rec = rec.replace(epochs=epochs, lr=lr, warmup_epochs=rec.warmup_fraction * epochs, seed=seed)
    return Run(data=fashion_data(n, scale), model=model, recipe=rec, overrides=ov)


def describe_setup(scale: Scale) -> str:
    """The shared setup in one paragraph, for the report's claims."""
    shape = {**get_config(VIT).to_dict(), **FASHION_VIT}
    P, grid = shape["patch_size"], 28 // shape["patch_size"]
    aug = "random horizontal flips" + (
        f" and random resized crops (scale {PLAIN['crop_scale']:g}-1)" if PLAIN.get("crop_scale", 1.0) < 1 else ""
    )
    init = "the original release's initialisation" if RECIPES[VIT].init == "jax" else "timm's initialisation"

    def recipe(m: str) -> str:
        r = RECIPES[m]
        return f"lr {r.lr:g}, weight decay {r.weight_decay:g}, batch {r.batch_size}, warmup {r.warmup_fraction:.0%}"

    return (
        f"Fashion-MNIST, 28x28 grey, test accuracy on the first {fashion_data(0, scale).n_val:,} test images; "
        f"ViT = `vit_mini` with {shape['depth']} blocks (P={P}: {grid}x{grid} patches + class token, D={shape['dim']}, "
        f"{shape['heads']} heads, MLP {shape['mlp_dim']}, learned 1-D position embedding; {init}), "
        f"CNN = `resnet_mini`; AdamW (ViT: {recipe(VIT)}; CNN: {recipe(CNN)}), linear warmup then cosine, "
        f"gradient clipping at 1; {aug}; the recipe chosen by the search on held-out training images (see Recipe "
        "and budgets)."
    )


def code_budgets() -> dict[int, int]:
    """The default scale's budgets (STEPS), per training-set size."""
    return dict(STEPS["default"])


def code_regularised_budgets() -> dict[int, dict[str, int]]:
    """Claim 9's budgets in code where it has its own (REGULARISED_STEPS), per training-set size and model (its
    label): each model's own there, or the shared one."""
    return {
        n: {label: b.get(m, STEPS["default"][n]) for m, label in ((VIT, "ViT"), (CNN, "CNN"))}
        for n, b in sorted(REGULARISED_STEPS["default"].items())
    }


def search_size(n: int) -> int:
    """A training-set size of the claims as the recipe search trains it: 60,000 as its 50,000."""
    return min(n, 60_000 - HELD_OUT)


def claim_size(n: int | str) -> int:
    """A training-set size of the recipe search's record as the claims name it: its 50,000 as their 60,000."""
    return 60_000 if int(n) == 60_000 - HELD_OUT else int(n)


def budget_rows(record: dict, budgets: dict[int, int]) -> list[dict]:
    """The search's budget stage's rows (`convergence_row`s) at the sizes whose budget in `budgets` is the one the
    search found there (the same steps): the shared ViT and CNN at that budget and at twice it, held out."""
    rows = []
    for n, b in record.get("budgets", {}).items():
        if budgets.get(claim_size(n)) != b["steps"]:
            continue
        row = next(r for r in b["rows"] if r["steps"] == b["steps"])
        for model, (a, a2) in row["acc"].items():
            rows.append(convergence_row(model, claim_size(n), b["steps"], [a], [a2], record["tolerance"]))
    return rows
