"""The part of the recipe search (`vitlab reproduce --tune`) that one CPU core can run in about an hour, and
what the chosen recipe's ViT and CNN reach at 1,000 training images a measurement, not a test.

    PYTHONPATH=src python benchmarks/reproduce_search_small.py --out runs/search_small   # ~1-1.5 h, one core
    PYTHONPATH=src python benchmarks/reproduce_search_small.py --out runs/search_small \
        --budget 1000 --budget 50000:5000 --max-steps 10000 --workers 2   # one row at 50,000: 1.1 CPU-h more

Four parts, every run through the reproduce machinery (`Run`, the run cache under OUT/cache,
--workers processes of one thread), so that a second invocation reads the cache:

    recipe     the search's recipe stage as `vitlab reproduce --tune` runs it (search.STAGES: 4,000 of the
               50,000 search-training images, 40 epochs, validated on the 10,000 held-out training images),
               and its choice of claim 9's regularisation (shared.REGULARISATIONS on the ViT at 4,000 images,
               then the chosen one on both models at steps doubling from the shared budget: claim 9's own)
    budget     the search's budget stage at 1,000 images (and at the sizes of --budget N[:FIRST]; the full
               search runs 1,000, 4,000 and 50,000): steps doubling from the plan's first (or FIRST) until
               doubling moves neither model by a point, or until --max-steps
    convergence  the search's convergence stage (once the code holds the recipe): every arm of every
               Fashion-MNIST claim at the smallest and largest training set of its claim, at a budget and at twice
               it, the budget doubling from the budget stage's until no arm at that size moves by a point (up to
               the plan's raise_to; about 5 CPU-hours beyond the budget stage's runs); then the budgets it found,
               and claim 3's learning rates, are the code's to hold
    seeds      the chosen recipe's ViT and CNN at 1,000 images and that budget, seeds 0, 1, 2, validated on
               the 10,000 test images (the claims' data: measured here, not chosen on)

Writes OUT/search.json and search.md (the search's record and its tables, as `vitlab reproduce --tune` writes
them) and OUT/seeds_test.json (the seeds' test accuracies).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from vitlab.experiments.executors import open_executor
from vitlab.experiments.reproduce import search
from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.claims.shared import CNN, VIT, epochs_for, fashion_data
from vitlab.experiments.reproduce.runs import RunCache, train_on
from vitlab.runtime import num_threads


def test_run(model: str, knobs: dict, n: int, steps: int, seed: int):
    """The run `claims.shared.fashion_run` makes once the code holds `knobs` and the budget `steps`."""
    run = search.candidate(model, knobs, n, epochs=epochs_for(steps, n, knobs["batch_size"]))
    data = fashion_data(n, Scale("default", (0, 1, 2)))
    return dataclasses.replace(run, data=data, recipe=run.recipe.replace(seed=seed))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=1000, help="the training-set size of the seeds' runs")
    p.add_argument(
        "--budget",
        action="append",
        metavar="N[:FIRST]",
        help="a size of the budget stage and the steps it starts from (default: --n, from the plan's first)",
    )
    p.add_argument("--max-steps", type=int, default=search.PLANS["default"].max_steps)
    p.add_argument("--workers", type=int, default=1, help="runs trained side by side, one thread each")
    p.add_argument(
        "--parts",
        default="recipe,budget,seeds",
        help="the parts to run, of recipe,budget,convergence,seeds (the recipe stage always runs: the others "
        "need it); the record is written after the budget part, with the convergence stage's table when "
        "that part ran",
    )
    args = p.parse_args()
    sizes = [tuple(int(x) for x in b.split(":")) for b in args.budget or [str(args.n)]]
    out = Path(args.out)
    cache = RunCache(out / "cache")
    with open_executor("pool", device="cpu", workers=args.workers, n_items=64) as ex, num_threads(1):

        def train(specs):
            for spec, _ in train_on(sorted(specs, key=lambda s: -s.epochs * s.n_train), ex, cache, "auto"):
                r = cache.result(spec)
                print(
                    f"    trained {search.arm_label(spec)} N={spec.n_train} steps {spec.steps} lr {spec.lr:g} "
                    f"B {spec.recipe.batch_size}: {100 * r['val_acc']:.2f}% ({r['train_cpu_s']:.0f} CPU s)",
                    flush=True,
                )

        s = search.Search(cache, train, lambda m: print(m, flush=True))
        print("recipe stage:", flush=True)
        recipe, stages = s.recipe()
        print("claim 9's regularisation:", flush=True)
        regularisation = s.regularisation(recipe)
        budgets = {}
        for n, *first in sizes if "budget" in args.parts else []:
            print(f"budget stage at N={n:,}:", flush=True)
            plan = dataclasses.replace(
                search.PLANS["default"],
                max_steps=args.max_steps,
                first_steps=first[0] if first else search.PLANS["default"].first_steps,
            )
            budgets.update(search.Search(cache, train, s.log, plan).budgets(recipe, ns=(n,)))
        convergence = None
        if "convergence" in args.parts.split(","):
            if recipe != search.code_recipe():
                raise SystemExit("the convergence stage needs the code to hold the search's recipe (claims/shared.py)")
            print(
                "convergence stage (every claim's arms at a budget and twice it, doubling until none moves by a "
                "point):",
                flush=True,
            )
            convergence = s.convergence(Scale("default", (0,)), budgets, regularisation)
            print(search.hold_lines(convergence), flush=True)
        where = " and ".join(
            f"{n:,} images" + (f" (from {first[0]:,} steps, at most {args.max_steps:,})" if first else "")
            for n, *first in sizes
        )
        if "budget" not in args.parts:
            return
        record = search.make_record(
            search.PLANS["default"],
            stages,
            recipe,
            budgets,
            cache,
            regularisation=regularisation,
            convergence=convergence,
            made_by="`PYTHONPATH=src python benchmarks/reproduce_search_small.py --out DIR "
            + " ".join(f"--budget {b}" for b in args.budget or [])
            + (f" --max-steps {args.max_steps}" if args.budget else "")
            + f" --parts {args.parts}` (the recipe stage of `vitlab reproduce --tune`, its choice of "
            f"claim 9's regularisation and budget, its budget stage at {where}"
            + (" and its convergence stage" if convergence else "; not its convergence stage")
            + ". The runs include an earlier search's, with the CNN at batch 128)",
        )
        (out / "search.json").write_text(json.dumps(record, indent=1))
        (out / "search.md").write_text(search.render(record))
        if "seeds" not in args.parts:
            return
        steps = budgets[args.n]["steps"] if args.n in budgets else search.code_budgets()[args.n]
        print(f"seeds at N={args.n:,}, {steps} steps, on the test images:", flush=True)
        seeds = {}
        for m in (VIT, CNN):
            acc = s.acc([test_run(m, recipe[m], args.n, steps, seed) for seed in (0, 1, 2)])
            seeds[search.MODELS[m]] = acc
            print(
                f"  {search.MODELS[m]}: "
                + ", ".join(f"{100 * a:.2f}" for a in acc)
                + f"; mean {100 * statistics.fmean(acc):.2f} +- {100 * statistics.stdev(acc):.2f}",
                flush=True,
            )
    cpu = sum(json.loads(f.read_text())["train_cpu_s"] for f in cache.root.glob("*/result.json"))
    (out / "seeds_test.json").write_text(json.dumps({"n_train": args.n, "steps": steps, "acc": seeds}, indent=1))
    print(
        f"wrote {out / 'search.json'} (the search's record, as `vitlab reproduce --tune` writes it), search.md and "
        f"seeds_test.json; {cpu / 3600:.2f} CPU-hours of training in the cache"
    )


if __name__ == "__main__":
    main()
