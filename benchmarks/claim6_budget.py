"""Claim 6's fine-tuning budget (issue 28): seed 0's four arms (fine-tuned and from scratch, each at lr 3e-4 and
1e-3) on the 500 digits for 12, 24, 48, 96 and 192 epochs (16 steps of 32 an epoch), validated on the claim's
1,297 validation digits; the budget in code (claim6_pretrain.EPOCHS) is the first whose double moves no arm by a
point. A measurement, not a test.

    PYTHONPATH=src python benchmarks/claim6_budget.py --out runs/claim6_budget   # ~10 CPU-minutes, one core

The fine-tuned arms start from claim 5's ViT on all 60,000 Fashion-MNIST images (seed 0), which is trained first
(about 5 CPU-minutes more) when OUT/cache does not hold it (a copy of a default report's cache/runs/<key> folder will do).
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

EPOCHS = (12, 24, 48, 96, 192)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cache = RunCache(Path(args.out) / "cache")
    arms = [s for s in claim6._runs(Scale("default", (0, 1, 2))) if s.seed == 0]
    specs = {e: [dataclasses.replace(s, epochs=e) for s in arms] for e in EPOCHS}
    pre = arms[0].init  # the pre-trained parent of the fine-tuned arms: trained first
    todo = [s for s in [pre] + [s for group in specs.values() for s in group] if not cache.has(s)]
    with open_executor("pool", device="cpu", workers=1, n_items=max(1, len(todo))) as ex, num_threads(1):
        for batch in ([s for s in todo if s == pre], [s for s in todo if s != pre]):
            for _ in train_on(batch, ex, cache, "auto"):
                pass
    names = [f"{'fine-tuned' if s.init else 'from scratch'}, lr {s.lr:g}" for s in arms]
    print("| epochs | steps | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for e, group in specs.items():
        print(f"| {e} | {group[0].steps:,} | " + " | ".join(f"{100 * cache.result(s)['val_acc']:.2f}" for s in group) + " |")


if __name__ == "__main__":
    main()
