"""Claim 10, Section 4.4 and Figure 5 (the appendix's scaling table, Table 6): accuracy against training compute for
three families, ViTs, hybrids and CNNs, each at several sizes. Tested on all 60,000 Fashion-MNIST images: every model
trained for the shared budget at 60,000 (the same steps, so that the compute differs by the model's size alone),
one seed per model as the paper's figure has, the scale's seeds at the shared ViT and CNN (claim 5's runs). Each
part of the verdict needs three seeds at every model it reads (its interval is each model's own spread), so with one
seed per model both parts are inconclusive by rule until those seeds are trained."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitlab.analysis.flops import training_flops
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import CNN, VIT, budget_rows, code_budgets, fashion_run, n_full
from vitlab.experiments.reproduce.figures import compute_figure
from vitlab.experiments.reproduce.runs import Run, build_model
from vitlab.experiments.reproduce.verdicts import (
    INCONCLUSIVE,
    LEVEL,
    NOT_REPRODUCED,
    REPRODUCED,
    Estimate,
    Part,
    Verdict,
    combine,
    mean_std,
)

VIT_F, HYBRID_F, CNN_F = "ViT", "hybrid", "CNN"


def _vit(depth: int, dim: int, patch: int = 7) -> dict:
    return {"depth": depth, "dim": dim, "mlp_dim": 2 * dim, "patch_size": patch}  # 4 heads, MLP 2D, as vit_mini


def _hybrid(stem_width: int, depth: int, dim: int) -> dict:
    # The conv stem downsamples by powers of 2: 4-pixel "patches" of its feature map, a 7x7 grid (claim 7's hybrid)
    return {"stem": "hybrid", "stem_width": stem_width, **_vit(depth, dim, patch=4)}


# label -> (family, model, overrides). The shared ViT (D=64, 6 blocks, P=7) and the shared CNN are claim 5's runs at
# 60,000; "ViT P=4" is the shared ViT at claim 4's smaller patch, its patch-size comparison at 60,000 images.
SHARED = "ViT P=7 D64 L6"
SHARED_CNN = "CNN w16"  # claim 5's CNN at 60,000: like the shared ViT, every seed of the scale at no cost of its own
ALL_SEEDS = (SHARED, SHARED_CNN)
POINTS = {
    "ViT P=7 D32 L2": (VIT_F, VIT, _vit(2, 32)),
    "ViT P=7 D48 L4": (VIT_F, VIT, _vit(4, 48)),
    SHARED: (VIT_F, VIT, _vit(6, 64)),
    "ViT P=7 D96 L8": (VIT_F, VIT, _vit(8, 96)),
    "ViT P=4 D64 L6": (VIT_F, VIT, _vit(6, 64, patch=4)),
    "hybrid w8 D32 L2": (HYBRID_F, VIT, _hybrid(8, 2, 32)),
    "hybrid w8 D48 L4": (HYBRID_F, VIT, _hybrid(8, 4, 48)),
    "hybrid w16 D64 L6": (HYBRID_F, VIT, _hybrid(16, 6, 64)),
    "CNN w8": (CNN_F, CNN, {"width": 8}),
    SHARED_CNN: (CNN_F, CNN, {}),
    "CNN w24": (CNN_F, CNN, {"width": 24}),
}
FAMILIES = (VIT_F, HYBRID_F, CNN_F)
MATCHED = 5  # (b) compares the two frontiers at this many compute points, evenly spaced on log compute

# ---- the pre-registered rules (written before any default-scale run) ---------------------------------------------
MARGIN_A = 0.0  # (a): the hybrid's lead, in log error ratio, must shrink by more than this
MARGIN_B = 0.0  # (b): the ViT's frontier must lie above the CNN's by more than this (accuracy, points)
MIN_SEEDS = 3  # seeds of its own that every model a part reads needs, or the part is inconclusive by rule
RULE = (
    "Each family's frontier: its models (each at the mean over its seeds) in order of compute, joined by "
    "straight lines in log10 compute; a family's accuracy at a compute c is read off that line. "
    "(a) the hybrid's advantage over the ViT shrinks as compute grows: g(c) = log(err_ViT(c) / err_hybrid(c)), "
    "err = 1 - accuracy (the error-ratio scale, on which the 100% ceiling does not squeeze a lead), at the smallest "
    "and the largest compute both frontiers reach; reproduced if the {lv} interval of g(smallest) - g(largest) lies "
    "above {ma} (not reproduced if below). (b) the ViT's frontier stands above the CNN's at matched compute (the "
    "paper: ViTs use 2-4x less compute for the same accuracy): the mean of acc_ViT(c) - acc_CNN(c) over {k} computes "
    "evenly spaced on log compute across the range both reach; reproduced if its {lv} interval lies above {mb} "
    "points (not reproduced if below). Each difference is a weighted sum of the models' means; its interval takes "
    "each model's spread from that model's own seeds (se^2 = sum of (weight x std / sqrt(seeds))^2, of log err for "
    "(a) and of accuracy for (b), Welch-Satterthwaite df). A part that reads a model with fewer than {m} seeds is "
    "inconclusive by rule. Both parts: reproduced if both are"
).format(lv=f"{100 * LEVEL:g}%", ma=f"{MARGIN_A:g}", mb=f"{100 * MARGIN_B:g}", k=MATCHED, m=MIN_SEEDS)


def _run(label: str, seed: int, scale: Scale) -> Run:
    _, model, overrides = POINTS[label]
    return fashion_run(model, n_full(scale), seed, scale, overrides=overrides)


def _plan(scale: Scale) -> list[Run]:
    out = [_run(label, scale.seeds[0], scale) for label in POINTS]
    return out + [_run(label, s, scale) for label in ALL_SEEDS for s in scale.seeds[1:]]


def images_seen(run: Run) -> int:
    """Training images a run sees: its whole epochs of its training set (a run that mixes batches drops each epoch's
    short last one)."""
    return run.steps * run.recipe.batch_size if run.recipe.mixes else run.epochs * run.n_train


def run_flops(run: Run, model: nn.Module) -> int:
    """A run's training compute: the FLOP counter's forward-and-backward figure per image (`training_flops`, 3x the
    forward pass) times the images it saw."""
    shape = (run.data.channels, run.data.img_size, run.data.img_size)
    return training_flops(model, shape, images_seen(run))


@dataclass(frozen=True)
class Point:
    label: str
    family: str
    flops: float
    acc: list[float]  # per seed: one, but the shared ViT's
    params: int


def read_off(front: list[Point], c: float) -> dict[str, float]:
    """A family's curve (`front`: its points by compute) at compute `c`, as weights on its points' first-seed
    values: straight lines in log10 compute between neighbours ({label: weight}, the weights summing to 1)."""
    xs = [math.log10(p.flops) for p in front]
    x = math.log10(c)
    if not xs[0] - 1e-9 <= x <= xs[-1] + 1e-9:
        raise ValueError(f"compute {c:.3g} outside the frontier's {front[0].flops:.3g}-{front[-1].flops:.3g}")
    for i in range(len(front) - 1):
        if x <= xs[i + 1] + 1e-9:
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
            return {front[i].label: 1 - w, front[i + 1].label: w}
    return {front[-1].label: 1.0}


def combination(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """sum_i coefficient_i x weights_i, as one weight per point."""
    out: dict[str, float] = {}
    for coef, weights in parts:
        for label, w in weights.items():
            out[label] = out.get(label, 0.0) + coef * w
    return out


def estimate_of(weights: dict[str, float], per_seed: dict[str, list[float]]) -> Estimate | str:
    """sum_i w_i x (model i's mean over its seeds), with the se each model's own seeds give it (se_i = std_i /
    sqrt(n_i), se^2 = sum_i (w_i se_i)^2) and Welch-Satterthwaite degrees of freedom; or, where a model it reads has
    fewer than MIN_SEEDS seeds, the reason it is not estimated (naming them)."""
    read = {k: w for k, w in weights.items() if abs(w) > 1e-12}
    few = [f"{k} ({len(per_seed[k])})" for k in read if len(per_seed[k]) < MIN_SEEDS]
    if few:
        return f"fewer than {MIN_SEEDS} seeds at a model it reads: " + ", ".join(few)
    d = sum(w * statistics.fmean(per_seed[k]) for k, w in read.items())
    var = {k: (w * statistics.stdev(per_seed[k])) ** 2 / len(per_seed[k]) for k, w in read.items()}
    n = {k: len(per_seed[k]) for k in read}
    total = sum(var.values())
    df = total**2 / sum(v**2 / (n[k] - 1) for k, v in var.items()) if total > 0 else min(n.values()) - 1
    method = f"each model's own seeds ({min(n.values())}-{max(n.values())}), Welch-Satterthwaite df {df:.1f}"
    return Estimate(d, math.sqrt(total), df, min(n.values()), method)


def decide(est: Estimate | str, margin: float, *, what: str, unit: str) -> Verdict:
    """Reproduced if the LEVEL interval of `est` lies above `margin`, not reproduced if below, else inconclusive;
    inconclusive by rule where it could not be estimated (`est` says why)."""
    if isinstance(est, str):
        return Verdict(INCONCLUSIVE, f"{what}: {est}, inconclusive by rule", (Part(what, INCONCLUSIVE, "greater"),))
    lo, hi = est.interval(LEVEL)
    scale = 100 if unit == "points" else 1
    text = (
        f"{what} = {scale * est.d:+.3g} {unit}, {100 * LEVEL:g}% CI [{scale * lo:+.3g}, {scale * hi:+.3g}] "
        f"({est.method}), needed above {scale * margin:g}"
    )
    status = REPRODUCED if lo > margin else NOT_REPRODUCED if hi < margin else INCONCLUSIVE
    return Verdict(status, text, (Part(what, status, "greater", est.d, lo, hi, margin, est.n),))


def log_err(acc: float) -> float:
    return math.log(1 - acc)


def overlap(fronts: dict[str, list[Point]], f: str, g: str) -> tuple[float, float]:
    """The compute range both families' frontiers reach."""
    return max(fronts[f][0].flops, fronts[g][0].flops), min(fronts[f][-1].flops, fronts[g][-1].flops)


def envelope(front: list[Point]) -> dict[str, float]:
    """The best first-seed accuracy a family reaches at or below each of its points' compute (`front` by compute):
    the frontier as a user choosing the best model for a compute budget reads it."""
    best, out = -math.inf, {}
    for p in front:
        best = max(best, p.acc[0])
        out[p.label] = best
    return out


def below_cheaper(fronts: dict[str, list[Point]]) -> str:
    """A note, '' if none: the models that score below a cheaper model of their family at this fixed budget (not at
    their converged accuracy, or overfitting), and part (a)'s lead read off the best-so-far envelope instead, as a
    description beside the pre-registered rule, not a verdict."""
    best = {label: a for f in FAMILIES for label, a in envelope(fronts[f]).items()}
    low = [p for f in FAMILIES for p in fronts[f] if p.acc[0] < best[p.label]]
    if not low:
        return ""
    names = ", ".join(f"{p.label} ({100 * p.acc[0]:.1f}% against {100 * best[p.label]:.1f}%)" for p in low)
    text = (
        f" At this fixed budget {len(low)} model(s) score below a cheaper model of their family: {names}: at these "
        "steps they fall short of what the family already reaches for less compute (not converged, or overfitting; "
        "which, this report does not test), so the lines through them understate the family's frontier."
    )
    lo, hi = overlap(fronts, VIT_F, HYBRID_F)
    if lo < hi:
        errs = {k: log_err(a) for k, a in best.items()}
        gap = {
            c: sum(w * errs[k] for k, w in read_off(fronts[VIT_F], c).items())
            - sum(w * errs[k] for k, w in read_off(fronts[HYBRID_F], c).items())
            for c in (lo, hi)
        }
        text += (
            " Read off the best-so-far envelope instead (a description, not the rule): the hybrid's lead "
            f"log(err_ViT / err_hybrid) is {gap[lo]:+.3f} at {lo:.3g} FLOPs and {gap[hi]:+.3f} at {hi:.3g} FLOPs, a "
            f"change of {gap[lo] - gap[hi]:+.3f}."
        )
    return text


def frontiers(points: list[Point]) -> dict[str, list[Point]]:
    """Each family's points in order of compute."""
    return {f: sorted((p for p in points if p.family == f), key=lambda p: p.flops) for f in FAMILIES}


def verdict_of(points: list[Point]) -> Verdict:
    """The rule (RULE) on the models' points: (a) the hybrid's lead shrinks, (b) the ViT's frontier above the CNN's."""
    fronts = frontiers(points)
    log_errs = {p.label: [log_err(a) for a in p.acc] for p in points}
    accs = {p.label: p.acc for p in points}

    # (a) the hybrid's lead in log error ratio at the smallest and the largest compute both frontiers reach
    lo, hi = overlap(fronts, VIT_F, HYBRID_F)
    if lo < hi:
        lead = {
            c: combination([(1.0, read_off(fronts[VIT_F], c)), (-1.0, read_off(fronts[HYBRID_F], c))]) for c in (lo, hi)
        }
        gap_at = {c: sum(w * statistics.fmean(log_errs[k]) for k, w in lead[c].items()) for c in (lo, hi)}
        shrink = combination([(1.0, lead[lo]), (-1.0, lead[hi])])
        part_a = decide(
            estimate_of(shrink, log_errs),
            MARGIN_A,
            what=(
                f"hybrid's lead log(err_ViT / err_hybrid) at {lo:.3g} FLOPs ({gap_at[lo]:+.3f}) - at {hi:.3g} FLOPs "
                f"({gap_at[hi]:+.3f})"
            ),
            unit="log error ratio",
        )
    else:
        part_a = Verdict(INCONCLUSIVE, "the ViT's and the hybrid's frontiers reach no common compute")
    # (b) the ViT's frontier against the CNN's at matched compute
    lo_b, hi_b = overlap(fronts, VIT_F, CNN_F)
    if lo_b < hi_b:
        cs = [lo_b * (hi_b / lo_b) ** (i / (MATCHED - 1)) for i in range(MATCHED)]
        diff = combination(
            [(1.0 / MATCHED, read_off(fronts[VIT_F], c)) for c in cs]
            + [(-1.0 / MATCHED, read_off(fronts[CNN_F], c)) for c in cs]
        )
        part_b = decide(
            estimate_of(diff, accs),
            MARGIN_B,
            what=f"ViT - CNN, mean over {MATCHED} computes from {lo_b:.3g} to {hi_b:.3g} FLOPs",
            unit="points",
        )
    else:
        part_b = Verdict(INCONCLUSIVE, "the ViT's and the CNN's frontiers reach no common compute")
    return combine(part_a, part_b)


def _analyze(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    seed0 = scale.seeds[0]
    points = []
    for label, (family, _, _) in POINTS.items():
        runs = [_run(label, s, scale) for s in (scale.seeds if label in ALL_SEEDS else (seed0,))]
        with torch.device("meta"):  # shapes only: the count needs no weights (and a hybrid's run folder does not load)
            model = build_model(runs[0], res[runs[0]]["num_classes"])
        points.append(Point(label, family, run_flops(runs[0], model), res.acc(runs), res[runs[0]]["params"]))
    fronts = frontiers(points)
    shared = next(p for p in points if p.label == SHARED)
    fig = compute_figure(
        fig_dir / "claim10_compute.png",
        {f: [(p.flops, p.acc, p.label.split(" ", 1)[1]) for p in fronts[f]] for f in FAMILIES},
        f"Fashion-MNIST, {n_full(scale):,} training images: accuracy against training compute",
    )
    run0 = _run(SHARED, seed0, scale)
    p4 = next(p for p in points if p.label == "ViT P=4 D64 L6")
    return Outcome(
        setup=(
            f"All {run0.n_train:,} training images, every model for the shared budget there, {run0.steps:,} steps "
            f"({run0.epochs} epoch(s), batch {run0.recipe.batch_size}), with its family's recipe (the ViT's for the "
            "ViTs and hybrids, the CNN's for the CNNs; claims/shared.py RECIPES), so that the compute differs by the "
            "model alone. ViTs: `vit_mini` (4 heads, MLP 2D) at widths D and depths L, patch 7 (4x4 grid) and, for "
            "claim 4's comparison at this size, patch 4 (7x7); hybrids: the same transformer fed by claim 7's conv "
            "stem (3x3 conv + BasicBlock stages of width w, downsampling by 4: a 7x7 grid, then a 1x1 projection); "
            "CNNs: `resnet_mini` at first-stage widths w. Training compute: FLOPs per image of a forward and backward "
            "pass, 3x the forward pass counted by torch's FlopCounterMode (`vitlab.analysis.flops.training_flops`), "
            f"times the images seen. One seed per model (seed {seed0}); the shared ViT and CNN (claim 5's) with "
            f"{len(scale.seeds)}."
        ),
        header=["model", "family", "params", "training TFLOPs", "test acc % (mean +- std)"],
        rows=[
            [p.label, p.family, f"{p.params:,}", f"{p.flops / 1e12:.3g}", mean_std(p.acc)]
            for p in sorted(points, key=lambda p: (FAMILIES.index(p.family), p.flops))
        ],
        verdict=verdict_of(points),
        figures=[fig],
        csv_header=["model", "family", "seed", "params", "train_flops", "val_acc"],
        csv_rows=[
            [p.label, p.family, s, p.params, p.flops, a]
            for p in points
            for s, a in zip(scale.seeds if p.label in ALL_SEEDS else (seed0,), p.acc)
        ],
        notes=(
            "Claim 4's patch sizes at this size (one seed of P=4 against the shared ViT's seed "
            f"{seed0}): P=7 {100 * shared.acc[0]:.1f}%, P=4 {100 * p4.acc[0]:.1f}% at "
            f"{p4.flops / shared.flops:.1f}x the compute; claim 4's own comparison, at 1,000 images and 3 seeds, is "
            "in its section. Paper, Figure 5 (Section 4.4; the numbers in the appendix's Table 6): on the "
            "performance/compute trade-off ViTs dominate ResNets, using about 2-4x less compute for the same "
            "transfer accuracy; hybrids slightly outperform ViTs at small compute budgets, and the difference "
            "vanishes for larger models." + below_cheaper(fronts)
        ),
    )


def budget_evidence(record: dict) -> tuple[list[dict], bool, str] | None:
    """The Budget table: the search's budget stage at 60,000 (the shared ViT and CNN at the budget and twice it);
    the other models train for the same steps by design, converged or not, as every model of Figure 5 trains for
    the same epochs."""
    rows = [r for r in budget_rows(record, code_budgets()) if r["n_train"] == 60_000]
    if not rows:
        return None
    note = (
        "from the recipe search's budget stage, seed 0, held-out images: the shared ViT and CNN only; the other "
        "models train for the same steps whether or not they have converged (compute, not convergence, is this "
        "claim's axis)"
    )
    return rows, False, note


def search_arms(scale: Scale) -> list[Run]:
    """None: the recipe search's convergence stage does not train this claim's models (it is about compute at a
    fixed budget; the budget's own evidence is the budget stage's at 60,000)."""
    return []


EXPERIMENT = Experiment(
    number=10,
    name="compute",
    title="Accuracy against training compute: ViT, hybrid and CNN (Figure 5)",
    claim="On the performance/compute trade-off ViTs dominate ResNets (the same accuracy for less compute), and "
    "hybrids beat ViTs at small compute, an advantage that vanishes as the models grow.",
    source="paper Section 4.4 (Figure 5) and the appendix's Table 6",
    rule=RULE,
    plan=_plan,
    analyze=_analyze,
    search_plan=search_arms,
    budget_evidence=budget_evidence,
)
