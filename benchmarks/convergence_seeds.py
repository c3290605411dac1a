"""The shared ViT's held-out accuracy on three seeds at doubling budgets: a measurement, not a test.

    PYTHONPATH=src python benchmarks/convergence_seeds.py --out runs/convergence_seeds   # 2.9 CPU-hours on a Zen 4

The shared ViT of the report (claims/shared.py) on the recipe search's split (the 50,000 training images less
the 10,000 held out, never the test images), at 1,000 images for 5,000, 10,000 and 20,000 steps and at 50,000
images (the report's 60,000) for 10,000, 20,000 and 40,000 steps, seeds 0, 1, 2, each run through the reproduce
machinery (a run cache under OUT/cache, so a second invocation trains only what is missing). For each doubling it
prints the mean move over the seeds, the standard error of the seed-paired move, and the convergence stage's verdict
(`convergence_row(..., within_se=True)`: a mean move under a point and under the arm's standard error) read at
budgets beyond its `raise_to`.
Writes OUT/convergence-SIZES.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vitlab.experiments.executors import open_executor
from vitlab.experiments.reproduce import search
from vitlab.experiments.reproduce.claims.base import Scale, convergence_row
from vitlab.experiments.reproduce.claims.shared import VIT, fashion_run, search_size
from vitlab.experiments.reproduce.runs import RunCache, train_on
from vitlab.runtime import num_threads

BUDGETS = {1000: (5000, 10_000, 20_000), 60_000: (10_000, 20_000, 40_000)}
SEEDS = (0, 1, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=1, help="runs trained side by side, one thread each")
    p.add_argument("--sizes", default="1000,60000", help="report sizes to measure, comma-separated (of 1000, 60000)")
    p.add_argument("--steps", default=None, help="budgets, comma-separated (default: those of BUDGETS for the size)")
    args = p.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    out = Path(args.out)
    cache = RunCache(out / "cache")
    scale = Scale("default", SEEDS)
    record = []
    with open_executor("pool", device="cpu", workers=args.workers, n_items=64) as ex, num_threads(1):
        for n in sizes:
            budgets = tuple(int(b) for b in args.steps.split(",")) if args.steps else BUDGETS[n]
            base = fashion_run(VIT, n, 0, scale)
            runs = {(b, s): search.twin(base, steps=b, seed=s) for b in budgets for s in SEEDS}
            todo = [r for r in runs.values() if not cache.has(r)]
            for spec, _ in train_on(sorted(todo, key=lambda r: r.steps), ex, cache, "auto"):
                r = cache.result(spec)
                print(
                    f"  N={spec.n_train:,} steps {spec.steps:,} seed {spec.seed}: {100 * r['val_acc']:.2f}% "
                    f"({r['train_cpu_s']:.0f} CPU s)",
                    flush=True,
                )
            acc = {k: cache.result(r)["val_acc"] for k, r in runs.items()}
            for b in budgets:
                row = [acc[(b, s)] for s in SEEDS]
                entry = {"n_search": search_size(n), "n_report": n, "steps": runs[(b, 0)].steps}
                entry |= {"acc_seeds": row, "mean": statistics.fmean(row)}
                line = f"N={n:,} (search {entry['n_search']:,}), {entry['steps']:,} steps: " + ", ".join(
                    f"{100 * a:.2f}" for a in row
                )
                line += f"; mean {100 * entry['mean']:.2f}"
                if 2 * b in budgets:
                    moves = [acc[(2 * b, s)] - acc[(b, s)] for s in SEEDS]
                    stage = convergence_row("ViT", n, b, row, [acc[(2 * b, s)] for s in SEEDS], within_se=True)
                    entry |= {
                        "move_2x": statistics.fmean(moves),
                        "se_move": statistics.stdev(moves) / len(moves) ** 0.5,
                    }
                    entry |= {"se": stage["se"], "converged": stage["converged"]}
                    line += (
                        f"; 2x steps moves it {100 * entry['move_2x']:+.2f} (paired se {100 * entry['se_move']:.2f}; "
                        f"the arm's se {100 * entry['se']:.2f}): "
                        + ("converged" if entry["converged"] else "not converged")
                    )
                record.append(entry)
                print(line, flush=True)
    path = out / f"convergence-{'-'.join(map(str, sizes))}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
