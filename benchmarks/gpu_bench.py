"""ViT-B/16 training throughput and MFU on one NVIDIA GPU, bf16.

What it does, in one process:
1. the GPU's bf16 matrix-multiply rate (an n x n x n product, median of repeats): the ceiling;
2. ViT-B/16 at 224, one training step = forward under bf16 autocast, fp32 cross-entropy, backward and
   one fused AdamW step, with
   - `F.scaled_dot_product_attention` restricted to the flash / memory-efficient kernels
     (`torch.nn.attention.sdpa_kernel`, a context manager: nothing global is switched),
   - `torch.compile` of the model (compile time measured and reported, not hidden),
   - channels-last input (the patch projection is a strided convolution; cuDNN prefers NHWC in bf16),
   - fused AdamW (`vitlab.train.optim.build_optimizer`);
   eager and compiled are both timed, warm-up excluded, median of the timed windows;
3. images/s, achieved FLOP/s (3 x the forward FLOPs, `vitlab.analysis.flops.training_flops`) and MFU =
   achieved over the measured bf16 matmul rate (and, for reference, over the datasheet peak if given).

    bash benchmarks/gpu_bench.sh                      # on the GPU machine
    python benchmarks/gpu_bench.py --dry-run          # CPU, a tiny model: checks the script's logic

Target: MFU >= 45% of the measured bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import vitlab
from vitlab.analysis.flops import training_flops
from vitlab.bench import machine_info, matmul_rate
from vitlab.runtime import autocast
from vitlab.train.optim import build_optimizer


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224", help="vitlab model name")
    p.add_argument("--batch-size", type=int, default=256, help="training batch size")
    p.add_argument("--steps", type=int, default=20, help="timed steps per window")
    p.add_argument("--windows", type=int, default=3, help="timed windows (median reported)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the n^3 bf16 matmul probe")
    p.add_argument("--no-compile", action="store_true", help="time eager only")
    p.add_argument("--no-channels-last", action="store_true", help="keep the input NCHW")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="datasheet dense bf16 peak, for a second MFU column (H100/H200 SXM: 989)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, vit_mini_x, batch 8, 2 steps: exercises every code path without a GPU",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.dry_run:
        args.model, args.batch_size, args.steps, args.windows, args.warmup, args.matmul_size = (
            "vit_mini_x",
            8,
            2,
            2,
            1,
            256,
        )
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model, optimizer, x, y, device):
    def step() -> torch.Tensor:
        with autocast(device, "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def time_training(model, optimizer, x, y, device, *, warmup: int, steps: int, windows: int) -> dict:
    """Warm-up (compilation included, timed separately), then `windows` timed runs of `steps` steps."""
    step = make_step(model, optimizer, x, y, device)
    backends = (
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        if device.type == "cuda"
        else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    )
    with sdpa_kernel(backends):
        t0 = time.perf_counter()
        for _ in range(warmup):
            loss = step()
        sync(device)
        warmup_s = time.perf_counter() - t0
        per_step = []
        for _ in range(windows):
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = step()
            sync(device)
            per_step.append((time.perf_counter() - t0) / steps)
    if not torch.isfinite(loss):
        raise RuntimeError(f"training loss is {loss.item()}: the benchmark's step is broken")
    return {"warmup_s": warmup_s, "step_s": statistics.median(per_step), "windows_s": per_step, "loss": loss.item()}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible; run with --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    info = machine_info(device)
    print(f"torch {info['torch']} on {info.get('gpu', info['device'])}", flush=True)

    rate = matmul_rate("bf16", n=args.matmul_size, warmup=3, repeats=10, device=device)
    print(f"bf16 matmul {args.matmul_size}^3: {rate / 1e12:.1f} TFLOP/s", flush=True)

    torch.manual_seed(0)
    cfg_flops = None
    results = {
        "machine": info,
        "matmul_bf16_flops": rate,
        "model": args.model,
        "batch_size": args.batch_size,
        "runs": [],
    }
    variants = [("eager", False)] + ([] if args.no_compile else [("compiled", True)])
    for label, compiled in variants:
        model = vitlab.create_model(args.model).to(device).train()
        cfg_flops = training_flops(model, (model.cfg.in_chans, *model.cfg.img_size), args.batch_size)  # 3 x forward
        optimizer = build_optimizer(model, lr=1e-4)  # fused AdamW
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.batch_size, model.cfg.in_chans, *model.cfg.img_size, generator=g).to(device)
        if not args.no_channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, model.cfg.num_classes, (args.batch_size,), generator=g).to(device)
        run_model = torch.compile(model) if compiled else model
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        r = time_training(
            run_model, optimizer, x, y, device, warmup=args.warmup, steps=args.steps, windows=args.windows
        )
        r.update(
            {
                "variant": label,
                "images_per_s": args.batch_size / r["step_s"],
                "flops_per_s": cfg_flops / r["step_s"],
                "mfu": cfg_flops / r["step_s"] / rate,
            }
        )
        if args.peak_tflops:
            r["mfu_datasheet"] = cfg_flops / r["step_s"] / (args.peak_tflops * 1e12)
        if device.type == "cuda":
            r["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        results["runs"].append(r)
        del model, run_model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print(
        f"\n{args.model}, batch {args.batch_size}, bf16 autocast, fused AdamW, SDPA flash/efficient, "
        f"{'NCHW' if args.no_channels_last else 'channels-last'} input"
    )
    print(
        f"{'variant':<10}{'warm-up s':>10}{'step ms':>10}{'img/s':>10}{'TFLOP/s':>10}{'MFU':>8}"
        + (f"{'MFU (sheet)':>13}" if args.peak_tflops else "")
    )
    for r in results["runs"]:
        line = (
            f"{r['variant']:<10}{r['warmup_s']:>10.1f}{1e3 * r['step_s']:>10.1f}{r['images_per_s']:>10.1f}"
            f"{r['flops_per_s'] / 1e12:>10.2f}{100 * r['mfu']:>7.1f}%"
        )
        if args.peak_tflops:
            line += f"{100 * r['mfu_datasheet']:>12.1f}%"
        print(line)
    print(f"(FLOPs per step: 3 x forward = {cfg_flops / 1e12:.3f} TFLOP; MFU over the measured bf16 matmul rate)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=2)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
