"""Data and model descriptions that more than one claim uses: the small ViTs of the 32 px tasks (claims 2
and 8; claims 3 and 4), and the shapes task at each dataset size of the data-scale claim, whose runs claim
6 pre-trains on and claim 7 compares with."""

from __future__ import annotations

from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.runs import RunSpec, run_spec


# A small ViT for the 32 px tasks: vit_mini narrowed to D=32 (the seed's width), 4 blocks.
SMALL_VIT = dict(dim=32, heads=4, mlp_dim=64, depth=4)


def _shape_data(n: int, img: int, scale: Scale) -> dict:
    return {"name": "shape", "n_train": n, "n_val": 500 if scale.quick else 2000, "img_size": img}


# Claims 3 and 4 train on the arrangement task with the fixed 2-D sin-cos position embedding: at this
# scale it is the one the ViT learns from within a few hundred steps (see claim 2), so there is an
# accuracy to compare. Two blocks keep the P=2 runs (257 tokens) affordable.
FAST_VIT = dict(dim=32, heads=4, mlp_dim=64, depth=2, pos_embed="sincos2d")


def _fast_data(scale: Scale) -> dict:
    return {"name": "arrangement", "n_train": 400 if scale.quick else 2000, "n_val": 500 if scale.quick else 1000, "img_size": 32}


def _scale_points(scale: Scale) -> list[tuple[int, int]]:
    """(N, epochs): more data is seen for more steps, as in the paper's pre-training runs."""
    if scale.quick:
        return [(500, 3), (2000, 2)]
    return [(500, 30), (2000, 10), (10_000, 3), (50_000, 1)]


def _scale_run(model: str, n: int, epochs: int, seed: int, scale: Scale) -> RunSpec:
    return run_spec(_shape_data(n, 16, scale), model, epochs=epochs, lr=1e-3, batch_size=32, seed=seed)
