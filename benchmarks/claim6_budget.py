"""Claim 6's fine-tuning budget the four arms (fine-tuned and from scratch, each at lr 3e-4 and 1e-3) of
seeds 0, 1 and 2 on the 500 digits for 48, 96, 192 and 384 epochs (16 steps of 32 an epoch), validated on the
claim's held-out digits (400 of those not trained on, drawn per seed; never the verdict's); the budget in code
(claim6_pretrain.EPOCHS) is the first whose double moves no arm's mean over the seeds by a point. A measurement,
not a test.

    PYTHONPATH=src python benchmarks/claim6_budget.py --out runs/claim6_budget --workers 2   # ~40 CPU-minutes

The fine-tuned arms start from claim 5's ViT on all 60,000 Fashion-MNIST images (per seed), which is trained first
(about 5 CPU-minutes a seed) when OUT/cache does not hold it (a copy of a default report's cache/runs/<key> folder
will do).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from vitlab.experiments.executors import open_executor
from vitlab.experiments.reproduce.claims import claim6_pretrain as claim6
from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.runs import RunCache, train_on
from vitlab.runtime import num_threads

EPOCHS = (48, 96, 192, 384)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    cache = RunCache(Path(args.out) / "cache")
    arms = claim6._runs(Scale("default", (0, 1, 2)), held_out=True)
    specs = {e: [dataclasses.replace(s, recipe=s.recipe.replace(epochs=e)) for s in arms] for e in EPOCHS}
    parents = list({s.parent.key: s.parent for s in arms if s.parent is not None}.values())  # trained first
    todo = [s for s in parents + [s for group in specs.values() for s in group] if not cache.has(s)]
    with open_executor("pool", device="cpu", workers=args.workers, n_items=max(1, len(todo))) as ex, num_threads(1):
        for batch in (
            [s for s in todo if s in parents],
            sorted((s for s in todo if s not in parents), key=lambda s: -s.epochs),
        ):
            for _ in train_on(batch, ex, cache, "auto"):
                pass
    names = sorted({(s.parent is None, s.lr) for s in arms})
    label = {k: f"{'from scratch' if k[0] else 'fine-tuned'}, lr {k[1]:g}" for k in names}
    print("held-out accuracy %, seeds 0 / 1 / 2 (mean)")
    print("| epochs | steps | " + " | ".join(label[k] for k in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for e, group in specs.items():
        cells = []
        for k in names:
            accs = [100 * cache.result(s)["val_acc"] for s in group if (s.parent is None, s.lr) == k]
            cells.append(" / ".join(f"{a:.1f}" for a in accs) + f" ({sum(accs) / len(accs):.2f})")
        print(f"| {e} | {group[0].steps:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
