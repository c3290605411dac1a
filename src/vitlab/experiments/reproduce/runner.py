"""The plan and its execution: every selected claim's runs, each once and parents first, priced before
anything trains (a few timed steps per architecture and augmentation), trained by an executor (one by one
in this process, in a pool of spawned processes, or on a Ray cluster: vitlab.experiments.executors; one
thread each) that hands each run's result and weights back to this process, which alone writes the cache;
then analysed into report.md, report.html, results/*.csv and figures/*.png."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vitlab.data.transforms import mix_transform
from vitlab.errors import VitlabError, check_range
from vitlab.experiments.executors import Executor, check_executor, open_executor
from vitlab.experiments.reproduce.claims import select, shared
from vitlab.experiments.reproduce.claims.base import SCALES, Outcome, Results, Scale, convergence_row
from vitlab.experiments.reproduce.claims.shared import CHANCE, CNN, VIT, fashion_run, n_full, n_small
from vitlab.experiments.reproduce.report import _duration, render_html, render_markdown
from vitlab.experiments.reproduce.runs import (
    HELD_OUT,
    VAL_PER_EPOCH,
    RunCache,
    RunSpec,
    build_model,
    recipe,
    train_on,
    transforms,
)
from vitlab.experiments.reproduce.search import arm_label, code_budgets, code_regularised_budgets, load_record
from vitlab.experiments.reproduce.search import render as render_search
from vitlab.experiments.reproduce.verdicts import INCONCLUSIVE, Verdict, _stats
from vitlab.fileio import check_out_folder, output_folder, write_csv, write_text
from vitlab.runtime import num_threads, resolve_device
from vitlab.speed import paths
from vitlab.speed.fastpath import check_fast_path, choose_plan
from vitlab.train.optim import build_optimizer


def _all_runs(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """The plan's runs in execution order, parents (pre-training) first, each once."""
    seen, out = set(), []

    def add(s: RunSpec) -> None:
        if s.init is not None:
            add(s.init)
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)

    for s in specs:
        add(s)
    return out


def _arch_key(spec: RunSpec) -> tuple:
    """What a step's cost depends on: the model, the data's shape, the batch and the augmentation."""
    d = dict(spec.data)
    return spec.model, d["img_size"], d.get("channels", 3), spec.overrides, spec.batch_size, spec.aug


def calibrate(specs: Sequence[RunSpec], device: torch.device, seconds: float = 1.0) -> dict[tuple, tuple[float, float]]:
    """Seconds per training image for each architecture and augmentation in `specs`, as (wall clock, CPU
    time of this process): the batch augmentation, the batch mixing and a training step, the median of those
    timed after a warm-up (at least four, until `seconds` of CPU time, at most 39). Earlier estimates took the
    fastest of a quarter of a second, and priced a default report at 110 minutes that took 123. On a machine
    busy with other work the wall clock is longer than the CPU time; on an idle one they agree (one thread)."""
    out = {}
    for spec in specs:
        key = _arch_key(spec)
        if key in out:
            continue
        d = dict(spec.data)
        size, C, B = int(d["img_size"]), int(d.get("channels", 3)), spec.batch_size
        torch.manual_seed(0)
        model = build_model(spec, 10).to(device).train()
        plan = choose_plan(model, fast="auto", mode="train", precision="fp32", batch_size=B, items=1, device=device)
        opt = build_optimizer(model, lr=1e-4)
        train_tf, _ = transforms(spec, model, (size, size))
        rec = recipe(spec)
        mix = mix_transform(num_classes=10, mixup=rec.mixup, cutmix=rec.cutmix) if rec.mixes else None
        g = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (B, C, size, size), dtype=torch.uint8, generator=g).to(device)
        y = torch.randint(0, 10, (B,), generator=g).to(device)
        params = train_tf.draw(B, g)
        with paths.training(model, plan, precision="fp32") as net:  # as fit trains it
            walls, cpus = [], []
            while len(walls) < 5 or (len(walls) < 40 and sum(cpus[1:]) < seconds):  # a warm-up, then at least 4 timed
                t, c = time.perf_counter(), time.process_time()
                x, target = train_tf(images, params), y
                if mix is not None:
                    x, target = mix(x, y)
                F.cross_entropy(net(x), target).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
        out[key] = (statistics.median(walls[1:]) / B, statistics.median(cpus[1:]) / B)
    return out


def claim_costs(experiments, scale: Scale, costs: dict[str, float]) -> list[tuple]:
    """Each claim's share of the estimated seconds (`costs`, by run key, of the runs still to train): its runs no
    claim before it plans (a shared run is counted once, in the first)."""
    seen, out = set(), []
    for e in experiments:
        mine = {s.key for s in _all_runs(e.plan(scale))} - seen
        seen |= mine
        out.append((e, sum(costs.get(k, 0.0) for k in mine)))
    return out


def run_cost(spec: RunSpec, per_image: dict[tuple, float]) -> float:
    """Estimated seconds: training images seen, plus evaluation (a forward pass is ~1/3 of a step)."""
    n_val = int(dict(spec.data)["n_val"])
    seen = spec.epochs * spec.n_train + (spec.epochs * min(n_val, VAL_PER_EPOCH) + n_val) / 3
    return seen * per_image[_arch_key(spec)]


def reproduce(
    out_dir: str | Path,
    *,
    scale: str = "default",
    only: str | Sequence[str] | None = None,
    seeds: int | None = None,
    device: str = "auto",
    workers: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    force: bool = False,
    fast_path: str = "auto",
    executor: str = "pool",
    address: str | None = None,
) -> dict:
    """Run (or read from the cache) the selected experiments at `scale` ("quick", "default" or "large"; see
    `Scale`) and write report.md, report.html, results/*.csv and figures/*.png under `out_dir`. Returns
    {name: verdict status}.

    On CPU every run uses one thread, and `workers` runs (default: one per core, at most 4) train side by
    side in separate processes: these models are so small that a second intra-op thread costs more in
    synchronisation than it gains (and on a busy machine it can make a step 30x slower). With
    `executor="ray"` every run is a task of the Ray cluster at `address` (`ray start --head`; without an
    address, one of this machine with `workers` CPUs): one CPU each, or one GPU each where `device` allows
    it and the cluster has GPUs; no disk is shared, the runs come back through Ray's object store and this
    process writes the cache (vitlab.experiments.executors). The numbers do not depend on the executor or
    the number of workers: each run is seeded on its own and trains on one thread. Every option and
    `out_dir` (new, empty, an earlier report's folder, or with `force` any folder) are checked before
    anything runs. `fast_path`: each run's (`vitlab.speed.fastpath`), kept in its result.
    """
    check_fast_path(fast_path)
    if scale not in SCALES:
        raise VitlabError(f"scale must be one of {', '.join(SCALES)}; found {scale!r}", arg="scale")
    quick = scale == "quick"
    n_seeds = seeds if seeds is not None else (2 if quick else 3)
    check_range("seeds", n_seeds, low=1, integer=True, hint=" (3 or more for error bars)")
    check_executor(executor, address, workers, device)
    # This process prices the plan and analyses the runs on its own device; Ray's runs ask the cluster for theirs.
    dev = resolve_device("auto" if executor == "ray" and str(device) == "cuda" else device)
    experiments = select(only)
    out = check_out_folder(out_dir, kind="reproduce", force=force)
    with output_folder(out, kind="reproduce", force=force):
        return _reproduce(
            out,
            experiments,
            Scale(scale, tuple(range(n_seeds))),
            dev,
            device,
            workers=workers,
            progress=progress,
            log=log,
            fast_path=fast_path,
            executor=executor,
            address=address,
        )


def _reproduce(
    out: Path,
    experiments,
    scale: Scale,
    dev: torch.device,
    device: str,
    *,
    workers,
    progress,
    log,
    fast_path,
    executor,
    address,
) -> dict:
    scale_name, n_seeds = scale.name, len(scale.seeds)
    cache = RunCache(out / "cache")
    runs = _all_runs([s for e in experiments for s in e.plan(scale)])
    todo = [s for s in runs if not cache.has(s)]

    t_start = time.perf_counter()
    nodes: Counter = Counter()  # runs trained per node
    executing = (
        open_executor(executor, device=device, workers=workers, address=address, n_items=len(todo))
        if todo
        else contextlib.nullcontext(Executor(dev))
    )  # nothing to train: no pool to start, no cluster to join
    with num_threads(1 if dev.type == "cpu" else None), executing as ex:
        n_workers = ex.slots
        timing = calibrate(todo, dev, seconds=0.1 if scale.quick else 1.0) if todo else {}
        # On CPU the estimate comes from the CPU time of the timed steps: what they take on an idle machine
        # (a busy one stretches the wall clock, not the work); the wall-clock estimate is shown beside it.
        per_image = {k: (cpu if dev.type == "cpu" else wall) for k, (wall, cpu) in timing.items()}
        costs = {s.key: run_cost(s, per_image) for s in todo}
        total = sum(costs.values()) / n_workers
        loaded = sum(run_cost(s, {k: wall for k, (wall, _) in timing.items()}) for s in todo) / n_workers
        busy = (
            f"; {_duration(loaded)} at this machine's load now" if dev.type == "cpu" and loaded > 1.15 * total else ""
        )
        where = f"; the runs on {ex.describe()}, estimated at this machine's speed" if ex.kind == "ray" else ""
        log(
            f"vitlab reproduce: {len(experiments)} experiment(s), {len(runs)} training run(s), {len(runs) - len(todo)} cached; "
            f"estimated {_duration(total)} on {dev} with {n_workers} worker(s){busy}{where} "
            f"({scale_name} scale, {n_seeds} seed(s))"
        )
        if todo and len(experiments) > 1:  # where the time goes, to choose --only by
            log(
                "  by claim (a run shared by claims counted in the first): "
                + ", ".join(
                    f"{e.number} {e.name} {_duration(t / n_workers)}" for e, t in claim_costs(experiments, scale, costs)
                )
            )
        bar = tqdm(
            total=max(sum(costs.values()), 1e-9),
            disable=not progress or not todo,
            unit="s",
            desc="reproduce",
            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} est. s [{elapsed}<{remaining}]",
        )
        # Fine-tuning runs start from another run's weights: train every run without a pending parent first.
        # Longest first, so that no worker is left with one long run at the end (no number depends on the order).
        first = sorted((s for s in todo if s.init is None or cache.has(s.init)), key=lambda s: -costs[s.key])
        then = [s for s in todo if s not in first]
        for batch in (first, then):
            for spec, node in train_on(batch, ex, cache, fast_path):
                nodes[node] += 1
                bar.update(costs[spec.key])
        bar.close()
    if todo and ex.kind == "ray":
        log(f"trained on {ex.describe()}: " + ", ".join(f"{n} run(s) on {node}" for node, n in sorted(nodes.items())))

    fig_dir, res_dir = out / "figures", out / "results"
    fig_dir.mkdir(exist_ok=True)
    res_dir.mkdir(exist_ok=True)
    results = Results(cache, dev)
    record = load_record()
    outcomes = []
    for e in experiments:
        with num_threads(1 if dev.type == "cpu" else None):
            outcome = e.analyze(scale, results, fig_dir)
        _budget_evidence(e, outcome, scale, record)
        write_csv(res_dir / f"claim{e.number}_{e.name}.csv", outcome.csv_rows, outcome.csv_header)
        outcomes.append((e, outcome))
    write_csv(
        res_dir / "verdicts.csv",
        [[e.number, e.name, o.verdict.status, o.verdict.detail] for e, o in outcomes],
        ["claim", "name", "verdict", "detail"],
    )
    elapsed = time.perf_counter() - t_start
    meta = {
        "scale": scale_name,
        "seeds": n_seeds,
        "device": str(dev),
        "runs": len(runs),
        "trained": len(todo),
        "estimate_s": total,
        "estimate_load_s": loaded,
        "elapsed_s": elapsed,
        "torch": torch.__version__,
        "workers": n_workers,
        "executor": ex.kind if todo else None,
        "cluster": ex.describe() if todo else None,
        "nodes": dict(sorted(nodes.items())),
        "only": ",".join(str(e.number) for e in experiments) if len(experiments) < len(select(None)) else None,
        "train_s": sum(cache.result(s)["train_time_s"] for s in runs),
        "search": render_search(record, heading="###") if record and scale_name != "quick" else None,
        "quality": quality(results, runs, scale) if scale_name != "quick" else None,
    }
    # The time of the invocation that trained the runs outlives it: a later one that only reads the cache
    # (to redraw the report) still reports how long the training took.
    trained_by = out / "cache" / "invocation.json"
    if todo:
        write_text(
            trained_by,
            json.dumps(
                {
                    k: meta[k]
                    for k in (
                        "trained",
                        "elapsed_s",
                        "estimate_s",
                        "estimate_load_s",
                        "workers",
                        "executor",
                        "cluster",
                        "nodes",
                    )
                }
            ),
        )
    elif trained_by.is_file():
        meta["trained_by"] = json.loads(trained_by.read_text())
    write_text(out / "report.md", render_markdown(outcomes, meta))
    write_text(out / "report.html", render_html(outcomes, meta, out))
    log(f"wrote {out / 'report.md'} and report.html ({_duration(elapsed)}; {len(todo)} run(s) trained)")
    for e, o in outcomes:
        log(f"  claim {e.number} {e.name:12s} {o.verdict.status}")
    return {e.name: o.verdict.status for e, o in outcomes}


def _budget_evidence(e, outcome: Outcome, scale: Scale, record: dict | None) -> None:
    """A claim on Fashion-MNIST gets its convergence table from the recipe search (on held-out training images,
    at the budgets in code and twice them), when the search's record is for these budgets: the convergence
    stage's rows of every arm, or, for claim 5 (the shared ViT and CNN themselves) when the search ran no
    convergence stage, the budget stage's rows at the sizes whose budget in code is the one it found. An
    inconclusive verdict says why."""
    if not outcome.convergence and record and scale.name == "default":
        _from_search(e, outcome, record)
    late = [r for r in outcome.convergence if not r["converged"]]
    if outcome.verdict.status != INCONCLUSIVE:
        if late:  # decided by the rule, but on a budget that has not converged: the reader is told
            outcome.verdict = Verdict(
                outcome.verdict.status,
                f"{outcome.verdict.detail}. Not every arm's budget has "
                "converged (" + ", ".join(r["arm"] for r in late) + ": Budget table): a longer "
                "budget may change this verdict",
            )
        return
    if late:
        why = (
            "not every arm's budget has converged (" + ", ".join(r["arm"] for r in late) + "): the budget may decide it"
        )
    elif outcome.convergence and outcome.convergence_complete:
        why = (
            "every arm's budget has converged (doubling it moves no arm by a point: Budget table), so the effect is "
            "smaller than the spread between seeds, not hidden by training stopped early"
        )
    elif outcome.convergence:
        why = "its budgets are measured only in part (Budget table): the budget may decide it"
    else:
        why = "no convergence table at this scale: the budget may decide it"
    outcome.verdict = Verdict(INCONCLUSIVE, f"{outcome.verdict.detail}. Inconclusive because {why}")


def _from_search(e, outcome: Outcome, record: dict) -> None:
    if (
        record.get("convergence")
        and e.name in record["convergence"]
        and record["code_budgets"] == {str(n): st for n, st in code_budgets().items()}
        and record.get("code_regularised_budgets") == {str(n): st for n, st in code_regularised_budgets().items()}
    ):
        outcome.convergence = record["convergence"][e.name]
        outcome.convergence_note = (
            "from the recipe search: on the 10,000 training images held out from the other "
            "50,000, seed 0 (60,000 is trained there as the 50,000)"
        )
    elif e.name == "data_scale":
        rows = budget_rows(record, code_budgets())
        if rows:
            outcome.convergence = rows
            outcome.convergence_complete = {r["n_train"] for r in rows} >= set(code_budgets())
            outcome.convergence_note = (
                "from the recipe search's budget stage: on the 10,000 training images held out from the other 50,000, "
                "seed 0; measured at "
                + ", ".join(f"{n:,}" for n in sorted({r["n_train"] for r in rows}))
                + " training images"
                + ("" if outcome.convergence_complete else " only: the other sizes' budgets are not yet measured")
            )
    elif e.name == "recipe" and record.get("regularisation"):
        reg = record["regularisation"]  # claim 9's regularisation stage: each model with it at its budget and twice it
        if reg["chosen"] != shared.REGULARISATION or code_regularised_budgets().get(reg["n"]) != reg["budget"]:
            return
        outcome.convergence = [
            convergence_row(f"{m} + recipe", reg["n"], b, *[[x] for x in r["acc"]], record["tolerance"])
            for m, b in reg["budget"].items()
            for r in reg["rows"][m]
            if r["steps"] == b
        ]
        outcome.convergence_complete = False
        outcome.convergence_note = (
            f"from the recipe search's regularisation stage: on the 10,000 training images held "
            f"out from the other 50,000, seed 0; the arms with the recipe at {reg['n']:,} "
            "training images only: the others are not yet measured"
        )


def budget_rows(record: dict, budgets: dict[int, int]) -> list[dict]:
    """The budget stage's rows (`convergence_row`s) at the sizes whose budget in `budgets` is the one the
    search found there (the same steps): the shared ViT and CNN at that budget and at twice it, held out. The
    search's largest size, its 50,000 training images, stands for the code's 60,000 (the claims' full set)."""
    rows = []
    for n, b in record.get("budgets", {}).items():
        n = 60_000 if int(n) == 60_000 - HELD_OUT else int(n)
        if budgets.get(n) != b["steps"]:
            continue
        row = next(r for r in b["rows"] if r["steps"] == b["steps"])
        for model, (a, a2) in row["acc"].items():
            rows.append(convergence_row(model, n, b["steps"], [a], [a2], record["tolerance"]))
    return rows


def quality(results: Results, runs: Sequence[RunSpec], scale: Scale) -> dict:
    """The targets of models that have learned (issue 28): the ViT >= 88% on all 60,000 training images and >= 72%
    on 1,000, the CNN >= 91% on 60,000, and a spread between seeds of at most 2 points for every Fashion-MNIST arm
    above chance + 20 points; with what each reached."""
    arms: dict[str, list[RunSpec]] = {}
    for s in runs:
        if dict(s.data)["name"] == "fashion-mnist":
            arms.setdefault(dataclasses.replace(s, seed=0).key, []).append(s)
    spreads = []
    for group in arms.values():
        mean, std, n = _stats(results.acc(group))
        if n > 1 and mean > CHANCE + 0.2:
            spreads.append((std, group[0]))
    full, small = n_full(scale), n_small(scale)
    targets = [("ViT", VIT, full, 0.88), ("ViT", VIT, small, 0.72), ("CNN", CNN, full, 0.91)]
    rows = []
    for name, model, n, target in targets:
        mean, std, _ = _stats(results.acc([fashion_run(model, n, s, scale) for s in scale.seeds]))
        rows.append({"model": name, "n_train": n, "target": target, "mean": mean, "std": std, "met": mean >= target})
    worst = max(spreads, key=lambda t: t[0]) if spreads else (float("nan"), None)
    return {
        "targets": rows,
        "arms": len(spreads),
        "over_2": sum(1 for sd, _ in spreads if sd > 0.02),
        "max_std": worst[0],
        "max_std_arm": arm_label(worst[1]) + f" at N={worst[1].n_train:,}" if worst[1] else None,
    }
