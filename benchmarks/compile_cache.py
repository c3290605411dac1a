"""How long torch.compile takes the first time, and in the next process (inductor's on-disk cache).

Two fresh processes in turn compile the same model as vitlab compiles it (`vitlab.speed.compiled`:
freezing for inference, none for training) into one new, empty inductor cache folder; each prints the
wall seconds of its first call (the compile, and one call), of a second call, and inductor's and
AOTAutograd's cache counters (a hit means the graph was loaded, not generated and built; a frozen
inference graph is never a hit: its packed weights do not pickle, so inductor bypasses the FX graph
cache, and the second process reuses only the C++ kernels already built on disk).

    python benchmarks/compile_cache.py --model vit_small_patch16_224 --batch-size 32 --precision fp32
    python benchmarks/compile_cache.py --model vit_small_patch16_224 --batch-size 32 --train

Cost: several minutes on a 2-core CPU, most of it the first process's compile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters  # the counters inductor keeps, its caches' hits and misses among them

import vitlab
from vitlab.runtime import autocast
from vitlab.speed.compiled import CompiledModel


def child(args) -> dict:
    """One process: compile, time the first and the second call, read the cache counters."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = vitlab.create_model(args.model).train(args.train)
    mode = "train" if args.train else "inference"
    compiled = CompiledModel(model, mode=mode)
    x = torch.randn(args.batch_size, 3, *model.cfg.img_size)
    y = torch.zeros(args.batch_size, dtype=torch.long)
    device = torch.device("cpu")

    def call() -> None:
        if args.train:
            with autocast(device, args.precision):
                logits = compiled(x)
            F.cross_entropy(logits.float(), y).backward()
        else:
            with torch.inference_mode(), autocast(device, args.precision):
                compiled(x)

    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    caches = {k: v for group in ("inductor", "aot_autograd") for k, v in counters[group].items() if "cache" in k}
    return {"first_call_s": times[0], "second_call_s": times[1], "caches": caches}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--train", action="store_true", help="compile a training step (forward and backward)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    what = f"{args.model} {'training step' if args.train else 'inference'} {args.precision} batch {args.batch_size}"
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for run in ("first process (empty cache)", "second process (the first one's cache)"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", *(argv or sys.argv[1:])],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(
                f"{what}, {run}: first call {r['first_call_s']:.1f} s (compile + one call), second call "
                f"{r['second_call_s']:.2f} s; caches {r['caches']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
