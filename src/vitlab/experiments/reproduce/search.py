"""The recipe search of `vitlab reproduce --tune`: the shared setup's recipe and step budgets, chosen on
10,000 Fashion-MNIST training images held out from the other 50,000 (`vitlab.data.subsets.search_split`), never on the
10,000 test images that decide the verdicts. One seed (0) per configuration, but three in the convergence stage.
Three stages:

    recipe       one knob at a time (STAGES), from the previous report's recipe, each model on its own: the
                 learning rate, the ViT's initialisation, its patch size and depth, the batch size, the
                 weight decay and the warmup; every candidate trains on 4,000 images for
                 40 epochs (the same images seen at any batch size), and the best held-out accuracy wins
                 (the current value on a tie); the CNN takes the ViT's batch size (FOLLOWS)
    budgets      the chosen recipe's ViT and CNN at 1,000, 4,000 and 50,000 images (the search's largest
                 set; the claims train on 60,000), at steps doubling from 625: the budget at a size is the
                 first whose double moves neither model's held-out accuracy by TOLERANCE or more
    convergence  every arm of every Fashion-MNIST claim (claims 2-5 and 7-9; claim 3's whole learning-rate
                 sweep) at the smallest and the largest training set of its claim, at a budget and at twice it,
                 on CONVERGENCE_SEEDS seeds (one seed's move is as much noise as signal): an arm has converged
                 when the mean move is below TOLERANCE and no larger than the arm's standard error over its
                 seeds (`convergence_row(..., within_se=True)`). The arms at one size share a
                 budget (claim 9's of each model their own), which starts at the budget stage's (claim 9's at its
                 regularisation's) and doubles until every arm of it has converged (up to 5,000 steps, for the
                 report's time); claim 3's learning rates are then each pooling's best held out at that budget

The recipe, the budgets and claim 3's learning rates are then written into the code by hand
(`claims/shared.py`, `claims/claim3_cls_vs_gap.py`; the search prints them), and the search's record is kept
beside it (`search.json`, which the report shows; `code_holds` says where the code differs from it): the
convergence stage runs only when the code holds the search's recipe. Every run goes through the reproduce
machinery (`Run`, the run cache, the executors), so a second invocation reads the cache and an
interrupted one resumes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vitlab.data.subsets import HELD_OUT, ExperimentData
from vitlab.errors import VitlabError
from vitlab.experiments.executors import open_executor
from vitlab.experiments.reproduce.claims import EXPERIMENTS, shared
from vitlab.experiments.reproduce.claims.base import Scale, convergence_row
from vitlab.experiments.reproduce.claims.shared import (
    CNN,
    VIT,
    claim_size,
    code_budgets,
    code_regularised_budgets,
    epochs_for,
    search_size,
    steps_per_epoch,
)
from vitlab.experiments.reproduce.report import md_table
from vitlab.experiments.reproduce.runs import BASE_RECIPE, Run, RunCache, train_on
from vitlab.fileio import check_out_folder, output_folder, write_json, write_text
from vitlab.models.registry import get_config
from vitlab.runtime import num_threads
from vitlab.train.recipe import Recipe

RECORD = Path(__file__).with_name("search.json")  # the search whose choice claims/shared.py holds
TOLERANCE = 0.01  # doubling the budget moves held-out accuracy by less than 1 point: converged
CONVERGENCE_SEEDS = (0, 1, 2)  # the convergence stage judges each arm on these seeds
MODELS = {VIT: "ViT", CNN: "CNN"}
AUGS = {"flips": {"augment": True, "hflip": True}, "flips + crops": {"augment": True, "hflip": True, "crop_scale": 0.8}}
AUG_FIELDS = ("augment", "hflip", "crop_scale", "auto_augment", "reprob", "mixup", "cutmix")
INITS = {"default": "trunc_normal", "release": "jax"}  # the weight_init knob: the constructor's, the original release's
SHAPES = {
    "P=4, 6 blocks": {"patch_size": 4, "depth": 6},
    "P=7, 6 blocks": {"patch_size": 7, "depth": 6},
    "P=4, 4 blocks": {"patch_size": 4, "depth": 4},
    "P=4, 8 blocks": {"patch_size": 4, "depth": 8},
}
# Where the search starts: the previous report's recipe (the same for both models, the ViT as built).
START = {
    m: {
        "weight_init": "default",
        "lr": 1e-3,
        "weight_decay": 0.05,
        "warmup": 0.1,
        "batch_size": 128,
        "aug": "flips",
        **({"shape": "P=4, 6 blocks"} if m == VIT else {}),
    }
    for m in MODELS
}
# The recipe stage: (knob, candidates, models), in this order. Small on purpose (about one CPU core-hour): the
# learning rates of the previous report's lr sweep first, then each knob against one or two alternatives. The
# augmentation is not searched (random flips, as before; AUGS names a candidate for a larger search).
STAGES = (
    ("lr", (5e-4, 1e-3, 2e-3, 4e-3), (VIT, CNN)),
    ("weight_init", ("default", "release"), (VIT,)),
    ("shape", ("P=4, 6 blocks", "P=7, 6 blocks", "P=4, 4 blocks"), (VIT,)),
    ("batch_size", (64, 128), (VIT, CNN)),
    ("weight_decay", (0.05, 0.15), (VIT, CNN)),
    ("warmup", (0.02, 0.1), (VIT, CNN)),
)
# A knob one model takes from another: the CNN trains at the ViT's batch size, so that the same step budget is
# the same images for both (claim 5 compares them at equal budgets). Its accuracy at each value is still shown.
FOLLOWS = {("batch_size", CNN): VIT}


@dataclass(frozen=True)
class SearchPlan:
    """The search's sizes: the recipe stage's training set and epochs and its knobs, the budget stage's training
    sets and the steps it starts from and stops at, and the held-out images validated on."""

    search_n: int
    recipe_epochs: int
    stages: tuple
    budget_ns: tuple[int, ...]
    first_steps: int
    max_steps: int
    n_val: int = HELD_OUT
    regularisation: tuple[int, int] = (4000, 2500)  # claim 9's smaller training set and its budget there
    # The largest budget the convergence stage raises one to: a raised budget is paid by every arm at that size, three
    # seeds each, in every report, so beyond it the stage stops and the report flags the arms still moving.
    raise_to: int = 5000


PLANS = {
    # 4,000 images for 40 epochs (1,250 steps of 128); budgets at 1,000, 4,000 and 50,000 (all the search has)
    "default": SearchPlan(4000, 40, STAGES, (1000, 4000, 50_000), 625, 20_000),
    # --tune --quick: the code path on 200 images and 250 held-out ones, in seconds; its choice means nothing
    "quick": SearchPlan(200, 2, (("lr", (1e-3, 4e-3), (VIT, CNN)),), (200,), 2, 8, 250, (200, 4)),
}


def search_data(n: int, n_val: int = HELD_OUT) -> ExperimentData:
    return ExperimentData("fashion-mnist", n_train=n, n_val=n_val, img_size=28, channels=1, split="search")


def knob_recipe(knobs: dict) -> Recipe:
    """The search's knobs as a recipe (but for its length and seed), as claims/shared.py's RECIPES holds them."""
    return BASE_RECIPE.replace(
        lr=knobs["lr"],
        weight_decay=knobs["weight_decay"],
        batch_size=knobs["batch_size"],
        warmup_fraction=knobs["warmup"],
        init=INITS[knobs["weight_init"]],
        **AUGS[knobs["aug"]],
    )


def candidate(model: str, knobs: dict, n: int, *, epochs: int, n_val: int = HELD_OUT, aug: dict | None = None) -> Run:
    """The run of one recipe candidate: `model` with `knobs` (and the augmentation `aug`, if given) on `n` of the
    search's training images for `epochs`, warmed up over the knobs' fraction of them, seed 0."""
    ov = shared.own_overrides(model, dict(SHAPES[knobs["shape"]]) if model == VIT else {})
    rec = knob_recipe(knobs).replace(**(aug or {}))
    rec = rec.replace(epochs=epochs, warmup_epochs=rec.warmup_fraction * epochs, seed=0)
    return Run(data=search_data(n, n_val), model=model, recipe=rec, overrides=ov)


def at_steps(model: str, knobs: dict, n: int, steps: int, n_val: int = HELD_OUT) -> Run:
    return candidate(model, knobs, n, epochs=epochs_for(steps, n, knobs["batch_size"]), n_val=n_val)


def regularised(model: str, knobs: dict, name: str, n: int, steps: int, n_val: int = HELD_OUT) -> Run:
    """The run `at_steps` makes with claim 9's regularisation `name` (shared.REGULARISATIONS) added."""
    aug, drop_path = shared.REGULARISATIONS[name]
    epochs = epochs_for(steps, n, knobs["batch_size"], drop_last=True)  # mixing drops each epoch's short batch
    run = candidate(model, knobs, n, epochs=epochs, n_val=n_val, aug=aug)
    return run if model != VIT else dataclasses.replace(run, overrides={**dict(run.overrides), "drop_path": drop_path})


def twin(run: Run, factor: int = 1, steps: int | None = None, seed: int = 0) -> Run:
    """A claim's run on the search's split (at most its 50,000 images), seed `seed`, for `factor` x its steps, or
    `factor` x the budget `steps` (placed, as the claim places its budget, at the whole epoch of its training set)."""
    n, batch, mixing = search_size(run.n_train), run.recipe.batch_size, run.recipe.mixes
    if steps is not None:
        steps = epochs_for(steps, run.n_train, batch, mixing) * steps_per_epoch(run.n_train, batch, mixing)
    epochs = epochs_for(factor * (run.steps if steps is None else steps), n, batch, drop_last=mixing)
    data = dataclasses.replace(run.data, n_train=n, n_val=HELD_OUT, split="search")
    rec = run.recipe.replace(epochs=epochs, warmup_epochs=run.recipe.warmup_epochs / run.epochs * epochs, seed=seed)
    return dataclasses.replace(run, data=data, recipe=rec)


def arm_label(spec: Run) -> str:
    """A claim's arm in words: the model, what differs from the shared setup, the recipe, the learning rate."""
    ov = dict(spec.overrides)
    if (
        spec.model == VIT
    ):  # the shape as trained (an override equal to the registered model's is dropped), against the shared one
        base = get_config(VIT)
        ov = {**{k: getattr(base, k) for k in shared.FASHION_VIT}, **ov}
        ov = {k: v for k, v in ov.items() if shared.FASHION_VIT.get(k) != v}
    words = [MODELS.get(spec.model, spec.model)]
    words += [f"{k} {v}" for k, v in sorted(ov.items()) if k != "drop_path"]
    if spec.recipe.mixup:
        words.append("+ regularisation recipe")
    if spec.model in shared.RECIPES and spec.lr != shared.RECIPES[spec.model].lr:
        words.append(f"lr {spec.lr:g}")
    return ", ".join(words)


class Search:
    """Trains the search's runs on an executor (each batch of runs at once) and reads their held-out accuracy."""

    def __init__(
        self,
        cache: RunCache,
        train: Callable[[Sequence[Run]], None],
        log: Callable[[str], None],
        plan: SearchPlan = PLANS["default"],
    ):
        self.cache, self._train, self.log, self.plan = cache, train, log, plan

    def acc(self, specs: Sequence[Run]) -> list[float]:
        todo = list({s.key: s for s in specs if not self.cache.has(s)}.values())
        if todo:
            self._train(todo)
        return [self.cache.result(s)["val_acc"] for s in specs]

    def recipe(self) -> tuple[dict, list[dict]]:
        """The recipe stage: one knob at a time, each model on its own."""
        chosen = {m: dict(k) for m, k in START.items()}
        stages = []
        p = self.plan
        for knob, values, models in p.stages:
            for m in models:
                cands = [{**chosen[m], knob: v} for v in values]
                accs = self.acc([candidate(m, c, p.search_n, epochs=p.recipe_epochs, n_val=p.n_val) for c in cands])
                best = max(range(len(values)), key=lambda i: (accs[i], values[i] == chosen[m][knob]))
                leader = FOLLOWS.get((knob, m))
                if leader is not None:
                    best = values.index(chosen[leader][knob])
                stages.append(
                    {
                        "knob": knob,
                        "model": m,
                        "values": list(values),
                        "acc": accs,
                        "before": chosen[m][knob],
                        "chosen": values[best],
                        **({"rule": f"the {MODELS[leader]}'s"} if leader else {}),
                    }
                )
                self.log(
                    f"  {knob} ({MODELS[m]}): "
                    + ", ".join(f"{v}: {100 * a:.2f}" for v, a in zip(values, accs))
                    + f" -> {values[best]}"
                )
                chosen[m][knob] = values[best]
        return chosen, stages

    def regularisation(self, recipe: dict) -> dict:
        """Claim 9's regularisation: each candidate of shared.REGULARISATIONS on the ViT at the claim's smaller
        training set and the shared budget there, against the plain ViT; the best held-out accuracy wins (the code's
        on a tie). Then the chosen one on each model at steps doubling from that budget, as the budget stage does:
        the model's budget in the claim is the first whose double moves it by less than TOLERANCE (a regulariser needs
        longer to pay off than plain training)."""
        n, steps = self.plan.regularisation
        names = list(shared.REGULARISATIONS)
        plain, *accs = self.acc(
            [at_steps(VIT, recipe[VIT], n, steps, self.plan.n_val)]
            + [regularised(VIT, recipe[VIT], k, n, steps, self.plan.n_val) for k in names]
        )
        chosen = names[max(range(len(names)), key=lambda i: (accs[i], names[i] == shared.REGULARISATION))]
        self.log(
            f"  ViT at N={n:,}, {steps} steps: plain {100 * plain:.2f}; "
            + ", ".join(f"{k}: {100 * a:.2f}" for k, a in zip(names, accs))
            + f" -> {chosen}"
        )
        budgets, rows, converged = {}, {}, {}
        for m in MODELS:  # each model's budget with the regularisation, found as the budget stage finds one
            budget, rows[MODELS[m]] = steps, []
            while True:
                a, b = self.acc([regularised(m, recipe[m], chosen, n, k * budget, self.plan.n_val) for k in (1, 2)])
                rows[MODELS[m]].append({"steps": budget, "acc": [a, b]})
                self.log(
                    f"  {MODELS[m]} + {chosen} at N={n:,}, steps {budget} -> {2 * budget}: "
                    f"{100 * a:.2f} -> {100 * b:.2f}"
                )
                converged[MODELS[m]] = abs(b - a) < TOLERANCE
                if converged[MODELS[m]] or 2 * budget >= self.plan.max_steps:
                    break
                budget *= 2
            budgets[MODELS[m]] = budget
        return {
            "n": n,
            "steps": steps,
            "plain": plain,
            "values": names,
            "acc": accs,
            "chosen": chosen,
            "budget": budgets,
            "converged": converged,
            "rows": rows,
        }

    def budgets(self, recipe: dict, ns: Sequence[int] | None = None) -> dict[int, dict]:
        """The budget stage: at each size (the plan's, or `ns`), steps doubling from the plan's first until
        doubling moves neither model by TOLERANCE (or until the plan's most)."""
        out, p = {}, self.plan
        for n in p.budget_ns if ns is None else ns:
            steps, rows = p.first_steps, []
            while True:
                specs = [at_steps(m, recipe[m], n, s, p.n_val) for m in MODELS for s in (steps, 2 * steps)]
                a = self.acc(specs)
                row = {"steps": steps, "acc": {MODELS[m]: [a[2 * i], a[2 * i + 1]] for i, m in enumerate(MODELS)}}
                rows.append(row)
                self.log(
                    f"  N={n:,} steps {steps} -> {2 * steps}: "
                    + "; ".join(f"{k} {100 * x:.2f} -> {100 * y:.2f}" for k, (x, y) in row["acc"].items())
                )
                if all(abs(y - x) < TOLERANCE for x, y in row["acc"].values()) or 2 * steps >= p.max_steps:
                    out[n] = {
                        "steps": steps,
                        "converged": all(abs(y - x) < TOLERANCE for x, y in row["acc"].values()),
                        "rows": rows,
                    }
                    break
                steps *= 2
        return out

    def convergence(self, scale: Scale, budgets: dict[int, dict], regularisation: dict | None) -> dict:
        """The convergence stage: every arm of every Fashion-MNIST claim at the smallest and the largest training set
        of its claim (its `search_plan`'s where it has one; the plans' runs of `scale`'s first seed), at a budget and
        at twice it, on the search's split, each on CONVERGENCE_SEEDS seeds: converged when the mean move is under
        TOLERANCE and within the arm's standard error. The arms at one size share a budget (a claim's with
        `budget_per_model`, one per model: claim 9's); it starts at the budget stage's there (a model's own at the
        regularisation stage's) and doubles until no arm of it moves, or up to the plan's `raise_to`. Returns each
        claim's rows at the budget found, the budgets found (which the code then holds), every round, and each
        claim's `search_choice` made at them."""
        found = {claim_size(n): b["steps"] for n, b in budgets.items()}
        start = {n: found.get(n, s) for n, s in code_budgets().items()}
        arms: dict[tuple, list[tuple[str, Run]]] = {}  # (N, None): the size's shared budget; (N, model): a model's own
        for e in EXPERIMENTS:
            fashion = [
                s
                for s in (e.search_plan or e.plan)(scale)
                if s.data.name == "fashion-mnist" and s.seed == scale.seeds[0]
            ]
            if not fashion:
                continue
            ns = {min(s.n_train for s in fashion), max(s.n_train for s in fashion)}
            for s in {s.key: s for s in fashion if s.n_train in ns}.values():
                arms.setdefault((s.n_train, s.model if e.budget_per_model else None), []).append((e.name, s))
        budget = {g: start[g[0]] for g in arms}
        for m in MODELS if regularisation else ():  # claim 9's at its smaller size start at the regularisation stage's
            if (regularisation["n"], m) in arms:
                budget[(regularisation["n"], m)] = regularisation["budget"][MODELS[m]]
        rows: dict[tuple, list[dict]] = {}
        rounds, pending = [], list(arms)
        seeds = CONVERGENCE_SEEDS
        while pending:
            self.acc(
                [twin(s, k, budget[g], seed) for g in pending for _, s in arms[g] for k in (1, 2) for seed in seeds]
            )  # one batch
            for g in list(pending):
                rows[g] = []
                for name, s in arms[g]:
                    a, b = (self.acc([twin(s, k, budget[g], seed) for seed in seeds]) for k in (1, 2))
                    steps = twin(s, steps=budget[g]).steps
                    row = convergence_row(arm_label(s), s.n_train, steps, a, b, TOLERANCE, within_se=True)
                    rows[g].append({"claim": name, **row, "n_search": twin(s).n_train, "budget": budget[g]})
                late = list(
                    {r["arm"]: r for r in rows[g] if not r["converged"]}.values()
                )  # an arm of several claims once
                n_arms = len({s.key for _, s in arms[g]})
                stop = not late or 2 * budget[g] > self.plan.raise_to
                rounds.append(
                    {
                        "n_train": g[0],
                        "model": MODELS[g[1]] if g[1] else None,
                        "budget": budget[g],
                        "arms": n_arms,
                        "late": [r["arm"] for r in late],
                        "largest_move": max(abs(r["acc_2x"] - r["acc"]) for r in rows[g]),
                        "outcome": "budget" if not late else "stopped" if stop else "doubled",
                    }
                )
                self.log(
                    f"  N={g[0]:,}{' ' + MODELS[g[1]] + ' (claim 9)' if g[1] else ''}, {budget[g]:,} steps -> "
                    f"{2 * budget[g]:,}: {n_arms - len(late)} of {n_arms} arms moved by less than a point"
                    + "".join(f"; not {r['arm']} ({100 * r['acc']:.2f} -> {100 * r['acc_2x']:.2f})" for r in late)
                )
                if stop:
                    pending.remove(g)
                else:
                    budget[g] *= 2
        claims = {}
        for rs in rows.values():
            for r in rs:
                claims.setdefault(r.pop("claim"), []).append(r)
        shared_found = {n: b for (n, m), b in sorted(budget.items(), key=lambda kv: kv[0][0]) if m is None}
        own = {
            n: {MODELS[m]: budget.get((n, m), shared_found.get(n)) for m in MODELS}
            for n in sorted({n for n, m in budget if m is not None})
        }
        return {
            "claims": {e.name: claims[e.name] for e in EXPERIMENTS if e.name in claims},
            "budgets": shared_found,
            "own_budgets": own,
            "rounds": sorted(rounds, key=lambda r: (r["n_train"], r["model"] or "")),
            "choices": {e.search_choice.key: self._choice(e, arms, budget) for e in EXPERIMENTS if e.search_choice},
        }

    def _choice(self, e, arms: dict, budget: dict) -> dict | None:
        """A claim's `search_choice`, from its search_plan's arms each at its budget."""
        sweep = [(g, s) for g, runs in arms.items() for name, s in runs if name == e.name]
        if not sweep:
            return None
        acc = self.acc([twin(s, steps=budget[g]) for g, s in sweep])
        return e.search_choice.choose([(s, a) for (_, s), a in zip(sweep, acc)], budget[sweep[0][0]])


def _train(specs: Sequence[Run], ex, cache: RunCache, fast_path: str, log: Callable[[str], None]) -> None:
    for spec, _ in train_on(sorted(specs, key=lambda s: -s.epochs * s.n_train), ex, cache, fast_path):  # longest first
        r = cache.result(spec)
        log(
            f"    trained {arm_label(spec)}, N={spec.n_train:,}, {spec.steps:,} steps, lr {spec.lr:g}, batch "
            f"{spec.recipe.batch_size}: {100 * r['val_acc']:.2f}% held out"
        )


def code_recipe() -> dict:
    """The recipe claims/shared.py holds, in the search's knobs."""
    shape = next((k for k, v in SHAPES.items() if v == shared.FASHION_VIT), None)
    out = {}
    for m in MODELS:
        r = shared.RECIPES[m]
        same_aug = [
            k
            for k, v in AUGS.items()
            if all(getattr(r, f) == x for f, x in BASE_RECIPE.replace(**v).to_dict().items() if f in AUG_FIELDS)
        ]
        out[m] = {
            "weight_init": {v: k for k, v in INITS.items()}[r.init],
            "lr": r.lr,
            "weight_decay": r.weight_decay,
            "warmup": r.warmup_fraction,
            "batch_size": r.batch_size,
            "aug": same_aug[0] if same_aug else None,
            **({"shape": shape} if m == VIT else {}),
        }
    return out


def _choosers() -> list:
    return [e for e in EXPERIMENTS if e.search_choice is not None]


def make_record(
    plan: SearchPlan,
    stages: list[dict],
    recipe: dict,
    budgets: dict[int, dict],
    cache: RunCache,
    *,
    convergence: dict | None = None,
    made_by: str = "`vitlab reproduce --tune --out DIR`",
    regularisation: dict | None = None,
) -> dict:
    """The search's record (search.json): what it tried, what it chose, and the runs it took."""
    results = [json.loads(p.read_text()) for p in cache.root.glob("*/result.json")]
    conv = convergence or {}
    return {
        "held_out": plan.n_val,
        "search_n": plan.search_n,
        "recipe_epochs": plan.recipe_epochs,
        "tolerance": TOLERANCE,
        "start": START,
        "stages": stages,
        "recipe": recipe,
        "regularisation": regularisation,
        "budgets": {str(n): b for n, b in budgets.items()},
        "code_budgets": {str(n): s for n, s in code_budgets().items()} if convergence else None,
        "code_regularised_budgets": {str(n): s for n, s in code_regularised_budgets().items()} if convergence else None,
        "convergence": conv.get("claims"),
        "convergence_budgets": {str(n): s for n, s in conv["budgets"].items()} if convergence else None,
        "convergence_own_budgets": {str(n): s for n, s in conv["own_budgets"].items()} if convergence else None,
        "convergence_rounds": conv.get("rounds"),
        **{e.search_choice.key: (conv.get("choices") or {}).get(e.search_choice.key) for e in _choosers()},
        "made_by": made_by,
        "runs": len(results),
        "train_cpu_s": sum(r["train_cpu_s"] for r in results),
    }


def hold_lines(convergence: dict) -> str:
    """What the code must hold for the convergence stage's budgets and the claims' search choices, and whether it
    does."""
    own = {
        n: {m: b for m, b in bs.items() if b != convergence["budgets"].get(n)}
        for n, bs in convergence["own_budgets"].items()
    }
    lines = [
        f"  budgets found: {convergence['budgets']} (claims/shared.py STEPS['default']: {code_budgets()}); claim 9's "
        f"own: {own} (REGULARISED_STEPS: {code_regularised_budgets()})"
    ]
    for e in _choosers():
        if (convergence.get("choices") or {}).get(e.search_choice.key):
            chosen = convergence["choices"][e.search_choice.key]["chosen"]
            lines.append(f"  {e.search_choice.what}: {chosen} (in code: {e.search_choice.held()})")
    return "\n".join(lines)


def code_holds(record: dict) -> list[str]:
    """Where the code differs from the search's record: the recipe, claim 9's regularisation, the budgets the
    convergence stage found (or, without one, the budget stage's), the claims' search choices. Empty: it holds them."""
    bad = []
    if code_recipe() != record["recipe"]:
        bad.append("the recipe")
    if record.get("regularisation") and shared.REGULARISATION != record["regularisation"]["chosen"]:
        bad.append("claim 9's regularisation")
    if record.get("convergence_budgets"):
        if {str(n): s for n, s in code_budgets().items()} != record["convergence_budgets"]:
            bad.append("the budgets (STEPS)")
        label = {v: k for k, v in MODELS.items()}
        if any(
            shared.regularised_steps(label[m], int(n), Scale("default", (0,))) != b
            for n, bs in record["convergence_own_budgets"].items()
            for m, b in bs.items()
        ):
            bad.append("claim 9's budgets (REGULARISED_STEPS)")
    else:
        for n, b in record["budgets"].items():
            n = claim_size(n)
            if b["converged"] and code_budgets().get(n, b["steps"]) != b["steps"]:
                bad.append(f"the budget at {n:,}")
    for e in _choosers():
        entry = record.get(e.search_choice.key)
        if entry and entry["chosen"] != e.search_choice.held():
            bad.append(e.search_choice.what)
    return bad


def tune(
    out_dir: str | Path,
    *,
    scale: str = "default",
    workers: int | None = None,
    log: Callable[[str], None] = print,
    force: bool = False,
    fast_path: str = "auto",
    executor: str = "pool",
    address: str | None = None,
    device: str = "auto",
) -> dict:
    """Run the search (or read it from the cache) into `out_dir`: search.md, search.json and the run cache."""
    if scale not in PLANS:
        raise VitlabError(f"--tune runs at the default or the quick scale; found --scale {scale}", arg="scale")
    plan = PLANS[scale]
    out = check_out_folder(out_dir, kind="reproduce-search", force=force)
    with output_folder(out, kind="reproduce-search", force=force):
        cache = RunCache(out / "cache")
        with (
            open_executor(executor, device=device, workers=workers, address=address, n_items=64) as ex,
            num_threads(1 if ex.device.type == "cpu" else None),
        ):
            search = Search(cache, lambda specs: _train(specs, ex, cache, fast_path, log), log, plan)
            log(f"recipe stage ({plan.search_n:,} images, {plan.recipe_epochs} epochs, held-out accuracy in %):")
            recipe, stages = search.recipe()
            log("claim 9's regularisation (held-out accuracy in %):")
            regularisation = search.regularisation(recipe)
            log("budget stage:")
            budgets = search.budgets(recipe)
            convergence = None
            if scale == "default" and recipe != code_recipe():
                log(
                    "the code does not hold this recipe yet: set claims/shared.py to it and run --tune again for the "
                    f"convergence stage: {json.dumps(recipe)}"
                )
            elif scale == "default":
                log(
                    "convergence stage (every claim's arms at a budget and twice it, doubling until none moves by a "
                    "point):"
                )
                convergence = search.convergence(Scale("default", (0,)), budgets, regularisation)
                log(hold_lines(convergence))
            record = make_record(
                plan, stages, recipe, budgets, cache, convergence=convergence, regularisation=regularisation
            )
            write_json(out / "search.json", record, indent=1)
            write_text(out / "search.md", render(record))
    log(f"wrote {out / 'search.md'} and search.json; to fix the choice in code, copy search.json to {RECORD}")
    return record


def load_record() -> dict | None:
    """The committed search (search.json beside this module), or None when there is none."""
    return json.loads(RECORD.read_text()) if RECORD.is_file() else None


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _render_regularisation(record: dict) -> list[str]:
    """Claim 9's regularisation stage in Markdown."""
    reg = record.get("regularisation")
    if not reg:
        return []
    lines: list[str] = []
    lines += [
        f"**Claim 9's regularisation**, chosen the same way: each candidate added to the chosen ViT's recipe on "
        f"{reg['n']:,} images (the claim's smaller training set) for {reg['steps']:,} steps (the shared budget "
        "there); "
        "held-out accuracy in %, the best kept; then the chosen one on both models at that budget and at twice it:",
        "",
    ]
    lines += [
        md_table(
            ["ViT plain"] + reg["values"],
            [
                [_pct(reg["plain"])]
                + [f"**{_pct(a)}**" if k == reg["chosen"] else _pct(a) for k, a in zip(reg["values"], reg["acc"])]
            ],
        ),
        "",
    ]
    lines += [
        f"Then each model's budget with it at {reg['n']:,} images, as the budget stage finds one: steps doubling "
        f"from {reg['steps']:,} until doubling moves the model by less than {100 * record['tolerance']:.0f} point "
        "(held-out %):",
        "",
    ]
    lines += [
        md_table(
            [f"model + {reg['chosen']}", "steps", "2x steps", "held-out %", ""],
            [
                [
                    m,
                    str(r["steps"]),
                    str(2 * r["steps"]),
                    f"{_pct(a)} -> {_pct(b)} ({100 * (b - a):+.2f})",
                    ""
                    if r["steps"] != reg["budget"][m]
                    else "**budget**"
                    if reg["converged"][m]
                    else "**not converged** (the search stopped here)",
                ]
                for m, rs in reg["rows"].items()
                for r in rs
                for a, b in [r["acc"]]
            ],
        ),
        "",
    ]
    return lines


def _render_convergence(record: dict) -> list[str]:
    """The convergence stage in Markdown: its rounds and every arm at its budget."""
    if not record.get("convergence"):
        return []
    lines: list[str] = []
    lines += [
        f"**Convergence** of every claim's arms (claim 3's whole learning-rate sweep) at the smallest and the "
        "largest training set of the claim, at a budget and at twice it (60,000 trained as the search's 50,000). "
        "The arms at one size share a budget, claim 9's arms of each model their own; it starts at the budget "
        "stage's (claim 9's at the regularisation stage's) and doubles until doubling moves none of them by "
        f"{100 * record['tolerance']:.0f} point. The rounds:",
        "",
    ]
    if record.get("convergence_rounds"):
        outcome = {
            "budget": "**budget**",
            "doubled": "doubled",
            "stopped": "**not converged** (the search stopped here)",
        }
        lines += [
            md_table(
                ["N", "arms", "steps", "2x steps", "largest move (points)", "moved by a point or more", ""],
                [
                    [
                        f"{r['n_train']:,}",
                        f"claim 9's {r['model']}" if r["model"] else f"the shared budget's {r['arms']}",
                        f"{r['budget']:,}",
                        f"{2 * r['budget']:,}",
                        f"{100 * r['largest_move']:.2f}",
                        "; ".join(r["late"]) or "none",
                        outcome[r["outcome"]],
                    ]
                    for r in record["convergence_rounds"]
                ],
            ),
            "",
        ]
    # a record made when the stage judged seed 0 alone has no per-seed values: its table is shown as it was
    seeded = any("acc_seeds" in r for rs in record["convergence"].values() for r in rs)
    found = record.get("convergence_budgets") or record["code_budgets"]
    own = record.get("convergence_own_budgets") or record.get("code_regularised_budgets") or {}
    lines += [
        "The budgets found, which the code holds: "
        + ", ".join(f"{int(n):,} images: {s:,} steps" for n, s in found.items())
        + "; "
        "claim 9's own: "
        + "; ".join(f"{int(n):,} images: " + ", ".join(f"{m} {s:,}" for m, s in b.items()) for n, b in own.items())
        + ". Every arm at its budget"
        + (
            " (the mean over its seeds: converged when it moves by less than "
            f"{100 * record['tolerance']:.0f} point and by no more than the arm's standard error):"
            if seeded
            else ":"
        ),
        "",
    ]
    rows = [
        [name, r["arm"], f"{r['n_train']:,}", f"{r['steps']:,}"]
        + ([str(len(r["acc_seeds"]))] if seeded else [])
        + [_pct(r["acc"]), _pct(r["acc_2x"]), f"{100 * (r['acc_2x'] - r['acc']):+.2f}"]
        + ([f"{100 * r['se']:.2f}" if r.get("se") is not None else ""] if seeded else [])
        + ["yes" if r["converged"] else "**no**"]
        for name, rs in record["convergence"].items()
        for r in rs
    ]
    header = ["claim", "arm", "N", "steps"] + (["seeds"] if seeded else [])
    header += ["held-out %", "2x steps: held-out %", "difference (points)"] + (["se (points)"] if seeded else [])
    lines += [md_table(header + ["converged"], rows), ""]
    return lines


def render(record: dict, heading: str = "#") -> str:
    """The search in Markdown: its stages' tables, the budgets and the convergence of every claim's arms."""
    lines = [
        f"{heading} The recipe search",
        "",
        f"Fashion-MNIST's 60,000 training images split once into 50,000 to train on and {record['held_out']:,} "
        "held out to validate on (never the test images, which decide the verdicts); one seed. Made by "
        f"{record['made_by']} (`vitlab/experiments/reproduce/search.py`); {record['runs']} runs, "
        f"{record['train_cpu_s'] / 3600:.1f} CPU-hours of training.",
        "",
        f"**Recipe**, one knob at a time from the previous report's recipe, each model on its own, on "
        f"{record['search_n']:,} images for {record['recipe_epochs']} epochs "
        f"({record['recipe_epochs'] * -(-record['search_n'] // 128):,} "
        "steps at batch 128; the same images seen at any batch size); held-out accuracy in %, the best kept "
        "(the current value on a tie), except where a model takes another's value (the CNN trains at the ViT's "
        "batch, so "
        "that equal steps are equal images):",
        "",
    ]
    rows = [
        [
            s["knob"],
            MODELS[s["model"]],
            str(s["before"]),
            ", ".join(f"{v}: {_pct(a)}" for v, a in zip(s["values"], s["acc"])),
            f"**{s['chosen']}**" + (f" ({s['rule']})" if s.get("rule") else ""),
        ]
        for s in record["stages"]
    ]
    lines += [md_table(["knob", "model", "from", "held-out accuracy % per value", "chosen"], rows), ""]
    lines += [
        "Chosen: "
        + "; ".join(f"{MODELS[m]}: " + ", ".join(f"{k} {v}" for k, v in r.items()) for m, r in record["recipe"].items())
        + ".",
        "",
    ]
    lines += _render_regularisation(record)
    lines += [
        f"**Budgets**: at each training-set size the chosen recipe's ViT and CNN for doubling numbers of steps; "
        f"the budget is the first whose double moves neither by {100 * record['tolerance']:.0f} point or more:",
        "",
    ]
    rows = []
    for n, b in record["budgets"].items():
        for r in b["rows"]:
            rows.append(
                [f"{int(n):,}", str(r["steps"]), str(2 * r["steps"])]
                + [f"{_pct(x)} -> {_pct(y)} ({100 * (y - x):+.2f})" for x, y in r["acc"].values()]
                + [
                    ""
                    if r["steps"] != b["steps"]
                    else "**budget**"
                    if b["converged"]
                    else "**not converged** (the search stopped here)"
                ]
            )
    lines += [md_table(["N", "steps", "2x steps", "ViT held-out %", "CNN held-out %", ""], rows), ""]
    lines += _render_convergence(record)
    for e in _choosers():
        if record.get(e.search_choice.key):
            lines += [e.search_choice.render(record[e.search_choice.key]), ""]
    return "\n".join(lines) + "\n"


__all__ = [
    "CONVERGENCE_SEEDS",
    "RECORD",
    "TOLERANCE",
    "Search",
    "arm_label",
    "code_budgets",
    "code_holds",
    "code_recipe",
    "code_regularised_budgets",
    "load_record",
    "render",
    "search_data",
    "tune",
    "twin",
]
