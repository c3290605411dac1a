"""`vitlab tune`: measure, on this machine, the fastest plan of a model for each batch, precision and mode,
and keep it for `--fast-path tuned` (`vitlab.speed.tune`).

    vitlab tune --model vit_base_patch16_224 --batch-size 1 32 --precision fp32 bf16 --train --threads 1
    vitlab predict photos/*.jpg --model vit_base_patch16_224 --pretrained w.safetensors --fast-path tuned
"""

from __future__ import annotations

import sys

from vitlab.cli._common import add_threads
from vitlab.cli._help import example
from vitlab.errors import VitlabError, check_range
from vitlab.options import PRECISIONS

EXAMPLE = "vitlab tune --model vit_small_patch16_224 --batch-size 1 32 --threads 1"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "tune",
        help=summary,
        description=(
            "Times the candidate plans of a ViT (torch's fused attention or the explicit products, torch's or "
            "oneDNN's matrix products, compiled or not, a batch in pieces) for each batch size, precision and "
            "mode at the thread count given, and keeps the fastest (when it beats the fixed rules' plan by 3%) "
            "in vitlab's cache folder. Commands with --fast-path tuned then run on it; a run records the plan "
            "it used. A compile per candidate: minutes for a large model."
        ),
        epilog=example(EXAMPLE),
    )
    p.add_argument("--model", required=True, metavar="NAME", help="a vitlab model name, e.g. vit_base_patch16_224")
    p.add_argument("--img-size", type=int, default=None, metavar="S", help="image side (default: the model's)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[32], metavar="B", help="batch size(s) (default 32)")
    p.add_argument("--precision", nargs="+", default=["fp32"], choices=PRECISIONS, help="fp32 and/or bf16")
    p.add_argument("--train", action="store_true", help="tune training steps too, not only inference")
    p.add_argument("--again", action="store_true", help="measure again what was tuned before")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per candidate (median; default 5)")
    add_threads(p, help="intra-op threads to tune for (a plan is kept per thread count; default: torch's)")
    p.set_defaults(func=run)


def _say(line: str) -> None:
    print(f"... {line}", file=sys.stderr, flush=True)


def run(args) -> int:
    import torch

    from vitlab.models.factory import create_model
    from vitlab.models.registry import get_variant
    from vitlab.runtime import check_threads, num_threads
    from vitlab.speed import tune
    from vitlab.speed.fastpath import choose_plan
    from vitlab.speed.machine import this_machine

    if not get_variant(args.model).is_vit:
        raise VitlabError(
            f"model {args.model!r} is a CNN baseline; vitlab tune tunes ViTs (a CNN runs as built)", arg="model"
        )
    for b in args.batch_size:
        check_range("batch_size", b, low=1, integer=True)
    check_range("repeats", args.repeats, low=1, integer=True)
    check_threads(args.threads)
    device = torch.device("cpu")
    with num_threads(args.threads):
        model = create_model(args.model, img_size=args.img_size)
        print(f"tuning on {this_machine().describe()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
        for mode in ("inference", "train") if args.train else ("inference",):
            for precision in args.precision:
                for b in args.batch_size:
                    rules = choose_plan(
                        model, fast="auto", mode=mode, precision=precision, batch_size=b, items=10**6, device=device
                    )
                    plan = None if args.again else tune.known(model, mode=mode, precision=precision, batch_size=b)
                    if plan is None:
                        plan = tune.tune(
                            model,
                            mode=mode,
                            precision=precision,
                            batch_size=b,
                            default=rules,
                            repeats=args.repeats,
                            log=_say,
                        )
                    print(
                        f"{args.model} {mode} {precision} batch {b}: {plan.describe()}; the rules: {rules.describe()}"
                    )
    print(f"kept in {tune.tuning_file()}")
    return 0
