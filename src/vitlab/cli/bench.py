"""`vitlab bench`: images/s, achieved FLOP/s and MFU for vitlab next to timm, timm compiled and ONNX
Runtime, with the same weights and inputs; compile times; peak memory.

    vitlab bench --model vit_small_patch16_224 --batch-size 1 32 --precision fp32 bf16 --train \\
        --against timm,compile,onnxruntime --threads 1
    vitlab bench --model vit_base_patch16_224 --memory --batch-size 16      # gradient checkpointing saving
    vitlab bench --quick --json                                             # a smoke run, seconds
"""

from __future__ import annotations

import json
import sys

from vitlab.cli._common import add_device, add_threads
from vitlab.cli._help import example
from vitlab.options import BENCH_FAST_PATHS, DEFAULT_FAST_PATH, PRECISIONS

EXAMPLE = "vitlab bench --model vit_small_patch16_224 --batch-size 1 --threads 1"  # the last line of its --help

QUICK_MODEL = "vit_mini_x"


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser(
        "bench",
        help=summary,
        epilog=example(EXAMPLE),
        description=(
            "Measures the machine's matmul rate (2048^3, fp32 and bf16), then inference (and with --train, "
            "training-step) images/s of each model on vitlab's path and on each peer of --against, the same "
            "weights, inputs, precision and threads, run alternately: warm-up, then the median of --repeats. "
            "MFU (model FLOP utilisation) = achieved FLOP/s over the matmul rate of the same precision. Compile "
            "times are printed below the table. --memory measures peak resident memory instead."
        ),
    )
    p.add_argument(
        "--model",
        nargs="+",
        default=None,
        metavar="NAME",
        help="vitlab model name(s), e.g. vit_base_patch16_224 (default: vit_small_patch16_224; "
        f"{QUICK_MODEL} with --quick)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=None,
        metavar="B",
        help="batch size(s) (default 32; 8 with --quick; 16 with --memory)",
    )
    p.add_argument(
        "--precision", nargs="+", default=["fp32"], choices=PRECISIONS, help="fp32 and/or bf16 (autocast on every path)"
    )
    p.add_argument("--train", action="store_true", help="also time a training step (forward, backward, AdamW)")
    p.add_argument(
        "--against",
        default=None,
        metavar="PEERS",
        help="a comma list of peers raced alongside: timm (timm's VisionTransformer, eager), compile "
        "(timm's under torch.compile, with freezing for inference; vitlab's compiled model is then "
        "measured too), onnxruntime (the exported model in ONNX Runtime, fp32 inference)",
    )
    p.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="recompute block activations in the backward pass (training rows)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="measure peak memory instead: training with and without gradient checkpointing "
        "at --batch-size, and inference at batch 1, each in a fresh process",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per row (median; default 5, 2 with --quick)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before timing (default 1)")
    add_threads(p, help="intra-op threads for the whole run (default: torch's)")
    p.add_argument(
        "--matmul-size", type=int, default=None, help="n of the n^3 matmul probe (default 2048; 256 with --quick)"
    )
    add_device(p)
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: elapsed seconds; cpu: the process's CPU seconds, which leave out waiting for a "
        "core on a shared machine (use with --threads 1)",
    )
    p.add_argument("--quick", action="store_true", help=f"a seconds-long smoke run ({QUICK_MODEL}, small sizes)")
    p.add_argument(
        "--fast-path",
        nargs="+",
        choices=BENCH_FAST_PATHS,
        default=[DEFAULT_FAST_PATH],
        help="vitlab's row(s): auto, the plan the fixed rules give this machine for a long run; tuned, the "
        "plan `vitlab tune` measured fastest here (measured first if need be), row vitlab-tuned",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the rows as a JSON list (one object per measurement) instead of the table",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab import bench
    from vitlab.models.registry import get_config
    from vitlab.models.size import check_fits, check_memory
    from vitlab.runtime import check_threads, num_threads, resolve_device

    models = args.model or [QUICK_MODEL if args.quick else "vit_small_patch16_224"]
    bench.check_options(
        models,
        batch_sizes=args.batch_size or [],
        precisions=args.precision,
        warmup=args.warmup,
        repeats=1 if args.repeats is None else args.repeats,
        matmul_size=1 if args.matmul_size is None else args.matmul_size,
        clock=args.clock,
    )
    check_threads(args.threads)
    resolve_device(args.device)
    n = args.matmul_size or 2048
    check_memory(
        3 * n * n * 4 + 3 * n * n * 2,
        f"matmul_size {n}: the {n}^3 matrix-product probe (three {n} x {n} matrices in fp32 and bf16)",
        arg="matmul_size",
        fix="; choose a smaller size",
    )
    for name in models:
        for b in args.batch_size or [32]:
            check_fits(get_config(name), what=name, batch_size=b, training=args.train or args.memory)
    against = bench.parse_against(args.against)
    say = (lambda s: print(f"... {s}", file=sys.stderr, flush=True)) if not args.json else None
    with num_threads(args.threads):
        if args.memory:
            batch = (args.batch_size or [4 if args.quick else 16])[0]
            reports = [bench.memory_report(m, batch, precision=args.precision[0], threads=args.threads) for m in models]
            if args.json:
                print(json.dumps(reports, indent=2))
            else:
                print("\n\n".join(bench.format_memory(r) for r in reports))
            return 0
        result = bench.run_bench(
            models,
            batch_sizes=args.batch_size or [8 if args.quick else 32],
            precisions=args.precision,
            modes=["inference", "train"] if args.train else ["inference"],
            against=against,
            fast_paths=args.fast_path,
            grad_checkpointing=args.grad_checkpointing,
            warmup=args.warmup,
            repeats=args.repeats or (2 if args.quick else 5),
            matmul_size=args.matmul_size or (256 if args.quick else 2048),
            device=args.device,
            clock=args.clock,
            progress=say,
        )
    if args.json:
        print(json.dumps(result["rows"], indent=2))
    else:
        print(bench.format_table(result))
    return 0
