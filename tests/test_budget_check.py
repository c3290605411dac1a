"""The budget check and the fragile test (`vitlab reproduce --check-budgets`): the rule on constructed verdicts,
which seeds the leave-one-seed-out test leaves out, the marks a verdict row gets from a record, that the committed
record is of the code's runs, and that every verdict row of the report carries the three marks."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest
import torch

from vitlab.experiments.reproduce import EXPERIMENTS, INCONCLUSIVE, REPRODUCED, Scale, budgetcheck
from vitlab.experiments.reproduce.claims.base import Outcome
from vitlab.experiments.reproduce.report import MARKS, after_results, render_html, render_markdown
from vitlab.experiments.reproduce.verdicts import Part, Verdict

CLAIMS = {e.number: e for e in EXPERIMENTS}


def _verdict(status: str, *parts: tuple) -> Verdict:
    return Verdict(status, "d", tuple(Part(f"part {i}", status, "close", *p) for i, p in enumerate(parts)))


# a part: (d, lo, hi, bound, n)
@pytest.mark.parametrize(
    ("at_2x", "expected"),
    [
        (_verdict(REPRODUCED, (0.014, 0.0, 0.03, 0.03, 3)), budgetcheck.CHECKED),  # moved 0.004 < 0.015
        (_verdict(REPRODUCED, (0.026, 0.0, 0.03, 0.03, 3)), budgetcheck.FAILED),  # moved 0.016 >= half the tolerance
        (_verdict(INCONCLUSIVE, (0.012, 0.0, 0.03, 0.03, 3)), budgetcheck.FAILED),  # the verdict moved
        (_verdict(REPRODUCED, (0.01, 0.0, 0.03, 0.03, 3), (0.0, 0.0, 0.0, None, 3)), budgetcheck.FAILED),  # a part more
    ],
)
def test_a_budget_is_checked_when_no_part_moves_by_half_its_bound_and_the_verdict_stands(at_2x, expected):
    at_1x = _verdict(REPRODUCED, (0.01, 0.0, 0.03, 0.03, 3))
    status, rows = budgetcheck.compare(at_1x, at_2x)
    assert status == expected
    assert rows[0]["allowed"] == pytest.approx(0.015) and rows[0]["moved"] == pytest.approx(
        abs(at_2x.parts[0].d - 0.01)
    )


def test_without_a_margin_the_allowance_is_half_the_parts_own_interval():
    greater = Part("a - b", REPRODUCED, "greater", 0.05, 0.02, 0.08, 0.0, 5)  # margin 0: half the width, 0.03
    assert budgetcheck.allowance(greater) == pytest.approx(0.03)
    moved = dataclasses.replace(greater, d=0.081)  # by 0.031
    assert budgetcheck.compare(Verdict(REPRODUCED, "", (greater,)), Verdict(REPRODUCED, "", (moved,)))[0] == "failed"
    still = dataclasses.replace(greater, lo=0.05, hi=0.05)  # every seed alike: no width, and no move either
    assert budgetcheck.compare(Verdict(REPRODUCED, "", (still,)), Verdict(REPRODUCED, "", (still,)))[0] == "checked"
    # a verdict written by hand, without numbers, is compared by its status alone
    assert budgetcheck.compare(Verdict(REPRODUCED, "x"), Verdict(REPRODUCED, "y"))[0] == "checked"
    assert budgetcheck.compare(Verdict(REPRODUCED, "x"), Verdict(INCONCLUSIVE, "x"))[0] == "failed"


def test_leave_one_seed_out_leaves_out_only_seeds_whose_arms_keep_three():
    scale = Scale("default", budgetcheck.SEEDS)
    assert budgetcheck.droppable(CLAIMS[3], scale) == [0, 1, 2, 3, 4]  # every arm at 1,000 images: five seeds
    assert budgetcheck.droppable(CLAIMS[5], scale) == [3, 4]  # its 4,000 and 60,000 arms have three
    assert budgetcheck.droppable(CLAIMS[8], scale) == []
    without_2 = Scale("default", (0, 1), dropped=(2,))
    assert {s.recipe.seed for s in CLAIMS[3].plan(without_2)} == {0, 1, 3, 4}


def test_a_row_is_not_checked_without_a_record_of_the_codes_runs():
    e = CLAIMS[4]
    assert budgetcheck.marks(e, Scale("default", (0, 1, 2)), None)["budget"] == budgetcheck.NOT_CHECKED
    at_1x, at_2x = budgetcheck.scales()
    entry = {
        "title": e.title,
        "plan": budgetcheck.fingerprint(e, Scale("default", budgetcheck.SEEDS)),
        "fragile": {"status": budgetcheck.FRAGILE},
        "budget": {
            "status": budgetcheck.CHECKED,
            "verdict": [REPRODUCED, REPRODUCED],
            "parts": [{"what": "a - b", "moved": 0.001, "allowed": 0.01}],
            "plan_1x": budgetcheck.fingerprint(e, at_1x),
            "plan_2x": budgetcheck.fingerprint(e, at_2x),
            "cpu_s_2x": 60.0,
            "runs_2x": 2,
        },
    }
    record = {"claims": {"4": entry}}
    m = budgetcheck.marks(e, Scale("default", (0, 1, 2)), record)
    assert (m["budget"], m["fragile"]) == (budgetcheck.CHECKED, budgetcheck.FRAGILE) and "a - b" in m["text"]
    stale = {"claims": {"4": {**entry, "plan": "0", "budget": {**entry["budget"], "plan_2x": "0"}}}}
    m = budgetcheck.marks(e, Scale("default", (0, 1, 2)), stale)
    assert (m["budget"], m["fragile"]) == (budgetcheck.NOT_CHECKED, budgetcheck.UNTESTED)
    assert budgetcheck.marks(e, Scale("quick", (0, 1)), record)["budget"] == budgetcheck.NOT_CHECKED


def test_the_committed_check_is_of_the_codes_runs_and_says_what_it_found():
    record = budgetcheck.load_record()
    assert record is not None and record["seeds"] == list(budgetcheck.SEEDS)
    for number, entry in record["claims"].items():
        e = CLAIMS[int(number)]
        m = budgetcheck.marks(e, Scale("default", budgetcheck.SEEDS), record)
        assert m["budget"] == entry["budget"]["status"], f"claim {number}: the check is of other runs; run it again"
        assert entry["fragile"]["status"] in (budgetcheck.FRAGILE, budgetcheck.ROBUST, budgetcheck.UNTESTED)
        b = entry["budget"]
        if "parts" in b:  # the status is the rule's on the parts it records
            within = all(p["within"] for p in b["parts"]) and b["verdict"][0] == b["verdict"][1]
            assert b["status"] == (budgetcheck.CHECKED if within else budgetcheck.FAILED), number
        else:  # not run by rule, or only its leave-one-seed-out test has (--fragile-only)
            assert b["status"] == budgetcheck.NOT_CHECKED
            assert int(number) in budgetcheck.NOT_RUN or b["why"] == budgetcheck.NOT_YET, number
    for number in budgetcheck.NOT_RUN:
        assert budgetcheck.marks(CLAIMS[number], Scale("default", (0, 1, 2)), record)["budget"] == "not checked"


def test_every_verdict_row_carries_the_three_marks(tmp_path):
    record = budgetcheck.load_record()
    outcomes = []
    for e in EXPERIMENTS:
        o = Outcome(setup="s", header=["a"], rows=[["1"]], verdict=Verdict(REPRODUCED, "d"))
        o.marks = budgetcheck.marks(e, Scale("default", (0, 1, 2)), record)
        outcomes.append((e, o))
    meta = {"scale": "default", "seeds": 3, "device": "cpu", "torch": torch.__version__, "runs": 1, "trained": 1}
    meta |= {"estimate_s": 1.0, "elapsed_s": 1.0, "workers": 1, "claims": [e.number for e in EXPERIMENTS]}
    md, html = render_markdown(outcomes, meta), render_html(outcomes, meta, tmp_path)
    rows = [line for line in md.split("## Verdicts")[1].split("\n## ")[0].splitlines() if line.startswith("| ")]
    assert rows[0] == "| # | claim | source | verdict | " + " | ".join(MARKS) + " | v1 |"
    for (e, o), row in zip(outcomes, rows[1:], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4:7] == [
            o.marks["budget"],
            o.marks["fragile"],
            f"[{after_results(e.number)}](#history-{e.number})",
        ]
        assert f'<a id="history-{e.number}"></a>' in md and f"id='history-{e.number}'" in html
    changed = sum(after_results(e.number) == "yes" for e in EXPERIMENTS)
    assert f"**Rules changed after results: {changed} of 11 claims" in md and "Fixed before the results" not in md


def test_fragile_only_reads_the_reports_runs_alone_and_keeps_a_budget_check_on_record(tmp_path):
    report = Scale("default", budgetcheck.SEEDS)
    alone = budgetcheck.runs_to_check([CLAIMS[5]], budgets=False)
    both = budgetcheck.runs_to_check([CLAIMS[5]])
    assert {s.key for s in alone} == {s.key for s in CLAIMS[5].plan(report)} < {s.key for s in both}

    class Claim:  # a claim with no runs, whose verdict reads reproduced however many seeds it keeps
        number, name, title = 5, "fake", "A fake claim"

        def plan(self, scale):
            return []

        def analyze(self, scale, results, figures):
            return Outcome(setup="s", header=["a"], rows=[["1"]], verdict=Verdict(REPRODUCED, "d"))

    (tmp_path / "cache").mkdir()
    kept = budgetcheck.load_record()["claims"]["4"]["budget"]  # a check on record (claim 4's: failed)
    (tmp_path / "budget_check.json").write_text(json.dumps({"seeds": [0, 1, 2], "claims": {"5": {"budget": kept}}}))

    def train(todo):
        raise AssertionError(f"trained {len(todo)} runs")

    record = budgetcheck.check(tmp_path, [Claim()], torch.device("cpu"), train, log=lambda _: None, budgets=False)
    assert record["claims"]["5"]["budget"] == kept and record["claims"]["5"]["fragile"]["verdict"] == REPRODUCED
    (tmp_path / "budget_check.json").unlink()
    record = budgetcheck.check(tmp_path, [Claim()], torch.device("cpu"), train, log=lambda _: None, budgets=False)
    assert record["claims"]["5"]["budget"] == {"status": budgetcheck.NOT_CHECKED, "why": budgetcheck.NOT_YET}
    assert budgetcheck.NOT_YET in (tmp_path / "budget_check.md").read_text()


def test_the_committed_check_is_the_one_beside_the_report():
    """`--check-budgets --out docs/reproduce` merges into docs/reproduce/budget_check.json; the report reads the copy
    in the package, which must be the same."""
    docs = budgetcheck.RECORD.parents[4] / "docs" / "reproduce"
    assert (docs / "budget_check.json").read_text() == budgetcheck.RECORD.read_text()
    assert (docs / "budget_check.md").read_text() == budgetcheck.render(budgetcheck.load_record())


def test_a_replicate_is_pooled_seed_by_seed_and_its_verdict_read_from_its_csvs(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(
        "pool,lr,seed,val_acc,probe_5shot_acc,digits_probe_5shot_acc\ncls,0.001,0,0.70,0.60,0.4\ncls,0.001,1,0.80,0.70,0.5\n"
    )
    b.write_text("pool,lr,seed,val_acc,probe_5shot_acc\ncls,0.001,1,0.90,0.72\ncls,0.001,0,0.72,0.64\n")
    rows = list(csv.DictReader(io.StringIO(budgetcheck._pooled(a, b))))
    assert [(r["seed"], float(r["val_acc"]), float(r["probe_5shot_acc"])) for r in rows] == [
        ("0", pytest.approx(0.71), pytest.approx(0.62)),
        ("1", pytest.approx(0.85), pytest.approx(0.71)),
    ]
    assert [r["digits_probe_5shot_acc"] for r in rows] == ["", ""]  # measured by one of the two: not pooled
    docs = budgetcheck.RECORD.parents[4] / "docs" / "reproduce"
    zen4 = budgetcheck.replicate_verdict(3, docs / "zen4-claim3", docs)  # the Zen 4 rerun under claim 3's rule now
    assert zen4.status == INCONCLUSIVE and len(zen4.parts) == 2 and zen4.parts[0].d == pytest.approx(0.011, abs=5e-4)
    pooled = budgetcheck.replicate_verdict(3, docs / "zen4-claim3", docs, pooled=True)
    assert pooled.parts[0].d == pytest.approx((zen4.parts[0].d + 0.0128) / 2, abs=5e-4)  # the Xeon's is +1.28 points


@pytest.mark.parametrize("page", ["README.md", "docs/claims.md"])
def test_the_readme_and_the_claims_page_show_the_reports_verdicts_and_marks(page):
    root = budgetcheck.RECORD.parents[4]

    def rows(text: str) -> list[list[str]]:  # (number, verdict, budget, fragile, changed after results, v1)
        out = []
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and cells[0].isdigit() and len(cells) >= 7:
                out.append([cells[0]] + [c.split("](")[0].lstrip("[") for c in cells[-5:]])
        return out

    report = (root / "docs" / "reproduce" / "report.md").read_text().split("## Verdicts")[1].split("\n## ")[0]
    shown = (root / page).read_text().split("| # | claim | verdict (v2 rules) | budget |")[1].split("\n\n")[0]
    assert rows(shown) == rows(report) and len(rows(report)) == len(EXPERIMENTS)
