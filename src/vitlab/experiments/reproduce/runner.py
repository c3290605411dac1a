"""The plan and its execution: every selected claim's runs, each once and parents first, priced before
anything trains (a few timed steps per architecture), trained one by one or in a pool of spawned
processes (one thread each), then analysed into report.md, report.html, results/*.csv and figures/*.png."""

from __future__ import annotations

import os
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vitlab.errors import VitlabError, check_range
from vitlab.experiments.reproduce.claims import select
from vitlab.experiments.reproduce.claims.base import Results, Scale
from vitlab.experiments.reproduce.report import _duration, render_html, render_markdown
from vitlab.experiments.reproduce.runs import VAL_PER_EPOCH, RunCache, RunSpec, build_model, execute_run
from vitlab.fileio import write_csv, write_text
from vitlab.runtime import num_threads, process_pool, resolve_device
from vitlab.speed.fastpath import check_fast_path
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
    return spec.model, dict(spec.data)["img_size"], spec.overrides, spec.batch_size


def calibrate(specs: Sequence[RunSpec], device: torch.device) -> dict[tuple, float]:
    """Seconds per training image for each architecture in `specs`: two timed steps after a warm-up."""
    out = {}
    for spec in specs:
        key = _arch_key(spec)
        if key in out:
            continue
        img = int(dict(spec.data)["img_size"])
        torch.manual_seed(0)
        model = build_model(spec, 10).to(device).train()
        opt = build_optimizer(model, lr=1e-4)
        x = torch.randn(spec.batch_size, 3, img, img, device=device)
        y = torch.randint(0, 10, (spec.batch_size,), device=device)
        times = []
        for i in range(3):
            t = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
        out[key] = min(times[1:]) / spec.batch_size
    return out


def run_cost(spec: RunSpec, per_image: dict[tuple, float]) -> float:
    """Estimated seconds: training images seen, plus evaluation (a forward pass is ~1/3 of a step)."""
    n_val = int(dict(spec.data)["n_val"])
    seen = spec.epochs * spec.n_train + (spec.epochs * min(n_val, VAL_PER_EPOCH) + n_val) / 3
    return seen * per_image[_arch_key(spec)]


def reproduce(
    out_dir: str | Path,
    *,
    quick: bool = False,
    only: str | Sequence[str] | None = None,
    seeds: int | None = None,
    device: str = "auto",
    workers: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    fast_path: str = "auto",
) -> dict:
    """Run (or read from the cache) the selected experiments and write report.md, report.html,
    results/*.csv and figures/*.png under `out_dir`. Returns {name: verdict status}.

    On CPU every run uses one thread, and `workers` runs (default: one per core, at most 4) train side by
    side in separate processes: these models are so small that a second intra-op thread costs more in
    synchronisation than it gains (and on a busy machine it can make a step 30x slower). The numbers do
    not depend on the number of workers: each run is seeded on its own. `fast_path`: each run's
    (`vitlab.speed.fastpath`; a run compiles only where its own steps repay it), kept in its result.
    """
    check_fast_path(fast_path)
    n_seeds = seeds if seeds is not None else (2 if quick else 3)
    if n_seeds < 1:
        raise VitlabError(f"seeds must be at least 1 (3 or more for error bars); found {n_seeds}", arg="seeds")
    dev = resolve_device(device)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    scale = Scale(quick=quick, seeds=tuple(range(n_seeds)))
    experiments = select(only)
    cache = RunCache(out / "cache")
    runs = _all_runs([s for e in experiments for s in e.plan(scale)])
    todo = [s for s in runs if not cache.has(s)]

    t_start = time.perf_counter()
    n_workers = _workers(workers, dev, len(todo))
    with num_threads(1 if dev.type == "cpu" else None):
        per_image = calibrate(todo, dev) if todo else {}
        costs = {s.key: run_cost(s, per_image) for s in todo}
        total = sum(costs.values()) / n_workers
        log(f"vitlab reproduce: {len(experiments)} experiment(s), {len(runs)} training run(s), {len(runs) - len(todo)} cached; "
            f"estimated {_duration(total)} on {dev} with {n_workers} worker(s) "
            f"({'quick' if quick else 'full'} scale, {n_seeds} seed(s))")
        bar = tqdm(total=max(sum(costs.values()), 1e-9), disable=not progress or not todo, unit="s", desc="reproduce",
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} est. s [{elapsed}<{remaining}]")
        # Fine-tuning runs start from another run's weights: train every run without a pending parent first.
        first = [s for s in todo if s.init is None or cache.has(s.init)]
        then = [s for s in todo if s not in first]
        for batch in (first, then):
            if n_workers == 1:
                for spec in batch:
                    step = costs[spec.key] / max(spec.epochs, 1)
                    execute_run(spec, cache, dev, on_epoch=lambda: bar.update(step), fast_path=fast_path)
            else:
                _run_parallel(batch, cache, dev, n_workers, lambda spec: bar.update(costs[spec.key]), fast_path)
        bar.close()

    fig_dir, res_dir = out / "figures", out / "results"
    fig_dir.mkdir(exist_ok=True)
    res_dir.mkdir(exist_ok=True)
    results = Results(cache)
    outcomes = []
    for e in experiments:
        with num_threads(1 if dev.type == "cpu" else None):
            outcome = e.analyze(scale, results, fig_dir)
        write_csv(res_dir / f"claim{e.number}_{e.name}.csv", outcome.csv_rows, outcome.csv_header)
        outcomes.append((e, outcome))
    write_csv(res_dir / "verdicts.csv", [[e.number, e.name, o.verdict.status, o.verdict.detail] for e, o in outcomes],
              ["claim", "name", "verdict", "detail"])
    elapsed = time.perf_counter() - t_start
    meta = {"quick": quick, "seeds": n_seeds, "device": str(dev), "runs": len(runs), "trained": len(todo),
            "estimate_s": total, "elapsed_s": elapsed, "torch": torch.__version__, "workers": n_workers,
            "train_s": sum(cache.result(s)["train_time_s"] for s in runs)}
    write_text(out / "report.md", render_markdown(outcomes, meta))
    write_text(out / "report.html", render_html(outcomes, meta, out))
    compiled = sum(any(line.startswith("fast path: compiled") for line in cache.result(s).get("fast_path", []))
                   for s in todo)
    log(f"fast path: {fast_path}: {compiled} of {len(todo)} run(s) trained compiled (the others repaid no compile)")
    log(f"wrote {out / 'report.md'} and report.html ({_duration(elapsed)}; {len(todo)} run(s) trained)")
    for e, o in outcomes:
        log(f"  claim {e.number} {e.name:12s} {o.verdict.status}")
    return {e.name: o.verdict.status for e, o in outcomes}


def _workers(workers: int | None, device: torch.device, n_todo: int) -> int:
    check_range("workers", workers, low=1, integer=True, optional=True)
    if device.type != "cpu":
        return 1  # one accelerator: runs go one after the other
    n = workers if workers is not None else min(os.cpu_count() or 1, 4)
    return max(1, min(n, n_todo))


def _worker_run(spec: RunSpec, cache_root: str, device: str, fast_path: str) -> str:
    execute_run(spec, RunCache(cache_root), torch.device(device), fast_path=fast_path)
    return spec.key


def _run_parallel(specs: Sequence[RunSpec], cache: RunCache, device: torch.device, n_workers: int,
                  done: Callable[[RunSpec], None], fast_path: str) -> None:
    """Train `specs` in `n_workers` spawned processes (one thread each); call `done` as each finishes."""
    if not specs:
        return
    with process_pool(n_workers, threads=1) as pool:
        futures = {pool.submit(_worker_run, spec, str(cache.cache_dir), str(device), fast_path): spec
                   for spec in specs}
        for future in as_completed(futures):
            future.result()  # re-raise a worker's error here
            done(futures[future])
