"""The mini experiment's training loop (`vitlab demo`: vit_mini_x on dataset X, AdamW 3e-3, batch 32,
60 epochs), vitlab's against timm's: time and final accuracy.

Four runs, one process, one thread count, the same data:
  timm  + simple loop   a plain loop: DataLoader over a TensorDataset, torch.optim.AdamW (foreach),
                        zero_grad / forward / backward / step, evaluation every epoch. The baseline.
  vitlab + fit          what `vitlab demo` runs: `vitlab.train.engine.fit` (TensorLoader slices, fused
                        AdamW, warmup + cosine, gradient clipping, metrics on the device) with vitlab's model
  vitlab + simple loop  isolates the model
  timm  + fit           isolates the engine
timm's model is VisionTransformer(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4,
mlp_ratio=2, num_classes=2): vit_mini_x's configuration. Each run reports wall seconds and the process's
CPU seconds (on a shared machine the CPU seconds are the steadier figure at one thread), and the
final validation accuracy. With --compile, vitlab's model is also run under torch.compile, the
compilation time included in its total.

With --demo it times the whole mini experiment as a user gets it instead: `vitlab demo`'s two runs
(with and without position embedding; side by side in two processes, one thread each, on a CPU
with two cores) against the simple loop driving timm's model for the same two runs one after
the other, at 1 thread and at torch's default thread count. It prints one line per timed run (wall
seconds, final accuracies of both runs) and the speed-ups; the demo's own output (its per-epoch lines
and table) is not printed.

    python benchmarks/bench_demo_loop.py --epochs 60            # ~4 x 60-80 s CPU on one core
    python benchmarks/bench_demo_loop.py --epochs 5 --compile
    python benchmarks/bench_demo_loop.py --epochs 60 --demo     # ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import vitlab
from vitlab.data.synthetic import dataset_x_splits
from vitlab.runtime import num_threads
from vitlab.train.engine import TensorLoader, fit
from vitlab.train.recipe import RECIPES


def timm_mini() -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=2
    )


def simple_loop(model, data, epochs: int, seed: int) -> float:
    """The plain training loop a tutorial writes, with nothing added. Returns the last validation accuracy."""
    (xt, yt), (xv, yv) = data
    torch.manual_seed(seed)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, yv), batch_size=250)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    acc = 0.0
    for _ in range(epochs):
        model.train()
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val:
                correct += (model(x).argmax(-1) == y).sum().item()
        acc = correct / len(yv)
    return acc


def engine_loop(model, data, epochs: int, seed: int) -> float:
    """`vitlab demo`'s path: fit() with the mini experiment's recipe (RECIPES["mini"])."""
    (xt, yt), (xv, yv) = data
    recipe = RECIPES["mini"].replace(epochs=epochs, seed=seed)
    history = fit(
        model,
        TensorLoader(xt, yt, batch_size=recipe.batch_size, shuffle=True, seed=seed),
        TensorLoader(xv, yv, batch_size=250),
        recipe,
        device="cpu",
    )
    return history.last["val_acc"]


def timm_mini_no_pos() -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=2, pos_embed="none"
    )


def whole_demo(epochs: int, seed: int) -> list[dict]:
    """`vitlab demo` against the simple loop driving timm for both runs (wall seconds)."""
    import tempfile

    from vitlab.experiments.demo import run_demo

    data, rows = dataset_x_splits(), []
    for threads in (1, torch.get_num_threads()):
        with num_threads(threads):
            wall, accs = time.perf_counter(), []
            for build in (timm_mini, timm_mini_no_pos):
                torch.manual_seed(seed)
                accs.append(simple_loop(build(), data, epochs, seed))
            rows.append(
                {
                    "run": f"timm + simple loop, 2 runs, {threads} thread(s)",
                    "wall_s": time.perf_counter() - wall,
                    "val_acc": accs,
                }
            )
            print(f"{rows[-1]['run']:<44} wall {rows[-1]['wall_s']:7.1f} s  val_acc {accs}", flush=True)
    with tempfile.TemporaryDirectory() as out:
        wall = time.perf_counter()
        summary = run_demo(epochs=epochs, seed=seed, out=out, device="cpu", progress=False, echo=lambda line: None)
        accs = [summary["runs"][p]["final_val_acc"] for p in ("learned", "none")]
        rows.append(
            {
                "run": f"vitlab demo, {summary['workers']} process(es) x 1 thread",
                "wall_s": time.perf_counter() - wall,
                "val_acc": accs,
            }
        )
        print(f"{rows[-1]['run']:<44} wall {rows[-1]['wall_s']:7.1f} s  val_acc {accs}", flush=True)
    for r in rows[:-1]:
        print(f"vitlab demo / ({r['run']}): {r['wall_s'] / rows[-1]['wall_s']:.2f}x faster")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=60, help="epochs per run (the mini experiment: 60)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for every run")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the shuffling")
    p.add_argument("--compile", action="store_true", help="add a run of vitlab + fit under torch.compile")
    p.add_argument(
        "--demo",
        action="store_true",
        help="time the whole demo (both runs) instead: one line per timed run and the speed-ups, "
        "not the demo's own output",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.demo:
        rows = whole_demo(args.epochs, args.seed)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"epochs": args.epochs, "rows": rows}, f, indent=2)
        return 0

    data = dataset_x_splits()
    runs = [
        ("timm + simple loop", timm_mini, simple_loop),
        ("vitlab + fit", lambda: vitlab.create_model("vit_mini_x"), engine_loop),
        ("vitlab + simple loop", lambda: vitlab.create_model("vit_mini_x"), simple_loop),
        ("timm + fit", timm_mini, engine_loop),
    ]
    if args.compile:
        runs.append(("vitlab + fit + compile", lambda: torch.compile(vitlab.create_model("vit_mini_x")), engine_loop))
    rows = []
    with num_threads(args.threads):
        for name, build, loop in runs:
            torch.manual_seed(args.seed)
            model = build()
            wall, cpu = time.perf_counter(), time.process_time()
            acc = loop(model, data, args.epochs, args.seed)
            rows.append(
                {"run": name, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "val_acc": acc}
            )
            print(
                f"{name:<24} wall {rows[-1]['wall_s']:7.1f} s  cpu {rows[-1]['cpu_s']:7.1f} s  val_acc {acc:.3f}",
                flush=True,
            )
    base = rows[0]
    print(f"\n{args.epochs} epochs, {args.threads} thread(s); speed-up over timm + simple loop:")
    for r in rows[1:]:
        r["speedup_wall"], r["speedup_cpu"] = base["wall_s"] / r["wall_s"], base["cpu_s"] / r["cpu_s"]
        print(f"  {r['run']:<24} {r['speedup_cpu']:.2f}x (cpu seconds)  {r['speedup_wall']:.2f}x (wall)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"epochs": args.epochs, "threads": args.threads, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
