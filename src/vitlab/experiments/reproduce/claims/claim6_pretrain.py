"""Claim 6, seed 004 s6: pre-trained on the large synthetic set (claim 5's largest ViT run), then
fine-tuned on 500 digits, a ViT beats the same ViT trained on the digits from scratch."""

from __future__ import annotations

from pathlib import Path

from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import _scale_points, _scale_run
from vitlab.experiments.reproduce.figures import _bar_figure
from vitlab.experiments.reproduce.runs import RunSpec, run_spec
from vitlab.experiments.reproduce.verdicts import _ms, _stats, greater


def _ft_lrs(scale: Scale) -> tuple[float, ...]:
    return (1e-3,) if scale.quick else (3e-4, 1e-3)


def _digits_data(scale: Scale) -> dict:
    return {"name": "digits", "n_train": 200 if scale.quick else 500, "n_val": 1297, "img_size": 16}


def _plan_ft(scale: Scale) -> list[RunSpec]:
    n_big, e_big = _scale_points(scale)[-1]
    out = []
    for s in scale.seeds:
        pre = _scale_run("vit_mini", n_big, e_big, s, scale)  # the data-scale experiment's largest ViT run
        for lr in _ft_lrs(scale):
            out.append(run_spec(_digits_data(scale), "vit_mini", epochs=5 if scale.quick else 20, lr=lr, batch_size=32, seed=s, init=pre))
            out.append(run_spec(_digits_data(scale), "vit_mini", epochs=5 if scale.quick else 20, lr=lr, batch_size=32, seed=s))
    return out


def _analyze_ft(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    runs = _plan_ft(scale)
    arms = {"fine-tuned": [r for r in runs if r.init is not None], "from scratch": [r for r in runs if r.init is None]}
    acc = {(a, lr): res.acc([r for r in arms[a] if r.lr == lr]) for a in arms for lr in _ft_lrs(scale)}
    best = {a: max(_ft_lrs(scale), key=lambda lr: _stats(acc[(a, lr)])[0]) for a in arms}
    verdict = greater(acc[("fine-tuned", best["fine-tuned"])], acc[("from scratch", best["from scratch"])], 0.0,
                      what=f"fine-tuned (lr {best['fine-tuned']:g}) - from scratch (lr {best['from scratch']:g})")
    fig = _bar_figure(fig_dir / "claim6_pretrain.png", [f"{a}\n(lr {best[a]:g})" for a in arms],
                      [acc[(a, best[a])] for a in arms], "Digits (500 train): pre-trained on shapes vs scratch", hlines={"chance": 0.1})
    n_big, e_big = _scale_points(scale)[-1]
    spec0 = arms["fine-tuned"][0]
    return Outcome(
        setup=(f"Pre-training: the data-scale experiment's ViT (`vit_mini` at 16x16) trained on {n_big:,} shapes for {e_big} "
               f"epoch(s). Fine-tuning: scikit-learn digits (real handwriting, 8x8 upsampled to 16x16), "
               f"{spec0.n_train} train images (stratified) / the rest ({dict(spec0.data)['n_val']}) val, new zero head "
               f"(Section 3.2), all weights trained, AdamW, batch 32, {spec0.epochs} epochs; from scratch: the same model "
               f"randomly initialised, same recipe. Each arm gets its best lr of {', '.join(f'{lr:g}' for lr in _ft_lrs(scale))}."),
        header=["arm", "lr", "val acc % (mean +- std)", ""],
        rows=[[a, f"{lr:g}", _ms(acc[(a, lr)]), "best" if lr == best[a] else ""] for a in arms for lr in _ft_lrs(scale)],
        verdict=verdict, figures=[fig],
        csv_header=["arm", "lr", "seed", "val_acc"],
        csv_rows=[[a, r.lr, r.seed, res[r]["val_acc"]] for a in arms for r in arms[a]],
    )


EXPERIMENT = Experiment(
    6, "pretrain", "Pre-train, then fine-tune on a small real dataset",
    "Pre-train on a large dataset, replace the head and fine-tune on the small task: better than training "
    "the same ViT from scratch on the small task.",
    "seed 004 section 6.2; paper Section 3.2", "reproduced if fine-tuned beats from scratch, each at its best lr "
    "(greater, margin 0)", _plan_ft, _analyze_ft,
)
