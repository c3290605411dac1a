"""The plan and its execution: every selected claim's runs, each once and parents first, priced before
anything trains (a few timed steps per architecture and augmentation), trained one by one or in a pool of
spawned processes (one thread each), then analysed into report.md, report.html, results/*.csv and
figures/*.png."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vitlab.data.transforms import mix_transform
from vitlab.errors import VitlabError, check_range
from vitlab.experiments.reproduce.claims import select
from vitlab.experiments.reproduce.claims.base import SCALES, Results, Scale
from vitlab.experiments.reproduce.report import _duration, render_html, render_markdown
from vitlab.experiments.reproduce.runs import VAL_PER_EPOCH, RunCache, RunSpec, build_model, execute_run, recipe, transforms
from vitlab.fileio import check_out_folder, output_folder, write_csv, write_text
from vitlab.runtime import num_threads, process_pool, resolve_device
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


def calibrate(specs: Sequence[RunSpec], device: torch.device) -> dict[tuple, tuple[float, float]]:
    """Seconds per training image for each architecture and augmentation in `specs`, as (wall clock, CPU
    time of this process): the batch augmentation, the batch mixing and a training step, the fastest of
    those timed after a warm-up (at least two, until a quarter of a second). On a machine busy with other work the wall clock is longer than the CPU time; on an
    idle one they agree (one thread)."""
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
            while len(walls) < 3 or (len(walls) < 8 and sum(cpus[1:]) < 0.25):  # a warm-up, then at least 2 timed
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
        out[key] = (min(walls[1:]) / B, min(cpus[1:]) / B)
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
) -> dict:
    """Run (or read from the cache) the selected experiments at `scale` ("quick", "default" or "large"; see
    `Scale`) and write report.md, report.html, results/*.csv and figures/*.png under `out_dir`. Returns
    {name: verdict status}.

    On CPU every run uses one thread, and `workers` runs (default: one per core, at most 4) train side by
    side in separate processes: these models are so small that a second intra-op thread costs more in
    synchronisation than it gains (and on a busy machine it can make a step 30x slower). The numbers do
    not depend on the number of workers: each run is seeded on its own. Every option and `out_dir` (new,
    empty, an earlier report's folder, or with `force` any folder) are checked before anything runs.
    `fast_path`: each run's (`vitlab.speed.fastpath`), kept in its result.
    """
    check_fast_path(fast_path)
    if scale not in SCALES:
        raise VitlabError(f"scale must be one of {', '.join(SCALES)}; found {scale!r}", arg="scale")
    quick = scale == "quick"
    n_seeds = seeds if seeds is not None else (2 if quick else 3)
    check_range("seeds", n_seeds, low=1, integer=True, hint=" (3 or more for error bars)")
    check_range("workers", workers, low=1, integer=True, optional=True)
    dev = resolve_device(device)
    experiments = select(only)
    out = check_out_folder(out_dir, kind="reproduce", force=force)
    with output_folder(out, kind="reproduce", force=force):
        return _reproduce(out, experiments, Scale(scale, tuple(range(n_seeds))), dev, workers=workers,
                          progress=progress, log=log, fast_path=fast_path)


def _reproduce(out: Path, experiments, scale: Scale, dev: torch.device, *, workers, progress, log, fast_path) -> dict:
    scale_name, n_seeds = scale.name, len(scale.seeds)
    cache = RunCache(out / "cache")
    runs = _all_runs([s for e in experiments for s in e.plan(scale)])
    todo = [s for s in runs if not cache.has(s)]

    t_start = time.perf_counter()
    n_workers = _workers(workers, dev, len(todo))
    with num_threads(1 if dev.type == "cpu" else None):
        timing = calibrate(todo, dev) if todo else {}
        # On CPU the estimate comes from the CPU time of the timed steps: what they take on an idle machine
        # (a busy one stretches the wall clock, not the work); the wall-clock estimate is shown beside it.
        per_image = {k: (cpu if dev.type == "cpu" else wall) for k, (wall, cpu) in timing.items()}
        costs = {s.key: run_cost(s, per_image) for s in todo}
        total = sum(costs.values()) / n_workers
        loaded = sum(run_cost(s, {k: wall for k, (wall, _) in timing.items()}) for s in todo) / n_workers
        busy = f"; {_duration(loaded)} at this machine's load now" if dev.type == "cpu" and loaded > 1.15 * total else ""
        log(f"vitlab reproduce: {len(experiments)} experiment(s), {len(runs)} training run(s), {len(runs) - len(todo)} cached; "
            f"estimated {_duration(total)} on {dev} with {n_workers} worker(s){busy} "
            f"({scale_name} scale, {n_seeds} seed(s))")
        bar = tqdm(total=max(sum(costs.values()), 1e-9), disable=not progress or not todo, unit="s", desc="reproduce",
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} est. s [{elapsed}<{remaining}]")
        # Fine-tuning runs start from another run's weights: train every run without a pending parent first.
        # Longest first, so that no worker is left with one long run at the end (no number depends on the order).
        first = sorted((s for s in todo if s.init is None or cache.has(s.init)), key=lambda s: -costs[s.key])
        then = [s for s in todo if s not in first]
        if n_workers == 1:
            for spec in first + then:
                step = costs[spec.key] / max(spec.epochs, 1)
                execute_run(spec, cache, dev, on_epoch=lambda: bar.update(step), fast_path=fast_path)
        else:
            _run_parallel([first, then], cache, dev, n_workers, lambda spec: bar.update(costs[spec.key]), fast_path)
        bar.close()

    fig_dir, res_dir = out / "figures", out / "results"
    fig_dir.mkdir(exist_ok=True)
    res_dir.mkdir(exist_ok=True)
    results = Results(cache, dev)
    outcomes = []
    for e in experiments:
        with num_threads(1 if dev.type == "cpu" else None):
            outcome = e.analyze(scale, results, fig_dir)
        write_csv(res_dir / f"claim{e.number}_{e.name}.csv", outcome.csv_rows, outcome.csv_header)
        outcomes.append((e, outcome))
    write_csv(res_dir / "verdicts.csv", [[e.number, e.name, o.verdict.status, o.verdict.detail] for e, o in outcomes],
              ["claim", "name", "verdict", "detail"])
    elapsed = time.perf_counter() - t_start
    meta = {"scale": scale_name, "seeds": n_seeds, "device": str(dev), "runs": len(runs), "trained": len(todo),
            "estimate_s": total, "estimate_load_s": loaded, "elapsed_s": elapsed, "torch": torch.__version__,
            "workers": n_workers,
            "only": ",".join(str(e.number) for e in experiments) if len(experiments) < len(select(None)) else None,
            "train_s": sum(cache.result(s)["train_time_s"] for s in runs)}
    # The time of the invocation that trained the runs outlives it: a later one that only reads the cache
    # (to redraw the report) still reports how long the training took.
    trained_by = out / "cache" / "invocation.json"
    if todo:
        write_text(trained_by, json.dumps({k: meta[k] for k in ("trained", "elapsed_s", "estimate_s", "estimate_load_s",
                                                                 "workers")}))
    elif trained_by.is_file():
        meta["trained_by"] = json.loads(trained_by.read_text())
    write_text(out / "report.md", render_markdown(outcomes, meta))
    write_text(out / "report.html", render_html(outcomes, meta, out))
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


def _run_parallel(batches: Sequence[Sequence[RunSpec]], cache: RunCache, device: torch.device, n_workers: int,
                  done: Callable[[RunSpec], None], fast_path: str) -> None:
    """Train the runs of `batches` in `n_workers` spawned processes (one thread each), a batch after the
    previous one has finished (its runs start from the earlier batches' weights); call `done` as each
    finishes. One pool for all: a spawned process takes seconds to import torch."""
    if not any(batches):
        return
    with process_pool(n_workers, threads=1) as pool:
        for specs in batches:
            futures = {pool.submit(_worker_run, spec, str(cache.cache_dir), str(device), fast_path): spec
                       for spec in specs}
            for future in as_completed(futures):
                future.result()  # re-raise a worker's error here
                done(futures[future])
