"""Is the data pipeline the bottleneck? Training images per second on Fashion-MNIST, one epoch of the same
images and batches, the same model configuration (`vit_mini`: P=4 on 28x28x1, D=64, 4 blocks, 4 heads,
MLP 128), fused AdamW, one process:

  plain loop + timm        a plain PyTorch loop (index a preloaded, normalised float tensor; forward;
                           backward; step) driving timm's VisionTransformer of the same configuration:
                           the ceiling, no data pipeline at all
  vitlab, in memory        the loop behind `vitlab train --dataset fashion-mnist` (train_one_epoch over a
                           MemoryLoader: uint8 batches gathered and normalised on the device), without
                           augmentation and with a random resized crop (scale 0.35-1) + flip (the default
                           before docs/recipe.md), and with the regularisation recipe of `vitlab
                           reproduce`'s claim 9 (RandAugment + MixUp/CutMix)
  vitlab, decoding         the same run with the images read as they would be from a folder too large for
                           memory: Fashion-MNIST written as PNGs (`vitlab data fashion-mnist`), each image
                           opened, decoded and augmented on its own every epoch (PIL, torchvision v2,
                           DataLoader with --workers processes)

vitlab's loop also clips gradients and keeps its metrics on the device, as `vitlab train` does (vit_mini, a small
model, trains as built on every CPU: `vitlab.speed.rules`).

    python benchmarks/bench_data_pipeline.py --out runs/bench_pipeline            # ~5 min on one CPU core
    python benchmarks/bench_data_pipeline.py --device cuda --images 60000 --out runs/bench_pipeline_gpu

Time it on an otherwise idle machine: the table is images per second of wall clock.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

import vitlab
from vitlab.data.datasets import RunData, load_data, make_loaders
from vitlab.data.fashion_mnist import write_fashion_mnist_folder
from vitlab.data.folder import scan_folder
from vitlab.data.transforms import mix_transform
from vitlab.fileio import write_json
from vitlab.runtime import num_threads, resolve_device
from vitlab.train.distributed import single_process
from vitlab.train.engine import train_one_epoch
from vitlab.train.optim import build_optimizer
from vitlab.train.recipe import RECIPES

BATCH = 128


def timm_model() -> torch.nn.Module:
    """timm's VisionTransformer with vit_mini's configuration on 28x28 grey images."""
    return VisionTransformer(
        img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0
    )


def plain_loop(x: torch.Tensor, y: torch.Tensor, device: torch.device, seed: int) -> float:
    """One epoch of the plain loop over preloaded tensors; returns images per second."""
    torch.manual_seed(seed)
    model = timm_model().to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = (x.to(device).float() / 255 - 0.5) / 0.5  # normalised once, like the data of a simple script
    y = y.to(device)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).to(device)

    def epoch(n_batches: int) -> None:
        for i in range(n_batches):
            rows = order[i * BATCH : (i + 1) * BATCH]
            loss = F.cross_entropy(model(x[rows]), y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    epoch(3)  # warm-up
    _sync(device)
    t = time.perf_counter()
    epoch(len(x) // BATCH)
    _sync(device)
    return (len(x) // BATCH) * BATCH / (time.perf_counter() - t)


def vitlab_epoch(data: RunData, recipe, device: torch.device, workers: int, seed: int) -> float:
    """One epoch of vitlab's training loop on `data` (in memory or read from disk); returns images per second."""
    torch.manual_seed(seed)
    model = vitlab.create_model("vit_mini", num_classes=10, img_size=28, in_chans=1)
    model.pretrained_cfg = model.pretrained_cfg.replace(crop_pct=1.0)  # as `vitlab train` on a bundled dataset
    dist = single_process(device)
    loader, _ = make_loaders(data, model, recipe, dist=dist, workers=workers)
    model.to(device)
    opt = build_optimizer(model, lr=recipe.lr)
    mix = mix_transform(num_classes=10, mixup=recipe.mixup, cutmix=recipe.cutmix) if recipe.mixes else None
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    else:
        loader.sampler.set_epoch(0)
    _sync(device)
    t = time.perf_counter()
    train_one_epoch(model, loader, opt, device=device, clip_grad=recipe.clip_grad, batch_transform=mix)
    _sync(device)
    return len(loader) * recipe.batch_size / (time.perf_counter() - t)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--images", type=int, default=10_000, help="training images per epoch (a nested subset of the 60,000)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader processes of the decoding run (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for the PNG copy of Fashion-MNIST and results.json")
    args = p.parse_args()
    device = resolve_device(args.device)
    out = Path(args.out).expanduser()
    pngs = out / "fashion_png"
    if not pngs.exists():
        write_fashion_mnist_folder(pngs, train_size=args.images, seed=args.seed)
    data = load_data(dataset="fashion-mnist", train_size=args.images, seed=args.seed)
    from_disk = RunData(scan_folder(pngs, cache_mb=0))  # nothing kept decoded: every epoch opens every file
    base = RECIPES["scratch"].replace(batch_size=BATCH, seed=args.seed)
    rows = []
    with num_threads(args.threads):
        rows.append(
            (
                "plain loop + timm (preloaded tensors, no augmentation)",
                plain_loop(data.train.images, data.train.labels, device, args.seed),
            )
        )
        runs = [
            ("vitlab, in memory, no augmentation", data, base.replace(augment=False)),
            ("vitlab, in memory, crop 0.35 + flip", data, base.replace(hflip=True, crop_scale=0.35)),
            (
                "vitlab, in memory, crop + flip + RandAugment + MixUp/CutMix",
                data,
                base.replace(hflip=True, crop_scale=0.35, auto_augment="rand", mixup=0.8, cutmix=1.0),
            ),
            ("vitlab, decoding PNGs every epoch, no augmentation", from_disk, base.replace(augment=False)),
            (
                "vitlab, decoding PNGs every epoch, crop 0.35 + flip",
                from_disk,
                base.replace(hflip=True, crop_scale=0.35),
            ),
        ]
        for name, d, recipe in runs:
            rows.append((name, vitlab_epoch(d, recipe, device, args.workers, args.seed)))
    ceiling = rows[0][1]
    print(
        f"Fashion-MNIST, {args.images:,} training images, batch {BATCH}, {device}, {args.threads} thread(s), "
        f"{args.workers} DataLoader worker(s) for the decoding runs; torch {torch.__version__}"
    )
    print("| run | images/s | vs plain loop |")
    print("|---|---:|---:|")
    for name, ips in rows:
        print(f"| {name} | {ips:,.0f} | {ips / ceiling:.2f}x |")
    write_json(
        out / "results.json",
        {
            "images": args.images,
            "device": str(device),
            "threads": args.threads,
            "workers": args.workers,
            "rows": [{"run": n, "images_per_s": v} for n, v in rows],
        },
    )


if __name__ == "__main__":
    main()
