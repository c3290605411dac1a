"""The paper's claims, one module each (plan, analysis and `Experiment` entry), and `EXPERIMENTS` in claim
order, loaded from the registry `vitlab.options.CLAIMS` (which the command line's help reads without torch).
The classes they are made of are in `base`; the Fashion-MNIST setup the claims share (models, recipes, the
data-scale grid whose runs most claims reuse) in `shared`."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.claims.base import Experiment
from vitlab.options import CLAIMS

# claim N is the module claimN_<name> of this package, its EXPERIMENT numbered N and named <name>
EXPERIMENTS: list[Experiment] = [
    importlib.import_module(f"{__name__}.claim{number}_{name}").EXPERIMENT for number, name in CLAIMS.items()
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
