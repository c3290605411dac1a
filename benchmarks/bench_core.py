"""vitlab vs timm, same configuration, same process, same thread count: images per second.

Rows, each timed for vitlab's model and for timm's:
  ViT-S/16 and ViT-B/16 at 224, fp32: inference at batch 32, and one AdamW training step at batch 16
  the demo's training loop: vit_mini_x on dataset X, batch 32, one epoch of `train_one_epoch`, against
  the same loop driving timm's VisionTransformer(img_size=32, patch_size=4, embed_dim=32, depth=2,
  num_heads=4, mlp_ratio=2, num_classes=2)

Method: both models get the same weights (vitlab's state dict loads into timm's model with strict=True,
and the logits are compared first); each measurement is warmed up, then the two implementations
alternate (the order flips every repeat, so a slow phase of a shared machine hits both), and the
median of the repeats is reported. Timings on a shared machine move with its load: read the ratio.

    python benchmarks/bench_core.py            # full sizes (minutes on a 2-core CPU)
    python benchmarks/bench_core.py --quick    # batch 4 / 2, 10 demo steps: a smoke run in about a minute
    make bench ARGS=--quick

Cost: the full run does ~40 large forward/backward passes of ViT-B/16; on 2 CPU cores that is
10+ minutes. `--device cuda` runs the same rows on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import vitlab
from vitlab.data.synthetic import dataset_x_splits
from vitlab.train.engine import TensorLoader, train_one_epoch
from vitlab.train.optim import build_optimizer


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small batches and few repeats: a smoke run")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per implementation (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--only", default="small,base,demo", help="comma-separated rows: small, base, demo")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be at least 1; found {args.repeats}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1; found {args.threads}")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def race(fns: dict[str, Callable[[], None]], *, warmup: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds per call of each function, alternating between them after a warm-up."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            _sync(device)
            t0 = time.perf_counter()
            fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def timm_twin(model: torch.nn.Module, **timm_kwargs) -> torch.nn.Module:
    """timm's VisionTransformer with the same configuration and the same weights as `model`."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    twin = TimmViT(**timm_kwargs)
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin


def check_same(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor) -> float:
    a.eval(), b.eval()
    with torch.no_grad():
        return (a(x) - b(x)).abs().max().item()


def big_rows(size: str, *, batch_infer: int, batch_train: int, warmup: int, repeats: int, device) -> list[dict]:
    name = f"vit_{size}_patch16_224"
    torch.manual_seed(0)
    ours = vitlab.create_model(name).to(device)
    torch.nn.init.normal_(ours.head.weight, std=0.02)  # a non-zero head, so the logit check means something
    c = ours.cfg
    theirs = timm_twin(
        ours,
        img_size=224,
        patch_size=16,
        embed_dim=c.dim,
        depth=c.depth,
        num_heads=c.heads,
        mlp_ratio=c.mlp_ratio,
        num_classes=c.num_classes,
    ).to(device)
    diff = check_same(ours, theirs, torch.randn(2, 3, 224, 224, device=device))
    label = f"ViT-{size[0].upper()}/16"
    rows = []

    x = torch.randn(batch_infer, 3, 224, 224, device=device)

    def infer(model):
        def fn():
            with torch.inference_mode():
                model(x)

        return fn

    ours.eval(), theirs.eval()
    t = race({"vitlab": infer(ours), "timm": infer(theirs)}, warmup=warmup, repeats=repeats, device=device)
    rows.append({"row": f"{label} inference, batch {batch_infer}", "images": batch_infer, **t, "max_logit_diff": diff})

    xt = torch.randn(batch_train, 3, 224, 224, device=device)
    yt = torch.randint(0, c.num_classes, (batch_train,), device=device)

    def step(model):
        opt = build_optimizer(model, lr=1e-4)

        def fn():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xt), yt).backward()
            opt.step()

        return fn

    ours.train(), theirs.train()
    t = race({"vitlab": step(ours), "timm": step(theirs)}, warmup=warmup, repeats=repeats, device=device)
    rows.append({"row": f"{label} AdamW train step, batch {batch_train}", "images": batch_train, **t})
    return rows


def demo_row(*, n_images: int, warmup: int, repeats: int, device) -> list[dict]:
    """The demo's loop (vitlab.train.engine.train_one_epoch, batch 32, fused AdamW, grad clipping)."""
    torch.manual_seed(0)
    ours = vitlab.create_model("vit_mini_x").to(device)
    theirs = timm_twin(
        ours, img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2, num_classes=2
    ).to(device)
    (x, y), _ = dataset_x_splits(2000, 1, seed=0)
    x, y = x[:n_images], y[:n_images]
    diff = check_same(ours, theirs, x[:8].to(device))

    def epoch(model):
        opt = build_optimizer(model, lr=3e-3)
        loader = TensorLoader(x, y, batch_size=32, shuffle=True, seed=0)
        return lambda: train_one_epoch(model, loader, opt, device=device)

    t = race({"vitlab": epoch(ours), "timm": epoch(theirs)}, warmup=warmup, repeats=repeats, device=device)
    return [
        {
            "row": f"demo loop: vit_mini_x, dataset X, batch 32 ({n_images} images/epoch)",
            "images": n_images,
            **t,
            "max_logit_diff": diff,
        }
    ]


def _rate(x: float) -> str:
    """Three significant digits without scientific notation: 1234, 123.4 -> 123, 0.1234 -> 0.123."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    import timm

    repeats = args.repeats or (3 if args.quick else 5)
    warmup = 1
    only = set(args.only.split(","))
    t_start = time.perf_counter()
    print(
        f"vitlab {vitlab.__version__} vs timm {timm.__version__}; torch {torch.__version__}, {device}, "
        f"{torch.get_num_threads()} threads, fp32, median of {repeats} alternating repeats after {warmup} warm-up"
        f"{' (--quick: small batches)' if args.quick else ''}"
    )
    rows = []
    for size in ("small", "base"):
        if size in only:
            rows += big_rows(
                size,
                batch_infer=4 if args.quick else 32,
                batch_train=2 if args.quick else 16,
                warmup=warmup,
                repeats=repeats,
                device=device,
            )
            print(f"  done: {size}", flush=True)
    if "demo" in only:
        rows += demo_row(n_images=320 if args.quick else 2000, warmup=warmup, repeats=repeats, device=device)

    print(f"\n{'row':<58}{'vitlab img/s':>14}{'timm img/s':>12}{'vitlab/timm':>13}")
    for r in rows:
        r["vitlab_img_s"], r["timm_img_s"] = r["images"] / r["vitlab"], r["images"] / r["timm"]
        r["ratio"] = r["vitlab_img_s"] / r["timm_img_s"]
        print(f"{r['row']:<58}{_rate(r['vitlab_img_s']):>14}{_rate(r['timm_img_s']):>12}{r['ratio']:>12.2f}x")
    diffs = [r["max_logit_diff"] for r in rows if "max_logit_diff" in r]
    print(
        f"same weights in both: max |logit difference| {max(diffs):.2e}; "
        f"wall time {time.perf_counter() - t_start:.0f} s; host {platform.node() or '?'} ({platform.machine()})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": str(device),
                    "threads": torch.get_num_threads(),
                    "quick": args.quick,
                    "repeats": repeats,
                    "rows": rows,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
