"""The report of `vitlab reproduce`: Markdown and a self-contained HTML page (figures embedded) from the
same outcomes, each claim with its setup, tables, figures, rule, its verdict by the v2 rules beside the v1 rules'
(the v1 report's), and its record of changes (history.json)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

from vitlab.experiments.reproduce import history
from vitlab.experiments.reproduce.verdicts import INCONCLUSIVE, LEVEL, NOT_REPRODUCED, REPRODUCED


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


_BADGE = {REPRODUCED: "#2e7d32", NOT_REPRODUCED: "#c62828", INCONCLUSIVE: "#9e6a00"}


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


SCALE_TEXT = {
    "quick": "quick (smoke-test scale: every claim's code path on tiny data and few steps; its verdicts mean nothing)",
    "default": "default (claims 2-11 on Fashion-MNIST at the step budgets of the recipe search, 3.5-6.5 hours on 2 CPU "
    "cores, by CPU kind)",
    "large": "large (every budget of the default scale doubled: the default's verdicts, checked at twice the training)",
}
SCALE_FLAG = {"quick": " --quick", "default": "", "large": " --scale large"}


def _intro(meta: dict) -> list[str]:
    default_seeds = 2 if meta["scale"] == "quick" else 3
    command = (
        "vitlab reproduce"
        + SCALE_FLAG[meta["scale"]]
        + (f" --only {meta['only']}" if meta.get("only") else "")
        + (f" --seeds {meta['seeds']}" if meta["seeds"] != default_seeds else "")
        + " --out DIR"
    )
    timing = meta.get("trained_by", meta)  # the invocation that trained the runs
    load = timing.get("estimate_load_s", timing["estimate_s"])
    at_load = f", {duration(load)} at the machine's load then" if load > 1.15 * timing["estimate_s"] else ""
    took = (
        f"{meta['trained']} trained in this invocation, the rest read from the cache); this invocation took "
        if "trained_by" not in meta
        else f"all read from the cache, this invocation took {duration(meta['elapsed_s'])}; the {timing['trained']} "
        f"trained by an earlier invocation); that one took "
    )
    ray = (
        f" on {timing['cluster']} ({', '.join(f'{n} run(s) on {node}' for node, n in timing['nodes'].items())})"
        if timing.get("executor") == "ray"
        else ""
    )
    return [
        f"Made by `{command}`.",
        "",
        f"Scale: **{SCALE_TEXT[meta['scale']]}**; {meta['seeds']} seeds per configuration; device `{meta['device']}`; "
        f"torch {meta['torch']}; {meta['runs']} training runs ({took}{duration(timing['elapsed_s'])} with "
        f"{timing['workers']} worker(s){ray} (estimate printed at start: {duration(timing['estimate_s'])}{at_load})"
        + (f"; {_took(meta['time'])} (Where the time went, below)." if meta.get("time") else "."),
        "",
        "Every accuracy is measured after the last epoch (no early stopping, no picking the best epoch), as mean +- "
        "sample standard deviation over seeds; a seed fixes the training subset, the order of the batches, the "
        "augmentation and the initialisation. Claims 2-9 run on Fashion-MNIST (real photos of clothing, 28x28 grey, "
        "10 classes), and their test accuracy is measured on its 10,000 test images (never used to choose anything); "
        "claim 1 on the mini experiment's dataset X (its validation images), claim 6's fine-tuning on scikit-learn's "
        'digits. Where a table says "k-shot probe acc", the number is a few-shot linear probe of the trained '
        "model's frozen features (the paper's Table 8 and Figure 9 measure): a ridge regression fitted on k training "
        "images per class, its strength chosen on held-out training images, scored on the test images.",
        "",
        f"**Rules changed after results: {_changed(meta)}.** Each claim's setup (data, models, arms, budget: the "
        "optimizer steps at each training-set size, the same for every arm of a comparison) and its verdict rule are "
        "fixed in code (`vitlab/experiments/reproduce/claims/`), and the recipe (learning rate, weight decay, "
        "warmup, batch size, augmentation, the ViT's initialisation, patch size and depth) and the budgets were "
        "chosen by the recipe search on 10,000 training images held out from the other 50,000, never on the test "
        "images (Recipe and budgets, below). But rules, arms and budgets have changed after a committed result was "
        "seen: every change is in the claim's record of changes (at the end of its section), and the verdict "
        "table's last mark links to it (unknown: a change whose log does not say).",
        "",
        "**Trained enough, and fragile.** The verdict table's budget column is the budget check's (`vitlab reproduce "
        "--check-budgets`, committed): *checked* when, every arm trained for twice its budget on seeds 0-2, no part of "
        "the verdict moves by half its margin or tolerance (half its interval where it has none) and the verdict "
        "stands; *failed* when one does or it flips; *not checked* where the check has not run for these runs. A "
        "verdict is *fragile* when leaving one seed out (of arms that keep three) flips it, or a replicate on "
        "another CPU kind decides otherwise; *untested* where no seed can be left out. Each claim's Budget table "
        "(its arms at their budget and twice it, from the recipe search) is information, not a gate.",
        "",
        "**Verdict rules** (`vitlab/experiments/reproduce/verdicts.py`; each claim's, with every number it decides "
        "by, under **Rule**). The verdict is the v2 rules': Student-t intervals at a stated level "
        f"({100 * LEVEL:g}%), seed-paired (the per-seed differences, df n - 1) where both arms train on each seed's "
        "data, else Welch's; *a beats b by a margin* is reproduced when the interval of a - b lies above the margin, "
        "not reproduced when it lies below; *a and b are about equal* by two one-sided tests (TOST): reproduced when "
        f"the {100 * (2 * LEVEL - 1):g}% interval lies inside +-tol, not reproduced when the {100 * LEVEL:g}% one "
        "lies outside it (and inconclusive when both arms stay below chance + 3 points: equal because nothing was "
        "learned); *at least* and *near* are the one-sample versions. The v2 rules were written after the committed "
        "report's verdicts had been seen (each claim's record of changes says so). Beside it, for the record, the "
        "verdict of the v1 rules, which decided the v1 report: d +- 2 se (se = sqrt(var_a/n_a + var_b/n_b)), "
        "*a beats b* when d - 2se > 0 and d >= margin, *about equal* whenever |d| <= tol (not an equivalence test), "
        "tol 3 points. A claim with parts is reproduced when every part is, not reproduced when any part is not. "
        '"Not reproduced at this scale" is about these small models, this data and this budget, not about the paper.',
        "",
        "**Seeds.** Where a verdict hinges on an equivalence or the spread between seeds exceeds a point, the arms "
        "have five seeds, fixed in code before any run with them (`claims/shared.py`, SEEDS_AT: the 1,000-image arms "
        "of claims 2, 3, 4, 5 and 7); the others have the scale's"
        + (" (at the quick scale, every arm)." if meta["scale"] == "quick" else "."),
        "",
        "An earlier version of this report tested claims 2-8 on synthetic shapes; it is kept in "
        "`docs/reproduce/synthetic/` as a record of the mechanisms it showed (for example, that a learned 1-D table "
        "stays at chance on a task that is only about where things are, where a fixed 2-D sin-cos embedding learns "
        "it at once).",
    ]


def _took(t: dict) -> str:
    """The runs' own time in one clause: CPU time on CPU (with their wall clock beside), wall clock on a GPU."""
    if t["clock"] == "cpu":
        return (
            f"the runs themselves took {t['took_s'] / 3600:.2f} CPU-hours (one thread each) and "
            f"{t['wall_s'] / 3600:.2f} hours of wall clock added up (more than their CPU time where the machine was "
            "shared)"
        )
    return f"the runs themselves took {t['wall_s'] / 3600:.2f} hours of wall clock added up"


def _time(t: dict) -> list[str]:
    """The section on where the time went: each claim's runs, the time they took, and their estimate."""
    unit = "CPU-min" if t["clock"] == "cpu" else "min"

    def ratio(took: float, est: float | None) -> str:
        return f"{took / est:.2f}" if est else "-"

    rows = [
        [str(r["claim"]), r["title"], str(r["runs"]), f"{r['took_s'] / 60:.1f}"]
        + (
            [f"{r['estimate_s'] / 60:.1f}", ratio(r["took_s"], r["estimate_s"])]
            if r["estimate_s"] is not None
            else ["-", "-"]
        )
        for r in t["rows"]
    ]
    priced = [r for r in t["rows"] if r["estimate_s"] is not None and r["runs"]]
    est = sum(r["estimate_s"] for r in priced)
    took = sum(r["took_s"] for r in priced)
    rows.append(
        ["", "all", str(sum(r["runs"] for r in t["rows"])), f"{t['took_s'] / 60:.1f}"]
        + ([f"{est / 60:.1f}", ratio(took, est)] if priced else ["-", "-"])
    )
    older = (
        f" {t['without_eval']} of the runs' records predate the final evaluation's time: for those the table counts "
        "their training alone."
        if t["without_eval"]
        else ""
    )
    machines = "; ".join(f"{name}: {n} run(s)" for name, n in t["machines"].items())
    return [
        "## Where the time went",
        "",
        f"Trained on {machines}.",
        "",
        "Each claim's runs, read from their records: the time each took to train (with its per-epoch check) and to "
        "be evaluated, "
        + (
            "its CPU time on its one thread, which a machine busy with other work does not stretch"
            if t["clock"] == "cpu"
            else "wall clock"
        )
        + "; a run that several claims share is counted in the first that plans it. Estimated: what the "
        "invocation that trained the runs priced them at before it started (from each architecture's timed steps on "
        "that machine), where it priced every run of the claim; the ratio is the time taken over the estimate, for "
        "those claims (the last row: over the claims with an estimate)." + older,
        "",
        md_table(["#", "claim", "runs", unit, f"estimated {unit}", "took / estimated"], rows),
        "",
    ]


CONVERGENCE_HEADER = ["arm", "N train", "steps", "val acc %", "2x steps: val acc %", "difference (points)", "converged"]


def convergence_rows(rows: Sequence[dict]) -> list[list[str]]:
    return [
        [
            r["arm"],
            f"{r['n_train']:,}",
            f"{r['steps']:,}",
            f"{100 * r['acc']:.2f}",
            f"{100 * r['acc_2x']:.2f}",
            f"{100 * (r['acc_2x'] - r['acc']):+.2f}",
            "yes" if r["converged"] else "**no**",
        ]
        for r in rows
    ]


def _quality(q: dict) -> list[str]:
    """The section on whether the models learned: the targets, and the spread between seeds."""
    rows = [
        [
            t["model"],
            f"{t['n_train']:,}",
            f">= {100 * t['target']:.0f}%",
            f"{100 * t['mean']:.1f} +- {100 * t['std']:.1f}",
            "yes" if t["met"] else "**no**",
        ]
        for t in q["targets"]
    ]
    spread = (
        f"Of the {q['arms']} Fashion-MNIST arms above chance + 20 points, {q['over_2']} have a standard deviation "
        f"over seeds above 2 points; the largest is {100 * q['max_std']:.1f} points ({q['max_std_arm']})."
    )
    return [
        "## Models that have learned",
        "",
        "Anchors on Fashion-MNIST: scikit-learn's SVC reaches about 89.7% with all 60,000 training images (the "
        "dataset's benchmark table), small CNNs 91-93%. The targets this report set itself, and what the runs reached:",
        "",
        md_table(["model", "N train", "target", "test acc % (mean +- std)", "met"], rows),
        "",
        spread,
        "",
    ]


def render_markdown(outcomes, meta: dict) -> str:
    lines = [
        "# vitlab reproduce: the paper's claims at laptop scale, on real images",
        "",
        *_intro(meta),
        "",
        "## Verdicts",
        "",
    ]
    lines.append(
        md_table(
            ["#", "claim", "source", "verdict", *MARKS, "v1"],
            [
                [str(e.number), e.title, e.source, f"**{o.verdict.status}**", *_marks(e, o, link=True), _v1(o)]
                for e, o in outcomes
            ],
        )
    )
    if meta.get("quality"):
        lines += [""] + _quality(meta["quality"])
    if meta.get("time"):
        lines += [""] + _time(meta["time"])
    if meta.get("search"):
        lines += ["", "## Recipe and budgets", "", meta["search"].strip()]
    for e, o in outcomes:
        lines += [
            "",
            f"## {e.number}. {e.title}",
            "",
            f"> {e.claim}",
            ">",
            f"> Source: {e.source}",
            "",
            f"**Setup.** {o.setup}",
            "",
            md_table(o.header, o.rows),
            "",
        ]
        for title, header, rows in o.tables:
            lines += [f"**{title}.**", "", md_table(header, rows), ""]
        if o.notes:
            lines += [o.notes, ""]
        lines += [f"![claim {e.number}](figures/{f.name})" for f in o.figures]
        if o.convergence:
            lines += [
                "",
                f"**Budget.** Each arm at its budget and at twice it ({o.convergence_note}):",
                "",
                md_table(CONVERGENCE_HEADER, convergence_rows(o.convergence)),
            ]
        lines += [
            "",
            f"**Rule.** {e.rule}.",
            "",
            f"**Verdict: {o.verdict.status}.** {o.verdict.detail}",
            "",
            f"**Budget check.** {o.marks.get('text', 'Not checked.')} "
            f"Fragile: {o.marks.get('fragile_text', 'untested')}.",
            "",
            f"**v1 verdict (the v1 report's rules, for the record): {_v1(o)}.** "
            + (o.verdict_v1.detail if o.verdict_v1 else ""),
            "",
            f'<a id="history-{e.number}"></a>**{RECORD}**',
            "",
            _record(e.number),
            "",
            f"Raw numbers: `results/claim{e.number}_{e.name}.csv`.",
        ]
    return "\n".join(lines) + "\n"


RECORD = (
    "Record of changes (history.json): every change to the claim's rule, arms, budgets or choices since the rules "
    "were first committed, and whether a result had been seen before it."
)


MARKS = ("budget", "fragile", "changed after results")


def after_results(number: int) -> str:
    """Whether the claim's rules changed after a result was seen: "yes" (a change says so), "unknown" (a change
    whose log does not say, and none that says so), or "no"."""
    seen = {c.after_results for c in history.load().get(number, [])}
    return "yes" if True in seen else "unknown" if None in seen else "no"


def _marks(e, o, link: bool = False) -> list[str]:
    """The verdict row's three marks: the budget check's, the fragile test's and the record of changes'."""
    after = after_results(e.number)
    return [
        o.marks.get("budget", "not checked"),
        o.marks.get("fragile", "untested"),
        f"[{after}](#history-{e.number})" if link else after,
    ]


def _changed(meta: dict) -> str:
    """ "N of K claims" whose rules changed after a result was seen (and how many are unknown)."""
    numbers = meta.get("claims") or list(history.CLAIMS)
    marks = [after_results(n) for n in numbers]
    unknown = f", {marks.count('unknown')} unknown" if "unknown" in marks else ""
    return f"{marks.count('yes')} of {len(numbers)} claims{unknown}"


def _v1(o) -> str:
    return o.verdict_v1.status if o.verdict_v1 is not None else "-"


def _record(number: int) -> str:
    """The claim's record of changes as a Markdown table, or a sentence where the record has none for it."""
    record = history.load()
    return history.render(number, record) if number in record else "No change recorded for this claim."


def _md_to_html(text: str) -> str:
    """The Markdown this module writes (headings, paragraphs, pipe tables, **bold**, `code`) as HTML."""

    def inline(t: str) -> str:
        t = html.escape(t)
        t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", t)

    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.strip().splitlines()
        if not lines:
            continue
        if lines[0].startswith("#"):
            level = len(lines[0]) - len(lines[0].lstrip("#"))
            out.append(f"<h{level}>{inline(lines[0].lstrip('#').strip())}</h{level}>")
        elif lines[0].startswith("|"):
            cells = [
                [c.strip() for c in line.strip().strip("|").split("|")] for line in lines if not line.startswith("|---")
            ]
            head = "".join(f"<th>{inline(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in cells[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        else:
            out.append(f"<p>{inline(' '.join(lines))}</p>")
    return "\n".join(out)


def render_html(outcomes, meta: dict, out: Path) -> str:
    esc = html.escape

    def table(header, rows):
        head = "".join(f"<th>{esc(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def badge(status):
        return f'<span class="badge" style="background:{_BADGE[status]}">{esc(status)}</span>'

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vitlab reproduce</title><style>",
        "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.45}",
        "table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}",
        "blockquote{border-left:4px solid #ccc;margin:0;padding:.2em 1em;color:#333}img{max-width:100%}",
        ".badge{color:white;padding:.1em .5em;border-radius:.3em;font-weight:600}</style></head><body>",
        "<h1>vitlab reproduce: the paper's claims at laptop scale, on real images</h1>",
    ]
    parts += [f"<p>{esc(p).replace('**', '')}</p>" for p in _intro(meta) if p]
    parts.append("<h2>Verdicts</h2>")
    extra = (
        ([] if not meta.get("quality") else _quality(meta["quality"]))
        + ([] if not meta.get("time") else _time(meta["time"]))
        + ([] if not meta.get("search") else ["## Recipe and budgets", "", meta["search"]])
    )
    parts.append(
        "<table><thead><tr><th>#</th><th>claim</th><th>source</th><th>verdict</th>"
        + "".join(f"<th>{m}</th>" for m in MARKS)
        + "<th>v1</th></tr></thead><tbody>"
        + "".join(
            f"<tr><td>{e.number}</td><td><a href='#claim{e.number}'>{esc(e.title)}</a></td><td>{esc(e.source)}</td>"
            f"<td>{badge(o.verdict.status)}</td>"
            + "".join(f"<td>{esc(m)}</td>" for m in _marks(e, o)[:2])
            + f"<td><a href='#history-{e.number}'>{esc(_marks(e, o)[2])}</a></td><td>{esc(_v1(o))}</td></tr>"
            for e, o in outcomes
        )
        + "</tbody></table>"
    )
    parts.append(_md_to_html("\n".join(extra)))
    for e, o in outcomes:
        parts += [
            f"<h2 id='claim{e.number}'>{e.number}. {esc(e.title)}</h2>",
            f"<blockquote><p>{esc(e.claim)}</p><p>Source: {esc(e.source)}</p></blockquote>",
            f"<p><b>Setup.</b> {esc(o.setup)}</p>",
            table(o.header, o.rows),
        ]
        for title, header, rows in o.tables:
            parts += [f"<p><b>{esc(title)}.</b></p>", table(header, rows)]
        if o.notes:
            parts.append(f"<p>{esc(o.notes)}</p>")
        for f in o.figures:
            data = base64.b64encode(Path(f).read_bytes()).decode()
            parts.append(f"<p><img alt='claim {e.number}' src='data:image/png;base64,{data}'></p>")
        if o.convergence:
            parts += [
                f"<p><b>Budget.</b> Each arm at its budget and at twice it ({esc(o.convergence_note)}):</p>",
                table(CONVERGENCE_HEADER, [[c.replace("**", "") for c in r] for r in convergence_rows(o.convergence)]),
            ]
        parts += [
            f"<p><b>Rule.</b> {esc(e.rule)}.</p>",
            f"<p><b>Verdict:</b> {badge(o.verdict.status)} {esc(o.verdict.detail)}</p>",
            f"<p><b>v1 verdict (the v1 report's rules, for the record):</b> {esc(_v1(o))}. "
            f"{esc(o.verdict_v1.detail if o.verdict_v1 else '')}</p>",
            f"<p><b>Budget check.</b> {esc(o.marks.get('text', 'Not checked.'))} "
            f"Fragile: {esc(o.marks.get('fragile_text', 'untested'))}.</p>",
            f"<p id='history-{e.number}'><b>{esc(RECORD)}</b></p>",
            _md_to_html(_record(e.number)),
        ]
    parts.append("</body></html>")
    return "\n".join(parts)
