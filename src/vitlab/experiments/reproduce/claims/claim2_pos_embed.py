"""Claim 2, Table 8: having a position embedding matters (none is clearly worse); which kind (learned 1-D,
learned 2-D, sin-cos 2-D, relative) hardly does."""

from __future__ import annotations

from pathlib import Path

from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import SMALL_VIT
from vitlab.experiments.reproduce.figures import _bar_figure
from vitlab.experiments.reproduce.runs import RunSpec, run_spec
from vitlab.experiments.reproduce.verdicts import MARGIN, TOL, _ms, _stats, close, combine, greater


PE_KINDS = ("none", "learned", "learned2d", "sincos2d", "relative")


def _arr_data(scale: Scale) -> dict:
    return {"name": "arrangement", "n_train": 800 if scale.quick else 3000, "n_val": 500 if scale.quick else 1000, "img_size": 32}


def _pe_lrs(scale: Scale) -> tuple[float, ...]:
    # Each kind gets the better of two learning rates. (The first full run used 1e-3 alone; the learned
    # tables stayed at chance while sin-cos learned the task, and claim 8's model learned its task only at
    # 3e-3, so 3e-3 was added for every kind. The rule was not changed.)
    return (1e-3,) if scale.quick else (1e-3, 3e-3)


def _plan_pe(scale: Scale) -> list[RunSpec]:
    return [
        run_spec(_arr_data(scale), "vit_mini", overrides={**SMALL_VIT, "pos_embed": pe}, epochs=2 if scale.quick else 8,
                 lr=lr, batch_size=32, seed=s)
        for pe in PE_KINDS
        for lr in _pe_lrs(scale)
        for s in scale.seeds
    ]


def _analyze_pe(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    runs = _plan_pe(scale)
    lrs = _pe_lrs(scale)
    by_lr = {(pe, lr): res.acc([r for r in runs if dict(r.overrides)["pos_embed"] == pe and r.lr == lr])
             for pe in PE_KINDS for lr in lrs}
    best_lr = {pe: max(lrs, key=lambda lr: _stats(by_lr[(pe, lr)])[0]) for pe in PE_KINDS}
    acc = {pe: by_lr[(pe, best_lr[pe])] for pe in PE_KINDS}  # each kind at its own best lr
    others = [pe for pe in PE_KINDS if pe != "none"]
    means = {pe: _stats(acc[pe])[0] for pe in others}
    best, worst = max(others, key=means.get), min(others, key=means.get)
    parts = [greater(acc[pe], acc["none"], MARGIN, what=f"{pe} - none") for pe in others]
    parts.append(close(acc[best], acc[worst], TOL, what=f"best ({best}) - worst ({worst}) of the four",
                       floor=0.25 + MARGIN))
    paper = {"none": 61.382, "learned": 64.206, "learned2d": 64.001, "sincos2d": None, "relative": 64.032}
    fig = _bar_figure(fig_dir / "claim2_pos_embed.png", [f"{pe}\n(lr {best_lr[pe]:g})" for pe in PE_KINDS],
                      [acc[pe] for pe in PE_KINDS], "Arrangement task: position embeddings, each at its best lr",
                      hlines={"chance": 0.25})
    spec0 = runs[0]
    return Outcome(
        setup=(f"Shapes *arrangement* task (32x32; a red and a blue object of random shape, size and shade on grey; "
               f"label = where the red one is relative to the blue one: left/right/above/below, 4 classes, chance 25%); "
               f"{spec0.n_train:,} train / {dict(spec0.data)['n_val']:,} val images; ViT P=4, D=32, 4 heads, 4 blocks, "
               f"MLP 64 ({res[spec0]['params']:,} params without position table); AdamW, batch 32, {spec0.epochs} epochs, "
               + (f"lr {' or '.join(f'{lr:g}' for lr in lrs)} (each kind at the better one, by mean)." if len(lrs) > 1
                  else f"lr {lrs[0]:g}.")),
        header=["position embedding"] + [f"val acc % at lr {lr:g}" for lr in lrs] + ["paper Table 8 (ImageNet 5-shot, %)"],
        rows=[[pe] + [_ms(by_lr[(pe, lr)]) + (" (best)" if lr == best_lr[pe] and len(lrs) > 1 else "") for lr in lrs]
              + [f"{paper[pe]:.2f}" if paper[pe] else "-"] for pe in PE_KINDS],
        verdict=combine(*parts), figures=[fig],
        csv_header=["pos_embed", "lr", "seed", "val_acc"],
        csv_rows=[[dict(r.overrides)["pos_embed"], r.lr, r.seed, res[r]["val_acc"]] for r in runs],
        notes=("The first full run of this report trained every kind at lr 1e-3 only; the learned tables stayed at "
               "chance. The 3e-3 runs were added afterwards, for every kind alike, with the rule unchanged."
               if len(lrs) > 1 else ""),
    )


EXPERIMENT = Experiment(
    2, "pos_embed", "Position embeddings (Table 8)",
    "\"none 0.61382; 1-D 0.64206; 2-D 0.64001; relative 0.64032\": having a position embedding matters; "
    "which kind hardly matters.",
    "paper Appendix D.4, Table 8", "each kind at its better lr; reproduced if every kind beats none by >= 3 points "
    "(greater, margin 3) and the best and worst of the four kinds are within 3 points (close, tol 3, above chance)", _plan_pe, _analyze_pe,
)
