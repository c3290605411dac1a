"""A vitlab fp32 training step on CPU with and without `vitlab.speed.cpu_training` (each product by the library
measured faster on this machine).

The same model and weights twice, one with its nn.Linear layers swapped for TrainingLinear (what
`fit`, `vitlab train` and `vitlab finetune` do on CPU), each taking a forward pass, cross-entropy,
backward and a fused AdamW step on one fixed batch; alternating rounds after a warm-up step, median.

With --products it times the three products of a Linear one by one instead, MKL (what nn.Linear
calls) against oneDNN with the weight reordered on each call (vitlab.speed.cpu_training), for ViT-B/16's
four Linear shapes at 197, 1576 and 6304 rows (batch 1, 8 and 32 at 224), and prints the ranges that
`src/vitlab/speed/cpu_training.py`'s docstring cites: they differ from CPU to CPU, which is why vitlab
measures them on the machine it runs on.

    python benchmarks/bench_train_linears.py --model vit_base_patch16_224 --batch-size 16 --threads 2
    python benchmarks/bench_train_linears.py --products        # ~2 min, one thread

Cost: a ViT-B/16 training step at batch 16 takes ~10 s on a 2-core CPU, and a run takes 8 of them (a
warm-up and 3 rounds for each of the two models): ~1.5 min with --threads 2, several minutes with the
default single thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import vitlab
from vitlab.speed import cpu_training
from vitlab.runtime import num_threads
from vitlab.train.optim import build_optimizer


def make_step(model, x, y):
    optimizer = build_optimizer(model, lr=1e-4)

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def products(repeats: int) -> None:
    """MKL time over oneDNN time for y = x W^T + b, dx = dy W and dW = dy^T x, per row count."""
    print("MKL time / oneDNN time (weight reordered per call), ViT-B/16's Linear shapes (in, out) "
          f"(768, 2304) (768, 3072) (3072, 768) (768, 768); median of {repeats}:")
    print(f"{'rows':>6}  {'forward y':<14}{'backward dx':<14}{'backward dW':<14}")
    for rows in (197, 1576, 6304):
        ratios: dict[str, list[float]] = {"y": [], "dx": [], "dW": []}
        for k, n in ((768, 2304), (768, 3072), (3072, 768), (768, 768)):
            g = torch.Generator().manual_seed(rows + k + n)
            x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
            dy = torch.randn(rows, n, generator=g)
            pairs = {
                "y": (lambda: torch.addmm(b, x, w.t()), lambda: cpu_training._onednn_linear(x, w, b)),
                "dx": (lambda: dy.mm(w), lambda: cpu_training._onednn_linear(dy, w.t().contiguous(), None)),
                "dW": (lambda: dy.t().mm(x),
                       lambda: cpu_training._onednn_linear(dy.t().contiguous(), x.t().contiguous(), None)),
            }
            for name, (mkl, onednn) in pairs.items():
                ratios[name].append(median_ms(mkl, repeats) / median_ms(onednn, repeats))
        cells = [f"{min(r):.2f}-{max(r):.2f}x" for r in ratios.values()]
        print(f"{rows:>6}  " + "".join(f"{c:<14}" for c in cells))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    p.add_argument("--products", action="store_true", help="time the three products one by one (see above)")
    args = p.parse_args(argv)
    if not cpu_training.supported():
        p.error("this torch build has no oneDNN: nothing to compare")
    if args.products:
        with num_threads(args.threads):
            products(repeats=max(args.rounds, 5))
        return 0

    torch.manual_seed(0)
    plain = vitlab.create_model(args.model).train()
    swapped = vitlab.create_model(args.model).train()
    swapped.load_state_dict(plain.state_dict())
    n = cpu_training.use_onednn_linears(swapped)
    cfg = plain.cfg
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, cfg.in_chans, *cfg.img_size, generator=g)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,), generator=g)
    steps = {"nn.Linear (MKL)": make_step(plain, x, y), "vitlab.speed.cpu_training": make_step(swapped, x, y)}
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
