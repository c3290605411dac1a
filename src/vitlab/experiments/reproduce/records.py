"""A report's run cache as records: every finished run's folder without its weights, but for the runs whose
weights something still reads (a claim whose analysis `loads_models`, or a fine-tuning run's parent). What a
committed report keeps: a few MB instead of a hundred, and enough to render the report again, to resume it
(`vitlab reproduce --out` the folder trains only the runs it lacks) and to read every run's result.json.

    PYTHONPATH=src python -m vitlab.experiments.reproduce.records SRC_DIR DST_DIR

copies the records of the default scale's runs cached under SRC_DIR/cache into DST_DIR/cache (a run already
there is replaced), with the cached probes; with SRC_DIR = DST_DIR (a report trained in its own folder) it removes,
in place, the weights nothing reads. A run's folder kept without its weights counts as finished
(`RunCache.has`); asking for its model is one error naming the folder (`RunCache.load_model`).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from vitlab.experiments.reproduce.claims import EXPERIMENTS
from vitlab.experiments.reproduce.claims.base import Experiment, Scale
from vitlab.experiments.reproduce.runs import RunCache, all_runs
from vitlab.fileio import mark_folder


def weights_needed(experiments: Sequence[Experiment], scale: Scale) -> set[str]:
    """Keys of the runs whose weights a later step reads: those of claims that load models, and every parent."""
    every = all_runs([s for e in experiments for s in e.plan(scale)])
    loaded = {s.key for e in experiments if e.loads_models for s in all_runs(e.plan(scale))}
    return loaded | {s.parent.key for s in every if s.parent is not None}


def keep_records(src: Path, dst: Path, scale: Scale, experiments: Sequence[Experiment] = EXPERIMENTS) -> tuple:
    """Copy the records of the finished runs of `experiments` at `scale` from the report folder `src` into the
    report folder `dst` (each one's cache/; `dst` marked as a report's folder, so that `vitlab reproduce --out dst`
    resumes from them); `src` itself when they are one folder, whose unread weights are then removed. Returns
    (runs kept, of them with weights)."""
    source, target = RunCache(src / "cache"), RunCache(dst / "cache")
    keep = weights_needed(experiments, scale)
    in_place = Path(src).resolve() == Path(dst).resolve()
    copied = with_weights = 0
    for run in all_runs([s for e in experiments for s in e.plan(scale)]):
        if not source.has(run):
            continue
        if in_place:  # the report's own folder: drop the weights nothing reads
            if run.key not in keep and source.has_weights(run):
                shutil.rmtree(source.folder(run) / "checkpoints")
            copied, with_weights = copied + 1, with_weights + source.has_weights(run)
            continue
        if target.folder(run).exists():
            shutil.rmtree(target.folder(run))
        weights = run.key in keep and source.has_weights(run)
        shutil.copytree(source.folder(run), target.folder(run), ignore=None if weights else _no_checkpoints)
        copied, with_weights = copied + 1, with_weights + weights
    if (source.cache_dir / "probes").is_dir() and not in_place:
        shutil.copytree(source.cache_dir / "probes", target.cache_dir / "probes", dirs_exist_ok=True)
    mark_folder(dst, "reproduce")
    return copied, with_weights


def _no_checkpoints(folder: str, names: list[str]) -> list[str]:
    return ["checkpoints"] if "checkpoints" in names else []


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m vitlab.experiments.reproduce.records SRC_DIR DST_DIR", file=sys.stderr)
        return 2
    src, dst = (Path(a) for a in argv)
    if not (src / "cache" / "runs").is_dir():
        print(
            f"error: {src}: no run cache here (expected {src / 'cache' / 'runs'}, as `vitlab reproduce` leaves)",
            file=sys.stderr,
        )
        return 2
    copied, with_weights = keep_records(src, dst, Scale("default", (0, 1, 2)))
    print(f"{copied} run record(s) into {dst / 'cache'}, {with_weights} with their weights")
    return 0


if __name__ == "__main__":  # pragma: no cover - the command
    sys.exit(main(sys.argv[1:]))
