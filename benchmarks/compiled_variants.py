"""vitlab's compiled inference in variants, against timm compiled with freezing, in one process.

The measurements behind two choices of `vitlab.speed`: running a batch a few images at a time
(`vitlab.speed.pieces`) and calling the compiled graph from inductor's C++ wrapper
(`vitlab.speed.compiled`). Every path runs alternately (`vitlab.speed.bench.race`, each repeat at least
0.5 s of calls); "vs timm-compile" is the median of back-to-back pairs.

    # the batch of 32 in pieces of 32 (whole), 8, 4 and 1 images, each compiled for its piece shape
    python benchmarks/compiled_variants.py --model vit_small_patch16_224 --batch-size 32 --pieces 32,8,4,1
    # batch 1, compiled with and without the C++ wrapper
    python benchmarks/compiled_variants.py --model vit_small_patch16_224 --batch-size 1 --precision bf16 --wrapper

Cost: a compile per variant (10-30 s each on a 2-core CPU), then the repeats.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from vitlab.models.factory import create_model
from vitlab.runtime import autocast
from vitlab.speed.bench import _give_head_weights, paired_ratio, race, timm_twin
from vitlab.speed.calibration import cpu_model
from vitlab.speed.compiled import compile_model
from vitlab.speed.pieces import in_pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pieces", default="", help="comma-separated piece sizes, e.g. 32,8,4")
    ap.add_argument("--wrapper", action="store_true", help="with and without inductor's C++ wrapper")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = create_model(args.model).eval()
    _give_head_weights(ours, 0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, ours.cfg.in_chans, *ours.cfg.img_size, generator=g)
    device = torch.device("cpu")

    def call(fn, size: int):
        def run():
            with torch.inference_mode(), autocast(device, args.precision):
                return in_pieces(fn, x, size)

        return run

    fns = {"timm-compile": call(compile_model(timm_twin(ours).eval(), "inference", cpp_wrapper=False), len(x))}
    for size in [int(s) for s in args.pieces.split(",") if s]:
        fns[f"vitlab, {size} at a time"] = call(compile_model(copy.deepcopy(ours), "inference"), size)
    if args.wrapper:
        for wrapper in (False, True):
            model = compile_model(copy.deepcopy(ours), "inference", cpp_wrapper=wrapper)
            fns[f"vitlab, {'C++' if wrapper else 'Python'} wrapper"] = call(model, len(x))
    with torch.inference_mode():
        eager = ours(x)
    for name, fn in fns.items():  # the compile, and a check: every path gives the eager model's logits
        diff = (fn().float() - eager).abs().max().item()
        print(f"{name}: compiled; max |logit - eager fp32 logit| = {diff:.2g}", flush=True)
    times = race(fns, warmup=1, repeats=args.repeats, min_repeat_s=0.5)
    print(f"{args.model}, {args.precision}, batch {args.batch_size}, {args.threads} thread(s), {cpu_model()}, "
          f"torch {torch.__version__}; median of {args.repeats} repeats")
    for name, ts in times.items():
        print(f"  {name:24s} {len(x) / statistics.median(ts):8.2f} img/s   "
              f"vs timm-compile {paired_ratio(ts, times['timm-compile']):.3f}x")


if __name__ == "__main__":
    main()
