"""Claim 8, Figure 7: inside a ViT trained on all of Fashion-MNIST (claim 5's, six blocks), the mean
attention distance grows with depth, and the learned 1-D position embeddings show 2-D structure; and its
patch-embedding filters, as the paper shows them."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from vitlab.analysis.attention import (
    mean_attention_distance,
    patch_distances,
    patch_embedding_pcs,
    position_embedding_similarity,
)
from vitlab.analysis.plots import figure7a, figure7b, figure7c
from vitlab.data.subsets import experiment_splits
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.claims.shared import VIT, describe_setup, fashion_run, n_full
from vitlab.experiments.reproduce.figures import depth_figure
from vitlab.experiments.reproduce.runs import Run, transforms
from vitlab.experiments.reproduce.verdicts import Rule, combine, greater_v1

# The rules (v2), one-sample over seeds: the distance rises from the first layer to the last; vertically adjacent
# position embeddings are more alike than far ones by at least 0.1 cosine.
RISES = Rule("at_least", 0.0, paired=False, unit="px")
LOCAL = Rule("at_least", 0.1, paired=False, unit="cosine")

N_IMAGES = 256  # validation images the attention distances are averaged over


def _plan(scale: Scale) -> list[Run]:
    return [fashion_run(VIT, n_full(scale), s, scale) for s in scale.seeds]  # claim 5's ViT on the full training set


def pe_structure(sim: torch.Tensor, grid_size: tuple[int, int]) -> tuple[float, float]:
    """Mean cosine similarity of vertically adjacent positions (a grid row apart in the 1-D sequence, so
    only a 2-D-aware embedding makes them similar) and of positions at least half the grid apart (Manhattan)."""
    gh, gw = grid_size
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    dy, dx = (ys[:, None] - ys[None]).abs(), (xs[:, None] - xs[None]).abs()  # (N, N)
    vertical = sim[(dy == 1) & (dx == 0)]
    far = sim[(dy + dx) >= (gh + gw) // 2]
    return float(vertical.mean()), float(far.mean())


def _analyze(scale: Scale, res: Results, fig_dir: Path) -> Outcome:
    runs = _plan(scale)
    rise, locality, per_layer, rows, figures, similarity = [], [], [], [], [], []
    for spec in runs:
        model = res.model(spec)
        _, val, _ = experiment_splits(spec.data, spec.seed)
        x = transforms(spec, model, val.size)[1](val.images[:N_IMAGES], {})  # normalised, as in evaluation
        layers, dist = mean_attention_distance(model, x, batch_size=64)  # (L, h) pixels
        layer_mean = dist.mean(dim=1)  # (L,)
        sim = position_embedding_similarity(model)
        vertical, far = pe_structure(sim, model.cfg.grid_size)
        rise.append(float(layer_mean[-1] - layer_mean[0]))
        locality.append(vertical - far)
        similarity.append((vertical, far))
        per_layer.append(layer_mean.tolist())
        if spec is runs[0]:
            uniform = float(patch_distances(model.cfg.grid_size, model.cfg.patch_size).mean())
            comps, explained = patch_embedding_pcs(model, k=16)
            figures = [
                figure7a(comps, explained, fig_dir / "claim8_embedding_filters.png", cols=8),
                figure7b(sim, model.cfg.grid_size, fig_dir / "claim8_pe_similarity.png"),
                figure7c(
                    layers,
                    dist,
                    fig_dir / "claim8_attention_distance.png",
                    uniform=uniform,
                    title=f"Mean attention distance per head (seed {spec.seed})",
                ),
            ]
        rows.append(
            [str(spec.seed), f"{100 * res[spec]['val_acc']:.1f}"]
            + [f"{d:.2f}" for d in layer_mean.tolist()]
            + [f"{vertical:.3f}", f"{far:.3f}"]
        )
    figures.append(depth_figure(fig_dir / "claim8_distance_by_depth.png", per_layer, uniform))
    what = ("mean attention distance, last layer - first layer", "PE cosine similarity, vertical neighbours - far")
    verdict = combine(RISES.decide(rise, what=what[0]), LOCAL.decide(locality, what=what[1]))
    verdict_v1 = combine(  # the v1 report's rule
        greater_v1(rise, 0.0, 0.0, what=what[0], unit="px"),
        greater_v1(locality, 0.0, 0.1, what=what[1] + " positions", unit="cosine"),
    )
    L = len(per_layer[0])
    mean_row = ["mean", ""] + [f"{statistics.fmean(p[i] for p in per_layer):.2f}" for i in range(L)] + ["", ""]
    spec0 = runs[0]
    cfg = res.model(spec0).cfg
    P, g, D = cfg.patch_size, cfg.grid_size[0], cfg.dim
    return Outcome(
        setup=(
            f"{describe_setup(scale)} The models: claim 5's ViT trained on all {spec0.n_train:,} training images for "
            f"{spec0.steps:,} steps ({spec0.epochs} epochs), one per seed (validation accuracy in the table), "
            "analysed on the first "
            f"{N_IMAGES} test images. Mean attention distance (Figure 7, right): for each head, the sum over key "
            "patches of attention x pixel distance between patch centres, averaged over query patches and images; "
            f"uniform attention gives {uniform:.1f} px on this {g}x{g} grid of {P}-pixel patches. Position-embedding "
            'similarity (Figure 7, centre): cosine similarity of the learned rows; "2-D structure" means that '
            f"vertically adjacent positions, {g} apart in the 1-D table, end up alike. Embedding filters (Figure 7, "
            f"left): the principal components of the {D} patch-embedding filters ({P}x{P}, grey)."
        ),
        header=["seed", "model test acc %"]
        + [f"layer {i + 1} distance (px)" for i in range(L)]
        + ["PE sim. vertical neighbours", "PE sim. far"],
        rows=rows + [mean_row],
        verdict=verdict,
        verdict_v1=verdict_v1,
        figures=figures,
        notes=(
            "Paper, Figure 7 (ViT-L/16 on JFT-300M, 24 layers): in the lowest layers some heads attend locally and "
            "others over most of the image; the distance grows with depth, and in the last layers every head "
            "attends globally. Its position embeddings show row and column structure; its filters resemble "
            "plausible basis functions for a low-dimensional representation of each patch."
        ),
        # per layer the attention distance; per seed (on each of its rows) the position embeddings' two similarities
        csv_header=["seed", "layer", "mean_distance_px", "pe_vertical_cos", "pe_far_cos"],
        csv_rows=[[r.seed, i + 1, per_layer[j][i], *similarity[j]] for j, r in enumerate(runs) for i in range(L)],
    )


EXPERIMENT = Experiment(
    number=8,
    name="attention",
    title="Inside the trained model (Figure 7)",
    claim="The mean attention distance grows with depth; the learned position embeddings show 2-D structure "
    "(nearby rows and columns have similar embeddings).",
    source="paper Section 4.5, Figure 7",
    rule="reproduced if both parts are: (1) the last layer's mean distance less the first's, per seed, "
    f"{RISES.text()}; (2) the cosine similarity of vertically adjacent position embeddings less that of far ones, "
    f"per seed, {LOCAL.text()}",
    plan=_plan,
    analyze=_analyze,
    loads_models=True,
)
