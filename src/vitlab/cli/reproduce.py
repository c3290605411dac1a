"""`vitlab reproduce [--quick | --scale large | --tune | --check-budgets [--fragile-only]] [--only NAME,...]
[--seeds K] [--device D] [--executor ray [--address HOST:PORT]] --out DIR`: the paper's claims, each tested at
laptop scale with seeds and error bars, in one report (vitlab.experiments.reproduce).

Cost: --quick about 3 minutes on 2 CPU cores (smoke scale); the default scale (151 runs) about 3.5 hours on 2
cores of a Xeon with AMX (estimated at 6.0 CPU-hours, its runs took 6.9) and 4.5-6.5 on 2 of an AMD Zen 4 (estimated
at 12.7 CPU-hours, and at 9.1 on another day with the CNN compiled); --scale large (every budget doubled) about twice
that. The estimate for the machine at hand is printed first (--dry-run prints it, by claim, and stops). --tune runs
the recipe search that chose the setup's recipe and budgets (on held-out training images; hours on 2 CPU cores).
Runs are cached under DIR/cache: rerunning resumes and retrains nothing finished. With --executor ray the runs are
tasks of a Ray cluster (docs/cluster.md): the same numbers, more machines.
"""

from __future__ import annotations

from vitlab.cli._common import add_device, add_fast_path, add_out
from vitlab.cli._help import example
from vitlab.errors import VitlabError
from vitlab.options import CLAIMS, EXECUTORS, SCALES

EXAMPLE = "vitlab reproduce --quick --out runs/reproduce_quick"  # the last line of its --help


def register(subparsers, summary: str) -> None:
    names = ", ".join(f"{number}={name}" for number, name in CLAIMS.items())
    p = subparsers.add_parser(
        "reproduce",
        help=summary,
        epilog=example(EXAMPLE),
        description=__doc__.split("\n\n")[0] + " Writes DIR/report.md, DIR/report.html (figures embedded), "
        "DIR/results/*.csv and DIR/figures/*.png.",
    )
    add_out(p, help="output folder (report, CSVs, figures, and the run cache; rerunning into it resumes)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        dest="scale",
        action="store_const",
        const="quick",
        default="default",
        help="smoke-test scale: every claim's code path on tiny data, 2 seeds (~3 min on 2 cores); "
        "the verdicts mean nothing",
    )
    size.add_argument(
        "--scale",
        choices=SCALES,
        default="default",
        help="default: the report (estimated at 3.5-6.5 hours on 2 CPU cores, by CPU kind); large: every budget "
        "doubled, the default's check (twice that) (default: default)",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="run the recipe search instead (on 10,000 training images held out from the rest; writes "
        "DIR/search.md and search.json; hours on 2 CPU cores; with --quick seconds, its choice meaningless): "
        "how the setup's recipe and budgets were chosen",
    )
    p.add_argument(
        "--check-budgets",
        action="store_true",
        help="run the budget check instead: the selected claims' arms (default: all) at their budget and at twice "
        "it on seeds 0-2, each verdict compared (checked when no part moves by half its margin and the verdict "
        "stands), and each verdict with one seed left out (fragile when that flips it); writes "
        "DIR/budget_check.json and .md, which the report's verdict table reads once committed; DIR may be the "
        "report's folder, whose runs it reads (up to 16 CPU-hours for all claims; resumable)",
    )
    p.add_argument(
        "--fragile-only",
        action="store_true",
        help="with --check-budgets: only the leave-one-seed-out test (the fragile mark), on the report's runs; "
        "nothing at twice the budget is trained, and a claim's budget check on record is kept (seconds where the "
        "report's runs are cached)",
    )
    p.add_argument(
        "--only", metavar="NAME,...", default=None, help=f"run only these experiments, by name or number: {names}"
    )
    p.add_argument(
        "--seeds", type=int, default=None, metavar="K", help="seeds per configuration (default 3; 2 with --quick)"
    )
    add_device(p)
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="runs trained side by side on CPU, one thread each (default: one per core, at most 4); with "
        "--executor ray and no --address, the CPUs of the Ray cluster started on this machine",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="pool",
        help="where the runs train: pool = processes on this machine; ray = tasks of a Ray cluster, one CPU "
        "(or GPU) each, no shared disk needed (pip install -e '.[cluster]'; see docs/cluster.md) "
        "(default: pool)",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help="with --executor ray: the head node of the Ray cluster to join (as `ray start --head` prints "
        "it); without it, a Ray cluster of this machine is started for the run",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the runs the report plans, how many DIR's cache holds and the estimate of the rest on this "
        "machine, by claim, then stop: nothing is trained or written",
    )
    add_fast_path(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from vitlab.experiments.reproduce import reproduce
    from vitlab.experiments.reproduce.runner import check_budgets
    from vitlab.experiments.reproduce.search import tune

    if args.tune and args.check_budgets:
        raise VitlabError("--tune and --check-budgets are two stages; run one at a time", arg="tune")
    if args.fragile_only and not args.check_budgets:
        raise VitlabError("--fragile-only is a part of --check-budgets; add --check-budgets", arg="fragile_only")
    if args.check_budgets:
        for flag, given in (("--dry-run", args.dry_run), ("--seeds", args.seeds is not None)):
            if given:
                raise VitlabError(
                    f"{flag} applies to the report, not to --check-budgets (its seeds are 0-2); drop it",
                    arg="check_budgets",
                )
        if args.scale != "default":
            raise VitlabError(
                f"--check-budgets checks the default scale's budgets against twice them; found --scale {args.scale}",
                arg="scale",
            )
        check_budgets(
            args.out,
            only=args.only,
            device=args.device,
            workers=args.workers,
            progress=not args.no_progress,
            force=args.force,
            fast_path=args.fast_path,
            executor=args.executor,
            address=args.address,
            budgets=not args.fragile_only,
        )
        return 0
    if args.tune:
        if args.dry_run:
            raise VitlabError("--dry-run applies to the report, not to --tune; drop it", arg="dry_run")
        if args.only is not None or args.seeds is not None:
            raise VitlabError(
                f"{'--only' if args.only is not None else '--seeds'} applies to the report, not to --tune "
                "(the search trains its own runs, one seed); drop it",
                arg="tune",
            )
        tune(
            args.out,
            scale=args.scale,
            workers=args.workers,
            force=args.force,
            fast_path=args.fast_path,
            executor=args.executor,
            address=args.address,
            device=args.device,
        )
        return 0
    reproduce(
        args.out,
        scale=args.scale,
        only=args.only,
        seeds=args.seeds,
        device=args.device,
        workers=args.workers,
        progress=not args.no_progress,
        force=args.force,
        fast_path=args.fast_path,
        executor=args.executor,
        address=args.address,
        dry_run=args.dry_run,
    )
    return 0
