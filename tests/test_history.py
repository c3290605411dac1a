"""The claims' history (history.json): it loads checked, renders, covers every claim, and says what the repository's
log says: every commit exists with its date, and every verdict before a change is the one its report committed."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.history import HISTORY_FILE, load, render
from vitlab.experiments.reproduce.verdicts import NOT_REPRODUCED

ROOT = Path(__file__).resolve().parents[1]


def test_every_claim_switched_to_v2_in_one_change_after_results():
    history = load()
    assert sorted(history) == list(range(1, 12))
    assert all(h[0].what.startswith("claim added") and not h[0].after_results for h in (history[10], history[11]))
    v2 = {n: [c for c in history[n] if c.what.startswith("verdict rules v2")] for n in range(1, 10)}
    assert all(len(c) == 1 for c in v2.values()), v2
    assert len({c[0].commit for c in v2.values()}) == 1  # one change for all
    assert all(c[0].date == "2026-12-03" and c[0].after_results for c in v2.values())


def test_the_seeds_and_claim_9s_regularisation_are_on_the_record():
    history = load()
    seeds = {n for n, changes in history.items() for c in changes if "five seeds at 1,000 images" in c.what}
    assert seeds == {2, 3, 4, 5, 7}
    assert any("stochastic depth" in c.what and "CNN" in c.what and c.after_results for c in history[9])


def test_the_known_changes_after_results():
    history = load()
    # claim 2's margin: 3 points until 8e09c62, after the synthetic report's "not reproduced" under it
    margin = next(c for c in history[2] if c.commit == "8e09c62")
    assert "margin 3 points" in margin.what and margin.verdict_before == NOT_REPRODUCED and margin.after_results
    for n in (2, 3, 6, 9):  # changed after a committed result, before v2
        assert any(c.after_results and c.commit != history[n][-1].commit for c in history[n]), n


def test_render_is_a_table_per_claim():
    for n in range(1, 12):
        table = render(n)
        lines = table.splitlines()
        assert lines[0] == "| date | commit | what changed | why | after results | verdict before |"
        assert len(lines) == 2 + len(load()[n])
        assert all(line.count(" | ") == 5 for line in lines[2:])  # no stray cell separators
    assert "| 2026-11-30 | `8e09c62` |" in render(2) and "not reproduced at this scale (report 9399359)" in render(2)
    with pytest.raises(VitlabError, match="claim_number must be one of 1, 2"):
        render(12)


def _write(tmp_path, claims) -> Path:
    p = tmp_path / "history.json"
    p.write_text(json.dumps({"claims": claims}))
    return p


def test_load_refuses_a_bad_record(tmp_path):
    good = json.loads(HISTORY_FILE.read_text())["claims"]
    with pytest.raises(VitlabError, match="expected"):
        load(_write(tmp_path, {k: v for k, v in good.items() if k != "9"}))
    entry = dict(good["1"][0])
    for broken, message in [
        ({**entry, "verdict_before": "reproduced"}, "come together"),
        ({**entry, "commit": "HEAD"}, "hex digits"),
        ({**entry, "date": "30.11.2026"}, "YYYY-MM-DD"),
        ({k: v for k, v in entry.items() if k != "why"}, "expected the fields"),
        ({**entry, "verdict_before": "reproduced", "report": "881c0bf", "after_results": False}, "after_results: true"),
    ]:
        with pytest.raises(VitlabError, match=message):
            load(_write(tmp_path, {**good, "1": [broken]}))
    with pytest.raises(VitlabError, match="date order"):
        load(_write(tmp_path, {**good, "1": list(reversed(good["1"]))}))
    with pytest.raises(VitlabError, match="non-empty list"):
        load(_write(tmp_path, {**good, "4": []}))


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_the_record_is_the_repositorys_log():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout here (an installed package or a source archive): commit ids cannot be checked")
    history = load()
    for n, changes in history.items():
        for c in changes:
            assert _git("cat-file", "-e", f"{c.commit}^{{commit}}").returncode == 0, (n, c.commit)
            assert _git("show", "-s", "--format=%ad", "--date=short", c.commit).stdout.strip() == c.date, (n, c.commit)
            if c.report is None:
                continue
            shown = _git("show", f"{c.report}:docs/reproduce/results/verdicts.csv")
            assert shown.returncode == 0, (n, c.report)
            verdict = {int(r["claim"]): r["verdict"] for r in csv.DictReader(io.StringIO(shown.stdout))}
            assert verdict[n] == c.verdict_before, (n, c.commit, c.report)
            older = _git("merge-base", "--is-ancestor", c.report, c.commit)
            assert older.returncode == 0, f"claim {n}: report {c.report} is not before {c.commit}"
            between = _git("rev-list", f"{c.report}..{c.commit}^", "--", "docs/reproduce/results/verdicts.csv")
            assert between.stdout.strip() == "", f"claim {n}: a later report than {c.report} came before {c.commit}"
