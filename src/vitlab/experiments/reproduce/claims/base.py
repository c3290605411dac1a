"""What a claim is made of: `Experiment` (the claim, its rule, and its plan and analyse functions),
`Scale` (quick or full, and the seeds), `Outcome` (table, figures, CSV rows and verdict) and `Results`
(the cached results of a plan's runs).

They live in this module rather than in `claims/__init__.py` because that module imports every claim
module to list `EXPERIMENTS`, and every claim module needs these classes: defined there, each claim
would import a half-initialised package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from torch import nn

from vitlab.experiments.reproduce.runs import RunCache, RunSpec
from vitlab.experiments.reproduce.verdicts import Verdict


@dataclass
class Scale:
    """How big: `quick` (the test's ~3-minute run) or full, and the seeds."""

    quick: bool
    seeds: tuple[int, ...]


@dataclass
class Outcome:
    setup: str
    header: list[str]
    rows: list[list[str]]
    verdict: Verdict
    figures: list[Path] = field(default_factory=list)
    csv_header: list[str] = field(default_factory=list)
    csv_rows: list[list] = field(default_factory=list)
    notes: str = ""


@dataclass
class Experiment:
    number: int
    name: str
    title: str
    claim: str
    source: str
    rule: str
    plan: Callable[[Scale], list[RunSpec]]
    analyze: Callable[[Scale, "Results", Path], Outcome]


class Results:
    """Cached results of a plan's runs, looked up by spec."""

    def __init__(self, cache: RunCache):
        self.cache = cache

    def __getitem__(self, spec: RunSpec) -> dict:
        return self.cache.result(spec)

    def acc(self, specs: Sequence[RunSpec]) -> list[float]:
        return [self[s]["val_acc"] for s in specs]

    def model(self, spec: RunSpec) -> nn.Module:
        return self.cache.load_model(spec)
