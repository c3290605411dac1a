"""Claims 10 and 11 of `vitlab reproduce`: claim 10's plan (every model at 60,000 images for the same steps, the
shared runs claim 5's), its training compute (the FLOP counter's figure per image times the images seen), its frontier
arithmetic and its verdict on made-up accuracies; claim 11's three arms differing only in how the parent's position
table comes over; the cache keys of the runs described before `Run.pos_embed`; `--only` selecting them and naming
nothing being an error; and `--quick --only 10,11` end to end."""

from __future__ import annotations

import csv
import dataclasses
import math
import re

import pytest
import torch
from safetensors.torch import load, save

from vitlab.analysis.flops import count_macs, forward_flops
from vitlab.cli import main
from vitlab.data.memory import BatchTransform, ImageTensors, MemoryLoader
from vitlab.errors import VitlabError
from vitlab.experiments.reproduce import Scale
from vitlab.experiments.reproduce.claims import claim5_data_scale, claim6_pretrain, select
from vitlab.experiments.reproduce.claims import claim10_compute as c10
from vitlab.experiments.reproduce.claims import claim11_resolution as c11
from vitlab.experiments.reproduce.claims.shared import CNN, STEPS, VIT, fashion_run
from vitlab.experiments.reproduce.runs import Run, build_model, start_model
from vitlab.experiments.reproduce.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from vitlab.runtime import seed_everything
from vitlab.weights.plan import resample_pos_embed

DEFAULT = Scale("default", (0, 1, 2))


def test_claim10_trains_every_model_on_60000_images_for_the_same_steps_and_reuses_claim5s_shared_runs():
    plan = c10.EXPERIMENT.plan(DEFAULT)
    assert len(plan) == len(c10.POINTS) + 4  # one seed per model, three at the shared ViT and CNN
    assert {r.n_train for r in plan} == {60_000} and len({r.steps for r in plan}) == 1
    assert abs(plan[0].steps - STEPS["default"][60_000]) < 60_000 / 64  # the shared budget, to the whole epoch
    families = {f: [lab for lab, (fam, _, _) in c10.POINTS.items() if fam == f] for f in c10.FAMILIES}
    assert all(3 <= len(labels) <= 5 for labels in families.values())
    claim5 = {r.key for r in claim5_data_scale.EXPERIMENT.plan(DEFAULT)}
    shared = {fashion_run(m, 60_000, s, DEFAULT).key for m in (VIT, CNN) for s in DEFAULT.seeds}
    assert shared <= {r.key for r in plan} and shared <= claim5  # claim 5's runs: trained once for both claims
    # claim 4's patch-size comparison at 60,000: the shared ViT and the same model at P=4, nothing else different
    p4 = c10._run("ViT P=4 D64 L6", 0, DEFAULT)
    assert p4 == fashion_run(VIT, 60_000, 0, DEFAULT, overrides={"patch_size": 4})
    assert c10.EXPERIMENT.search_plan(DEFAULT) == []  # the search's convergence stage does not train these models


def test_a_runs_training_flops_are_the_counters_figure_per_image_times_the_images_seen():
    quick = Scale("quick", (0, 1))
    for label in ("ViT P=7 D32 L2", "hybrid w8 D32 L2", "CNN w8"):
        run = c10._run(label, 0, quick)
        model = build_model(run, 10)
        per_image = forward_flops(model, torch.zeros(1, 1, 28, 28))
        # the images a run sees: what its loader yields over its epochs
        data = ImageTensors(torch.zeros(run.n_train, 1, 28, 28, dtype=torch.uint8), torch.zeros(run.n_train))
        loader = MemoryLoader(data, BatchTransform(size=(28, 28), mean=[0.5], std=[0.5], channels=1), batch_size=64)
        seen = run.epochs * sum(len(y) for _, y in loader)
        assert c10.images_seen(run) == seen == run.epochs * 400
        assert c10.run_flops(run, model) == 3 * per_image * seen
        if label.startswith("ViT"):
            assert per_image == count_macs(model.cfg).flops  # and the analytic count agrees
    with torch.device("meta"):  # a shapes-only model counts the same
        meta = build_model(run, 10)
    assert c10.run_flops(run, meta) == c10.run_flops(run, model)


def test_the_frontier_is_read_off_on_log_compute_and_each_models_interval_spreads_as_its_own_seeds():
    P = c10.Point
    front = [P("a", "ViT", 1e9, [0.80], 1), P("b", "ViT", 1e11, [0.90], 1)]
    w = c10.read_off(front, 1e10)  # halfway on log compute
    assert w == pytest.approx({"a": 0.5, "b": 0.5})
    assert c10.read_off(front, 1e9) == pytest.approx({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="outside"):
        c10.read_off(front, 1e12)
    diff = c10.combination([(1.0, w), (-1.0, {"a": 1.0})])  # the frontier at 1e10 less point a
    assert diff == pytest.approx({"a": -0.5, "b": 0.5})
    est = c10.estimate_of(diff, {"a": [0.79, 0.80, 0.81], "b": [0.88, 0.90, 0.92]})
    assert est.d == pytest.approx(0.05) and est.n == 3
    # each model its own spread: (0.5 x 0.01)^2 / 3 + (0.5 x 0.02)^2 / 3, Welch-Satterthwaite df
    v_a, v_b = (0.5 * 0.01) ** 2 / 3, (0.5 * 0.02) ** 2 / 3
    assert est.se == pytest.approx(math.sqrt(v_a + v_b))
    assert est.df == pytest.approx((v_a + v_b) ** 2 / (v_a**2 / 2 + v_b**2 / 2))
    why = c10.estimate_of(diff, {"a": [0.8, 0.81, 0.82], "b": [0.9]})  # a model it reads has one seed
    assert why == "fewer than 3 seeds at a model it reads: b (1)"
    assert c10.estimate_of({"a": 1.0, "b": 0.0}, {"a": [0.8, 0.81, 0.82], "b": [0.9]}).d == pytest.approx(0.81)


def test_a_model_below_a_cheaper_one_of_its_family_is_named_and_the_envelope_read_beside_the_rule():
    P = c10.Point
    fronts = {
        "ViT": [P("v1", "ViT", 1e9, [0.80], 1), P("v2", "ViT", 1e10, [0.90], 1), P("v3", "ViT", 1e11, [0.85], 1)],
        "hybrid": [P("h1", "hybrid", 1e9, [0.90], 1), P("h2", "hybrid", 1e11, [0.95], 1)],
        "CNN": [P("c1", "CNN", 1e9, [0.90], 1), P("c2", "CNN", 1e11, [0.92], 1)],
    }
    assert c10.envelope(fronts["ViT"]) == {"v1": 0.80, "v2": 0.90, "v3": 0.90}
    note = c10.below_cheaper(fronts)
    assert "1 model(s)" in note and "v3 (85.0% against 90.0%)" in note and "h2" not in note
    # the envelope's lead at 1e11: log(0.10 / 0.05) = +0.693; at 1e9: log(0.20 / 0.10) = +0.693; change 0
    assert "+0.693 at 1e+09 FLOPs and +0.693 at 1e+11 FLOPs, a change of +0.000" in note
    fronts["ViT"][2] = P("v3", "ViT", 1e11, [0.95], 1)
    assert c10.below_cheaper(fronts) == ""


class FakeResults:
    """Claim 10's results, made up: the accuracy `acc(label, seed)` of every run of its plan."""

    def __init__(self, acc, scale):
        self.by_key = {}
        for label in c10.POINTS:
            for s in scale.seeds:
                self.by_key[c10._run(label, s, scale).key] = acc(label, s)

    def __getitem__(self, run):
        return {"val_acc": self.by_key[run.key], "num_classes": 10, "params": 1}

    def acc(self, runs):
        return [self[r]["val_acc"] for r in runs]


def test_claim10s_verdict_on_made_up_accuracies(tmp_path):
    """ViTs gaining 2 points per decade of compute, CNNs 3 points below them, hybrids ahead of the ViTs by a lead
    that shrinks by about 2 points (reproduced) or grows by about 2 (not reproduced) across the compute they share;
    every model's seeds 0.1 points apart."""
    flops = {}
    for label in c10.POINTS:
        with torch.device("meta"):
            run = c10._run(label, 0, DEFAULT)
            flops[label] = c10.run_flops(run, build_model(run, 10))

    def make(lead_grows: bool):
        def acc(label, seed):
            family = c10.POINTS[label][0]
            x = math.log10(flops[label]) - 13
            a = 0.85 + 0.02 * x + 0.001 * seed
            if family == c10.CNN_F:
                a -= 0.03
            if family == c10.HYBRID_F:
                a += 0.01 + 0.03 * x if lead_grows else 0.03 * (1 - x)
            return a

        return acc

    def points(acc, seeds=(0, 1, 2)):
        return [
            c10.Point(label, c10.POINTS[label][0], flops[label], [acc(label, s) for s in seeds], 1) for label in flops
        ]

    verdict = c10.verdict_of(points(make(False)))  # three seeds at every model
    assert verdict.status == REPRODUCED, verdict.detail
    verdict = c10.verdict_of(points(make(True)))
    assert verdict.status == NOT_REPRODUCED and verdict.detail.startswith(f"(1) {NOT_REPRODUCED}")
    # the plan's one seed per model (three at the shared ViT): both parts inconclusive by rule, whatever the numbers
    out = c10.EXPERIMENT.analyze(DEFAULT, FakeResults(make(False), DEFAULT), tmp_path)
    assert out.verdict.status == INCONCLUSIVE and out.verdict.detail.count("inconclusive by rule") == 2
    assert (tmp_path / "claim10_compute.png").stat().st_size > 0
    assert len(out.rows) == len(c10.POINTS) and "P=4" in out.notes


def _tiny_parent() -> tuple[Run, tuple[int, bytes]]:
    quick = Scale("quick", (0, 1))
    parent = fashion_run(VIT, 400, 0, quick, overrides={"depth": 1, "dim": 16, "mlp_dim": 32, "patch_size": c11.PATCH})
    parent = dataclasses.replace(parent, data=dataclasses.replace(parent.data, img_size=c11.LOW))
    seed_everything(0)
    model = build_model(parent, 10)
    with torch.no_grad():  # a table unlike any fresh one, as a trained one is
        model.pos_embed.copy_(torch.linspace(-1, 1, model.pos_embed.numel()).reshape(model.pos_embed.shape))
    return parent, (10, save({k: v.contiguous() for k, v in model.state_dict().items()}))


def test_claim11s_arms_differ_only_in_how_the_parents_position_table_comes_over():
    parent, weights = _tiny_parent()
    quick = Scale("quick", (0, 1))
    runs = {carry if size == 28 else "16 px": c11._finetune(parent, size, carry, quick) for _, size, carry in c11.ARMS}
    models = {}
    for name, run in runs.items():
        seed_everything(run.seed)  # as train_run does
        models[name] = start_model(run, weights, 10)
    sd = {name: m.state_dict() for name, m in models.items()}
    parent_sd = load(weights[1])
    a, b, c = sd["interpolate"], sd["reinit"], sd["16 px"]
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        if k != "pos_embed":
            assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
            if not k.startswith("head."):
                assert torch.equal(a[k], parent_sd[k]), k  # loaded from the parent
    assert not models["interpolate"].head.weight.any()  # a new zero head (Section 3.2)
    assert a["pos_embed"].shape == (1, 1 + 7 * 7, 16) and c["pos_embed"].shape == (1, 1 + 4 * 4, 16)
    assert torch.equal(a["pos_embed"], resample_pos_embed(parent_sd["pos_embed"], (7, 7)))  # (a) interpolated
    assert torch.equal(c["pos_embed"], parent_sd["pos_embed"])  # (c) the parent's own
    fresh = b["pos_embed"]  # (b) a new table: truncated normal, std 0.02, nothing of the parent's
    assert fresh.shape == a["pos_embed"].shape and not torch.allclose(fresh, a["pos_embed"])
    assert 0.015 < fresh.std().item() < 0.025 and fresh.abs().max().item() < 0.1
    assert models["interpolate"].cfg.img_size == (28, 28) and models["16 px"].cfg.img_size == (16, 16)
    assert models["interpolate"].cfg.patch_size == models["16 px"].cfg.patch_size == 4  # Section 3.2: kept
    assert {r.recipe for r in runs.values()} == {runs["reinit"].recipe}  # the same budget, lr and batch for each


def test_pos_embed_keeps_every_earlier_runs_key_and_is_checked():
    # the keys of runs described before the field (claim 5's shared ViT at 60,000; claim 6's first fine-tuning run)
    assert fashion_run(VIT, 60_000, 0, DEFAULT).key == "a30c37b4dbadab1a"
    ft = next(r for r in claim6_pretrain.EXPERIMENT.plan(DEFAULT) if r.parent is not None)
    assert ft.key == "393738c6ddb19015" and "pos_embed" not in ft.to_dict()
    reinit = dataclasses.replace(ft, pos_embed="reinit")
    assert reinit.key != ft.key and reinit.to_dict()["pos_embed"] == "reinit"
    with pytest.raises(VitlabError, match="pos_embed must be one of interpolate, reinit"):
        dataclasses.replace(ft, pos_embed="zero")
    with pytest.raises(VitlabError, match="without a parent"):
        dataclasses.replace(ft, parent=None, pos_embed="reinit")
    plan = c11.EXPERIMENT.plan(DEFAULT)
    assert {r.parent.key for r in plan} == {p.key for p in c11.parents(DEFAULT)} and len(c11.parents(DEFAULT)) == 3
    for p in c11.parents(DEFAULT):  # the shared ViT at patch 4 on the 60,000 images at 16 px, the shared budget
        shared = fashion_run(VIT, 60_000, p.seed, DEFAULT)
        assert (p.data.img_size, p.data.n_train, build_model(p, 10).cfg.patch_size) == (16, 60_000, 4)
        assert p.recipe == shared.recipe and p.key != shared.key
    assert sorted((r.data.img_size, r.pos_embed) for r in plan) == sorted(
        [(28, "interpolate"), (28, "reinit"), (16, "interpolate")] * 3
    )


def test_only_selects_claims_10_and_11_and_naming_nothing_is_a_one_line_error(tmp_path, capsys):
    assert [e.number for e in select("10,11")] == [10, 11]
    assert [e.name for e in select("resolution, compute")] == ["compute", "resolution"]
    with pytest.raises(VitlabError, match="no experiment named"):
        select(",,,")
    assert main(["reproduce", "--quick", "--only", ",,,", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "',,,'" in err
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.slow  # 40 s on 2 cores; the quick report of every claim (test_reproduce.py) renders both claims too
def test_quick_only_10_11_end_to_end(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["reproduce", "--quick", "--no-progress", "--only", "10,11", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "## 10. " in md and "## 11. " in md and "## 9. " not in md
    assert re.search(r"!\[claim 10\]\(figures/claim10_compute\.png\)", md)
    assert re.search(r"!\[claim 11\]\(figures/claim11_resolution\.png\)", md)
    rows = list(csv.DictReader((out / "results" / "claim10_compute.csv").open()))
    # one row per model at seed 0, and the shared ViT's and CNN's second quick seed
    assert len(rows) == len(c10.POINTS) + len(c10.ALL_SEEDS) and all(float(r["train_flops"]) > 0 for r in rows)
    assert sorted(r["seed"] for r in rows if r["model"] in c10.ALL_SEEDS) == ["0", "0", "1", "1"]
    rows = list(csv.DictReader((out / "results" / "claim11_resolution.csv").open()))
    assert sorted({r["img_size"] for r in rows}) == ["16", "28"] and len(rows) == 4 * 2
