"""A vitlab fp32 training step on CPU with and without `vitlab.cpu_training` (oneDNN for the big products).

The same model and weights twice, one with its nn.Linear layers swapped for TrainingLinear (what
`fit`, `vitlab train` and `vitlab finetune` do on CPU), each taking a forward pass, cross-entropy,
backward and a fused AdamW step on one fixed batch; alternating rounds after a warm-up step, median.

    python benchmarks/bench_train_linears.py --model vit_base_patch16_224 --batch-size 16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import vitlab
from vitlab import cpu_training
from vitlab.bench import num_threads
from vitlab.train.optim import build_optimizer


def make_step(model, x, y):
    optimizer = build_optimizer(model, lr=1e-4)

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    args = p.parse_args(argv)
    if not cpu_training.supported():
        p.error("this torch build has no oneDNN: nothing to compare")

    torch.manual_seed(0)
    plain = vitlab.create_model(args.model).train()
    swapped = vitlab.create_model(args.model).train()
    swapped.load_state_dict(plain.state_dict())
    n = cpu_training.use_onednn_linears(swapped)
    cfg = plain.cfg
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, cfg.in_chans, *cfg.img_size, generator=g)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,), generator=g)
    steps = {"nn.Linear (MKL)": make_step(plain, x, y), "vitlab.cpu_training": make_step(swapped, x, y)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    with num_threads(args.threads):
        for step in steps.values():
            step()  # warm-up
        for _ in range(args.rounds):
            for name, step in steps.items():
                t = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t)
    print(f"{args.model}, batch {args.batch_size}, fp32, {args.threads} thread(s), {n} Linear layers swapped; "
          f"seconds per training step (median of {args.rounds} alternating rounds):")
    base = statistics.median(times["nn.Linear (MKL)"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:<22} {m:7.2f} s   {base / m:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
