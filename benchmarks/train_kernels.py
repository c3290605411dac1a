"""A training step with the kernels chosen one operation at a time, against the model as built.

The measurement behind `vitlab.speed.fastpath.check_whole_step`: each kernel choice of
`prepare_training` (the library per fp32 product, `vitlab.speed.cpu_training`; the attention kernel,
`vitlab.speed.attention`) is timed alone, and a choice that wins alone can make the whole step
slower. Four copies of one model train on the same batch, alternately, one step each in turn (forward,
backward, AdamW): as built, with the product choices only, with the attention choice only, and with
both; the median step of each, and its speed over the model as built.

    python benchmarks/train_kernels.py --model vit_mini_x --batch-size 8 32 128
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from vitlab.models.factory import create_model
from vitlab.speed import cpu_training
from vitlab.speed.attention import choose_attention
from vitlab.speed.calibration import cpu_model
from vitlab.train.optim import build_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_mini_x")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[32])
    ap.add_argument("--steps", type=int, default=0, help="steps of each copy (default: about 2000 images)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} on {cpu_model()}, {args.threads} thread(s); fp32 training steps, median")
    for batch in args.batch_size:
        torch.manual_seed(0)
        base = create_model(args.model).train()
        c = base.cfg
        x, y = torch.randn(batch, c.in_chans, *c.img_size), torch.randint(0, max(c.num_classes, 1), (batch,))
        linears, attention, both = (copy.deepcopy(base) for _ in range(3))
        cpu_training.use_onednn_linears(linears)
        chosen = choose_attention(attention, precision="fp32", batch_size=batch, train=True)
        cpu_training.use_onednn_linears(both)
        choose_attention(both, precision="fp32", batch_size=batch, train=True)
        models = {"as built": copy.deepcopy(base), "product choices": linears,
                  f"{chosen} attention": attention, "both": both}

        def step_of(model):
            optimizer = build_optimizer(model, lr=1e-4)

            def step() -> None:
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            return step

        steps = {name: step_of(m) for name, m in models.items()}
        seconds = {name: [] for name in steps}
        for _ in range(args.steps or max(20, 2000 // batch)):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                seconds[name].append(time.perf_counter() - t0)
        median = {name: statistics.median(s[2:]) for name, s in seconds.items()}  # the first two: warm-up
        print(f"{args.model} batch {batch}: " + "; ".join(
            f"{name} {s * 1e3:.2f} ms ({median['as built'] / s:.2f}x)" for name, s in median.items()))


if __name__ == "__main__":
    main()
