"""The recipe search of `vitlab reproduce --tune` and the budgets the held-out split never holds a test
image; the recipe stage keeps the best held-out accuracy; the budget stage doubles until doubling moves no model by a
point; the convergence stage doubles each size's budget until no claim's arm moves by a point, and chooses claim 3's
learning rates at it; the convergence rows and the reason an inconclusive verdict gives; the code holds the committed
search's choice; the original release's initialisation; and `--tune --quick` end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from vitlab.cli import main
from vitlab.data.fashion_mnist import load_fashion_mnist
from vitlab.data.subsets import HELD_OUT, experiment_splits, search_split
from vitlab.errors import VitlabError
from vitlab.experiments.reproduce import EXPERIMENTS, Outcome, Scale
from vitlab.experiments.reproduce.claims import claim5_data_scale, shared
from vitlab.experiments.reproduce.claims.base import convergence_row
from vitlab.experiments.reproduce.claims.shared import budget_rows, code_budgets, code_regularised_budgets
from vitlab.experiments.reproduce.runner import budget_table
from vitlab.experiments.reproduce.runs import BASE_RECIPE, build_model
from vitlab.experiments.reproduce.search import (
    AUG_FIELDS,
    CONVERGENCE_SEEDS,
    MODELS,
    PLANS,
    START,
    Search,
    SearchPlan,
    code_holds,
    code_recipe,
    knob_recipe,
    load_record,
    render,
    search_data,
)
from vitlab.experiments.reproduce.verdicts import INCONCLUSIVE, REPRODUCED, Verdict

VIT, CNN = shared.VIT, shared.CNN


def _aug(run) -> dict:
    """A run's augmentation: the recipe's fields that say it."""
    return {f: getattr(run.recipe, f) for f in AUG_FIELDS}


def _as_aug(fields: dict) -> dict:
    """The augmentation a dict of recipe fields (shared.PLAIN, shared.REGULARISATIONS) gives a run."""
    return {f: getattr(BASE_RECIPE.replace(**fields), f) for f in AUG_FIELDS}


class FakeCache:
    """A run cache whose runs 'train' to the accuracy `acc(spec)` gives, counting what was trained."""

    def __init__(self, acc):
        self.acc, self.done, self.trained = acc, {}, []

    def has(self, spec):
        return spec.key in self.done

    def result(self, spec):
        return {"val_acc": self.done[spec.key]}

    def train(self, specs):
        for s in specs:
            self.trained.append(s)
            self.done[s.key] = self.acc(s)


def _search(acc, plan: SearchPlan) -> tuple[Search, FakeCache]:
    cache = FakeCache(acc)
    return Search(cache, cache.train, lambda m: None, plan), cache


def test_the_search_split_holds_out_training_images_and_never_a_test_image(fashion):
    train_part, held = search_split()
    assert len(train_part) == 60_000 - HELD_OUT and len(held) == HELD_OUT
    assert torch.equal(torch.sort(torch.cat([train_part, held])).values, torch.arange(60_000))  # disjoint, all 60,000
    train, val, k = experiment_splits(search_data(300, 200), 0)
    x_train, y_train = load_fashion_mnist(train=True)
    x_test, _ = load_fashion_mnist(train=False)
    assert k == 10 and len(train) == 300 and len(val) == 200
    assert torch.equal(
        val.images.reshape(200, -1), x_train[held[:200]].reshape(200, -1)
    )  # the held-out training images
    test_rows = {bytes(x.reshape(-1).numpy()) for x in x_test}
    assert not any(bytes(x.reshape(-1).numpy()) in test_rows for x in val.images)  # no test image validates the search
    held_rows = {bytes(x.reshape(-1).numpy()) for x in x_train[held]}
    assert not any(bytes(x.reshape(-1).numpy()) in held_rows for x in train.images)  # nor is trained on


def test_recipe_stage_keeps_the_best_held_out_accuracy_and_the_current_value_on_a_tie():
    plan = SearchPlan(
        100, 2, (("lr", (1e-3, 2e-3, 4e-3), (VIT, CNN)), ("weight_decay", (0.05, 0.15), (VIT,))), (100,), 2, 8, 50
    )
    # the ViT peaks at lr 4e-3, the CNN at 1e-3; weight decay changes nothing (a tie: the current value stays)
    search, cache = _search(lambda s: 0.8 - abs(math.log2(s.lr / (4e-3 if s.model == VIT else 1e-3))) / 100, plan)
    recipe, stages = search.recipe()
    assert recipe[VIT]["lr"] == 4e-3 and recipe[CNN]["lr"] == 1e-3
    assert recipe[VIT]["weight_decay"] == START[VIT]["weight_decay"] == 0.05
    assert [(s["knob"], s["model"], s["chosen"]) for s in stages] == [
        ("lr", VIT, 4e-3),
        ("lr", CNN, 1e-3),
        ("weight_decay", VIT, 0.05),
    ]
    assert all(s.data.split == "search" and s.n_train == 100 and s.epochs == 2 for s in cache.trained)
    assert len(cache.trained) == 3 + 3 + 1  # the weight decay stage's current value is the lr stage's run: cached


def test_the_cnn_takes_the_vits_batch_size_and_its_own_accuracies_are_still_shown():
    plan = SearchPlan(100, 2, (("batch_size", (64, 128), (VIT, CNN)),), (100,), 2, 8, 50)
    # the ViT is best at batch 64, the CNN at 128: the CNN trains at 64 all the same (equal steps, equal images)
    search, _ = _search(lambda s: 0.8 + (s.recipe.batch_size == (64 if s.model == VIT else 128)) / 100, plan)
    recipe, stages = search.recipe()
    assert recipe[VIT]["batch_size"] == recipe[CNN]["batch_size"] == 64
    assert stages[0]["chosen"] == 64 and "rule" not in stages[0]
    assert stages[1]["chosen"] == 64 and stages[1]["rule"] == "the ViT's" and stages[1]["acc"] == [0.8, 0.81]
    record = {
        "held_out": 50,
        "search_n": 100,
        "recipe_epochs": 2,
        "tolerance": 0.01,
        "stages": stages,
        "recipe": recipe,
        "budgets": {},
        "made_by": "t",
        "runs": 4,
        "train_cpu_s": 1.0,
    }
    assert "| batch_size | CNN | 128 | 64: 80.00, 128: 81.00 | **64** (the ViT's) |" in render(record)


def test_budget_stage_doubles_until_doubling_moves_no_model_by_a_point():
    plan = SearchPlan(100, 2, (), (1000,), 100, 10_000, 50)
    # held-out accuracy 0.9 - 7/steps for the ViT, 0.9 - 2/steps for the CNN: the ViT decides
    search, _ = _search(lambda s: 0.9 - (7 if s.model == VIT else 2) / s.steps, plan)
    budgets = search.budgets(code_recipe())
    b = budgets[1000]
    # 100 -> 200 moves the ViT 3.8 points (12 and 25 epochs of 8 batches), 200 -> 400 1.75, 400 -> 800 0.875
    assert [r["steps"] for r in b["rows"]] == [100, 200, 400] and b["steps"] == 400 and b["converged"]
    search, _ = _search(lambda s: 0.9 - 500 / s.steps, SearchPlan(100, 2, (), (1000,), 100, 800, 50))
    b = search.budgets(code_recipe())[1000]
    assert b["steps"] == 400 and not b["converged"]  # stopped at the plan's most, and says so
    record = {
        "held_out": 50,
        "search_n": 100,
        "recipe_epochs": 2,
        "tolerance": 0.01,
        "stages": [],
        "recipe": {},
        "budgets": {"1000": b},
        "made_by": "t",
        "runs": 3,
        "train_cpu_s": 1.0,
    }
    assert "| 1,000 | 400 | 800 |" in render(record) and "**not converged** (the search stopped here)" in render(record)


def test_convergence_rows_and_the_budget_table_leaves_the_verdict_alone():
    assert convergence_row("ViT", 1000, 800, [0.80, 0.82], [0.815, 0.82])["converged"]  # +0.75 points
    assert not convergence_row("ViT", 1000, 800, [0.80, 0.82], [0.83, 0.82])["converged"]  # +1.5 points
    e = EXPERIMENTS[1]
    for verdict in (Verdict(INCONCLUSIVE, "d = 1.0 +- 2.0"), Verdict(REPRODUCED, "d = 5")):
        rows = [convergence_row("a", 1000, 8, [0.8], [0.9])]  # an arm moving by 10 points at twice the budget
        o = Outcome(setup="", header=[], rows=[], verdict=verdict, convergence=rows)
        budget_table(e, o, Scale("default", (0, 1, 2)), None)
        assert o.verdict == verdict and o.convergence == rows  # information: the budget check decides "trained enough"


def test_each_comparison_has_one_step_budget_and_the_budgets_are_the_codes():
    """Every arm of a model at one training-set size trains the code's steps at one batch size, to the whole
    epoch the engine trains (a mixing run drops each epoch's short last batch: 62 batches of 4,000 images, not 63);
    claim 9 its own where it has them."""
    for scale in (Scale("default", (0, 1, 2)), Scale("quick", (0, 1))):
        for e in EXPERIMENTS:
            budgets = {}
            for s in e.plan(scale):
                if s.data.name == "fashion-mnist" and s.parent is None:
                    budgets.setdefault((s.n_train, s.model), set()).add((s.steps, s.recipe.batch_size))
            for (n, model), b in budgets.items():
                assert {batch for _, batch in b} == {shared.RECIPES[model].batch_size}, (e.name, n, b)
                per_epoch = -(-n // shared.RECIPES[model].batch_size)
                want = shared.regularised_steps(model, n, scale) if e.name == "recipe" else shared.steps_table(scale)[n]
                for steps, _ in b:
                    assert abs(steps - want) <= per_epoch / 2 + 1, (e.name, n, steps)


def test_the_code_holds_the_committed_searchs_choice():
    record = load_record()
    assert record is not None, "search.json (the recipe search's record) is missing beside search.py"
    # the recipe, claim 9's regularisation, the budgets and claim 3's learning rates in code are the search's
    assert code_holds(record) == []
    assert all(knob_recipe(code_recipe()[m]) == shared.RECIPES[m] for m in MODELS)  # the knobs are the Recipes
    # the stage doubled every budget an arm still moved at, up to its most steps, and says where it stopped
    assert record["convergence"] and all(
        (r["outcome"] == "budget") == (not r["late"]) for r in record["convergence_rounds"]
    )
    last = {(r["n_train"], r["model"]): r for r in record["convergence_rounds"]}  # each budget's last round
    late = {a for r in last.values() for a in r["late"]}
    assert all(r["converged"] or r["arm"] in late for rs in record["convergence"].values() for r in rs)
    assert code_holds({**record, "pooling": {**record["pooling"], "chosen": {"cls": 0.5, "mean": 0.5}}}) == [
        "claim 3's learning rates (claim3_cls_vs_gap.POOL_LR)"
    ]
    assert code_holds({**record, "convergence_budgets": {**record["convergence_budgets"], "1000": 1}}) == [
        "the budgets (STEPS)"
    ]
    md = render(record)
    assert "held out" in md and "| knob | model |" in md and f"{record['runs']} runs" in md
    page = Path(__file__).parents[1] / "docs" / "reproduce" / "search.md"
    assert page.read_text() == md  # the site's page is this record, rendered


def test_release_init_gives_xavier_scale_weights_and_keeps_the_zero_head():
    default_run = shared.fashion_run(VIT, 1000, 0, Scale("default", (0,)))
    spec = dataclasses.replace(default_run, recipe=default_run.recipe.replace(init="jax"))  # the search's "release"
    torch.manual_seed(0)
    model = build_model(spec, 10)
    qkv = model.blocks[0].attn.qkv.weight  # (3D, D): three D x D maps, each Xavier-uniform: std sqrt(2 / 2D)
    D = qkv.shape[1]
    for part in qkv.chunk(3, dim=0):
        assert part.std().item() == pytest.approx((2 / (2 * D)) ** 0.5, rel=0.1)
    fc1 = model.blocks[0].mlp.fc1.weight  # (M, D): std sqrt(2 / (M + D))
    assert fc1.std().item() == pytest.approx((2 / sum(fc1.shape)) ** 0.5, rel=0.1)
    assert model.cls_token.abs().max() == 0 and model.head.weight.abs().max() == 0
    assert 0 < model.blocks[0].mlp.fc1.bias.abs().max() < 1e-5
    torch.manual_seed(0)
    default = build_model(default_run, 10)
    assert default.blocks[0].mlp.fc1.weight.std() < fc1.std() / 3  # the constructor's std 0.02: 4-6x smaller


@pytest.mark.slow  # 20 s on 2 cores: the search's code path end to end
def test_tune_quick_end_to_end(tmp_path, fashion, one_thread, capsys):
    out = tmp_path / "search"
    assert main(["reproduce", "--tune", "--quick", "--workers", "1", "--out", str(out)]) == 0
    record = json.loads((out / "search.json").read_text())
    plan = PLANS["quick"]
    assert [s["knob"] for s in record["stages"]] == ["lr", "lr"] and record["held_out"] == plan.n_val
    for s in record["stages"]:
        assert s["chosen"] == s["values"][max(range(len(s["values"])), key=lambda i: s["acc"][i])]
        assert all(0 <= a <= 1 for a in s["acc"])
    assert list(record["budgets"]) == ["200"] and record["budgets"]["200"]["steps"] in (2, 4)
    assert record["convergence"] is None  # the quick scale checks no claim's budgets
    assert "# The recipe search" in (out / "search.md").read_text()
    trained = record["runs"]
    capsys.readouterr()
    assert main(["reproduce", "--tune", "--quick", "--workers", "1", "--out", str(out)]) == 0
    assert "trained" not in capsys.readouterr().out  # the second invocation reads the cache
    assert json.loads((out / "search.json").read_text())["runs"] == trained
    assert main(["reproduce", "--tune", "--quick", "--seeds", "2", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: --seeds applies to the report")
    assert set(MODELS) == {VIT, CNN}


def test_claim5_takes_the_budget_stages_rows_where_the_code_holds_its_budget():
    record = {
        "tolerance": 0.01,
        "budgets": {
            "1000": {
                "steps": 625,
                "converged": True,
                "rows": [{"steps": 625, "acc": {"ViT": [0.70, 0.705], "CNN": [0.80, 0.80]}}],
            },
            "4000": {
                "steps": 1250,
                "converged": True,
                "rows": [{"steps": 1250, "acc": {"ViT": [0.8, 0.8], "CNN": [0.8, 0.8]}}],
            },
        },
    }
    rows = budget_rows(record, {1000: 625, 4000: 2500, 60_000: 5000})  # 4,000's budget in code is not the search's
    assert [(r["arm"], r["n_train"], r["steps"], r["converged"]) for r in rows] == [
        ("ViT", 1000, 625, True),
        ("CNN", 1000, 625, True),
    ]
    # the search's 50,000 training images are the code's 60,000; a budget that did not converge says so
    full = {
        "50000": {
            "steps": 5000,
            "converged": False,
            "rows": [{"steps": 5000, "acc": {"ViT": [0.85, 0.87], "CNN": [0.91, 0.912]}}],
        }
    }
    rows = budget_rows({**record, "budgets": full}, {1000: 625, 4000: 2500, 60_000: 5000})
    assert [(r["arm"], r["n_train"], r["converged"]) for r in rows] == [("ViT", 60_000, False), ("CNN", 60_000, True)]
    data_scale = next(e for e in EXPERIMENTS if e.name == "data_scale")
    o = Outcome(setup="", header=[], rows=[], verdict=Verdict(INCONCLUSIVE, "d"))
    monkey_budgets = {**code_budgets(), 1000: 625}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(claim5_data_scale, "code_budgets", lambda: monkey_budgets)
        budget_table(data_scale, o, Scale("default", (0, 1, 2)), record)
    assert len(o.convergence) == 2 and not o.convergence_complete and "1,000 training images only" in o.convergence_note
    assert o.verdict == Verdict(INCONCLUSIVE, "d")  # the table decides nothing


def test_claim9s_regularisation_is_chosen_on_the_vit_held_out_and_each_models_budget_doubled():
    plan = dataclasses.replace(PLANS["quick"], regularisation=(640, 20), max_steps=1000)  # 10 batches of 64 an epoch
    strength = {"DeiT's": 0.02, "mixing only": 0.03, "light": 0.01}  # mixing only is best for the ViT
    names = list(shared.REGULARISATIONS)
    assert names == list(strength)

    def acc(s):
        name = next((k for k, (a, _) in shared.REGULARISATIONS.items() if _as_aug(a) == _aug(s)), None)
        # with a regulariser the ViT gains 1 point per 10 steps up to 80 steps (20 -> 40 and 40 -> 80 move it 2 and 4
        # points), the CNN 0.1 point per 10 steps (converged from the first doubling)
        return 0.7 + (strength[name] + min(s.steps, 80) / (1e3 if s.model == VIT else 1e4) if name else 0.0)

    search, cache = _search(acc, plan)
    reg = search.regularisation(code_recipe())
    assert reg["chosen"] == "mixing only" and reg["n"] == 640 and reg["steps"] == 20
    assert reg["plain"] == pytest.approx(0.7) and reg["acc"] == pytest.approx([0.74, 0.75, 0.73])
    assert [r["steps"] for r in reg["rows"]["ViT"]] == [20, 40, 80] and [r["steps"] for r in reg["rows"]["CNN"]] == [20]
    assert reg["budget"] == {"ViT": 80, "CNN": 20} and reg["converged"] == {"ViT": True, "CNN": True}
    assert reg["rows"]["ViT"][1]["acc"] == pytest.approx([0.77, 0.81])
    mixing, drop_path = shared.REGULARISATIONS["mixing only"]
    vit = [s for s in cache.trained if s.model == VIT and _aug(s) == _as_aug(mixing)]
    assert {s.steps for s in vit} == {20, 40, 80, 160} and all(dict(s.overrides)["drop_path"] == drop_path for s in vit)
    assert all(s.data.split == "search" and s.n_train == 640 for s in cache.trained)
    assert not [s for s in cache.trained if s.model == CNN and _aug(s) != _as_aug(mixing)]  # the CNN only as the chosen
    # the plan's most steps stops the doubling: the budget is then said not to have converged
    search, _ = _search(acc, dataclasses.replace(plan, max_steps=80))
    reg = search.regularisation(code_recipe())
    assert reg["budget"] == {"ViT": 40, "CNN": 20} and reg["converged"] == {"ViT": False, "CNN": True}
    record = {
        "held_out": 50,
        "search_n": 100,
        "recipe_epochs": 2,
        "tolerance": 0.01,
        "stages": [],
        "recipe": {},
        "budgets": {},
        "made_by": "t",
        "runs": 3,
        "train_cpu_s": 1.0,
        "regularisation": reg,
    }
    md = render(record)
    assert "| ViT | 40 | 80 | 77.00 -> 81.00 (+4.00) | **not converged** (the search stopped here) |" in md
    assert "| CNN | 20 | 40 | 73.20 -> 73.40 (+0.20) | **budget** |" in md
    # a tie keeps the code's choice
    search, _ = _search(lambda s: 0.7 + 0.01 * (_aug(s) != _as_aug(shared.PLAIN)), plan)
    assert search.regularisation(code_recipe())["chosen"] == shared.REGULARISATION


def test_claim9_takes_the_regularisation_stages_rows_where_the_code_holds_its_choice():
    recipe_claim = next(e for e in EXPERIMENTS if e.name == "recipe")
    n = 4000
    budget = code_regularised_budgets()[n]  # {"ViT": steps, "CNN": steps}
    rows = {
        m: [
            {"steps": b // 2, "acc": [0.79, 0.81]},
            {"steps": b, "acc": [0.81, 0.815] if m == "ViT" else [0.853, 0.864]},
        ]
        for m, b in budget.items()
    }
    reg = {
        "n": n,
        "steps": 2500,
        "plain": 0.8,
        "values": list(shared.REGULARISATIONS),
        "acc": [0.79, 0.8, 0.81],
        "chosen": shared.REGULARISATION,
        "budget": budget,
        "converged": {"ViT": True, "CNN": False},
        "rows": rows,
    }
    record = {"tolerance": 0.01, "regularisation": reg, "budgets": {}}
    o = Outcome(setup="", header=[], rows=[], verdict=Verdict(INCONCLUSIVE, "d"))
    budget_table(recipe_claim, o, Scale("default", (0, 1, 2)), record)
    assert [(r["arm"], r["n_train"], r["steps"], r["converged"]) for r in o.convergence] == [
        ("ViT + recipe", n, budget["ViT"], True),
        ("CNN + recipe", n, budget["CNN"], False),
    ]
    assert not o.convergence_complete and o.verdict == Verdict(INCONCLUSIVE, "d")
    for other in ({**reg, "chosen": "something else"}, {**reg, "budget": {m: b // 2 for m, b in budget.items()}}):
        o = Outcome(setup="", header=[], rows=[], verdict=Verdict(REPRODUCED, "d"))
        budget_table(recipe_claim, o, Scale("default", (0, 1, 2)), {**record, "regularisation": other})
        assert o.convergence == []  # a search for another regularisation, or other budgets, says nothing of this one


def test_claim9_trains_each_models_arms_at_its_own_budget_and_shares_claim5s_runs_where_it_has_none():
    claims = {e.name: e for e in EXPERIMENTS}
    scale = Scale("default", (0, 1, 2))
    runs = claims["recipe"].plan(scale)
    own = shared.REGULARISED_STEPS["default"]
    for n, models in own.items():
        for m, steps in models.items():
            mine = [s for s in runs if s.n_train == n and s.model == m]
            assert len(mine) in (3, 6) and all(abs(s.steps - steps) < 1000 for s in mine), (n, m)  # to the whole epoch
            large = [s for s in claims["recipe"].plan(Scale("large", (0,))) if s.n_train == n and s.model == m]
            assert large and all(abs(s.steps - 2 * steps) < 1000 for s in large), (n, m)
    # at the shared budget (a model without its own budget at a size) the plain runs are claim 5's
    shared_budget = {s.key for s in runs if not s.recipe.mixup and s.model not in own.get(s.n_train, {})}
    assert len(shared_budget) == 3 * sum(m not in own.get(n, {}) for n in (4000, 60_000) for m in (VIT, CNN))
    assert shared_budget <= {s.key for s in claims["data_scale"].plan(scale)}


def test_the_convergence_stage_doubles_a_sizes_budget_until_no_arm_moves_and_chooses_claim3s_learning_rates():
    """A fake search in which, at 1,000 images, the ViT without a position embedding gains 2.5 points from 2,500 to
    5,000 steps and nothing after; claim 9's ViT with the recipe at 60,000 gains up to 20,000 steps; GAP is best at the
    largest learning rate and the class token at the smallest: the stage doubles the 1,000-image budget once, claim
    9's ViT at 60,000 once, and chooses the learning rates at the budgets found."""

    def acc(s):
        ov, a = dict(s.overrides), 0.8
        if ov.get("pos_embed") == "none":
            a = 0.7 + 0.05 * min(s.steps, 4992) / 4992
        if s.model == VIT and s.recipe.mixup and s.n_train == 50_000:
            a = 0.8 + 0.05 * min(s.steps, 19_000) / 19_000
        if ov.get("pool") == "mean":
            a += 0.001 * s.lr / 1e-3
        elif s.model == VIT and s.n_train == 1000 and set(ov) <= {"patch_size", "depth"}:  # the class token
            a -= 0.001 * s.lr / 1e-3
        return a

    search, cache = _search(acc, dataclasses.replace(PLANS["default"], raise_to=20_000))
    budgets = {1000: {"steps": 2500}, 4000: {"steps": 2500}, 50_000: {"steps": 10_000}}
    reg = {"n": 4000, "budget": {"ViT": 10_000, "CNN": 2500}}
    conv = search.convergence(Scale("default", (0,)), budgets, reg)
    assert conv["budgets"] == {1000: 5000, 4000: 2500, 60_000: 10_000}
    assert conv["own_budgets"] == {4000: {"ViT": 10_000, "CNN": 2500}, 60_000: {"ViT": 20_000, "CNN": 10_000}}
    moved = [(r["n_train"], r["model"], r["budget"], r["late"]) for r in conv["rounds"] if r["late"]]
    assert moved == [
        (1000, None, 2500, ["ViT, pos_embed none"]),
        (60_000, "ViT", 10_000, ["ViT, + regularisation recipe"]),
    ]
    assert all(r["converged"] for rs in conv["claims"].values() for r in rs)  # every row at its size's budget found
    assert {r["budget"] for r in conv["claims"]["pos_embed"]} == {5000}
    assert len(conv["claims"]["cls_vs_gap"]) == 6  # claim 3's whole sweep, not only its plan's two arms
    pooling = conv["choices"]["pooling"]
    assert pooling["chosen"] == {"cls": 1e-3, "mean": 4e-3} and pooling["budget"] == 5000
    assert all(s.data.split == "search" for s in cache.trained)
    assert {s.seed for s in cache.trained} == set(CONVERGENCE_SEEDS) == {0, 1, 2}  # every arm on three seeds
    record = {
        "held_out": 50,
        "search_n": 100,
        "recipe_epochs": 2,
        "tolerance": 0.01,
        "stages": [],
        "recipe": {},
        "budgets": {},
        "made_by": "t",
        "runs": 3,
        "train_cpu_s": 1.0,
        "convergence": conv["claims"],
        "convergence_budgets": {str(n): b for n, b in conv["budgets"].items()},
        "convergence_own_budgets": {str(n): b for n, b in conv["own_budgets"].items()},
        "convergence_rounds": conv["rounds"],
        "pooling": pooling,
    }
    md = render(record)
    assert "| 1,000 | the shared budget's 14 | 2,500 | 5,000 | 2.50 | ViT, pos_embed none | doubled |" in md
    assert "| 1,000 | the shared budget's 14 | 5,000 | 10,000 | 0.00 | none | **budget** |" in md
    assert "| 60,000 | claim 9's ViT | 10,000 | 20,000 | 2.33 | ViT, + regularisation recipe | doubled |" in md
    # the plan's largest raised budget stops the doubling, and the row says it has not converged
    search, _ = _search(acc, dataclasses.replace(PLANS["default"], raise_to=4000))  # no budget raised past 4,000
    conv = search.convergence(Scale("default", (0,)), budgets, reg)
    assert conv["budgets"][1000] == 2500 and not all(r["converged"] for r in conv["claims"]["pos_embed"])
    assert [r["outcome"] for r in conv["rounds"] if r["late"]] == ["stopped", "stopped"]
    assert "**Claim 3's learning rates**" in md


def test_convergence_is_judged_on_three_seeds_the_mean_move_under_a_point_and_the_arms_standard_error():
    # seed 0 alone moves 1.5 points, the mean of three 0.23, under its standard error (0.58): converged
    row = convergence_row("a", 1000, 8, [0.80, 0.81, 0.82], [0.815, 0.805, 0.817], within_se=True)
    assert row["converged"] and row["acc_seeds"] == [0.80, 0.81, 0.82] and math.isclose(row["se"], 0.01 / math.sqrt(3))
    assert not convergence_row("a", 1000, 8, [0.80], [0.815])["converged"]  # what seed 0 alone said
    # every seed moves half a point, far beyond the seeds' noise (se 0.06 points): a real move, not converged
    assert not convergence_row("a", 1000, 8, [0.800, 0.801, 0.802], [0.805, 0.806, 0.807], within_se=True)["converged"]
    assert convergence_row("a", 1000, 8, [0.800, 0.801, 0.802], [0.805, 0.806, 0.807])["converged"]  # a point only
    assert not convergence_row("a", 1000, 8, [0.7, 0.71, 0.72], [0.75, 0.76, 0.77], within_se=True)["converged"]
    with pytest.raises(VitlabError, match="within_se"):
        convergence_row("a", 1000, 8, [0.8], [0.8], within_se=True)

    # the stage: at 1,000 images the ViT without a position embedding moves 1.5 points on seed 0 from 2,500 to 5,000
    # steps and not at all on seeds 1 and 2 (each 1 point apart): its mean moves 0.5, within its se; it is not doubled
    def acc(s):
        a = 0.8 + 0.01 * s.seed
        if dict(s.overrides).get("pos_embed") == "none" and s.n_train == 1000:
            a = 0.7 + 0.01 * s.seed + (0.015 if s.seed == 0 and s.steps > 2600 else 0.0)
        return a

    search, cache = _search(acc, PLANS["default"])
    budgets = {1000: {"steps": 2500}, 4000: {"steps": 2500}, 50_000: {"steps": 10_000}}
    conv = search.convergence(Scale("default", (0,)), budgets, {"n": 4000, "budget": {"ViT": 10_000, "CNN": 2500}})
    assert conv["budgets"][1000] == 2500 and not any(r["late"] for r in conv["rounds"])
    (row,) = [r for r in conv["claims"]["pos_embed"] if r["arm"] == "ViT, pos_embed none" and r["n_train"] == 1000]
    assert row["acc_2x_seeds"][0] - row["acc_seeds"][0] == pytest.approx(0.015) and row["converged"]
    assert math.isclose(row["acc_2x"] - row["acc"], 0.005) and row["se"] == pytest.approx(0.01 / math.sqrt(3))
    assert {e.name for e in EXPERIMENTS} >= {"compute", "resolution"}
    assert not set(conv["claims"]) & {"compute", "resolution"}  # claims 10 and 11 fix their budgets otherwise
    md = render({**_record_of(conv), "convergence_rounds": conv["rounds"]})
    assert "| pos_embed | ViT, pos_embed none | 1,000 | 2,496 | 3 | 71.00 | 71.50 | +0.50 | 0.58 | yes |" in md


def _record_of(conv: dict) -> dict:
    return {
        "held_out": 50,
        "search_n": 100,
        "recipe_epochs": 2,
        "tolerance": 0.01,
        "stages": [],
        "recipe": {},
        "budgets": {},
        "made_by": "t",
        "runs": 3,
        "train_cpu_s": 1.0,
        "convergence": conv["claims"],
        "convergence_budgets": {str(n): b for n, b in conv["budgets"].items()},
        "convergence_own_budgets": {str(n): b for n, b in conv["own_budgets"].items()},
    }


def test_claim3_trains_each_pooling_at_the_searchs_learning_rate_and_the_search_the_whole_sweep():
    from vitlab.experiments.reproduce.claims.claim3_cls_vs_gap import POOL_LR, sweep

    claim3 = next(e for e in EXPERIMENTS if e.name == "cls_vs_gap")
    scale = Scale("default", (0, 1, 2))
    pos_embed = next(e for e in EXPERIMENTS if e.name == "pos_embed")
    plan = claim3.plan(scale)[:10]  # the poolings' runs; then claim 2's, whose effect sets the tolerance
    assert claim3.plan(scale)[10:] == pos_embed.plan(scale)
    assert {(dict(s.overrides).get("pool", "cls"), s.lr) for s in plan} == set(POOL_LR.items())
    assert claim3.search_plan is sweep and len(sweep(scale)) == 30  # 2 poolings x 3 lrs x 5 seeds (shared.SEEDS_AT)
    assert {s.key for s in plan} <= {s.key for s in sweep(scale)}  # the chosen arms are runs of the sweep
