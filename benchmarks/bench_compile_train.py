"""A training step eager and compiled, for the architectures of `vitlab reproduce`: the measurement behind the
rules' row that compiles a CNN's training (`vitlab.speed.rules.RULES`), a benchmark (prints a table), not a test.

    PYTHONPATH=src python benchmarks/bench_compile_train.py              # about 3 minutes on one core
    PYTHONPATH=src python benchmarks/bench_compile_train.py --steps 10   # a quick look

Each architecture is the default scale's (the shared ViT at patch 7, the ViT at patch 4, the hybrid, the CNN at
widths 16 and 24: `claims/shared.py`, claim 10's widths), one thread, batch 64 of 28x28 grey images, AdamW with
gradient clipping at 1, the step `fit` takes (cross-entropy, backward, clip, step). Printed: the CPU time of a step
(median of `--steps` after three warm-up steps), eager and under `torch.compile` as the rules compile a training
run (`vitlab.speed.compiled.compile_model(..., "train")`), their ratio, and the wall clock of the compiled path's
first step (the compile; inductor's cache is the one under VITLAB_CACHE: empty on a first run, full on a second).

Measured on the 2-core AMD EPYC (Zen 4, family 25, AVX-512 with bf16), torch 2.14.1, the other core busy with a
ViT's training run (`PYTHONPATH=src python benchmarks/bench_compile_train.py`):

    | architecture | eager ms/step | compiled ms/step | eager / compiled | first compiled step, wall s |
    | ViT P=7      |  35.7 |  36.3 | 0.98x | 23.8 |
    | ViT P=4      |  98.4 | 100.4 | 0.98x | 17.5 |
    | CNN w16      |  88.4 |  59.6 | 1.48x |  1.0 |
    | CNN w24      | 180.2 | 140.5 | 1.28x | 15.9 |
    | hybrid       | 155.3 | 130.0 | 1.19x | 24.1 |

`--whole-runs 1000` trains the CNN's reproduce run (1,000 images, seed 0) for 1,000 steps through `train_run`, with its
augmentation and per-epoch check, twice in one process eager and twice compiled, and prints each run's CPU seconds
beside `vitlab reproduce`'s estimate of it, and a digest of its weights.

A second run (`--steps 60`, the machine busier: load 3 on 2 cores, inductor's cache partly full) gave the CNN 1.29x
and 1.33x, the hybrid 1.21x, the ViTs 0.90x and 1.03x. The CNN gains in every run; the ViTs do not.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch
import torch.nn.functional as F

from vitlab.experiments.reproduce.claims.base import Scale
from vitlab.experiments.reproduce.claims.shared import CNN, VIT, fashion_run
from vitlab.experiments.reproduce.runner import calibrate, run_cost
from vitlab.experiments.reproduce.runs import build_model, train_run
from vitlab.speed.compiled import compile_model

SCALE = Scale("default", (0,))
ARCHITECTURES = {
    "ViT P=7": fashion_run(VIT, 1000, 0, SCALE),
    "ViT P=4": fashion_run(VIT, 1000, 0, SCALE, overrides={"patch_size": 4}),
    "CNN w16": fashion_run(CNN, 1000, 0, SCALE),
    "CNN w24": fashion_run(CNN, 1000, 0, SCALE, overrides={"width": 24}),
    "hybrid": fashion_run(VIT, 1000, 0, SCALE, overrides={"patch_size": 4, "stem": "hybrid", "stem_width": 16}),
}


def step_times(model: torch.nn.Module, net, steps: int) -> tuple[float, float]:
    """(the first step's wall clock, the median CPU time of `steps` steps after three warm-up ones), in seconds."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    for _ in range(2):
        step()
    cpu = []
    for _ in range(steps):
        c = time.process_time()
        step()
        cpu.append(time.process_time() - c)
    return first, statistics.median(cpu)


def whole_runs(steps: int) -> None:
    """The CNN's reproduce run for `steps` steps, twice eager, then twice compiled, in this process."""
    run, cpu = fashion_run(CNN, 1000, 0, SCALE, steps=steps), torch.device("cpu")
    print("| path | run in this process | CPU s | `vitlab reproduce`'s estimate, CPU s | val acc | weights |")
    for path in ("eager", "compile"):
        estimate = run_cost(run, {k: c for k, (_, c) in calibrate([run], cpu, fast_path=path).items()})
        for i in (1, 2):
            result, weights = train_run(run, cpu, fast_path=path)
            took = result["train_cpu_s"] + result["eval_cpu_s"]
            digest = hashlib.sha256(weights).hexdigest()[:12]
            print(f"| {path} | {i} | {took:.1f} | {estimate:.1f} | {result['val_acc']:.4f} | {digest} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="timed steps per path (after three warm-up steps)")
    p.add_argument("--whole-runs", type=int, default=0, metavar="STEPS", help="time whole runs of the CNN instead")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.whole_runs:
        whole_runs(args.whole_runs)
        return
    print("| architecture | eager ms/step | compiled ms/step | eager / compiled | first compiled step, wall s |")
    for name, run in ARCHITECTURES.items():
        torch.manual_seed(0)
        model = build_model(run, 10).train()
        _, eager = step_times(model, model, args.steps)
        first, compiled = step_times(model, compile_model(model.forward, "train"), args.steps)
        print(
            f"| {name:12s} | {1000 * eager:5.1f} | {1000 * compiled:5.1f} | {eager / compiled:.2f}x | {first:4.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
