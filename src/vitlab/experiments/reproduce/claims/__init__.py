"""The paper's claims, one module each (plan, analysis and `Experiment` entry), and `EXPERIMENTS` in claim
order. The classes they are made of are in `base`; the Fashion-MNIST setup the claims share (models,
recipes, the data-scale grid whose runs most claims reuse) in `shared`."""

from __future__ import annotations

from collections.abc import Sequence

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.claims import (
    claim1_x_pos_embed,
    claim2_pos_embed,
    claim3_cls_vs_gap,
    claim4_patch_size,
    claim5_data_scale,
    claim6_pretrain,
    claim7_hybrid,
    claim8_attention,
    claim9_recipe,
    claim10_compute,
    claim11_resolution,
)
from vitlab.experiments.reproduce.claims.base import Experiment

EXPERIMENTS: list[Experiment] = [
    claim1_x_pos_embed.EXPERIMENT,
    claim2_pos_embed.EXPERIMENT,
    claim3_cls_vs_gap.EXPERIMENT,
    claim4_patch_size.EXPERIMENT,
    claim5_data_scale.EXPERIMENT,
    claim6_pretrain.EXPERIMENT,
    claim7_hybrid.EXPERIMENT,
    claim8_attention.EXPERIMENT,
    claim9_recipe.EXPERIMENT,
    claim10_compute.EXPERIMENT,
    claim11_resolution.EXPERIMENT,
]


def experiment_names() -> list[str]:
    return [e.name for e in EXPERIMENTS]


def select(only: str | Sequence[str] | None) -> list[Experiment]:
    """Experiments by name or number ("pos_embed,5"); None or empty means all, and a list that names none
    (",,,") is a mistake."""
    if not only:
        return list(EXPERIMENTS)
    wanted = [w.strip() for w in (only.split(",") if isinstance(only, str) else only) if w.strip()]
    if not wanted:
        raise VitlabError(f"only: no experiment named in {only!r}; expected names or numbers such as 5,10", arg="only")
    chosen = []
    for w in wanted:
        match = [e for e in EXPERIMENTS if e.name == w or str(e.number) == w or f"claim{e.number}" == w]
        if not match:
            raise VitlabError(
                f"only: unknown experiment {w!r}; expected names or numbers from "
                f"{', '.join(f'{e.number}={e.name}' for e in EXPERIMENTS)}",
                arg="only",
            )
        if match[0] not in chosen:
            chosen.append(match[0])
    return sorted(chosen, key=lambda e: e.number)
