"""The training runs and `vitlab reproduce` reports under a folder, read for the page.

A run folder (vitlab.weights.checkpoint.find_runs) holds last.json/best.json and metrics.csv; a run
of `vitlab train`/`finetune` also has summary.json, curves.png, confusion.png and
per_class_accuracy.csv. A run without curves.png (each arm of `vitlab demo`) gets its curves drawn
from metrics.csv, the way `vitlab train` draws them. A `vitlab reproduce` output holds report.md and
figures/. Every file is read as untrusted input: one that is missing or unreadable becomes a note,
never an error that stops the page.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from vitlab.errors import VitlabError
from vitlab.train.report import plot_curves
from vitlab.weights.checkpoint import find_runs, read_pointer


@dataclass
class Run:
    """What the page shows of one run folder."""

    folder: Path
    name: str  # the folder relative to the runs root
    summary: dict | None = None  # summary.json, when the run wrote one
    metrics: list[dict] = field(default_factory=list)  # metrics.csv rows, numbers as floats
    best: dict | None = None  # best.json
    last: dict | None = None  # last.json
    per_class: list[list[str]] = field(default_factory=list)  # per_class_accuracy.csv rows, header first
    notes: list[str] = field(default_factory=list)  # files that could not be read

    def image(self, name: str) -> Path | None:
        path = self.folder / name
        return path if path.is_file() else None


def _number(text: str):
    try:
        return float(text) if "." in text or "e" in text.lower() else int(text)
    except ValueError:
        return text


def run_name(folder: str | Path, root: str | Path) -> str:
    """How the page names a run: its folder relative to the runs root (the folder's name if it is the root)."""
    folder = Path(folder)
    try:
        name = str(folder.relative_to(Path(root).expanduser()))
    except ValueError:
        return str(folder)
    return folder.name if name == "." else name


def read_run(folder: str | Path, root: str | Path) -> Run:
    """Read a run folder's summary, metrics, pointers and per-class accuracy."""
    folder = Path(folder)
    run = Run(folder=folder, name=run_name(folder, root))
    for attr, file in (("best", "best.json"), ("last", "last.json")):
        if (folder / file).is_file():
            try:
                setattr(run, attr, read_pointer(folder / file))
            except VitlabError as e:
                run.notes.append(str(e))
    if (folder / "summary.json").is_file():
        try:
            summary = json.loads((folder / "summary.json").read_text())
            run.summary = summary if isinstance(summary, dict) else None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            run.notes.append(f"{folder / 'summary.json'} is not readable JSON ({type(e).__name__})")
    for attr, file in (("metrics", "metrics.csv"), ("per_class", "per_class_accuracy.csv")):
        if (folder / file).is_file():
            try:
                with open(folder / file, newline="") as f:
                    rows = list(csv.reader(f))
            except (OSError, UnicodeDecodeError, csv.Error) as e:
                run.notes.append(f"{folder / file} is not a readable CSV ({type(e).__name__})")
                continue
            if attr == "metrics" and rows:
                header = rows[0]
                run.metrics = [{k: _number(v) for k, v in zip(header, r)} for r in rows[1:] if len(r) == len(header)]
            else:
                run.per_class = rows
    return run


def list_runs(root: str | Path) -> list[Run]:
    """Every run folder under `root`, read."""
    return [read_run(folder, root) for folder in find_runs(root)]


def _fmt(v, pct: bool = False) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:.2%}" if pct else (f"{v:.4g}" if isinstance(v, float) else str(v))
    return "-" if v is None else str(v)


def run_markdown(run: Run) -> str:
    """The run's headline numbers and settings, as Markdown."""
    s = run.summary or {}
    lines = [f"### {run.name}"]
    if s.get("model"):
        lines.append(f"model **{s['model']}** on `{s.get('data', '?')}`")
    if isinstance(s.get("images"), dict):
        im = s["images"]
        lines.append(
            f"images: {im.get('train', '?')} train, {im.get('val', '?')} val"
            + (f", {im['skipped']} skipped" if im.get("skipped") else "")
        )
    best = s.get("best") if isinstance(s.get("best"), dict) else run.best
    if best:
        lines.append(
            f"best epoch {_fmt(best.get('epoch'))}: val acc **{_fmt(best.get('val_acc'), pct=True)}**"
            + (f", val loss {_fmt(best.get('val_loss'))}" if "val_loss" in best else "")
        )
    if run.metrics:
        final = run.metrics[-1]
        lines.append(
            f"last epoch {_fmt(final.get('epoch'))}: train acc {_fmt(final.get('train_acc'), pct=True)}, "
            f"val acc {_fmt(final.get('val_acc'), pct=True)}, val loss {_fmt(final.get('val_loss'))}"
        )
    elif run.last:
        lines.append(f"last checkpoint: epoch {_fmt(run.last.get('epoch'))}")
    if isinstance(s.get("time_s"), (int, float)):
        lines.append(f"time: {s['time_s']:.0f} s")
    for d in s.get("diagnostics") or []:
        lines.append(f"note: {d}")
    for n in run.notes:
        lines.append(f"unreadable: {n}")
    return "  \n".join(lines)


def per_class_rows(run: Run) -> list[list[str]]:
    """per_class_accuracy.csv's rows (header dropped) with the accuracy as a percentage."""
    if len(run.per_class) < 2:
        return []
    header = run.per_class[0]
    col = header.index("accuracy") if "accuracy" in header else None
    rows = []
    for row in run.per_class[1:]:
        row = list(row)
        if col is not None and col < len(row) and row[col]:
            try:
                row[col] = f"{float(row[col]):.1%}"
            except ValueError:
                pass
        rows.append(row)
    return rows


def curves_image(run: Run, work_dir: str | Path) -> Path | None:
    """The run's curves.png, or curves drawn from its metrics.csv into `work_dir` (None without metrics)."""
    if run.image("curves.png"):
        return run.image("curves.png")
    needed = {"epoch", "train_loss", "val_loss", "train_acc", "val_acc", "lr"}
    rows = [r for r in run.metrics if needed <= r.keys() and all(isinstance(r[k], (int, float)) for k in needed)]
    if not rows:
        return None
    stamp = os.stat(run.folder / "metrics.csv").st_mtime_ns
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.name)
    return plot_curves(rows, Path(work_dir) / f"curves_{safe}_{stamp}.png", title=run.name)


# ----------------------------------------------------------------------------------------------------
# `vitlab reproduce` reports


def find_reports(root: str | Path) -> list[Path]:
    """Folders under `root` (itself included) that hold a `vitlab reproduce` report.md."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return []
    found = []
    for folder, subfolders, files in os.walk(root):
        if "report.md" in files and (Path(folder) / "figures").is_dir():
            found.append(Path(folder))
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("cache", "checkpoints")]
    return sorted(found)


_IMAGE = re.compile(r"!\[([^\]]*)\]\((figures/[^)\s]+\.png)\)")


def report_markdown(folder: str | Path) -> str:
    """report.md with its figures embedded (data URIs), so the page needs no access to the folder."""
    folder = Path(folder)

    def embed(m: re.Match) -> str:
        path = folder / m.group(2)
        if not path.is_file() or folder.resolve() not in path.resolve().parents:
            return f"*(figure {m.group(2)} is missing)*"
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{m.group(1)}](data:image/png;base64,{data})"

    return _IMAGE.sub(embed, (folder / "report.md").read_text(errors="replace"))


__all__ = [
    "Run",
    "run_name",
    "read_run",
    "list_runs",
    "run_markdown",
    "per_class_rows",
    "curves_image",
    "find_reports",
    "report_markdown",
]
