"""`vitlab demo`: the mini experiment on dataset X, with and without position embedding
(vitlab.experiments.demo). The README's first command, `make demo`, runs it."""

from __future__ import annotations

from vitlab.cli._common import add_device, add_out, add_threads
from vitlab.cli._help import example
from vitlab.train.recipe import RECIPES

EXAMPLE = "vitlab demo --out runs/demo"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "demo",
        help=summary,
        epilog=example(EXAMPLE),
        description="Train vit_mini_x (patch 4, D=32, 4 heads, 2 blocks, MLP 64) on dataset X (2000/500 "
        "synthetic 32x32 images: left half brighter vs mirrored) with AdamW, lr 3e-3, batch 32; then the same "
        "run with pos_embed='none'. Prints progress and a table of validation accuracies, and writes metrics "
        "CSVs, loss/accuracy curves, last-layer CLS attention maps, checkpoints and summary.json to --out.",
    )
    p.add_argument(
        "--epochs", type=int, default=RECIPES["mini"].epochs, help="epochs per run (the mini experiment uses 60)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the data, the initial weights and the batch order")
    add_out(
        p,
        required=False,
        default="runs/demo",
        help="output folder (created if missing; a folder of other files is refused unless --force)",
    )
    add_device(p)
    add_threads(
        p,
        default=1,
        help="CPU threads for torch (default 1: the mini model is too small to split between "
        "cores, and extra threads stall on a busy machine); 0 = torch's default",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        choices=(1, 2),
        help="2: train the two runs side by side in two processes; 1: one after the other (default: 2 on a "
        "CPU with two or more cores, 1 on a GPU); the numbers are the same either way",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (the per-epoch lines stay)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.experiments.demo import run_demo
    from vitlab.runtime import check_threads

    check_threads(args.threads, zero=True, optional=False)  # 0: torch's default
    run_demo(
        epochs=args.epochs,
        seed=args.seed,
        out=args.out,
        device=args.device,
        threads=args.threads or None,
        workers=args.workers,
        progress=not args.no_progress,
        force=args.force,
    )
    return 0
