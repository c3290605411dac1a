"""What a claim is made of: `Experiment` (the claim, its rule, its plan and analyse functions, and its hooks into
the recipe search), `SearchChoice`,
`Scale` (quick, default or large, and the seeds), `Outcome` (table, figures, CSV rows and verdict) and `Results`
(the cached results of a plan's runs, and their models' few-shot probes).

They live in this module rather than in `claims/__init__.py` because that module imports every claim
module to list `EXPERIMENTS`, and every claim module needs these classes: defined there, each claim
would import a half-initialised package.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from vitlab.data.subsets import ExperimentData
from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.probes import digits_probe, fashion_probe, has_digits_probe
from vitlab.experiments.reproduce.runs import Run, RunCache
from vitlab.experiments.reproduce.verdicts import Verdict
from vitlab.options import SCALES


@dataclass
class Scale:
    """How big, and the seeds. "quick": every claim's code path on tiny data in about 3 minutes (the test's
    run; its verdicts mean nothing); "default": the report, 3.5-6.5 hours on 2 CPU cores by CPU kind; "large": each
    claim's decisive version (longer training, hours on 2 CPU cores)."""

    name: str
    seeds: tuple[int, ...]
    # False: every arm has exactly `seeds`, none extended to shared.SEEDS_AT's (the budget check's 3 seeds per arm)
    more_seeds: bool = True
    # Seeds left out of every arm (the leave-one-seed-out test): `seeds` is without them, and shared.seeds_at
    # extends the seeds as if they were there, then drops them.
    dropped: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in SCALES:
            raise VitlabError(f"scale must be one of {', '.join(SCALES)}; found {self.name!r}", arg="scale")

    @property
    def quick(self) -> bool:
        return self.name == "quick"

    def pick(self, *, quick, default, large):
        """The value for this scale."""
        return {"quick": quick, "default": default, "large": large}[self.name]


@dataclass
class Outcome:
    """A claim's analysis: its table (`header`, `rows`), further titled tables (`tables`: (title, header, rows), such
    as a probe table), the verdict of the v2 rules (`verdict`, the report's) and of the v1 rules (`verdict_v1`, the
    committed report's, kept for the record), figures and per-seed CSV rows."""

    setup: str
    header: list[str]
    rows: list[list[str]]
    verdict: Verdict
    verdict_v1: Verdict | None = None
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    csv_header: list[str] = field(default_factory=list)
    csv_rows: list[list] = field(default_factory=list)
    notes: str = ""
    # The claim's budgets against twice them (`convergence_row`s): a claim on Fashion-MNIST gets them from the
    # recipe search (search.json, on held-out training images); one on other data measures them itself.
    convergence: list[dict] = field(default_factory=list)
    convergence_note: str = ""
    convergence_complete: bool = True  # False: the table covers only some of the claim's arms and sizes
    # The verdict row's marks from the committed budget check (budgetcheck.marks): "budget" (checked / failed / not
    # checked), "fragile" (fragile / robust / untested) and "text" (the check's result in a sentence).
    marks: dict = field(default_factory=dict)


def convergence_row(
    arm: str,
    n_train: int,
    steps: int,
    acc: Sequence[float],
    acc_2x: Sequence[float],
    tolerance: float = 0.01,
    *,
    within_se: bool = False,
) -> dict:
    """One arm's accuracy (mean over its seeds) at its budget and at twice it: converged when doubling the
    budget moves it by less than `tolerance` (1 point). With `within_se` (the recipe search's convergence stage, three
    seeds), also by no more than the arm's standard error at its budget (the sample std of its seeds / sqrt(n)): a
    move larger than the seeds' own noise is a real one, however small. The per-seed values are kept beside the
    means."""
    a, b = sum(acc) / len(acc), sum(acc_2x) / len(acc_2x)
    se = statistics.stdev(acc) / math.sqrt(len(acc)) if len(acc) > 1 else None
    if within_se and len(acc) < 2:
        raise VitlabError(f"within_se: the arm {arm!r} needs at least 2 seeds; found {len(acc)}", arg="acc")
    converged = abs(b - a) < tolerance and (not within_se or abs(b - a) <= se)
    return {
        "arm": arm,
        "n_train": n_train,
        "steps": steps,
        "acc": a,
        "acc_2x": b,
        "converged": converged,
        "acc_seeds": [float(x) for x in acc],
        "acc_2x_seeds": [float(x) for x in acc_2x],
        "se": se,
    }


@dataclass(frozen=True, kw_only=True)
class SearchChoice:
    """A constant of a claim that the recipe search's convergence stage chooses from the claim's `search_plan` arms,
    each trained on held-out images at its converged budget; kept in search.json under `key`, held by the code."""

    key: str  # its entry in search.json
    choose: Callable[[list[tuple[Run, float]], int], dict]  # ((arm, held-out acc) each, budget) -> entry with "chosen"
    held: Callable[[], object]  # the code's value, compared with the entry's "chosen"
    what: str  # the code's constant, in words
    render: Callable[[dict], str]  # the entry in Markdown, for search.md


@dataclass(frozen=True, kw_only=True)
class Experiment:
    number: int
    name: str
    title: str
    claim: str
    source: str
    rule: str
    plan: Callable[[Scale], list[Run]]
    analyze: Callable[[Scale, Results, Path], Outcome]
    # The runs the recipe search trains for the claim on held-out images (its convergence stage), where they are more
    # than the plan's: a sweep whose choice (`search_choice`) the code then holds.
    search_plan: Callable[[Scale], list[Run]] | None = None
    search_choice: SearchChoice | None = None
    # In the convergence stage the arms at one training-set size share one budget; with this, one per model.
    budget_per_model: bool = False
    # The claim's Budget table from the search's record (a dict) where the convergence stage has none for it:
    # (rows, complete, note), or None where the record has nothing for the budgets in code.
    budget_evidence: Callable[[dict], tuple[list[dict], bool, str] | None] | None = None
    # Whether the analysis reads its runs' models (probes, attention, timing), not only their results: a cache kept
    # as records (`records.keep_records`) keeps these runs' weights.
    loads_models: bool = False


class Results:
    """Cached results of a plan's runs, looked up by spec; `device` is where analyses run their models.
    `replicates`: (CPU, run cache) of the same runs trained again on another kind of CPU, where a probe of a run
    this cache keeps without its weights is read (`transfer_probes`)."""

    def __init__(
        self,
        cache: RunCache,
        device: torch.device = torch.device("cpu"),
        replicates: Sequence[tuple[str, RunCache]] = (),
    ):
        self.cache = cache
        self.device = device
        self.replicates = tuple(replicates)

    def __getitem__(self, spec: Run) -> dict:
        return self.cache.result(spec)

    def acc(self, specs: Sequence[Run]) -> list[float]:
        return [self[s]["val_acc"] for s in specs]

    def model(self, spec: Run) -> nn.Module:
        return self.cache.load_model(spec)

    def probe(self, spec: Run, scale: Scale) -> dict[int, dict]:
        """The run's few-shot linear probe on Fashion-MNIST (`probes.fashion_probe`), cached: {shots: result}."""
        return fashion_probe(self.cache, spec, self.device, quick=scale.quick)

    def digits_probe(self, spec: Run, digits: ExperimentData, scale: Scale, *, random_init: bool) -> dict[int, dict]:
        """The run's model (or its architecture at initialisation) probed on the digits (`probes.digits_probe`)."""
        return digits_probe(self.cache, spec, digits, self.device, random_init=random_init, quick=scale.quick)

    def transfer_probes(
        self, specs: Sequence[Run], digits: ExperimentData, scale: Scale
    ) -> tuple[list[dict[int, dict]] | None, str]:
        """The runs' trained features probed on the digits (`probes.digits_probe`), all from one source: this
        cache's models where it keeps every run's weights or probe, else the first replicate that does. (probes,
        "" or that replicate's CPU); (None, "") where no source has them all (records kept without weights)."""
        for cpu, cache in (("", self.cache), *self.replicates):
            if all(
                cache.has(s) and (cache.has_weights(s) or has_digits_probe(cache, s, digits, quick=scale.quick))
                for s in specs
            ):
                probes = [
                    digits_probe(cache, s, digits, self.device, random_init=False, quick=scale.quick) for s in specs
                ]
                return probes, cpu
        return None, ""
