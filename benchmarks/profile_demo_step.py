"""Where one training step of the mini experiment spends its time.

vit_mini_x (patch 4 on 32 px: 65 tokens, D = 32, 4 heads of 8 channels, 2 blocks), batch 32, the
mini experiment's AdamW step with clipping, on the CPU: the share of each torch operator in
torch.profiler's self time, then the step time of the alternatives to the fused attention kernel,
alternating runs, median of several rounds:

  sdpa              what vitlab and timm both run: F.scaled_dot_product_attention (flash kernel for CPU)
  explicit          softmax(q k^T / sqrt(d)) v as three ops (`model(x, return_attention=True)`)
  sdpa + compile    torch.compile of the model (inductor), its compile time printed apart: with a
                    fresh, empty inductor cache (what a first run gets), or the usual one with --warm-cache
  2 threads         the sdpa step with two intra-op threads instead of one

    python benchmarks/profile_demo_step.py            # ~1 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

import vitlab
from vitlab.runtime import num_threads
from vitlab.train.optim import build_optimizer


def make_step(model, x, y, explicit: bool = False):
    optimizer = build_optimizer(model, lr=3e-3, weight_decay=0.05)

    def step():
        logits = model(x, return_attention=True)[0] if explicit else model(x)
        F.cross_entropy(logits, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median is reported")
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="compile with inductor's usual on-disk cache instead of a fresh, empty one",
    )
    args = p.parse_args(argv)
    cold = None if args.warm_cache else tempfile.TemporaryDirectory(prefix="inductor-cold-")
    if cold is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold.name  # read when inductor first compiles

    torch.manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 2, (32,))
    with num_threads(1):
        step = make_step(vitlab.create_model("vit_mini_x"), x, y)
        for _ in range(20):
            step()
        if not torch.cuda.is_available():
            # Kineto (the profiler's backend) asks for CUDA devices when it stops, even for CPU-only
            # profiling, and on a machine without a GPU logs "gpuGetDeviceCount failed": silence its log
            # (KINETO_LOG_LEVEL is read when the profiler first starts; a value set by the user wins).
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]
        ) as prof:  # the step runs on the CPU
            for _ in range(args.steps):
                step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        print(f"torch.profiler, {args.steps} steps, 1 thread: share of self CPU time per operator")
        for e in events[:10]:
            print(f"  {100 * e.self_cpu_time_total / total:5.1f}%  {e.key}")

        compiled = torch.compile(vitlab.create_model("vit_mini_x"))
        t0 = time.perf_counter()
        compiled_step = make_step(compiled, x, y)
        compiled_step()
        cache = "warm (usual) cache" if cold is None else "fresh, empty cache"
        print(f"\ntorch.compile: first step (compilation, {cache}) {time.perf_counter() - t0:.1f} s")
        variants = {
            "sdpa": step,
            "explicit": make_step(vitlab.create_model("vit_mini_x"), x, y, explicit=True),
            "sdpa + compile": compiled_step,
        }

    def timed(name: str) -> float:
        threads = 2 if name == "2 threads" else 1
        fn = step if name == "2 threads" else variants[name]
        with num_threads(threads):
            fn()
            t = time.perf_counter()
            for _ in range(args.steps):
                fn()
            return (time.perf_counter() - t) / args.steps * 1e3

    names = [*variants, "2 threads"]
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            times[n].append(timed(n))
    base = statistics.median(times["sdpa"])
    print(f"\nms per training step (median of {args.rounds} alternating rounds of {args.steps} steps):")
    for n in names:
        m = statistics.median(times[n])
        print(f"  {n:<16} {m:6.2f} ms   {base / m:.2f}x the sdpa step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
