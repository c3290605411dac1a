"""Whether each claim's verdict is trained enough and stands on its seeds: the budget check and the
leave-one-seed-out test, a stage of its own (`vitlab reproduce --check-budgets`, like the recipe search's
`--tune`), run once per recipe; its record (`budget_check.json` beside this module, the committed one) is
what the report's verdict table reads.

**The budget check** (fixed before any run at twice the budget was seen). A claim's budget is *checked* when,
with every arm of its plan trained for twice its budget (the large scale: shared.steps_table, every
budget doubled) on seeds 0, 1 and 2, and the same arms at the budget on the same seeds:
  - each part of its verdict (`Verdict.parts`: the contrast d a rule decides on) moves by less than half
    the part's margin or tolerance, or, where the part has none (a margin of 0, a threshold, a count), by
    less than half the width of its own interval at the budget; and
  - the claim's verdict (reproduced / not reproduced / inconclusive) is the same at both budgets.
A contrast that does not move at all is within, however narrow its interval (added after claim 1's first check
read "failed": its every seed at 100% at both budgets, so its interval had no width to move in).
It *failed* when either does not hold, and is *not checked* where it has not run for the code's plan (its
record is of other runs) or cannot run (claim 10, whose points do not all have three seeds). Each arm's accuracy
at the budget and at twice it stays in the claim's Budget table as information; it decides nothing.

**Fragile** (fixed before the leave-one-seed-out verdicts were seen). The report's verdict, recomputed with
one seed left out of every arm that trains it, for each seed whose arms keep three or more without it (a t-interval
on two seeds, at df 1, flips a verdict by its width alone: so the five seeds of the 1,000-image arms, and none of
a claim whose arms all have three), is *fragile* when any of those verdicts differs from it, or when a replicate of
the claim (the same code and seeds trained on another kind of CPU, REPLICATES) decides otherwise; *robust* when none
does; *untested* where no seed can be left out and there is no replicate. A replicate is pooled with the report's
runs seed by seed (each seed's number the mean of the two machines' runs of it: another CPU's rounding is a
second draw of the same seed's noise, not a new seed), and the verdict is fragile
when the replicate's own verdict or the pooled one differs from the report's. The report's verdict itself stays the
one of its own runs (a replicate is kept as its CSVs, not as a run cache the report reads); the pooled one is in this
record beside it.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from vitlab.experiments.reproduce import recompute
from vitlab.experiments.reproduce.claims.base import Experiment, Outcome, Results, Scale
from vitlab.experiments.reproduce.runs import RunCache, all_runs, machine_of
from vitlab.experiments.reproduce.verdicts import Part, Verdict
from vitlab.fileio import write_json, write_text

RECORD = Path(__file__).with_name("budget_check.json")  # the committed check, which the report reads
SEEDS = (0, 1, 2)  # the check's seeds, every arm's (its arms at 1,000 images have no more)
CHECKED, FAILED, NOT_CHECKED = "checked", "failed", "not checked"
FRAGILE, ROBUST, UNTESTED = "fragile", "robust", "untested"
# Claims the check does not run, and why (their verdict row reads "not checked").
NOT_RUN = {10: "its points do not all have three seeds yet (the P=4 ViT has one)"}
NOT_YET = "its runs at twice the budget are not trained yet (only its leave-one-seed-out test has run)"
# Replicates: a claim trained again, the same code and seeds, on another kind of CPU, kept as a report folder beside
# the report's (its results/*.csv): {claim: [(the CPU, the folder)]}. The report's own runs are a 2-core Intel Xeon
# with AMX's. A replicate's verdict is the claim's rule on its per-seed numbers (`recompute`), a claim it did not train
# (claim 3 reads claim 2's runs for its tolerance) read from the report's.
# The AVX-512 EPYC's rerun of claims 2 and 3 (kept with their probes, so that the report reads the transfer probes of
# those runs from it) gives claim 3's numbers of the Zen 4 rerun bit for bit.
EPYC = ("a 2-core AMD EPYC with AVX-512 and bf16", "epyc-claims2-3")
REPLICATES: dict[int, list[tuple[str, str]]] = {2: [EPYC], 3: [("a 2-core AMD EPYC (Zen 4)", "zen4-claim3"), EPYC]}


def replicate_caches(report: Path) -> list[tuple[str, RunCache]]:
    """(CPU, run cache) of each replicate folder beside `report` that keeps its run records (cache/runs), once each:
    where a claim's analysis reads the probe of a run the report keeps without its weights (`Results`)."""
    folders = dict(sorted({(f, cpu) for reps in REPLICATES.values() for cpu, f in reps}))
    return [
        (cpu, RunCache(report / f / "cache")) for f, cpu in folders.items() if (report / f / "cache" / "runs").is_dir()
    ]


def replicate_verdict(number: int, replicate: Path, report: Path, pooled: bool = False) -> Verdict:
    """The claim's verdict on the replicate folder's CSVs, the others' from the report folder's; `pooled`: on each
    seed's numbers averaged over the report's runs and the replicate's."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        shutil.copytree(report / "results", results)
        for f in (replicate / "results").glob("claim*.csv"):
            rows = _pooled(report / "results" / f.name, f) if pooled else f.read_text()
            (results / f.name).write_text(rows)
        return recompute.CLAIMS[number](Path(tmp))


def _pooled(a: Path, b: Path) -> str:
    """CSV text: the rows of `a`, each numeric column the mean of `a`'s and `b`'s rows of the same key (every
    column that is not a measurement: the arm, its learning rate, the seed); a measurement `b` lacks is left empty
    (no rule reads one: a replicate older than the column)."""
    ra, rb = list(csv.DictReader(a.open())), list(csv.DictReader(b.open()))
    measured = [c for c in ra[0] if c.endswith("_acc") and c in rb[0]]
    key = [c for c in ra[0] if not c.endswith("_acc")]
    lacking = {c: "" for c in ra[0] if c.endswith("_acc") and c not in rb[0]}
    other = {tuple(r[c] for c in key): r for r in rb}
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(ra[0]))
    w.writeheader()
    for r in ra:
        twin = other[tuple(r[c] for c in key)]
        w.writerow({**r, **lacking, **{c: (float(r[c]) + float(twin[c])) / 2 for c in measured}})
    return out.getvalue()


def scales() -> tuple[Scale, Scale]:
    """The check's two scales: every arm at its budget, and at twice it, on SEEDS alone."""
    return Scale("default", SEEDS, more_seeds=False), Scale("large", SEEDS, more_seeds=False)


def fingerprint(e: Experiment, scale: Scale) -> str:
    """What a record is of: a hash of the claim's runs at `scale` (changed by any change to an arm, budget or seed)."""
    keys = sorted(s.key for s in all_runs(e.plan(scale)))
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def allowance(part: Part) -> float:
    """How far a part's contrast may move at twice the budget: half its margin or tolerance, else half its interval's
    width (nan where the part has no numbers)."""
    if part.bound:
        return part.bound / 2
    return (part.hi - part.lo) / 2


def compare(at_1x: Verdict, at_2x: Verdict) -> tuple[str, list[dict]]:
    """The budget check's rule on one claim's verdict at its budget and at twice it: (CHECKED or FAILED, its parts
    side by side, each with how far it moved and how far it may)."""
    p1, p2 = at_1x.part_list(), at_2x.part_list()
    rows, ok = [], at_1x.status == at_2x.status and len(p1) == len(p2)
    for a, b in zip(p1, p2, strict=False):
        moved, may = abs(b.d - a.d), allowance(a)
        numbers = not (math.isnan(moved) or math.isnan(may))
        # a part without numbers: by its status; one that does not move at all is within however narrow its interval
        fine = (moved < may or moved == 0) if numbers else a.status == b.status
        ok = ok and fine
        rows.append(
            {
                "what": a.what,
                "rule": a.rule,
                "status": [a.status, b.status],
                "d": [_num(a.d), _num(b.d)],
                "interval": [_num(a.lo), _num(a.hi)],
                "bound": a.bound,
                "moved": _num(moved),
                "allowed": _num(may),
                "within": fine,
            }
        )
    return (CHECKED if ok else FAILED), rows


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def analyze(e: Experiment, scale: Scale, results: Results) -> Outcome:
    """The claim's analysis at `scale`, its figures drawn into a folder that is removed again."""
    with tempfile.TemporaryDirectory(dir=results.cache.cache_dir) as figures:
        return e.analyze(scale, results, Path(figures))


def droppable(e: Experiment, scale: Scale) -> list[int]:
    """The seeds the leave-one-seed-out test leaves out: each one whose every arm keeps three or more without it
    (a t-interval on two seeds, at df 1, flips a verdict by its width alone)."""
    arms: dict[str, set[int]] = {}
    for s in e.plan(scale):
        arms.setdefault(dataclasses.replace(s, recipe=s.recipe.replace(seed=0)).key, set()).add(s.recipe.seed)
    seeds = sorted(set().union(*arms.values()))
    return [x for x in seeds if all(len(v) >= 4 for v in arms.values() if x in v)]


def leave_one_out(e: Experiment, scale: Scale, results: Results, verdict: Verdict) -> dict:
    """The fragility test's leave-one-seed-out half: the claim's verdict with each droppable seed left out in turn."""
    seeds = droppable(e, scale)
    if not seeds:
        return {"status": UNTESTED, "why": "no seed can be left out with three left in each of its arms", "without": {}}
    without = {}
    for s in seeds:
        kept = tuple(x for x in scale.seeds if x != s)
        subset = dataclasses.replace(scale, seeds=kept, dropped=(*scale.dropped, s))
        without[str(s)] = analyze(e, subset, results).verdict.status
    flips = [s for s, v in without.items() if v != verdict.status]
    return {"status": FRAGILE if flips else ROBUST, "flips": flips, "without": without}


def fragility(number: int, loo: dict, verdict: str, report: Path) -> dict:
    """The fragile mark from the leave-one-seed-out verdicts and the replicates (folders beside `report`)."""
    replicates = []
    for cpu, folder in REPLICATES.get(number, []):
        v = replicate_verdict(number, report / folder, report).status
        both = replicate_verdict(number, report / folder, report, pooled=True).status
        replicates.append(
            {"cpu": cpu, "folder": folder, "verdict": v, "pooled": both, "flips": verdict not in (v, both)}
        )
    flipped = loo["status"] == FRAGILE or any(r["flips"] for r in replicates)
    status = FRAGILE if flipped else (UNTESTED if loo["status"] == UNTESTED and not replicates else ROBUST)
    return {**loo, "status": status, "verdict": verdict, "replicates": replicates}


def check_claim(e: Experiment, results: Results, report_scale: Scale, report: Path, budget: dict | None = None) -> dict:
    """One claim's record: its budget check (where it runs; `budget`, when given, is kept as its budget entry
    instead) and its fragility at the report's scale."""
    at_1x, at_2x = scales()
    entry: dict = {"title": e.title, "plan": fingerprint(e, report_scale)}
    report_verdict = analyze(e, report_scale, results).verdict
    entry["fragile"] = fragility(
        e.number, leave_one_out(e, report_scale, results, report_verdict), report_verdict.status, report
    )
    if e.number in NOT_RUN:
        entry["budget"] = {"status": NOT_CHECKED, "why": NOT_RUN[e.number]}
        return entry
    if budget is not None:
        entry["budget"] = budget
        return entry
    v1, v2 = analyze(e, at_1x, results).verdict, analyze(e, at_2x, results).verdict
    status, parts = compare(v1, v2)
    runs_2x = [s for s in all_runs(e.plan(at_2x))]
    records = [results[s] for s in runs_2x]
    entry["budget"] = {
        "status": status,
        "verdict": [v1.status, v2.status],
        "parts": parts,
        "plan_1x": fingerprint(e, at_1x),
        "plan_2x": fingerprint(e, at_2x),
        "runs_2x": len(runs_2x),
        "cpu_s_2x": sum(r["train_cpu_s"] + r.get("eval_cpu_s", 0.0) for r in records),
        "machines": dict(Counter(machine_of(r) for r in records).most_common()),
    }
    return entry


def runs_to_check(experiments: Sequence[Experiment], budgets: bool = True) -> list:
    """Every run the check reads: the claims' plans at the report's scale and, with `budgets`, at the check's two."""
    at_1x, at_2x = scales()
    report = Scale("default", SEEDS)
    plans = [
        s
        for e in experiments
        for sc in ((report, at_1x, at_2x) if budgets else (report,))
        if e.number not in NOT_RUN or sc is report
        for s in e.plan(sc)
    ]
    return all_runs(plans)


def check(
    out: Path,
    experiments: Sequence[Experiment],
    dev: torch.device,
    train: Callable[[list], None],
    log: Callable[[str], None] = print,
    budgets: bool = True,
) -> dict:
    """Train what the check lacks (`train`: the runs not in `out`'s cache), check each claim, and merge the entries
    into `out`/budget_check.json (an entry of a claim not checked now is kept); writes budget_check.md beside it.
    Without `budgets`, only the leave-one-seed-out test runs (on the report's runs, nothing at twice the budget): a
    claim's budget entry on record is kept, or reads "not checked" (its runs at twice the budget not trained yet)."""
    cache = RunCache(out / "cache")
    todo = [s for s in runs_to_check(experiments, budgets) if not cache.has(s)]
    if todo:
        train(todo)
    results = Results(cache, dev, replicate_caches(out))
    path = out / "budget_check.json"
    record = json.loads(path.read_text()) if path.is_file() else {"seeds": list(SEEDS), "claims": {}}
    for e in experiments:
        kept = None
        if not budgets:
            on_record = record["claims"].get(str(e.number), {}).get("budget")
            kept = on_record or {"status": NOT_CHECKED, "why": NOT_YET}
        entry = check_claim(e, results, Scale("default", SEEDS), out, budget=kept)
        record["claims"][str(e.number)] = entry
        b, f = entry["budget"], entry["fragile"]
        log(
            f"  claim {e.number} {e.name:12s} budget {b['status']}"
            + (f" ({' -> '.join(b['verdict'])})" if "verdict" in b else "")
            + f"; {f['status']}"
        )
    record["claims"] = dict(sorted(record["claims"].items(), key=lambda kv: int(kv[0])))
    write_json(path, record, indent=1)
    write_text(out / "budget_check.md", render(record))
    log(f"wrote {path} and budget_check.md; to make it the report's, copy budget_check.json to {RECORD}")
    return record


def load_record() -> dict | None:
    """The committed check (budget_check.json beside this module), or None when there is none."""
    return json.loads(RECORD.read_text()) if RECORD.is_file() else None


def marks(e: Experiment, scale: Scale, record: dict | None) -> dict:
    """A verdict row's budget and fragile marks from the committed check, where it is of the code's plan: {"budget":
    CHECKED / FAILED / NOT_CHECKED, "fragile": FRAGILE / ROBUST / UNTESTED, "text": the check in a sentence}."""
    entry = (record or {}).get("claims", {}).get(str(e.number))
    if scale.name != "default" or entry is None:
        why = "the check is of the default scale" if scale.name != "default" else "no check of this claim recorded"
        return {"budget": NOT_CHECKED, "fragile": UNTESTED, "text": f"Not checked: {why}."}
    at_1x, at_2x = scales()
    b, f = entry["budget"], entry["fragile"]
    if "plan_1x" in b and (b["plan_1x"], b["plan_2x"]) != (fingerprint(e, at_1x), fingerprint(e, at_2x)):
        budget, text = NOT_CHECKED, "Not checked: the check on record is of other runs than the code's."
    elif "parts" in b:
        worst = max(b["parts"], key=lambda p: (p["moved"] or 0) / (p["allowed"] or float("inf")))
        budget = b["status"]
        moved = (
            f"the part that moved most, {worst['what']}, moved by {_fmt(worst['moved'])} against "
            f"{_fmt(worst['allowed'])} allowed (in the contrast's own unit)"
            if worst["moved"]
            else "no part moved"
        )
        text = (
            f"{budget.capitalize()}: at twice the budget on seeds {', '.join(map(str, SEEDS))} the verdict is "
            f"{b['verdict'][1]} ({b['verdict'][0]} at the budget on those seeds); {moved} "
            f"(the {b['runs_2x']} runs it reads at twice the budget: {b['cpu_s_2x'] / 3600:.2f} CPU-hours; "
            "budget_check.md)."
        )
    else:
        budget, text = b["status"], f"{b['status'].capitalize()}: {b.get('why', '')}."
    fragile = f["status"] if entry["plan"] == fingerprint(e, Scale("default", SEEDS)) else UNTESTED
    flips = [f"seed {s} left out gives {f['without'][s]}" for s in f.get("flips", [])]
    flips += [f"the {r['cpu']} replicate gives {r['verdict']}" for r in f.get("replicates", []) if r["flips"]]
    why = "; ".join(flips) if fragile == FRAGILE else f.get("why", "") if fragile == UNTESTED else "nothing flips it"
    return {
        "budget": budget,
        "fragile": fragile,
        "text": text,
        "fragile_text": f"{fragile} ({why})" if why else fragile,
    }


def render(record: dict) -> str:
    """The check's record as Markdown: each claim's budget check, part by part, and its fragility."""
    lines = ["# The budget check and the leave-one-seed-out test", "", __doc__.split("\n\n", 1)[1].strip(), ""]
    for number, entry in record["claims"].items():
        b, f = entry["budget"], entry["fragile"]
        lines += [
            f"## {number}. {entry['title']}",
            "",
            f"Budget: **{b['status']}**" + (f" ({b['why']})" if b.get("why") else ""),
        ]
        if "parts" in b:
            lines[-1] += (
                f"; verdict {b['verdict'][0]} at the budget, {b['verdict'][1]} at twice it; {b['runs_2x']} runs "
                f"at twice the budget, {b['cpu_s_2x'] / 60:.1f} CPU-min on "
                + ", ".join(f"{m} ({n})" for m, n in b["machines"].items())
            )
            lines += ["", "| part | d at 1x | d at 2x | moved | allowed | within |", "|---|---|---|---|---|---|"]
            for p in b["parts"]:
                lines.append(
                    f"| {p['what']} | {_fmt(p['d'][0])} | {_fmt(p['d'][1])} | {_fmt(p['moved'])} | "
                    + f"{_fmt(p['allowed'])} | "
                    + ("yes" if p["within"] else "**no**")
                    + " |"
                )
        without = ", ".join(f"seed {s}: {v}" for s, v in f.get("without", {}).items())
        reps = "; ".join(
            f"{r['cpu']} ({r['folder']}): {r['verdict']}, pooled with the report's runs {r['pooled']}"
            for r in f.get("replicates", [])
        )
        lines += [
            "",
            f"Fragile: **{f['status']}** (the report's verdict: {f['verdict']}"
            + (f"; each seed left out: {without}" if without else f"; {f.get('why', '')}")
            + (f"; replicates: {reps}" if reps else "")
            + ")",
            "",
        ]
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3g}"
