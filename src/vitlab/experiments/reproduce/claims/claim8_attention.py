"""Claim 8, Figure 7: inside a trained ViT, the mean attention distance grows with depth, and the learned
1-D position embeddings show 2-D structure."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from vitlab.analysis.attention import mean_attention_distance, patch_distances, position_embedding_similarity
from vitlab.analysis.plots import figure7b, figure7c
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import SMALL_VIT
from vitlab.experiments.reproduce.runs import RunSpec, _dataset, run_spec
from vitlab.experiments.reproduce.verdicts import combine, greater


def _pos_data(scale: Scale) -> dict:
    return {"name": "position", "n_train": 600 if scale.quick else 3000, "n_val": 500 if scale.quick else 1000, "img_size": 32}


def _plan_attn(scale: Scale) -> list[RunSpec]:
    # A learned 1-D table, as in the paper, on a task it can learn at this scale (claim 2's arrangement
    # task it cannot): the 3 x 3 cell of one shape, which depends on both image coordinates.
    return [run_spec(_pos_data(scale), "vit_mini", overrides={**SMALL_VIT, "pos_embed": "learned"},
                     epochs=2 if scale.quick else 12, lr=3e-3, batch_size=32, seed=s) for s in scale.seeds]


def pe_structure(sim: torch.Tensor, grid_size: tuple[int, int]) -> tuple[float, float]:
    """Mean cosine similarity of vertically adjacent positions (N/g apart in the 1-D sequence, so only a
    2-D-aware embedding makes them similar) and of positions at least half the grid apart (Manhattan)."""
    gh, gw = grid_size
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy, dx = (ys[:, None] - ys[None]).abs(), (xs[:, None] - xs[None]).abs()  # (N, N)
    vertical = sim[(dy == 1) & (dx == 0)]
    far = sim[(dy + dx) >= (gh + gw) // 2]
    return float(vertical.mean()), float(far.mean())


def _analyze_attn(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    runs = _plan_attn(scale)
    rise, locality, per_layer, rows = [], [], [], []
    for spec in runs:
        model = res.model(spec)
        xt, yt, xv, yv, _ = _dataset(spec.data, spec.seed)
        layers, dist = mean_attention_distance(model, xv[:256], batch_size=64)  # (L, h) pixels
        layer_mean = dist.mean(dim=1)  # (L,)
        sim = position_embedding_similarity(model)
        vertical, far = pe_structure(sim, model.cfg.grid_size)
        rise.append(float(layer_mean[-1] - layer_mean[0]))
        locality.append(vertical - far)
        per_layer.append(layer_mean.tolist())
        if spec is runs[0]:
            uniform = float(patch_distances(model.cfg.grid_size, model.cfg.patch_size).mean())
            f1 = figure7b(sim, model.cfg.grid_size, fig_dir / "claim8_pe_similarity.png")
            f2 = figure7c(layers, dist, fig_dir / "claim8_attention_distance.png", uniform=uniform,
                          title=f"Mean attention distance (seed {spec.seed})")
        rows.append([str(spec.seed), f"{100 * res[spec]['val_acc']:.1f}"] + [f"{d:.2f}" for d in layer_mean.tolist()]
                    + [f"{vertical:.3f}", f"{far:.3f}"])
    verdict = combine(
        greater(rise, 0.0, 0.0, what="mean attention distance, last layer - first layer", unit="px"),
        greater(locality, 0.0, 0.1, what="PE cosine similarity, vertical neighbours - far positions", unit="cosine"),
    )
    L = len(per_layer[0])
    mean_row = ["mean", ""] + [f"{statistics.fmean(p[i] for p in per_layer):.2f}" for i in range(L)] + ["", ""]
    return Outcome(
        setup=(f"A ViT with the paper's learned 1-D position embedding (P=4 on 32x32, so an 8x8 grid; D=32, 4 blocks x 4 "
               f"heads, MLP 64), trained per seed on the shapes *position* task (one shape in one cell of a 3x3 grid; label "
               f"= the cell, 9 classes, chance 11%; {runs[0].n_train:,} train images, AdamW lr 3e-3, batch 32, "
               f"{runs[0].epochs} epochs), analysed on 256 validation images. (Claim 2's learned-embedding models do not "
               f"learn the arrangement task at this scale, so they would show an untrained table.) Mean attention distance: for each head, "
               f"sum over key patches of attention x pixel distance, averaged over query patches and images (Figure 7 right; "
               f"uniform attention gives {float(patch_distances((8, 8), 4).mean()):.1f} px). Position-embedding similarity: cosine "
               f"similarity of the learned rows (Figure 7 centre). The paper's \"2-D structure\": vertically adjacent "
               f"positions, 8 apart in the 1-D table, end up similar."),
        header=["seed", "model val acc %"] + [f"layer {i + 1} distance (px)" for i in range(L)]
        + ["PE sim. vertical neighbours", "PE sim. far"],
        rows=rows + [mean_row], verdict=verdict, figures=[f1, f2],
        notes=("The analysed models are only as informative as they are trained: their validation accuracy on the "
               "position task is in the second column (chance 11%)."),
        csv_header=["seed", "layer", "mean_distance_px"],
        csv_rows=[[r.seed, i + 1, per_layer[j][i]] for j, r in enumerate(runs) for i in range(L)],
    )


EXPERIMENT = Experiment(
    8, "attention", "Inside the trained model (Figure 7)",
    "The mean attention distance grows with depth; the learned position embeddings show 2-D structure "
    "(nearby rows and columns have similar embeddings).",
    "paper Section 4.5, Figure 7 (centre, right)",
    "reproduced if the last layer's mean distance exceeds the first's (greater over seeds, margin 0) and "
    "vertically adjacent position embeddings are more similar than far ones by >= 0.1 cosine (greater, margin 0.1)",
    _plan_attn, _analyze_attn,
)
