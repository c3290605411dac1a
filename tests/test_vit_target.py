"""The search towards a ViT at 90.5% (benchmarks/vit_target.py): its committed record is its committed runs, and
docs/claims.md quotes the record. Nothing trains: the runs are read from docs/reproduce/vit-target/cache."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vitlab.experiments.reproduce.runs import RunCache

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "reproduce" / "vit-target"
_spec = importlib.util.spec_from_file_location("vit_target", ROOT / "benchmarks" / "vit_target.py")
vit_target = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vit_target)
RECORD = json.loads((FOLDER / "vit_target.json").read_text())
CACHE = RunCache(FOLDER / "cache")


def section() -> str:
    text = (ROOT / "docs" / "claims.md").read_text()
    return text.split("**Towards a ViT at 90.5% on the test images.**")[1].split("\n## ")[0]


def test_every_held_out_row_is_its_candidates_committed_run():
    """Each row names a candidate the benchmark still builds to the same run (the same cache key), and its numbers
    are that run's record."""
    assert len(RECORD["rows"]) >= 6
    for row in RECORD["rows"]:
        run = vit_target.candidate_run(row["candidate"])
        assert run.key == row["key"], row["candidate"]
        result = CACHE.result(run)
        assert row["acc"] == result["val_acc"] and row["params"] == result["params"], row["candidate"]
        assert run.data.split == "search" and run.data.n_val == 10_000  # held out, never the test images


def test_the_docs_table_quotes_the_record():
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in section().splitlines() if "|" in line}
    for row in RECORD["rows"]:
        cells = rows[row["candidate"]]
        assert cells[1] == f"{100 * row['acc']:.2f}", row["candidate"]
        assert cells[3] == f"{100 * row['train_acc']:.1f}" and cells[5].strip(" |") == f"{row['train_cpu_min']:.1f}", (
            row["candidate"]
        )


@pytest.mark.parametrize("name", sorted(RECORD.get("tested", {})))
def test_a_tested_candidate_is_its_runs_on_the_test_images_and_the_docs_quote_it(name):
    """The test seeds are the candidate at 60,000 training images, tested on the 10,000 test images, and the shared
    ViT they are compared with is the report's own runs (claim 5's, the same keys)."""
    tested = RECORD["tested"][name]
    report = RunCache(vit_target.REPORT_CACHE)
    for seed, acc, base in zip(tested["seeds"], tested["test_acc"], tested["shared_vit_test_acc"], strict=True):
        run = vit_target.test_run(name, seed)
        assert run.n_train == 60_000 and run.data.split != "search" and run.data.n_val == 10_000
        assert CACHE.result(run)["val_acc"] == acc
        assert report.result(vit_target.test_run("the shared ViT", seed))["val_acc"] == base
    assert f"{tested['interval']}" in section() and f"a mean of {100 * tested['mean']:.2f}%" in section()


def test_the_held_out_winner_is_tested_and_the_docs_say_whether_it_reaches_the_target():
    """The candidate with the best held-out accuracy is the one tested at 60,000 images, and the docs' "reached"
    follows its mean test accuracy."""
    best = max(RECORD["rows"], key=lambda row: row["acc"])["candidate"]
    tested = RECORD["tested"][best]
    reached = tested["mean"] >= vit_target.TARGET
    assert ("the target of 90.5% is reached" in section()) == reached
    if reached:  # and the README quotes it
        assert f"reaches {tested['interval']} % on 60,000" in (ROOT / "README.md").read_text()
