"""`vitlab reproduce`: the verdict rules on hand-made numbers, the plans (claims share the data-scale runs;
the scales differ only in size), and the --quick report end to end (its structure, claim 1 reproduced,
and a second run served from the cache)."""

from __future__ import annotations

import ast
import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.cli import main
from vitlab.data.memory import MemoryLoader
from vitlab.data.subsets import DIGITS_HELD_OUT, experiment_splits
from vitlab.errors import VitlabError
from vitlab.experiments.reproduce import (
    EXPERIMENTS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Scale,
    at_least_v1,
    close_v1,
    combine,
    greater_v1,
    near_v1,
    pe_structure,
    runner,
    search,
)
from vitlab.experiments.reproduce.claims import claim6_pretrain as claim6
from vitlab.experiments.reproduce.claims.shared import FASHION_VIT, digits_data
from vitlab.experiments.reproduce.records import keep_records
from vitlab.experiments.reproduce.runner import claim_costs
from vitlab.experiments.reproduce.runs import RunCache, all_runs, transforms
from vitlab.speed.machine import this_machine
from vitlab.train.engine import evaluate

# ----------------------------------------------------------------------------------------------------
# The v1 verdict rules (the committed report's; kept beside v2) on hand-made numbers


def test_v1_greater_rule():
    assert greater_v1([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], 0.03).status == REPRODUCED
    # no difference, measured precisely: confidently less than the claimed 3-point advantage
    assert greater_v1([0.80, 0.81, 0.82], [0.80, 0.81, 0.82], 0.03).status == NOT_REPRODUCED
    # a 5-point difference drowned in seed noise
    assert greater_v1([0.70, 0.95, 0.80], [0.60, 0.90, 0.80], 0.0).status == INCONCLUSIVE
    # significant but smaller than the margin, and the interval still reaches the margin
    assert greater_v1([0.82, 0.83, 0.84], [0.80, 0.81, 0.82], 0.03).status == INCONCLUSIVE
    assert greater_v1([0.95], [0.5], 0.0).status == INCONCLUSIVE  # one seed: no error bar, no verdict
    assert greater_v1([1.0, 2.0, 3.0], 0.0, 0.0, unit="px").status == REPRODUCED  # one-sample form


def test_v1_close_at_least_near_and_combine():
    assert close_v1([0.80, 0.81, 0.82], [0.81, 0.82, 0.83], 0.03).status == REPRODUCED
    assert close_v1([0.70, 0.71, 0.72], [0.80, 0.81, 0.82], 0.03).status == NOT_REPRODUCED
    assert close_v1([0.70, 0.80, 0.90], [0.80, 0.90, 1.00], 0.03).status == INCONCLUSIVE
    # equal at chance: says nothing
    assert close_v1([0.25, 0.26], [0.25, 0.25], 0.03, floor=0.28).status == INCONCLUSIVE
    assert close_v1([0.95, 0.96], [0.95, 0.95], 0.03, floor=0.28).status == REPRODUCED
    assert at_least_v1([0.96, 0.97], 0.95).status == REPRODUCED
    assert at_least_v1([0.80, 0.81], 0.95).status == NOT_REPRODUCED
    assert near_v1([0.50, 0.52], 0.5, 0.05).status == REPRODUCED
    assert near_v1([0.90, 0.91], 0.5, 0.05).status == NOT_REPRODUCED
    r, n, i = greater_v1([0.9, 0.91], [0.5, 0.51]), greater_v1([0.5, 0.51], [0.9, 0.91]), greater_v1([0.9], [0.5])
    assert combine(r, r).status == REPRODUCED
    assert combine(r, i).status == INCONCLUSIVE
    assert combine(r, i, n).status == NOT_REPRODUCED


def test_pe_structure_separates_2d_from_1d_embeddings():
    from vitlab.models.vit import sincos_2d_embedding

    g = (8, 8)
    pe = torch.nn.functional.normalize(sincos_2d_embedding(g, 64), dim=-1)
    vertical, far = pe_structure(pe @ pe.T, g)
    assert vertical - far > 0.1  # a 2-D embedding: vertical neighbours alike, far positions not
    idx = torch.arange(64.0)[:, None]  # a 1-D embedding of the raster index: vertical neighbours are 8 apart
    pe1 = torch.nn.functional.normalize(
        torch.cat(
            [torch.sin(idx / 4 ** (k / 8)) for k in range(8)] + [torch.cos(idx / 4 ** (k / 8)) for k in range(8)], dim=1
        ),
        dim=-1,
    )
    v1, f1 = pe_structure(pe1 @ pe1.T, g)
    assert (vertical - far) > (v1 - f1)


# ----------------------------------------------------------------------------------------------------
# The plans


def _fashion_runs(plan):
    return [s for s in plan if s.data.name == "fashion-mnist"]


def test_claims_reuse_the_data_scale_runs_and_each_comparison_has_one_budget():
    scale = Scale("default", (0, 1, 2))
    plans = {e.name: e.plan(scale) for e in EXPERIMENTS}
    grid = {s.key for s in plans["data_scale"]}
    assert sorted({s.n_train for s in plans["data_scale"]}) == [1000, 4000, 60_000]
    assert {s.seed for s in plans["data_scale"] if s.n_train > 1000} == {0, 1, 2}
    assert {s.seed for s in plans["data_scale"] if s.n_train == 1000} == {0, 1, 2, 3, 4}  # shared.SEEDS_AT
    # the hybrid's conv stem downsamples by powers of 2: its ViT arm is the shared ViT only at such a patch size
    P = FASHION_VIT["patch_size"]
    for name in ("pos_embed", "cls_vs_gap", "patch_size", "attention", "recipe") + (
        ("hybrid",) if P & (P - 1) == 0 else ()
    ):
        e = next(e for e in EXPERIMENTS if e.name == name)  # claim 3's: in the sweep the search chooses its lrs from
        assert grid & {s.key for s in (e.search_plan or e.plan)(scale)}, (
            f"{name}'s baseline arm is not a data-scale run"
        )
        budgets = {}
        for s in _fashion_runs(plans[name]):
            budgets.setdefault((s.n_train, s.model), set()).add((s.recipe.batch_size, s.recipe.weight_decay))
        assert all(len(b) == 1 for b in budgets.values()), (name, budgets)  # every arm of a model at one N: one recipe
    assert {s.key for s in plans["attention"]} <= grid  # Figure 7 is read off claim 5's ViTs on all 60,000
    assert {s.parent.key for s in plans["pretrain"] if s.parent is not None} <= grid
    assert max(s.n_train for s in plans["attention"]) == 60_000


def test_the_large_scale_trains_the_same_arms_longer():
    default, large = Scale("default", (0, 1, 2)), Scale("large", (0, 1, 2))
    for e in EXPERIMENTS:
        a, b = _fashion_runs(e.plan(default)), _fashion_runs(e.plan(large))
        same = lambda s: (s.model, s.overrides, s.recipe.replace(epochs=1, warmup_epochs=0), s.n_train)  # noqa: E731
        assert [same(s) for s in a] == [same(s) for s in b], e.name
        per_epoch = lambda s: -(-s.n_train // s.recipe.batch_size)  # noqa: E731
        assert all(abs(y.steps - 2 * x.steps) <= 2 * per_epoch(x) for x, y in zip(a, b)), e.name


# ----------------------------------------------------------------------------------------------------
# The --quick report, end to end (about 3 minutes on 2 CPU cores)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory, fashion):
    out = tmp_path_factory.mktemp("reproduce") / "tmp"
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(out)]) == 0
    return out


def test_quick_report_has_every_claim_with_a_verdict(quick_report):
    md = (quick_report / "report.md").read_text()
    html = (quick_report / "report.html").read_text()
    statuses = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    for e in EXPERIMENTS:
        section = md.split(f"## {e.number}. {e.title}")[1].split("\n## ")[0]
        verdict = re.search(r"\*\*Verdict: (.+?)\.\*\*", section)
        assert verdict and verdict.group(1) in statuses, e.name
        assert "Source:" in section and "**Rule.**" in section and "| " in section  # quote, rule, table
        assert re.search(r"!\[claim \d+\]\(figures/.+\.png\)", section)
        assert f"id='claim{e.number}'" in html
        rows = list(csv.reader((quick_report / "results" / f"claim{e.number}_{e.name}.csv").open()))
        assert len(rows) >= 3  # a header and per-seed rows
    assert html.count("data:image/png;base64,") >= len(EXPERIMENTS)  # self-contained: figures embedded
    assert "src='figures/" not in html
    verdicts = {r["name"]: r["verdict"] for r in csv.DictReader((quick_report / "results" / "verdicts.csv").open())}
    assert set(verdicts) == {e.name for e in EXPERIMENTS}
    assert verdicts["x_pos_embed"] == REPRODUCED  # dataset X >= 95%, and chance without position embedding
    claim1 = md.split("## 1. ")[1].split("\n## ")[0]  # its budget against twice it, per arm
    assert "**Budget.**" in claim1 and re.search(
        r"\| position embedding learned \| 2,000 \| \d+ \| 100\.00 \| 100\.00 \| \+0\.00 \| yes \|", claim1
    )


def test_claims_2_and_3_report_a_transfer_probe_beside_the_same_dataset_one(quick_report):
    """Each of their models' features probed on the digits, per seed in the CSV, and a table saying the models are
    the report's own and what decides. (Before test_second_run_reads_the_cache renders claims 1 and 8 alone.)"""
    md = (quick_report / "report.md").read_text()
    for number, name in ((2, "pos_embed"), (3, "cls_vs_gap")):
        rows = list(csv.DictReader((quick_report / "results" / f"claim{number}_{name}.csv").open()))
        transfer = [float(r["digits_probe_2shot_acc"]) for r in rows]
        same = [float(r["probe_2shot_acc"]) for r in rows]
        assert all(0.0 < t <= 1.0 for t in transfer) and transfer != same  # another dataset, another number
        section = md.split(f"## {number}. ")[1].split("\n## ")[0]
        assert "**Transfer probe (not part of the rule)" in section and "the models: this report's runs" in section
        assert "What decides: the rule's two parts" in section


def test_the_report_says_where_the_time_went_from_the_runs_own_records(quick_report):
    """Each run keeps the seconds the invocation priced it at beside the time it took (training and the final
    evaluation); the report's table adds them up per claim, each run once, in the first claim that plans it."""
    scale, cache = Scale("quick", (0, 1)), RunCache(quick_report / "cache")
    records = [cache.result(s) for s in all_runs([s for e in EXPERIMENTS for s in e.plan(scale)])]
    assert all(r["estimate_s"] > 0 and r["eval_cpu_s"] > 0 and r["eval_time_s"] > 0 for r in records)
    t = runner.time_by_claim(EXPERIMENTS, scale, cache, torch.device("cpu"))
    took = [r["train_cpu_s"] + r["eval_cpu_s"] for r in records]
    assert t["clock"] == "cpu" and t["without_eval"] == 0
    assert t["machines"] == {this_machine().describe(): len(records)}  # the CPU that trained them, by name
    assert sum(r["runs"] for r in t["rows"]) == len(records)
    assert sum(r["took_s"] for r in t["rows"]) == pytest.approx(t["took_s"]) == pytest.approx(sum(took))
    assert sum(r["estimate_s"] for r in t["rows"]) == pytest.approx(sum(r["estimate_s"] for r in records))
    assert next(r for r in t["rows"] if r["claim"] == 8)["runs"] == 0  # Figure 7 reads claim 5's runs
    md = (quick_report / "report.md").read_text()
    section = md.split("## Where the time went")[1].split("\n## ")[0]
    all_row = re.search(r"\|  \| all \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", section)
    assert all_row and int(all_row.group(1)) == len(records)
    assert float(all_row.group(2)) == pytest.approx(sum(took) / 60, abs=0.051)
    assert float(all_row.group(4)) == pytest.approx(sum(took) / sum(r["estimate_s"] for r in records), abs=0.006)


def test_a_dry_run_prices_what_the_cache_lacks_and_writes_nothing(quick_report, tmp_path, capsys):
    stamps = {p: p.stat().st_mtime_ns for p in quick_report.rglob("*")}
    capsys.readouterr()
    assert main(["reproduce", "--quick", "--dry-run", "--only", "1", "--out", str(quick_report)]) == 0
    out = capsys.readouterr().out
    planned = len(all_runs(EXPERIMENTS[0].plan(Scale("quick", (0, 1)))))
    assert f"1 experiment(s), {planned} training run(s), {planned} cached; estimated 0 s" in out
    assert {p: p.stat().st_mtime_ns for p in quick_report.rglob("*")} == stamps  # nothing written
    fresh = tmp_path / "new"
    assert main(["reproduce", "--quick", "--dry-run", "--only", "1", "--out", str(fresh)]) == 0
    estimate = re.search(rf"{planned} training run\(s\), 0 cached; estimated (\d+) s", capsys.readouterr().out)
    assert estimate and int(estimate.group(1)) > 0 and not fresh.exists()
    assert main(["reproduce", "--tune", "--dry-run", "--out", str(fresh)]) == 2
    assert "--dry-run applies to the report, not to --tune" in capsys.readouterr().err


def test_second_run_reads_the_cache(quick_report, capsys):
    results = sorted((quick_report / "cache" / "runs").glob("*/result.json"))
    stamps = [p.stat().st_mtime_ns for p in results]
    capsys.readouterr()
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(quick_report), "--only", "x_pos_embed,8"]) == 0
    out = capsys.readouterr().out
    assert "0 run(s) trained" in out and "cached" in out
    assert [p.stat().st_mtime_ns for p in results] == stamps  # nothing retrained
    assert sorted((quick_report / "cache" / "runs").glob("*/result.json")) == results
    md = (quick_report / "report.md").read_text()
    assert "## 1." in md and "## 8." in md and "## 2." not in md  # --only selects the report's claims
    assert "Made by `vitlab reproduce --quick --only 1,8 --out DIR`." in md  # and its command line says so
    trained = json.loads((quick_report / "cache" / "invocation.json").read_text())  # the time of the training run
    assert trained["trained"] > 0 and trained["elapsed_s"] > 0
    assert "all read from the cache" in md and f"the {trained['trained']} trained by an earlier invocation" in md


def test_a_finished_run_is_a_vitlab_run_folder_that_create_model_loads(quick_report):
    run = EXPERIMENTS[0].plan(Scale("quick", (0, 1)))[0]  # claim 1: the ViT on dataset X
    folder = RunCache(quick_report / "cache").folder(run)
    assert {p.name for p in folder.iterdir()} == {"last.json", "best.json", "checkpoints", "result.json"}
    model = vitlab.create_model(checkpoint=folder)  # through every checkpoint check
    assert model.cfg.pos_embed == "learned" and model.pretrained_cfg.crop_pct == 1.0
    _, val, _ = experiment_splits(run.data, run.seed)
    loader = MemoryLoader(val, transforms(run, model, val.size)[1], batch_size=500)
    acc = evaluate(model, loader, device=torch.device("cpu"))["val_acc"]
    assert acc == pytest.approx(json.loads((folder / "result.json").read_text())["val_acc"], abs=1e-6)


def test_a_report_kept_as_records_renders_again_and_says_which_weights_it_lacks(quick_report, tmp_path, capsys):
    """A committed report's cache keeps every run's record and the weights only of the runs something reads
    (claim 8 loads its models; claim 1's are read as results): rendered again from the records, nothing trains and
    every verdict is the same; asking for a model whose weights were not kept is one error naming its folder."""
    scale, chosen = Scale("quick", (0, 1)), [e for e in EXPERIMENTS if e.number in (1, 8)]
    copied, with_weights = keep_records(quick_report, tmp_path / "kept", scale, chosen)
    cache = RunCache(tmp_path / "kept" / "cache")
    claim1, claim8 = (all_runs(e.plan(scale)) for e in chosen)
    assert copied == len(claim1) + len(claim8) and with_weights == len(claim8)
    assert all(cache.has(s) and not cache.has_weights(s) for s in claim1)
    assert all(cache.has_weights(s) for s in claim8)
    for ask in (cache.load_model, cache.weights):
        with pytest.raises(VitlabError, match=r"kept without its weights .* delete .* to train it again"):
            ask(claim1[0])
    capsys.readouterr()
    args = ["reproduce", "--quick", "--only", "1,8", "--no-progress", "--out", str(tmp_path / "kept")]
    assert main(args) == 0  # the folder is marked as a report's: no --force
    assert "0 run(s) trained" in capsys.readouterr().out
    verdicts = [(r["name"], r["verdict"]) for r in csv.DictReader((tmp_path / "kept/results/verdicts.csv").open())]
    before = {r["name"]: r["verdict"] for r in csv.DictReader((quick_report / "results" / "verdicts.csv").open())}
    assert verdicts == [(n, before[n]) for n in ("x_pos_embed", "attention")]
    shutil.copytree(quick_report / "cache" / "runs", tmp_path / "own" / "cache" / "runs")  # every weight
    assert keep_records(tmp_path / "own", tmp_path / "own", scale, chosen) == (copied, with_weights)  # in place
    own = RunCache(tmp_path / "own" / "cache")
    assert not any(own.has_weights(s) for s in claim1) and all(own.has_weights(s) for s in claim8)


def test_the_generic_code_names_no_claim():
    """runner.py and search.py import no claim module and compare nothing with a claim's name: what is particular
    to a claim is a hook on its Experiment."""
    names = {e.name for e in EXPERIMENTS}
    for module in (runner, search):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if re.search(r"claims\.claim\d", m or "")], module.__name__
        compared = {
            c.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Compare)
            for c in [n.left, *n.comparators]
            if isinstance(c, ast.Constant)
        }
        assert not compared & names, (module.__name__, compared & names)


def test_unknown_experiment_or_two_scales_is_a_one_line_error(tmp_path, capsys):
    assert main(["reproduce", "--quick", "--only", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "x_pos_embed" in err and "nope" in err
    assert main(["reproduce", "--quick", "--scale", "large", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scale: not allowed with argument --quick" in err


def test_the_command_line_scale_is_default_unless_asked(monkeypatch, tmp_path):
    """`vitlab reproduce --out DIR` alone runs the default scale (the report's command)."""
    import vitlab.experiments.reproduce as library

    seen = {}
    monkeypatch.setattr(library, "reproduce", lambda out, **kw: seen.update(kw))  # what `vitlab reproduce` runs
    for argv, scale in ([], "default"), (["--quick"], "quick"), (["--scale", "large"], "large"):
        assert main(["reproduce", *argv, "--out", str(tmp_path / "r")]) == 0
        assert seen["scale"] == scale


def test_the_estimate_by_claim_counts_each_run_once_in_the_first_claim_that_plans_it():
    scale = Scale("default", (0, 1, 2))
    runs = all_runs([s for e in EXPERIMENTS for s in e.plan(scale)])
    costs = {s.key: float(s.steps * s.recipe.batch_size) for s in runs}  # any price per run
    by = {e.name: t for e, t in claim_costs(EXPERIMENTS, scale, costs)}
    assert sum(by.values()) == pytest.approx(sum(costs.values()))
    assert by["attention"] == 0  # Figure 7 reads claim 5's ViTs, counted there
    assert by["cls_vs_gap"] > 0 and by["recipe"] > 0
    shared_vit = {s.key for s in next(e for e in EXPERIMENTS if e.name == "pos_embed").plan(scale)}
    assert by["pos_embed"] == pytest.approx(sum(costs[k] for k in shared_vit))  # the 1,000-image ViT counted in claim 2


def test_claim6_chooses_each_arms_lr_on_held_out_digits_never_on_the_verdicts(tmp_path):
    scale = Scale("default", (0, 1, 2))
    train, verdict, _ = experiment_splits(digits_data(scale), 1)
    train2, held, _ = experiment_splits(digits_data(scale, held_out=True), 1)
    rows = lambda t: {bytes(x.numpy().tobytes()) for x in t.images}  # noqa: E731
    assert len(held) == DIGITS_HELD_OUT and len(verdict) == 1797 - 500 - DIGITS_HELD_OUT
    assert torch.equal(train.images, train2.images) and not rows(held) & rows(verdict) and not rows(train) & rows(held)

    class Fake:  # held out, lr 3e-4 is better for both arms; on the verdict's digits, 1e-3 would be
        def __getitem__(self, s):
            held_out = s.data.split == "held_out"
            base = 0.9 if s.parent is not None else 0.8
            return {"val_acc": base + (0.01 if (s.lr == 3e-4) == held_out else 0.0) + 0.001 * s.seed}

        def acc(self, specs):
            return [self[s]["val_acc"] for s in specs]

        def digits_probe(self, spec, digits, scale, *, random_init):  # frozen features: not part of the rule
            assert digits.split == "test" and spec.data.name == "fashion-mnist"
            return {5: {"test_acc": 0.5 if random_init else 0.7}}

    o = claim6.EXPERIMENT.analyze(scale, Fake(), tmp_path)
    chosen = [r[:2] for r in o.rows if r[-1] == "chosen (held out)"]
    assert chosen == [["fine-tuned", "0.0003"], ["from scratch", "0.0003"]]
    assert "(lr 0.0003) - from scratch (lr 0.0003)" in o.verdict.detail
    assert {s.data.split for s in claim6._plan(scale)} == {"held_out", "test"}
    probe = dict(zip(o.tables[0][1], o.tables[0][2][0]))  # the 5-shot row of the digits probe table
    assert [v.split(" ")[0] for k, v in probe.items() if "ViT" in k] == ["70.0", "50.0"]
