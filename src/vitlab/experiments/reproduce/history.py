"""The record of changes to each claim: every change to a claim's rule, arms, budgets or choices since the rules were
first committed, with whether a committed result had been seen before it and, if so, the verdict that result gave
(history.json beside this module, read from the repository's log; `render` is the table in each claim's section of
the report).

    commit         the change, as the repository's log names it
    date           its date (YYYY-MM-DD)
    what           what changed
    why            the reason the log gives (or that it gives none)
    verdict_before the verdict of the last committed report before the change (null: none of that claim yet)
    report         the commit of that report (null with verdict_before)
    after_results  whether a result had been seen before the change: true, false, or null where the log does not say
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from vitlab.errors import VitlabError
from vitlab.experiments.reproduce.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

HISTORY_FILE = Path(__file__).with_name("history.json")
CLAIMS = range(1, 12)
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Change:
    commit: str
    date: str
    what: str
    why: str
    verdict_before: str | None
    report: str | None
    after_results: bool | None


FIELDS = tuple(Change.__dataclass_fields__)


def _change(entry: object, where: str) -> Change:
    """One entry, checked: its fields, their types and formats, and that a verdict comes with its report."""
    if not isinstance(entry, dict) or set(entry) != set(FIELDS):
        found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise VitlabError(f"{where}: expected the fields {', '.join(FIELDS)}; found {found}")
    c = Change(**entry)
    if not isinstance(c.commit, str) or not _COMMIT.fullmatch(c.commit):
        raise VitlabError(f"{where}: commit must be 7-40 lowercase hex digits; found {c.commit!r}")
    if not isinstance(c.date, str) or not _DATE.fullmatch(c.date):
        raise VitlabError(f"{where}: date must be YYYY-MM-DD; found {c.date!r}")
    for name in ("what", "why"):
        if not isinstance(getattr(c, name), str) or not getattr(c, name).strip():
            raise VitlabError(f"{where}: {name} must be a non-empty string; found {getattr(c, name)!r}")
    if c.verdict_before not in (None, REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE):
        raise VitlabError(f"{where}: verdict_before must be a verdict or null; found {c.verdict_before!r}")
    if (c.verdict_before is None) != (c.report is None):
        raise VitlabError(f"{where}: verdict_before and report come together; found {c.verdict_before!r}, {c.report!r}")
    if c.report is not None and not (isinstance(c.report, str) and _COMMIT.fullmatch(c.report)):
        raise VitlabError(f"{where}: report must be a commit id; found {c.report!r}")
    if c.after_results not in (True, False, None):
        raise VitlabError(f"{where}: after_results must be true, false or null; found {c.after_results!r}")
    if c.verdict_before is not None and c.after_results is not True:
        raise VitlabError(f"{where}: a change after a committed report's verdict is after_results: true")
    return c


def load(path: Path = HISTORY_FILE) -> dict[int, list[Change]]:
    """{claim number: its changes in date order}, every claim 1-11 with at least one, checked."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise VitlabError(f"{path}: cannot read the claims' history ({err})") from err
    claims = raw.get("claims") if isinstance(raw, dict) else None
    if not isinstance(claims, dict) or sorted(claims, key=str) != sorted(map(str, CLAIMS)):
        found = sorted(claims) if isinstance(claims, dict) else type(claims).__name__
        raise VitlabError(f'{path}: expected {{"claims": {{"1": [...], ..., "11": [...]}}}}; found claims {found}')
    out = {}
    for n in CLAIMS:
        entries = claims[str(n)]
        if not isinstance(entries, list) or not entries:
            raise VitlabError(f"{path}: claim {n} must have a non-empty list of changes; found {entries!r}")
        changes = [_change(e, f"{path}: claim {n}, entry {i + 1}") for i, e in enumerate(entries)]
        if [c.date for c in changes] != sorted(c.date for c in changes):
            raise VitlabError(f"{path}: claim {n}'s changes must be in date order; found {[c.date for c in changes]}")
        out[n] = changes
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(claim_number: int, history: dict[int, list[Change]] | None = None) -> str:
    """The claim's changes as a Markdown table, oldest first."""
    history = load() if history is None else history
    if claim_number not in history:
        raise VitlabError(f"claim_number must be one of {', '.join(map(str, sorted(history)))}; found {claim_number!r}")
    seen = {True: "yes", False: "no", None: "not recorded"}
    rows = ["| date | commit | what changed | why | after results | verdict before |", "|---|---|---|---|---|---|"]
    for c in history[claim_number]:
        before = f"{c.verdict_before} (report {c.report})" if c.verdict_before else "-"
        rows.append(
            f"| {c.date} | `{c.commit}` | {_cell(c.what)} | {_cell(c.why)} | {seen[c.after_results]} | {before} |"
        )
    return "\n".join(rows)
