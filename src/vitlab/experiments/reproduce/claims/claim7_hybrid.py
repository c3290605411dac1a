"""Claim 7, Section 3.1 / seed 004 s8: a conv stem (hybrid) helps the ViT on small data."""

from __future__ import annotations

from pathlib import Path

from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import _scale_points, _scale_run, _shape_data
from vitlab.experiments.reproduce.figures import _bar_figure
from vitlab.experiments.reproduce.runs import RunSpec, run_spec
from vitlab.experiments.reproduce.verdicts import _ms, greater


def _hybrid_point(scale: Scale) -> tuple[int, int]:
    return _scale_points(scale)[1]  # the data-scale experiment's second-smallest N: small data


def _plan_hybrid(scale: Scale) -> list[RunSpec]:
    n, e = _hybrid_point(scale)
    out = [_scale_run("vit_mini", n, e, s, scale) for s in scale.seeds]  # shared with the data-scale experiment
    out += [run_spec(_shape_data(n, 16, scale), "vit_mini", overrides={"stem": "hybrid", "stem_width": 16}, epochs=e, lr=1e-3,
                     batch_size=32, seed=s)
            for s in scale.seeds]
    return out


def _analyze_hybrid(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    runs = _plan_hybrid(scale)
    k = len(scale.seeds)
    vit, hyb = res.acc(runs[:k]), res.acc(runs[k:])
    verdict = greater(hyb, vit, 0.0, what="hybrid - ViT")
    fig = _bar_figure(fig_dir / "claim7_hybrid.png", ["ViT (patch stem)", "hybrid (conv stem)"], [vit, hyb],
                      "Small data: hybrid vs pure ViT", hlines={"chance": 1 / 6})
    n, e = _hybrid_point(scale)
    return Outcome(
        setup=(f"Shapes task at 16x16 (6 classes), {n:,} train images, {e} epochs, AdamW lr 1e-3, batch 32. ViT: `vit_mini` "
               f"(P=4 patches, {res[runs[0]]['params']:,} params). Hybrid: the same transformer fed by a ResNet-style stem "
               f"(3x3 conv + 2 BasicBlock stages, width 16, downsampling 4, then a 1x1 projection; {res[runs[k]]['params']:,} params)."),
        header=["model", "val acc % (mean +- std)", "params"],
        rows=[["ViT", _ms(vit), f"{res[runs[0]]['params']:,}"], ["hybrid", _ms(hyb), f"{res[runs[k]]['params']:,}"]],
        verdict=verdict, figures=[fig],
        csv_header=["model", "seed", "val_acc"],
        csv_rows=[["vit", r.seed, res[r]["val_acc"]] for r in runs[:k]] + [["hybrid", r.seed, res[r]["val_acc"]] for r in runs[k:]],
    )


EXPERIMENT = Experiment(
    7, "hybrid", "Hybrid (conv stem) vs pure ViT on small data",
    "Feeding the transformer a CNN feature map (hybrid) beats the pure ViT at small budgets.",
    "paper Section 3.1 and Section 4.4 (Figure 5); seed 004 section 8.1",
    "reproduced if the hybrid beats the ViT (greater, margin 0)", _plan_hybrid, _analyze_hybrid,
)
