"""Towards a pure ViT at >= 90.5% test accuracy on all 60,000 Fashion-MNIST training images: candidate recipes and
sizes, each trained on the recipe search's 50,000 training images and validated on its 10,000 held-out training images
(`vitlab.data.subsets.search_split`), never on the test images; then the held-out winner on the test images. A
measurement, not a test.

    PYTHONPATH=src python benchmarks/vit_target.py --out docs/reproduce/vit-target --workers 2   # every candidate
    PYTHONPATH=src python benchmarks/vit_target.py --out docs/reproduce/vit-target --only "label smoothing 0.1"
    PYTHONPATH=src python benchmarks/vit_target.py --out docs/reproduce/vit-target --workers 3 \
        --test "random resized crops (0.8-1), 8x the steps"                                    # 3 test seeds

Every candidate is the shared ViT (claims/shared.py: P=7, D=64, 6 blocks, its recipe) with one change, at the
shared budget for the largest training set (10,000 steps of 64) or a multiple of it, seed 0; it goes through the
reproduce machinery (`Run`, the run cache under OUT/cache, --workers processes of one thread), so a second invocation
reads the cache and an interrupted one resumes. Writes OUT/vit_target.json and prints a table of every candidate in the
cache: held-out accuracy, its change against the shared ViT's, the last epoch's training accuracy (on its augmented
batches: how far a run is from fitting its data), parameters, and the CPU-minutes each run took, with the CPU that
trained it.

--test trains a candidate on all 60,000 training images (seeds 0, 1, 2: the report's seeds) and tests it on the
10,000 test images, against the shared ViT's runs of the same seeds in the report's own cache (docs/reproduce/cache,
claim 5's runs: nothing of the baseline trains here), with the seed-paired 95% t-interval of the difference.

The held-out images are easier than the test images: the shared ViT scores 89.06% held out at this budget (search.json,
budget stage) and 88.4% on the test images at 60,000 (the report's claim 5), so a candidate needs about 91.2% held out
to be expected at 90.5% on the test images. With random resized crops the gap was smaller: 0.31 points at 4x the
steps, 0.20 at 8x (docs/claims.md, "Towards a ViT at 90.5%").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from vitlab.experiments.executors import open_executor
from vitlab.experiments.reproduce import search
from vitlab.experiments.reproduce.claims import shared
from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.claims.shared import STEPS, VIT, own_overrides, search_size
from vitlab.experiments.reproduce.probes import mean_interval
from vitlab.experiments.reproduce.runs import RunCache, machine_of, train_on
from vitlab.experiments.reproduce.verdicts import LEVEL, estimate
from vitlab.runtime import num_threads

N, STEPS_60K = search_size(60_000), STEPS["default"][60_000]
TARGET = 0.905  # test accuracy at 60,000 training images
TEST_SCALE = Scale("default", (0, 1, 2))  # the report's seeds: --test's, and the baseline runs it reads
REPORT_CACHE = Path(__file__).resolve().parents[1] / "docs" / "reproduce" / "cache"  # the report's runs
# The shared ViT at this size and budget, held out: the search's budget stage (search.json, "budgets"), seed 0.
SHARED = search.load_record()["budgets"][str(N)]
# The shared ViT itself (on this CPU) at the budget and longer, and one change each to it, at the budget and longer:
# (overrides of the model, fields of the recipe, times the budget).
CANDIDATES = {
    "the shared ViT": ({}, {}, 1),
    "the shared ViT, twice the steps": ({}, {}, 2),
    "D=128 (MLP 256), 6 blocks": ({"dim": 128, "mlp_dim": 256}, {}, 1),
    "P=4, 4 blocks": ({"patch_size": 4, "depth": 4}, {}, 1),
    "label smoothing 0.1": ({}, {"label_smoothing": 0.1}, 1),
    "RandAugment 2/9 + label smoothing 0.1": ({}, {"auto_augment": "rand", "label_smoothing": 0.1}, 1),
    # Longer budgets: the changes above that may need more steps than the shared ViT.
    "the shared ViT, 4x the steps": ({}, {}, 4),
    "label smoothing 0.1, 4x the steps": ({}, {"label_smoothing": 0.1}, 4),
    "random resized crops (0.8-1), 4x the steps": ({}, {"crop_scale": 0.8}, 4),
    "random resized crops (0.8-1) + label smoothing 0.1, 4x the steps": (
        {},
        {"crop_scale": 0.8, "label_smoothing": 0.1},
        4,
    ),
    "random resized crops (0.8-1), 8x the steps": ({}, {"crop_scale": 0.8}, 8),
    "P=4, 4 blocks, 3x the steps": ({"patch_size": 4, "depth": 4}, {}, 3),
    "D=128 (MLP 256), 6 blocks, 3x the steps": ({"dim": 128, "mlp_dim": 256}, {}, 3),
}


def candidate_run(name: str):
    """The candidate's run: the search's run of the shared ViT at 50,000 images and the 60,000-image budget, changed."""
    overrides, recipe, factor = CANDIDATES[name]
    run = search.at_steps(VIT, search.code_recipe()[VIT], N, factor * STEPS_60K)
    ov = own_overrides(VIT, {**dict(run.overrides), **overrides})
    return dataclasses.replace(run, recipe=run.recipe.replace(**recipe), overrides=ov)


def shared_acc() -> float:
    """The shared ViT's held-out accuracy at this size and budget, from the search's record."""
    (row,) = [r for r in SHARED["rows"] if r["steps"] == STEPS_60K]
    return row["acc"]["ViT"][0]


def test_run(name: str, seed: int):
    """The candidate on all 60,000 training images, tested on the 10,000 test images: the report's run of the shared
    ViT at 60,000 (claim 5's, the same cache key for the shared ViT itself), changed as the candidate changes it."""
    overrides, recipe, factor = CANDIDATES[name]
    run = shared.fashion_run(VIT, 60_000, seed, TEST_SCALE, overrides=overrides, steps=factor * STEPS_60K)
    return dataclasses.replace(run, recipe=run.recipe.replace(**recipe))


def train(todo: list, cache: RunCache, workers: int, what: str) -> None:
    """Train the runs not yet in `cache`, `workers` side by side (one thread each), printing each as it comes back."""
    todo = [r for r in todo if not cache.has(r)]
    if todo:
        with open_executor("pool", device="cpu", workers=workers, n_items=len(todo)) as ex, num_threads(1):
            for run, _ in train_on(todo, ex, cache, "auto"):
                print(f"trained {run.key}: {100 * cache.result(run)['val_acc']:.2f}% {what}", flush=True)


def row_of(name: str, run, cache: RunCache) -> dict:
    r = cache.result(run)
    return {
        "candidate": name,
        "key": run.key,
        "acc": r["val_acc"],
        "train_acc": r["train_acc"],
        "params": r["params"],
        "train_cpu_min": r["train_cpu_s"] / 60,
        "machine": machine_of(r),
    }


def held_out(names: list[str], cache: RunCache, workers: int) -> list[dict]:
    """Train `names` on the search's split; the table of every candidate whose run is in the cache."""
    train([candidate_run(n) for n in names], cache, workers, "held out")
    runs = {name: candidate_run(name) for name in CANDIDATES}
    shared_run = runs["the shared ViT"]
    base = cache.result(shared_run)["val_acc"] if cache.has(shared_run) else shared_acc()
    rows = [row_of(name, run, cache) for name, run in runs.items() if cache.has(run)]
    print("| candidate | held-out acc % | vs the shared ViT | train acc % | params | CPU-min | CPU |")
    print("|---|---|---|---|---|---|---|")
    print(f"| the shared ViT (the search's record, search.json) | {100 * shared_acc():.2f} | | | | | |")
    for row in rows:
        print(
            f"| {row['candidate']} | {100 * row['acc']:.2f} | {100 * (row['acc'] - base):+.2f} | "
            f"{100 * row['train_acc']:.1f} | {row['params']:,} | "
            f"{row['train_cpu_min']:.1f} | {row['machine']} |"
        )
    return rows


def tested(name: str, seeds: list[int], cache: RunCache, workers: int) -> dict:
    """Train `name` at 60,000 images on `seeds` and test it; the shared ViT's same seeds come from the report's own
    runs (REPORT_CACHE), trained by `vitlab reproduce`, so nothing of the baseline is trained here."""
    runs = [test_run(name, s) for s in seeds]
    train(runs, cache, workers, "test")
    base_runs = [test_run("the shared ViT", s) for s in seeds]
    base_cache = RunCache(REPORT_CACHE)
    missing = [r.key for r in base_runs if not base_cache.has(r)]
    if missing:
        raise SystemExit(f"error: {REPORT_CACHE}: the shared ViT's 60,000-image runs {', '.join(missing)} are missing")
    acc = [cache.result(r)["val_acc"] for r in runs]
    base = [base_cache.result(r)["val_acc"] for r in base_runs]
    diff = estimate(acc, base, paired=True)
    lo, hi = diff.interval(LEVEL)
    out = {
        "candidate": name,
        "seeds": seeds,
        "test_acc": acc,
        "shared_vit_test_acc": base,
        "mean": statistics.fmean(acc),
        "interval": mean_interval(acc),
        "vs_shared": {"mean": diff.d, "lo": lo, "hi": hi, "test": diff.method},
        "target": TARGET,
        "train_cpu_min": sum(cache.result(r)["train_cpu_s"] for r in runs) / 60,
        "machine": sorted({machine_of(cache.result(r)) for r in runs}),
    }
    print(f"{name}, test accuracy at 60,000 images, seeds {seeds}: {out['interval']} % (95% t-interval)")
    pct = ", ".join(f"{100 * a:.2f}" for a in acc)
    print(f"  per seed {pct}; the shared ViT {', '.join(f'{100 * a:.2f}' for a in base)}")
    print(f"  vs the shared ViT {100 * diff.d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}] points ({diff.method})")
    print(f"  the target {100 * TARGET:.1f}%: {'reached' if out['mean'] >= TARGET else 'not reached'} by the mean")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", action="append", choices=list(CANDIDATES), help="train only these candidates")
    p.add_argument("--test", choices=list(CANDIDATES), help="train this candidate at 60,000 images and test it")
    p.add_argument("--workers", type=int, default=1, help="runs trained side by side, one thread each")
    args = p.parse_args()
    out_file = Path(args.out) / "vit_target.json"
    cache = RunCache(Path(args.out) / "cache")
    record = json.loads(out_file.read_text()) if out_file.exists() else {}
    if args.test:
        record.setdefault("tested", {})[args.test] = tested(args.test, list(TEST_SCALE.seeds), cache, args.workers)
    else:
        record["rows"] = held_out(args.only or list(CANDIDATES), cache, args.workers)
    record.update(n_train=N, steps=STEPS_60K, seed=0, search_record_acc=shared_acc())
    out_file.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
