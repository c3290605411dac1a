"""Claim 6, Section 3.2: pre-trained on a large dataset (claim 5's ViT on all 60,000 Fashion-MNIST
images), then fine-tuned on 500 handwritten digits, a ViT beats the same ViT trained on the digits from
scratch."""

from __future__ import annotations

from pathlib import Path

from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale, convergence_row
from vitlab.experiments.reproduce.claims.shared import CNN, RECIPES, VIT, digits_data, fashion_run, n_full
from vitlab.experiments.reproduce.figures import bar_figure
from vitlab.experiments.reproduce.probes import probe_table
from vitlab.experiments.reproduce.runs import BASE_RECIPE, Run
from vitlab.experiments.reproduce.verdicts import Rule, greater_v1, mean_std, stats

FINE_TUNED_WINS = Rule("greater", 0.0, paired=True)  # the rule (v2): each seed's two arms train on its digits


def _lrs(scale: Scale) -> tuple[float, ...]:
    return (1e-3,) if scale.quick else (3e-4, 1e-3)


# The fine-tuning budget: 192 epochs of the 500 digits (3,072 steps of 32). benchmarks/claim6_budget.py, the mean of
# seeds 0-2 on the held-out digits: 96 -> 192 epochs moved the from-scratch arms +1.75 and +2.42 points, 192 -> 384
# moved every fine-tuned arm by under a point and from scratch +1.25 (lr 3e-4) and -0.34 (lr 1e-3). 384 epochs would
# double the claim's cost again; at 192 the report's Budget table shows the one arm still moving.
EPOCHS = {"quick": 2, "default": 192, "large": 384}


def _runs(scale: Scale, factor: int = 1, held_out: bool = False) -> list[Run]:
    epochs = factor * EPOCHS[scale.name]
    out = []
    for s in scale.seeds:
        pre = fashion_run(VIT, n_full(scale), s, scale)  # the data-scale experiment's ViT on the full training set
        for lr in _lrs(scale):
            # No augmentation (a flipped digit is another digit); from scratch: the shared ViT, initialised as there.
            recipe = BASE_RECIPE.replace(epochs=epochs, lr=lr, batch_size=32, seed=s, init=RECIPES[VIT].init)
            for parent in (pre, None):
                out.append(Run(digits_data(scale, held_out), VIT, recipe, overrides=pre.overrides, parent=parent))
    return out


def _plan(scale: Scale) -> list[Run]:
    # every arm and learning rate on the held-out digits at the budget and twice it (the lr is chosen there, and the
    # budget checked), and on the verdict's digits at the budget; and the pre-trained CNN the digit probes read
    # (claim 5's, planned here too so that the claim runs alone)
    cnn = [fashion_run(CNN, n_full(scale), s, scale) for s in scale.seeds]
    return _runs(scale, held_out=True) + _runs(scale, 2, held_out=True) + _runs(scale) + cnn


def _analyze(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    def split(runs):
        return {
            "fine-tuned": [r for r in runs if r.parent is not None],
            "from scratch": [r for r in runs if r.parent is None],
        }

    arms, held, held_2x = split(_runs(scale)), split(_runs(scale, held_out=True)), split(_runs(scale, 2, held_out=True))
    lrs = _lrs(scale)
    acc = {(a, lr): res.acc([r for r in arms[a] if r.lr == lr]) for a in arms for lr in lrs}
    h = {(a, lr): res.acc([r for r in held[a] if r.lr == lr]) for a in arms for lr in lrs}
    h2 = {(a, lr): res.acc([r for r in held_2x[a] if r.lr == lr]) for a in arms for lr in lrs}
    best = {a: max(lrs, key=lambda lr: stats(h[(a, lr)])[0]) for a in arms}  # chosen held out, never on the verdict's
    what = f"fine-tuned (lr {best['fine-tuned']:g}) - from scratch (lr {best['from scratch']:g})"
    ft, sc = acc[("fine-tuned", best["fine-tuned"])], acc[("from scratch", best["from scratch"])]
    verdict = FINE_TUNED_WINS.decide(ft, sc, what=f"test acc {what}")
    verdict_v1 = greater_v1(ft, sc, 0.0, what=what)  # the v1 report's rule
    # Not part of the rule: the features themselves, frozen, probed on the digits (Fashion-pre-trained ViT and CNN,
    # claim 5's at the full N, against the ViT as initialised)
    digits = digits_data(scale)
    pres = {m: [fashion_run(m, n_full(scale), s, scale) for s in scale.seeds] for m in (VIT, CNN)}
    probes = {
        "ViT pre-trained on Fashion-MNIST": [res.digits_probe(r, digits, scale, random_init=False) for r in pres[VIT]],
        "ViT at initialisation": [res.digits_probe(r, digits, scale, random_init=True) for r in pres[VIT]],
        "CNN pre-trained on Fashion-MNIST": [res.digits_probe(r, digits, scale, random_init=False) for r in pres[CNN]],
    }
    spec0, spec_h = arms["fine-tuned"][0], held["fine-tuned"][0]
    fig = bar_figure(
        fig_dir / "claim6_pretrain.png",
        [f"{a}\n(lr {best[a]:g})" for a in arms],
        [acc[(a, best[a])] for a in arms],
        f"Digits ({spec0.n_train} train): pre-trained on Fashion-MNIST vs scratch",
        hlines={"chance": 0.1},
        full_axis=True,
    )
    return Outcome(
        setup=(
            f"Pre-training: claim 5's ViT trained on all {n_full(scale):,} Fashion-MNIST images for "
            f"{spec0.parent.steps:,} steps ({spec0.parent.epochs} epochs), per seed. Fine-tuning: scikit-learn's "
            "digits (real handwriting, 8x8 "
            f"upsampled to 28x28, one grey channel), {spec0.n_train} training images (stratified); of the others "
            f"{spec_h.data.n_val} held out (drawn per seed) to choose each arm's learning rate from "
            f"{', '.join(f'{lr:g}' for lr in lrs)} and to check the budget on, and {spec0.data.n_val} for the "
            "verdict. A new zero-initialised head (Section 3.2), all weights trained, AdamW, batch 32, "
            f"{spec0.epochs} epochs ({spec0.steps:,} steps), no augmentation (a flipped digit is another digit); from "
            "scratch: the same model randomly initialised, the same recipe."
        ),
        header=["arm", "lr", "held-out acc % (mean +- std)", "test acc % (mean +- std)", ""],
        rows=[
            [a, f"{lr:g}", mean_std(h[(a, lr)]), mean_std(acc[(a, lr)]), "chosen (held out)" if lr == best[a] else ""]
            for a in arms
            for lr in lrs
        ],
        verdict=verdict,
        verdict_v1=verdict_v1,
        tables=[
            (
                "Few-shot linear probes on the digits of frozen features (not part of the rule): the shots from the "
                f"{digits.n_train} training digits, the ridge strength chosen on the held-out digits, accuracy on the "
                "verdict's",
                *probe_table(probes),
            )
        ],
        figures=[fig],
        csv_header=["arm", "lr", "seed", "held_out_acc", "val_acc"],
        csv_rows=[
            [a, r.lr, r.seed, res[hr]["val_acc"], res[r]["val_acc"]] for a in arms for r, hr in zip(arms[a], held[a])
        ],
        convergence=[
            convergence_row(f"{a}, lr {lr:g}", spec0.n_train, spec_h.steps, h[(a, lr)], h2[(a, lr)])
            for a in arms
            for lr in lrs
        ],
        convergence_note=(
            "the fine-tuning budget, on the held-out digits, every seed; the pre-training budget is claim 5's"
        ),
        convergence_complete=False,  # the pre-training budget is not in this table
        notes=(
            "The paper's transfer numbers are from far larger pre-training (Table 2: ViT-L/16 pre-trained on "
            "ImageNet-21k reaches 85.30% on ImageNet after fine-tuning; Table 5: ViT-B/16 77.91% trained on "
            "ImageNet alone, 83.97% pre-trained on ImageNet-21k). Which decides: the fine-tuned test accuracy; the "
            "transfer probe (Fashion-MNIST features probed on the digits) is reported beside it. A same-dataset probe "
            "of the pre-trained models would have no held-out Fashion-MNIST images left to choose its ridge strength "
            "on at the default scale (they train on all 60,000), so claim 6 reports the transfer probe alone."
        ),
    )


EXPERIMENT = Experiment(
    number=6,
    name="pretrain",
    title="Pre-train, then fine-tune on a small real dataset",
    claim="Pre-train on a large dataset, replace the head and fine-tune on the small task: better than training "
    "the same ViT from scratch on the small task.",
    source="paper Section 3.2",
    rule="reproduced if fine-tuned beats from scratch, each at its learning rate chosen on held-out digits: "
    f"fine-tuned - from scratch test accuracy {FINE_TUNED_WINS.text()}",
    plan=_plan,
    analyze=_analyze,
    loads_models=True,
)
